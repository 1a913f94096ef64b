"""`grail compare --resume DIR --check-report`: is DIR's report the one its runs give? The report is rendered again
from the runs' files (grail.analysis.compare.report.write_report) into a temporary directory, training and evaluating
nothing and changing nothing in DIR, and compared with DIR's report.json (as JSON) and report.md (as text).

A report is a pure function of the runs' files and of the grail-rl that renders it: a difference means a run's
files changed after the report was written, or that another version of grail-rl renders it (the report's Code
section names the commits that trained the runs; render with the same one to tell the two apart). Where the
comparison lies is not part of it: each run's `run_dir` in report.json is compared from its `runs/` folder on, so a
copy, an unpacked archive or a moved folder checks the same.

Another machine's or another version's numerical libraries may sum in another order or compute a function more
exactly: the same report rendered with them can differ in a float's last digits (seen: a comparison rendered on a GPU
machine and checked on a CPU one, relative differences about 1e-15; the Student t quantile taken from scipy instead
of grail-rl's own, up to 4e-12). Numbers within ROUNDING (relative) of each other, with everything else equal, are the
same report; the check says so and gives the largest relative difference. report.md, whose numbers are rounded for
reading, must match exactly."""

from __future__ import annotations

import difflib
import json
import tempfile
from pathlib import Path

from grail.analysis.compare.report import write_report
from grail.analysis.compare.run import Log

__all__ = ["check_report"]

SHOWN_LINES = 20  # of report.md's diff
ROUNDING = 1e-9  # the relative difference between two floats that counts as rounding (module docstring)
SMALL = 1e-3  # below this size a difference is measured against SMALL (a sum that is 0 here and 1e-17 there)


def check_report(plan: dict, out_dir: str | Path, jobs: int, log: Log = print,
                 packed: str | Path | None = None) -> bool:
    """Render the report of out_dir again elsewhere and compare (module docstring); log what differs; True when
    report.json and report.md are both the same. `jobs`: the runs at a time the report records. `packed`: the
    .tar.xz archive that out_dir was unpacked from, named in the messages."""
    out_dir = Path(out_dir)
    missing = [name for name in ("report.json", "report.md") if not (out_dir / name).is_file()]
    if missing and packed is not None:
        raise ValueError(f"--check-report: {packed} has no {missing[0]} to check; unpack it (grail compare --resume "
                         f"{packed} --archive DIR) and render it there (grail compare --resume DIR --report-only).")
    if missing:
        raise ValueError(f"--check-report: {out_dir} has no {missing[0]} to check; render it first (grail compare "
                         f"--resume {out_dir}, or --report-only while runs are missing).")
    with tempfile.TemporaryDirectory(prefix="grail-check-report-") as scratch:
        write_report(out_dir, plan, jobs, into=scratch)
        fresh = json.loads((Path(scratch) / "report.json").read_text())
        fresh_md = (Path(scratch) / "report.md").read_text()
    stored, fresh = _placed(json.loads((out_dir / "report.json").read_text())), _placed(fresh)
    stored_md = (out_dir / "report.md").read_text()
    def text(value) -> str:  # as JSON text, so that a NaN equals itself
        return json.dumps(value, sort_keys=True)
    keys = sorted(k for k in set(stored) | set(fresh) if text(stored.get(k)) != text(fresh.get(k)))
    rounded = [rounding(stored.get(k), fresh.get(k)) for k in keys]
    if not keys:
        log("compare: report.json the same")
    elif all(r is not None and r <= ROUNDING for r in rounded):
        log(f"compare: report.json the same to rounding (its floats differ in the last digits in {', '.join(keys)}; "
            f"largest relative difference {max(rounded):.1e}: differences at rounding level, as another machine's or "
            f"version's numerical libraries give)")
        keys = []
    else:
        keys = [k for k, r in zip(keys, rounded, strict=True) if r is None or r > ROUNDING]
        log(f"compare: report.json differs in {', '.join(keys)}")
    if stored_md == fresh_md:
        log("compare: report.md the same")
    else:
        diff = list(difflib.unified_diff(stored_md.splitlines(), fresh_md.splitlines(), "report.md (stored)",
                                         "report.md (from the runs)", lineterm="", n=0))
        log(f"compare: report.md differs ({sum(line[:1] in '+-' for line in diff[2:])} lines):\n"
            + "\n".join(diff[:SHOWN_LINES]) + ("\n..." if len(diff) > SHOWN_LINES else ""))
    return not keys and stored_md == fresh_md


def rounding(a, b) -> float | None:
    """The largest relative difference between two JSON values' numbers when they are otherwise equal (same keys,
    lengths, strings, booleans, None; ints compare as numbers); None when they differ in anything but a number. NaN
    equals NaN; numbers smaller than SMALL are compared as if they were SMALL."""
    if isinstance(a, bool) or isinstance(b, bool) or not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        if type(a) is not type(b):
            return None
        if isinstance(a, dict):
            if a.keys() != b.keys():
                return None
            parts = [rounding(a[k], b[k]) for k in a]
        elif isinstance(a, list):
            if len(a) != len(b):
                return None
            parts = [rounding(x, y) for x, y in zip(a, b, strict=True)]
        else:
            return 0.0 if a == b else None
        return None if None in parts else max(parts, default=0.0)
    if a == b or (a != a and b != b):  # equal, or both NaN
        return 0.0
    if a != a or b != b or abs(a) == float("inf") or abs(b) == float("inf"):
        return None
    return abs(a - b) / max(abs(a), abs(b), SMALL)


def _placed(report: dict) -> dict:
    """report.json with each run's run_dir cut to its part from the comparison's folder on (runs/ARM/seedS)."""
    runs = [{**run, "run_dir": "/".join(Path(run["run_dir"]).parts[-3:])} if "run_dir" in run else run
            for run in report.get("runs", [])]
    return {**report, "runs": runs} if "runs" in report else report
