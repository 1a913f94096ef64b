"""The package's layers (docs/reference/layers.md, generated from LAYERS): a module's layer is its folder; imports
point down, there is no cycle, no command imports another command's module, and the light entry points stay light
(no TRL for the evaluation side and the CLI's help, no transformers for the pure core)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import grail

PACKAGE = Path(grail.__file__).parent
# The folders under src/grail, bottom to top ("grail" is the package's own folder): a module may import modules of
# its own folder or of the folders below it, never above.
LAYERS = {
    "tasks": "the synthetic task and the answer format; standard library only",
    "options": "options, config fields, presets, prompts, sampling's interface; no torch",
    "models": "the models a run starts from; knows nothing of the methods",
    "methods": "pure tensor functions, the probes, the method table and the functional API; no TRL",
    "methods.literature": "methods from the literature, registered as plug-ins through the method table's API",
    "methods.controls": "null methods a credit method must beat (position), registered as plug-ins the same way",
    "methods.signals": "grail-rl's own credit signals (grail_over_surprise), registered as plug-ins the same way",
    "evaluation": "grader, benchmarks, harness, scores, `grail eval`; no TRL",
    "training": "the config, the trainer and one run, on TRL (the one seam)",
    "analysis": "what the weights do: its three folders below",
    "analysis.saliency": "saliency quality against ground-truth token labels",
    "analysis.explain": "`grail explain`: where each method puts the credit",
    "analysis.compare": "`grail compare`: arms × seeds, a report over seeds",
    "grail": "the command line (imports each command on demand) and the package's exports",
}
RANK = {layer: rank for rank, layer in enumerate(LAYERS)}
# side by side: neither may import the other
SIBLINGS = {("models", "methods"), ("methods", "evaluation"), ("analysis.saliency", "analysis.explain"),
            ("analysis.explain", "analysis.compare")}
# The command modules: only the command line (grail.cli) imports them, so that no command borrows from another's.
COMMANDS = {"grail.models.cli", "grail.evaluation.cli", "grail.training.demo", "grail.analysis.explain.cli",
            "grail.analysis.compare.cli"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str:
    """A module's folder, as a LAYERS key: `grail.methods.core` → "methods", a package → its own folder."""
    path = MODULES[module]
    folder = path.parent.relative_to(PACKAGE).parts
    return ".".join(folder) or "grail"


def _resolve(name: str) -> str:
    """The module `name` stands for: itself, or (an attribute such as `grail.grail_weights`) its package."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _grail_imports(path: Path) -> set[str]:
    """Every grail module `path` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: a relative import; write `from grail.X import ...`")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "grail":
            for alias in node.names:
                if alias.name != "__version__":
                    found.add(_resolve(f"{node.module}.{alias.name}"))
        elif isinstance(node, ast.Import):
            found |= {_resolve(alias.name) for alias in node.names if alias.name.split(".")[0] == "grail"}
    return found


GRAPH = {module: _grail_imports(path) - {module} for module, path in MODULES.items()}


def test_every_folder_is_a_layer():
    folders = {layer_of(module) for module in MODULES}
    assert folders == set(LAYERS), "add new folders to LAYERS (docs/reference/layers.md is generated from it)"


def test_no_module_imports_a_higher_layer_or_a_sibling():
    sideways = SIBLINGS | {(b, a) for a, b in SIBLINGS}
    bad = [(m, d) for m, deps in GRAPH.items() for d in deps
           if RANK[layer_of(d)] > RANK[layer_of(m)] or (layer_of(m), layer_of(d)) in sideways]
    assert not bad, f"imports that point up or sideways: {bad}"


def test_no_command_imports_another_command():
    bad = [(m, d) for m, deps in GRAPH.items() for d in deps & COMMANDS if m != "grail.cli"]
    assert not bad, f"move what both need down into a shared module: {bad}"


def test_there_is_no_import_cycle():
    state: dict[str, int] = {}

    def visit(module, path):
        if state.get(module) == 1:
            raise AssertionError(f"import cycle: {' -> '.join([*path, module])}")
        if state.get(module) != 2:
            state[module] = 1
            for dep in sorted(GRAPH[module]):
                visit(dep, [*path, module])
            state[module] = 2

    for module in sorted(GRAPH):
        visit(module, [])


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in out.stdout.split()}


@pytest.mark.parametrize("code, absent", [
    ("import grail.methods.core, grail.methods.diagnostics, grail.methods.spans", {"transformers", "trl"}),
    ("import grail.options.choices, grail.options.fields", {"torch", "transformers", "trl"}),
    ("import grail.evaluation.harness, grail.methods.weighting", {"trl"}),
    ("import grail", {"torch", "transformers", "trl"}),
    ("from grail import grail_weights", {"trl"}),
    ("from grail.cli import main\ntry:\n    main(['eval', '--help'])\nexcept SystemExit:\n    pass", {"trl", "torch"}),
    ("from grail.cli import main\ntry:\n    main(['sft', '--help'])\nexcept SystemExit:\n    pass", {"trl", "torch"}),
    ("from grail.cli import main\ntry:\n    main(['validity', '-h'])\nexcept SystemExit:\n    pass", {"trl", "torch"}),
    ("from grail.cli import main\nmain(['presets'])", {"trl", "torch"}),
    ("from grail.cli import main\nmain(['models', 'list'])", {"trl", "torch", "transformers"}),
    ("from grail.cli import main\ntry:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass", {"trl"}),
])
def test_light_entry_points_do_not_load_heavy_libraries(code, absent):
    assert not _loaded_after(code) & absent
