"""The known-good set: every package that `pip install -c constraints.txt -e ".[dev]"` brings is pinned in
constraints.txt, and the environment running the tests holds exactly the pinned versions. A dependency left unpinned
takes whatever is newest on the day a new environment is made (how pytest 9.2 once broke a test that a machine's
older, hand-installed pytest kept passing); `.ci/run` makes that new environment every time."""

import importlib.metadata as md
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin (write name==version)"
            pins[canonicalize_name(name)] = version
    return pins


def _required(name: str, extras: frozenset[str], seen: dict[str, list[str]], path: list[str]) -> None:
    """Every distribution `name[extras]` requires on this platform, recursively, with the chain that brings it."""
    for text in md.distribution(name).requires or []:
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
            continue
        dep = canonicalize_name(req.name)
        key = f"{dep}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen[key] = path + [dep]
        _required(dep, frozenset(req.extras), seen, path + [dep])


def _dev_closure() -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    _required("grail-rl", frozenset({"dev"}), seen, ["grail-rl[dev]"])
    return {chain[-1]: chain for chain in seen.values() if chain[-1] != "grail-rl"}


def test_the_pin_reader_reads_exact_pins_and_skips_comments():
    pins = _pins()
    assert pins["torch"] == "2.13.0"  # the one pin that keeps a multi-GB CUDA build out
    assert all("=" not in v and " " not in v for v in pins.values())


def test_every_package_the_dev_install_brings_is_pinned():
    closure = _dev_closure()
    assert {"pytest", "mkdocs", "trl", "iniconfig", "pluggy"} <= set(closure), "the walk lost known dependencies"
    pins = _pins()
    missing = {name: " -> ".join(chain) for name, chain in closure.items() if name not in pins}
    assert not missing, (f"not pinned in constraints.txt (a new environment would take the newest): {missing}; "
                         f"add name==version for each, the version this environment's tests pass with")


def test_this_environment_holds_the_pinned_versions():
    pins = _pins()
    wrong = {}
    for name in _dev_closure().keys() & pins.keys():  # an unpinned one fails the test above
        installed = Version(md.version(name))
        if Version(pins[name]) != Version(installed.public):  # 2.13.0+cpu is the pinned 2.13.0
            wrong[name] = f"installed {installed}, pinned {pins[name]}"
    assert not wrong, (f"this environment differs from constraints.txt: {wrong}. Make a new virtual environment and "
                       f"install with `pip install -c constraints.txt -e \".[dev]\"` (as .ci/run does), or update the "
                       f"pin after checking the tests pass with the new version")


def test_ci_installs_into_a_new_virtual_environment_of_its_own():
    ci = (REPO / ".ci" / "run").read_text()
    venv_at, install_at = ci.find("-m venv "), ci.find("pip install -c constraints.txt")
    assert 0 <= venv_at < ci.find("/bin/activate") < install_at, ".ci/run must make and activate a venv, then install"
