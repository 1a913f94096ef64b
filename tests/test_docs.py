"""The documentation: the README stays a five-minute read, the site builds with `mkdocs build --strict` (a broken link,
a missing anchor or any other warning fails it), its pages stay small, and no project file points at `../shared/`
(a folder beside the repository that users never have; tests may read the benchmark data there)."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README_LIMIT = 9 * 1024
PAGE_LIMIT = 16 * 1024  # "about 15 KB" a page, measured on the Markdown after the generated parts are filled in
# written by `grail compare`, not by hand: a report is one page however long its tables are
MACHINE_WRITTEN = {"report.md"}
SHARED = b"../shared/"


def _hook():
    """docs/hooks/generate.py loaded as mkdocs loads a hook: its own folder on sys.path while it runs (it imports the
    hook modules beside it)."""
    spec = importlib.util.spec_from_file_location("docs_hook", REPO / "docs" / "hooks" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    saved = sys.path.copy()
    sys.path.insert(0, str(REPO / "docs" / "hooks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


def test_the_readme_is_at_most_9_kb():
    size = (REPO / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md is {size} bytes; move detail into docs/ (limit {README_LIMIT})"


def test_the_readme_keeps_the_test_command_that_ci_runs():
    command = 'python -m pip install -c constraints.txt -e ".[dev]" && python -m pytest -m "not slow" -n 2'
    assert command in (REPO / "README.md").read_text()
    assert command in (REPO / ".ci" / "run").read_text()


def test_the_site_builds_with_strict_checks(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()


def test_every_page_is_small_including_the_generated_ones():
    hook = _hook()
    sizes = {}
    for page in sorted((REPO / "docs").rglob("*.md")):
        if page.name in MACHINE_WRITTEN:
            continue
        text = page.read_text()
        sizes[page.relative_to(REPO).as_posix()] = len(hook.expand(text).encode())
    generated = [name for name in sizes if "<!-- grail:" in (REPO / name).read_text()]
    assert len(generated) >= 5, f"the generated reference pages went missing: {generated}"
    large = {name: size for name, size in sizes.items() if size > PAGE_LIMIT}
    assert not large, f"pages over {PAGE_LIMIT} bytes (split them): {large}"


def test_the_generated_reference_covers_every_config_field_and_command():
    from dataclasses import fields

    from grail import cli
    from grail.options.fields import GRAILFields

    hook = _hook()
    text = hook.generated("config-fields", skip="token weighting") + hook.generated("config-fields",
                                                                                    only="token weighting")
    missing = [f.name for f in fields(GRAILFields) if f"### `{f.name}`" not in text]
    assert not missing, f"config fields without a section in the reference: {missing}"
    commands = hook.generated("cli")
    for name, _, _ in hook._subcommands(cli._parser()):
        assert f"## `grail {name}`" in commands


def test_every_method_has_one_section_on_the_two_method_pages_and_the_table_links_to_it():
    from grail.methods.table import METHODS

    hook = _hook()
    pages = {"table.md": hook.generated("methods", sections="built-in"),
             "plugin-methods.md": hook.generated("methods", sections="plug-ins", table="no")}
    sections = {page: re.findall(r"^## (\w+)$", text, re.MULTILINE) for page, text in pages.items()}
    assert sorted(sections["table.md"] + sections["plugin-methods.md"]) == sorted(METHODS)
    assert "grail" in sections["table.md"] and "grail_over_surprise" in sections["plugin-methods.md"]
    assert "| `--token_weighting` |" not in pages["plugin-methods.md"]
    for name, target in re.findall(r"^\| \[`(\w+)`\]\(([^)]+)\)", pages["table.md"], re.MULTILINE):
        page, _, anchor = target.rpartition("#")
        assert anchor == name and name in sections[page or "table.md"], (name, target)


def test_no_project_file_points_at_the_shared_folder():
    roots = [REPO / name for name in ("src", "perf", "docs", "examples")]
    files = [REPO / name for name in ("README.md", "mkdocs.yml", "pyproject.toml", "constraints.txt")]
    for root in roots:
        files += [p for p in root.rglob("*") if p.is_file()
                  and "__pycache__" not in p.parts and not any(s.endswith(".egg-info") for s in p.parts)]
    found = [p.relative_to(REPO).as_posix() for p in files if SHARED in p.read_bytes()]
    assert not found, f"files that point at the folder beside the repository (state it in the docs instead): {found}"


def test_the_perf_index_lists_every_script_once_with_the_page_of_its_figures():
    """perf/README.md is the index the docs render (grail:scripts): every script on disk, nothing that is gone, and
    each row names a page of the docs."""
    text = _hook().generated("scripts")
    for path in sorted((REPO / "perf").glob("*/*.py")):
        (row,) = [line for line in text.splitlines() if f"`perf/{path.parent.name}/{path.name}`" in line]
        assert "](../" in row, f"{path.name}: no page with its figures in perf/README.md"
