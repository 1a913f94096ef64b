"""The package's layers (docs/reference/layers.md, generated from LAYERS): imports point down, there is no cycle,
and the light entry points stay light (no TRL for the evaluation side and the CLI's help, no transformers for the
pure core)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import grail

PACKAGE = Path(grail.__file__).parent
# Bottom to top. A module may import modules of its own layer or below, never above.
LAYERS = {
    "options": ["options", "checkpoint_dirs", "tasks", "word_problems", "synthetic", "config_fields", "boxed",
                "prompts", "sampling", "presets"],  # no torch
    "core": ["core", "bilevel", "diagnostics", "spans", "metrics", "token_labels"],  # pure tensor functions
    "model": ["probes", "oar_probes", "tiny", "real_models", "warmstart"],  # functions of a Hugging Face model
    "methods": ["methods", "weighting"],  # the method table and the functional API (no TRL)
    "evaluation": ["reference_text", "grader_guards", "grader", "release_scoring", "rewards", "benchmark_sources",
                   "benchmarks", "grader_check", "eval_harness"],  # no TRL
    # what the weights do: uses methods and evaluation, not TRL
    "analysis": ["explain", "explain_html", "saliency_quality", "compare_auroc", "compare_stats", "compare_sweep",
                 "compare_plots", "compare_report"],
    "training": ["config", "data", "model_checks", "trainer", "resume", "overrides", "train", "demo", "compare_run",
                 "compare"],  # TRL
    "cli": ["cli", "eval_cli", "explain_cli", "compare_cli", "models_cli", "__main__", "__init__"],
}
RANK = {module: rank for rank, modules in enumerate(LAYERS.values()) for module in modules}
SIBLINGS = {("methods", "evaluation")}  # side by side: neither may import the other


def _grail_imports(path: Path) -> set[str]:
    """Every grail module `path` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "grail":
            if node.module == "grail":
                found |= {alias.name for alias in node.names if alias.name != "__version__"}
            else:
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("grail.")}
    return found


GRAPH = {path.stem: _grail_imports(path) for path in PACKAGE.glob("*.py")}


def test_every_module_has_a_layer():
    assert set(GRAPH) == set(RANK), "add new modules to LAYERS (docs/reference/layers.md is generated from it)"


def test_no_module_imports_a_higher_layer_or_a_sibling():
    layer_of = {module: name for name, modules in LAYERS.items() for module in modules}
    bad = [(m, d) for m, deps in GRAPH.items() for d in deps
           if RANK[d] > RANK[m] or (layer_of[m], layer_of[d]) in SIBLINGS | {(b, a) for a, b in SIBLINGS}]
    assert not bad, f"imports that point up or sideways: {bad}"


def test_there_is_no_import_cycle():
    state: dict[str, int] = {}

    def visit(module, path):
        if state.get(module) == 1:
            raise AssertionError(f"import cycle: {' -> '.join([*path, module])}")
        if state.get(module) != 2:
            state[module] = 1
            for dep in sorted(GRAPH[module] - {module}):
                visit(dep, [*path, module])
            state[module] = 2

    for module in sorted(GRAPH):
        visit(module, [])


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in out.stdout.split()}


@pytest.mark.parametrize("code, absent", [
    ("import grail.core, grail.diagnostics, grail.spans", {"transformers", "trl"}),
    ("import grail.options, grail.config_fields", {"torch", "transformers", "trl"}),
    ("import grail.eval_harness, grail.weighting", {"trl"}),
    ("from grail.cli import main\ntry:\n    main(['eval', '--help'])\nexcept SystemExit:\n    pass", {"trl", "torch"}),
    ("from grail.cli import main\nmain(['presets'])", {"trl", "torch"}),
    ("from grail.cli import main\nmain(['models', 'list'])", {"trl", "torch", "transformers"}),
    ("from grail.cli import main\ntry:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass", {"trl"}),
])
def test_light_entry_points_do_not_load_heavy_libraries(code, absent):
    assert not _loaded_after(code) & absent
