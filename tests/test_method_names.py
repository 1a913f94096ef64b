"""Every list of methods derives from the method table: no method name list is written by hand outside the table and
its registrations (grail.methods.table, grail.methods.builtin, grail.methods.literature, the example plug-in).

What counts as a list of methods, read from each file's syntax tree:
  * in the package: a tuple/list/set literal, dict keys, a `Literal[...]`, or a comma-separated string naming two or
    more methods, except the few defaults of command-line flags in ALLOWED (each with its reason);
  * in tests, perf scripts and docs hooks: such a collection naming every probed built-in method (an enumeration of
    "the methods", which must come from the table so that a new method is not silently left out)."""

import ast
from pathlib import Path

import pytest

from grail.methods.builtin import BUILTIN
from grail.methods.spec import MethodSpec
from grail.methods.table import BUILTIN_SOURCE, METHODS

ROOT = Path(__file__).resolve().parents[1]
REGISTRATION = ("src/grail/methods/table.py", "src/grail/methods/builtin.py", "src/grail/methods/literature/",
                "examples/")
# (file, the names) → why a hand-written pair is right there
ALLOWED = {
    ("src/grail/training/demo.py", ("grail", "none")): "grail demo's default: GRPO vs GRAIL, the headline comparison",
    ("src/grail/cli.py", ("grail", "none")): "the same default on the command line, and its error example",
    ("src/grail/analysis/explain/cli.py", ("grail", "oar_g")): "an example in an error message",
    ("src/grail/cli.py", ("grail", "ktae")): "an example in an error message",
}
NAMES = set(METHODS)
ENUMERATION = {spec.name for spec in BUILTIN if spec.probe is not None}


def _collections(tree: ast.AST):
    """(line, names) of every collection literal or comma-separated string naming methods."""
    for node in ast.walk(tree):
        items = []
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        if items:
            names = {e.value for e in items if isinstance(e, ast.Constant) and e.value in NAMES}
            yield node.lineno, names
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "," in node.value:
            yield node.lineno, {part.strip() for part in node.value.split(",")} & NAMES


def _files(*folders: str):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(REGISTRATION):
                yield rel, ast.parse(path.read_text())


def test_the_package_writes_no_list_of_methods_by_hand():
    found = [f"{rel}:{line} {sorted(names)}" for rel, tree in _files("src")
             for line, names in _collections(tree)
             if len(names) >= 2 and (rel, tuple(sorted(names))) not in ALLOWED]
    assert not found, "method lists written by hand (derive them from grail.methods.table):\n" + "\n".join(found)


@pytest.mark.parametrize("folder", ["tests", "perf", "docs/hooks"])
def test_tests_and_scripts_take_their_method_lists_from_the_table(folder):
    found = [f"{rel}:{line}" for rel, tree in _files(folder) for line, names in _collections(tree)
             if names >= ENUMERATION]
    assert not found, "enumerations of the methods written by hand (use grail.methods.table):\n" + "\n".join(found)


def test_the_check_would_catch_a_hand_written_list():
    tree = ast.parse('METHOD_NAMES = ("grail", "oar_g", "oar_p", "entropy", "random")\nARMS = "none,grail"\n')
    assert [names >= ENUMERATION for _, names in _collections(tree)] == [True, False]
    assert [len(names) for _, names in _collections(tree)] == [5, 2]


def test_the_readme_method_table_has_every_shipped_method():
    """Every method grail-rl ships (built in, or an entry point of grail-rl's own package) is in the README's table;
    a plug-in installed from elsewhere (the example, a user's) is not grail-rl's to list."""
    rows = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `")]
    named = {line.split("`")[1] for line in rows}
    shipped = {name for name in METHODS if METHODS.source[name] in (BUILTIN_SOURCE, "grail-rl")}
    assert shipped >= {"grail", "ktae"} and shipped <= named


def test_a_plugin_from_another_package_is_not_counted_as_shipped():
    from grail import register_method, unregister_method
    from grail.methods import builtin

    register_method(MethodSpec("outside", "outside", lambda m, r, o, g: r.reasoning_BT.float(),
                               builtin.bilevel_pipeline, calls_model=False))
    try:
        assert METHODS.source["outside"] == "register_method"
    finally:
        unregister_method("outside")
