"""`grail compare --resume DIR --archive DEST`: a comparison's results without its weights, small enough to keep in
a repository or carry to another machine, from which `grail compare --resume DEST` renders the same report without
training or evaluating anything, or goes on with the runs DEST lacks.

What is copied: the comparison's own files (compare.json, before_rl.json, auroc_warmstart.json, the report and its
plots, the before-RL evaluation's samples) and, for every finished run (its compare_result.json exists), the whole
run directory: training log, code.jsonl, evaluation samples and results, AUROC files, compare.log. What is not:
model weights and optimiser state (final/, checkpoint-N/, and any *.safetensors, *.bin, *.pt, *.pth, *.gguf file),
locks and half-written temporaries, and runs that have not finished (their checkpoints are the weights; from DEST
they start over). A finished run already in DEST is replaced by DIR's copy, unless no file of it has changed since
it was archived (same names, sizes and modification times: copies keep their times), when it is left as it is;
DEST's other runs stay, so that archiving into the same DEST after every stop accumulates the finished runs.

`grail compare ... --archive-each DEST` does the same while the comparison runs: once its plan is written, after
each run finishes and with the final report (a failed copy is logged and the runs go on). The comparison keeps DEST
in ARCHIVE_EACH_FILE, so that a resume goes on archiving there without the flag (`--no-archive-each` forgets it);
that file names a place on this machine and is not archived.

DEST must be empty, new, or hold the same comparison (arms, seeds' fields, protocol, base config and AUROC plan);
checkpointing fields and the number of seeds may differ (they change on resume). Copying goes both ways: archiving
an archive into a fresh directory on a new machine and resuming there trains the missing runs.

DIR and DEST may each be a compressed archive, NAME.tar.xz (grail.analysis.compare.packed), instead of a folder: from
one, the runs are read as from the folder it holds; into one, the folder it holds (if it exists) takes the copy as a
folder DEST would, and the file is then written again whole, replacing the earlier one only once complete."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

from grail.analysis.compare.packed import is_packed, opened, pack, read_plan, unpacked
from grail.analysis.compare.plan import PLAN_FILE
from grail.analysis.compare.run import Log, write_json
from grail.analysis.compare.summary import RESULT_FILE, plan_seeds, run_path
from grail.options.checkpoint_dirs import checkpoint_dirs

__all__ = ["ARCHIVE_EACH_FILE", "WEIGHT_SUFFIXES", "archive_comparison", "check_destination", "forget_destination",
           "remember_destination", "remembered_destination"]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt")
_SAME_KEYS = ("arms", "seed_fields", "protocol", "first_seed", "auroc_rows", "auroc_set", "auroc_methods")
ARCHIVE_EACH_FILE = "archive_each.json"  # in a comparison: {"dest": where --archive-each copies it}
_CHECKPOINTING = {"save_steps", "save_total_limit"}  # the only base fields a resume may change (plan.amend_plan)


def _skipped(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES) or name.endswith(".lock") or (name.startswith(".") and name.endswith(".tmp"))


def _archived(source: Path, skip_dirs: set[Path], prefix: str = ""):
    """(path relative to source, path) of every folder and file archived from source, a folder before its contents:
    no weights, locks, temporaries, links or skip_dirs, in sorted order."""
    for item in sorted(source.iterdir()):
        if item in skip_dirs or item.is_symlink() or (not prefix and item.name == ARCHIVE_EACH_FILE):
            continue
        if item.is_dir():
            yield f"{prefix}{item.name}", item
            yield from _archived(item, skip_dirs, f"{prefix}{item.name}/")
        elif item.is_file() and not _skipped(item.name):
            yield f"{prefix}{item.name}", item


def _copy_tree(source: Path, dest: Path, skip_dirs: set[Path]) -> int:
    """Copy what source archives (_archived) into dest; returns the bytes copied."""
    copied = 0
    dest.mkdir(parents=True, exist_ok=True)
    for relative, item in _archived(source, skip_dirs):
        if item.is_dir():
            (dest / relative).mkdir(exist_ok=True)
        else:
            shutil.copy2(item, dest / relative)
            copied += item.stat().st_size
    return copied


def _listing(source: Path, skip_dirs: set[Path]) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime in ns) of every file _copy_tree would copy from source, sorted."""
    return [(relative, item.stat().st_size, item.stat().st_mtime_ns)
            for relative, item in _archived(source, skip_dirs) if not item.is_dir()]


def _check_same(plan: dict, stored: dict, dest: Path, flag: str) -> None:
    differs = [key for key in _SAME_KEYS if plan.get(key) != stored.get(key)]
    base, old = plan["base"], stored["base"]
    differs += [f"config field {k}" for k in sorted(set(base) | set(old))
                if k not in _CHECKPOINTING and base.get(k, "<unset>") != old.get(k, "<unset>")]
    if differs:
        raise ValueError(f"{flag} {dest}: it holds another comparison ({differs[0]} differs); give an empty or new "
                         f"directory, or the archive of this comparison.")


def remember_destination(out_dir: str | Path, dest: str | Path) -> None:
    """Keep --archive-each's DEST (as an absolute path) with the comparison in out_dir, for its resumes."""
    write_json(Path(out_dir) / ARCHIVE_EACH_FILE, {"dest": os.path.abspath(dest)})


