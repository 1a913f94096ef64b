"""A comparison's archive (grail.analysis.compare.archive) as one compressed file, `NAME.tar.xz`: what a repository
keeps (a 65-run comparison's 13 MB of samples and logs pack into about 1.3 MB), read by `grail compare --resume
NAME.tar.xz --check-report` as the plain folder is, and written by `--archive NAME.tar.xz` and `--archive-each
NAME.tar.xz`.

The file holds one folder, NAME/, with what the plain archive holds; `tar xJf NAME.tar.xz` unpacks it as it is. It is
written whole into a temporary file beside it, then renamed over it: a failed or interrupted write leaves the earlier
archive as it was. Entries are sorted and carry no owner, files keep their modification times (in whole seconds) and
folders carry none, so that packing the same runs again gives the same bytes. Reading accepts regular files and
folders under one top folder and nothing else (no links, devices or paths that leave it)."""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["SUFFIX", "is_packed", "opened", "pack", "read_plan", "unpacked"]

SUFFIX = ".tar.xz"
PRESET = 6  # xz's default: on run logs and samples, -9 packs no smaller and needs 7x the memory
PLAN = "compare.json"  # grail.analysis.compare.plan.PLAN_FILE; this module imports nothing of the package, so
# that reading an archive's plan stays light
_OTHER_FORMATS = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.zst", ".tar", ".zip", ".7z", ".gz", ".bz2", ".xz",
                  ".zst")


def is_packed(path: str | Path, flag: str) -> bool:
    """Whether `path` names a compressed archive (it ends in .tar.xz) rather than a folder (one that exists, or a new
    path, which is created as a folder); anything else is refused, `flag` naming the option in the message."""
    path = Path(path)
    if path.name.endswith(SUFFIX):
        if path.is_dir():
            raise ValueError(f"{flag} {path}: a folder named as a compressed archive; rename it, or give a folder "
                             f"whose name does not end in {SUFFIX}.")
        return True
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path}: neither a folder nor a {SUFFIX} archive; give a comparison's folder or a "
                         f"file ending in {SUFFIX} (what grail compare --archive NAME{SUFFIX} writes).")
    if path.name.lower().endswith(_OTHER_FORMATS):
        raise ValueError(f"{flag} {path}: only {SUFFIX} archives are read and written; name the file NAME{SUFFIX}, or "
                         f"give a folder.")
    return False


def _members(tar: tarfile.TarFile, path: Path) -> tuple[str, list[tarfile.TarInfo]]:
    """The archive's one top folder and its entries, each checked to be a plain file or folder inside it."""
    members = tar.getmembers()
    tops = {m.name.split("/", 1)[0] for m in members}
    if len(tops) != 1:
        raise ValueError(f"--resume {path}: a comparison's archive holds one folder, this one {len(tops)} "
                         f"({', '.join(sorted(tops)[:3])}); pack it with grail compare --archive NAME{SUFFIX}.")
    top = tops.pop()
    for m in members:
        if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in m.name.split("/"):
            raise ValueError(f"--resume {path}: {m.name!r} is not a plain file or folder inside {top}/; an archive "
                             f"grail compare writes holds no other entries. Unpack it by hand to see what it holds.")
    return top, members


def _open(path: Path) -> tarfile.TarFile:
    if not path.is_file():
        raise ValueError(f"--resume {path}: no such file; give the path of a comparison's {SUFFIX} archive, or its "
                         f"folder.")
    try:
        return tarfile.open(path, "r:xz")
    except (tarfile.TarError, EOFError, OSError) as err:
        raise ValueError(f"--resume {path}: not a readable {SUFFIX} archive ({err}); it may be cut short: copy it "
                         f"again.") from err


def read_plan(path: str | Path) -> dict:
    """The comparison's plan (compare.json) in the archive at `path`, without unpacking the rest."""
    path = Path(path)
    with _open(path) as tar:
        top, _ = _members(tar, path)
        try:
            return json.loads(tar.extractfile(f"{top}/{PLAN}").read())
        except KeyError:
            raise ValueError(f"--resume {path}: no {top}/{PLAN} in it; it is not the archive of a grail "
                             f"compare.") from None


@contextmanager
def unpacked(path: str | Path) -> Iterator[Path]:
    """The comparison in the archive at `path`, unpacked into a temporary folder that is removed afterwards."""
    path = Path(path)
    with _open(path) as tar, tempfile.TemporaryDirectory(prefix="grail-archive-") as scratch:
        top, members = _members(tar, path)
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4; checked above too
        tar.extractall(scratch, members=members, **safe)
        yield Path(scratch) / top


@contextmanager
def opened(path: str | Path, flag: str = "--resume") -> Iterator[Path]:
    """A comparison to read, as a folder: `path` itself, or a .tar.xz archive unpacked for the time of the block."""
    if is_packed(path, flag):
        with unpacked(path) as folder:
            yield folder
    else:
        yield Path(path)


def _entry(path: Path, name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if path.is_dir():  # a folder's time is when it was copied, not when its runs were: it carries none
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
    else:
        stat = path.stat()
        info.size, info.mode, info.mtime = stat.st_size, 0o644, int(stat.st_mtime)
    return info


def pack(folder: str | Path, dest: str | Path) -> int:
    """Write `folder` (a comparison's plain archive) as the compressed archive `dest` (NAME.tar.xz, holding NAME/),
    atomically (module docstring); returns dest's size in bytes."""
    folder, dest = Path(folder), Path(dest)
    top = dest.name[: -len(SUFFIX)]
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with partial.open("wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:xz", preset=PRESET, format=tarfile.PAX_FORMAT) as tar:
                tar.addfile(_entry(folder, top))
                for root, dirs, files in os.walk(folder):
                    dirs.sort()
                    for name in sorted(dirs + files):
                        item = Path(root) / name
                        if item.is_symlink():
                            continue
                        info = _entry(item, f"{top}/{item.relative_to(folder).as_posix()}")
                        if info.isdir():
                            tar.addfile(info)
                        else:
                            with item.open("rb") as handle:
                                tar.addfile(info, handle)
            raw.flush()
            os.fsync(raw.fileno())  # on disk before it replaces the earlier archive
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest.stat().st_size
