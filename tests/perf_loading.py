"""Load a script of perf/ as a module (perf/ is not a package: its scripts run by path)."""

import importlib.util
from pathlib import Path

PERF = Path(__file__).resolve().parents[1] / "perf"


def load_perf_script(name: str):
    """perf/<name>.py, executed as a fresh module named `name`."""
    spec = importlib.util.spec_from_file_location(name, PERF / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
