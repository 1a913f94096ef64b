"""Which code trained a run: `code.jsonl` in the run directory, one line per start and per resume.

A run that spans several sessions (killed, resumed, perhaps after the checkout moved on) keeps a record of every
attempt: grail-rl's version and, when it runs from a git checkout (an editable install), the commit and whether
tracked files differed from it; the versions of python, torch, transformers, TRL and accelerate.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
import tomllib
from importlib import metadata
from pathlib import Path

__all__ = ["CODE_FILE", "VERSION_KEYS", "code_versions", "record_code"]

CODE_FILE = "code.jsonl"
_PACKAGES = ("torch", "transformers", "trl", "accelerate")
VERSION_KEYS = ("grail_rl", "python", *_PACKAGES)  # the versions each line records (with commit and dirty)


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _own_version(root: Path) -> str | None:
    """grail-rl's installed version; for a source tree run without installing it (PYTHONPATH=src, as on a machine
    with no registry, where every compare worker once died here) the version its checkout's pyproject.toml declares;
    None when neither exists."""
    try:
        return metadata.version("grail-rl")
    except metadata.PackageNotFoundError:
        try:
            return tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return None


def code_versions() -> dict:
    """{grail_rl, commit, dirty, python, torch, ...}: commit and dirty are None outside a git checkout, a library's
    version None where it has no installed metadata (grail-rl's own: see `_own_version`)."""
    here = Path(__file__).resolve()
    root = here.parents[3]  # an editable install runs src/grail/training/provenance.py from the checkout
    checkout = (root / ".git").exists() and (root / "src" / "grail" / "training" / here.name).resolve() == here
    commit = _git(root, "rev-parse", "HEAD") if checkout else None
    status = _git(root, "status", "--porcelain", "--untracked-files=no") if commit else None
    versions = {"grail_rl": _own_version(root), "commit": commit,
                "dirty": None if status is None else bool(status), "python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def record_code(run_dir: str | Path, from_step: int) -> dict:
    """Append this attempt's line to run_dir/code.jsonl (from_step: 0 for a start, the checkpoint's step for a
    resume). Returns it."""
    line = {"from_step": from_step, "time": time.time(), **code_versions()}
    with (Path(run_dir) / CODE_FILE).open("a") as f:
        f.write(json.dumps(line) + "\n")
    return line