def remembered_destination(out_dir: str | Path) -> str | None:
    """The DEST an earlier command gave --archive-each for the comparison in out_dir, or None."""
    path = Path(out_dir) / ARCHIVE_EACH_FILE
    try:
        return json.loads(path.read_text())["dest"] if path.is_file() else None
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: unreadable ({err}); delete it, and give --archive-each DEST again if you want "
                         "the comparison archived as it runs.") from None


def forget_destination(out_dir: str | Path) -> None:
    """--no-archive-each: the comparison in out_dir is no longer archived as it runs."""
    (Path(out_dir) / ARCHIVE_EACH_FILE).unlink(missing_ok=True)


def check_destination(plan: dict, out_dir: str | Path, dest: str | Path, flag: str = "--archive") -> None:
    """Refuse a DEST (a folder or a .tar.xz file) that cannot take the archive of the comparison in out_dir (see the
    module docstring), before any copying; `flag` names the option in the message."""
    dest = Path(dest)
    if dest.resolve() == Path(out_dir).resolve():
        raise ValueError(f"{flag} {dest}: that is the comparison itself; give another directory.")
    if is_packed(dest, flag):
        if dest.exists():
            _check_same(plan, read_plan(dest), dest, flag)
    elif (dest / PLAN_FILE).is_file():
        _check_same(plan, json.loads((dest / PLAN_FILE).read_text()), dest, flag)
    elif dest.is_dir() and any(dest.iterdir()):
        raise ValueError(f"{flag} {dest}: it holds files but no {PLAN_FILE}; give an empty or new directory.")


@contextmanager
def _staged(dest: Path):
    """A folder to copy into for the compressed archive dest: what dest holds already (nothing if it is new), in a
    temporary folder."""
    if dest.exists():
        with unpacked(dest) as folder:
            yield folder
    else:
        with tempfile.TemporaryDirectory(prefix="grail-archive-") as scratch:
            yield Path(scratch)


def archive_comparison(out_dir: str | Path, dest: str | Path, log: Log = print) -> dict:
    """Copy the comparison in out_dir, less its weights and unfinished runs, into dest, either of them a folder or a
    .tar.xz archive (see the module's docstring); returns {"finished": [run names copied], "unfinished": [run names
    left out], "bytes": bytes copied, or the compressed archive's size}."""
    out_dir, dest = Path(out_dir), Path(dest)
    if dest.resolve() == out_dir.resolve():
        raise ValueError(f"--archive {dest}: that is the comparison itself; give another directory.")
    packed = is_packed(dest, "--archive")
    with ExitStack() as stack:
        source = stack.enter_context(opened(out_dir))
        path = source / PLAN_FILE
        if not path.is_file():
            raise ValueError(f"--resume {out_dir}: no {PLAN_FILE} there; give the --output_dir of a grail compare.")
        plan = json.loads(path.read_text())
        check_destination(plan, out_dir, dest)
        target = stack.enter_context(_staged(dest)) if packed else dest
        done = _copy_comparison(plan, source, target)
        if packed:
            done["bytes"] = pack(target, dest)
    log(f"compare: archived {len(done['finished'])} finished run(s) "
        + (f"into {dest} ({done['bytes'] / 1e6:.1f} MB compressed, no weights)" if packed else
           f"({done['bytes'] / 1e6:.1f} MB copied, no weights) to {dest}")
        + _next_steps(dest, packed, len(done["unfinished"])))
    return done


def _next_steps(dest: Path, packed: bool, unfinished: int) -> str:
    """What the log line after archiving suggests: how to read, re-render or go on from dest."""
    if packed:
        folder = f"DIR: grail compare --resume {dest} --archive DIR"
        return ((f"; {unfinished} unfinished not archived (from there they train from the start)" if unfinished else
                 "") + f". Check its report: grail compare --resume {dest} --check-report; to re-render or train, "
                f"unpack it into a {folder}, then grail compare --resume DIR")
    if unfinished:
        return (f"; {unfinished} unfinished not archived (from there they train from the start). Its report so far, "
                f"training nothing: grail compare --resume {dest} --report-only; continue there: grail compare "
                f"--resume {dest}")
    return f". Re-render: grail compare --resume {dest}"


def _copy_comparison(plan: dict, out_dir: Path, dest: Path) -> dict:
    """archive_comparison's copy from folder to folder, without the checks and the log line."""
    finished, unfinished = [], []
    for seed in plan_seeds(plan):
        for arm in plan["arms"]:
            name = f"{arm['slug']}/seed{seed}"
            (finished if (run_path(out_dir, arm["slug"], seed) / RESULT_FILE).is_file() else unfinished).append(name)
    runs = out_dir / "runs"
    copied = _copy_tree(out_dir, dest, skip_dirs={runs})
    for name in finished:
        slug, seed = name.rsplit("/seed", 1)
        target = run_path(dest, slug, int(seed))
        run_dir = run_path(out_dir, slug, int(seed))
        weights = {run_dir / "final", *(folder for _, folder in checkpoint_dirs(run_dir))}
        if target.is_dir() and _listing(target, set()) == _listing(run_dir, weights):
            continue  # archived before and unchanged since (copies keep their times): archiving again is cheap
        staging = target.with_name(f".{target.name}.archiving")
        shutil.rmtree(staging, ignore_errors=True)
        copied += _copy_tree(run_dir, staging, skip_dirs=weights)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return {"finished": finished, "unfinished": unfinished, "bytes": copied}
