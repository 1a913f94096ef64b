"""The lent GPU machine's scripts (perf/device/): grail-rl runs there from its source tree, so its plug-in methods
need the dist-info that perf/device/register_source.py writes; and a job's default methods must be ones the
benchmark it runs knows."""

import importlib.metadata
import importlib.util
import pathlib
import re
import tomllib

from harness import METHODS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _register_source():
    spec = importlib.util.spec_from_file_location("register_source", ROOT / "perf/device/register_source.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_source_tree_gets_the_entry_points_its_pyproject_declares(tmp_path):
    info = _register_source().register(tmp_path, ROOT / "pyproject.toml")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [dist] = importlib.metadata.distributions(path=[str(tmp_path)])
    assert (dist.metadata["Name"], dist.version) == (project["name"], project["version"])
    assert info.name == f"grail_rl-{project['version']}.dist-info"
    points = [point for point in dist.entry_points if point.group == "grail.methods"]
    methods = {point.name: point.value for point in points}
    assert methods == project["entry-points"]["grail.methods"] and "grail_over_surprise" in methods
    assert all(point.load().name == point.name for point in points)  # each imports from the source tree
    scripts = {point.name: point.value for point in dist.entry_points if point.group == "console_scripts"}
    assert scripts == project["scripts"]


def test_the_cost_pilot_job_names_only_methods_the_benchmark_knows():
    job = (ROOT / "perf/device/jobs/cost_pilot.sh").read_text()
    [default] = re.findall(r'\$\{METHODS:-([^}]+)\}', job)
    assert set(default.split(",")) <= set(METHODS) and "none" in default.split(",")
