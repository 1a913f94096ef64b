"""MkDocs hook: the reference pages that are generated from the code at build time, so each fact has one home.

A page asks for generated content with a marker line, which `on_page_markdown` replaces:

    <!-- grail:config-fields [only="SECTION"] [skip="SECTION"] -->   GRAILFields, from each field's help
    <!-- grail:cli [only="CMD,..."] [skip="CMD,..."] -->              the argparse parsers of grail.cli
    <!-- grail:presets -->                                           PRESETS of grail.options.presets
    <!-- grail:methods [sections="built-in|plug-ins"] [table="yes|no"] -->  the method table (METHODS), sections
    <!-- grail:method-contract -->                                   MethodSpec's fields and the probe/pipeline contract
    <!-- grail:layers -->                                            LAYERS of tests/test_layers.py, the folders
    <!-- grail:modules [layers="L1,L2"] -->                          every module (of those layers), from its docstring
    <!-- grail:scripts -->                                           perf/README.md's index of the scripts, by folder
    <!-- grail:trl-options -->                                       the TRL option matrix (grail.options.trl_matrix)

Only light imports: `grail.options.fields`, `grail.options.trl_matrix` and `grail.cli` load neither torch nor TRL
(tests/test_layers.py checks it), and the layer table is read from the test file with `ast`, never imported.
`generated(name, **args)` is what tests/test_docs.py calls to measure the generated pages.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import re
import tokenize
import types
import typing
from pathlib import Path

# the hook's own folder is on sys.path while mkdocs loads it (tests/test_docs.py loads it the same way)
from hook_text import code_span, escape, first_sentence
from method_pages import method_contract, methods

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "grail"
LAYER_TEST = ROOT / "tests" / "test_layers.py"
MARKER = re.compile(r"^<!-- grail:([a-z-]+)((?:\s+\w+=\"[^\"]*\")*)\s*-->$", re.MULTILINE)
ARG = re.compile(r"(\w+)=\"([^\"]*)\"")


# ----------------------------------------------------------------------------------------------- config fields

def _type_text(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return " \\| ".join(code_span(str(a)) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_text(a) for a in args)
    if hint is type(None):
        return "`None`"
    return code_span(getattr(hint, "__name__", str(hint)))


def _declared_sections(cls: type) -> list[tuple[str, str, list[str]]]:
    """(title, note, field names) per `# ---- title (note) ----` comment of the class body that declares `cls`."""
    source = Path(inspect.getsourcefile(cls)).read_text()
    comments = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT and tok.string.startswith("# ----")]
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    declared = [(n.lineno, n.target.id) for n in node.body if isinstance(n, ast.AnnAssign)]
    sections = []
    for i, (line, text) in enumerate(comments):
        end = comments[i + 1][0] if i + 1 < len(comments) else 10**9
        names = [name for lineno, name in declared if line < lineno < end]
        if not names:
            continue
        text = text.strip("#- ").strip()
        title, _, note = text.partition(" (")
        sections.append((title[:1].upper() + title[1:], note.rstrip(")").strip(), names))
    return sections


def config_fields(only: str = "", skip: str = "") -> str:
    """GRAILFields' sections, in field order: those of each dataclass it is made of (the token-weighting options are
    declared in `grail.options.choices.WeightingFields`, the rest in `GRAILFields` itself)."""
    from grail.options.fields import GRAILFields

    hints = typing.get_type_hints(GRAILFields)
    by_name = {f.name: f for f in dataclasses.fields(GRAILFields)}
    sections = [s for cls in reversed(GRAILFields.__mro__) if "__dataclass_fields__" in vars(cls)
                for s in _declared_sections(cls)]
    out = []
    for title, note, names in sections:
        if (only and not title.lower().startswith(only.lower())) or (skip and title.lower().startswith(skip.lower())):
            continue
        out += [f"## {title}", ""]
        if note:
            out += [f"*{escape(note)}*", ""]
        for name in names:
            f = by_name[name]
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out += [f"### `{f.name}`", "",
                    f"{_type_text(hints[f.name])} · default {code_span(repr(default))}", "",
                    escape(" ".join(f.metadata.get("help", "").split())), ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- command line

def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: (a.help or "").replace("%%", "%") for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else " " + formatter._format_args(action, action.dest.upper())
            name = ", ".join(action.option_strings) + metavar
        else:
            name = formatter._format_args(action, action.dest)
        help_text = formatter._expand_help(action) if action.help else ""
        default = "" if action.default in (None, argparse.SUPPRESS, False, []) else code_span(repr(action.default))
        if action.required:
            default = "required"
        rows.append(f"| {code_span(name)} | {default} | {escape(' '.join(help_text.split()))} |")
    return rows


def _command(path: list[str], help_text: str, parser: argparse.ArgumentParser, fields_epilog: str) -> list[str]:
    level = "#" * len(path)
    out = [f"{level} `{' '.join(path)}`", ""]
    if help_text:
        out += [escape(help_text[:1].upper() + help_text[1:]) + ".", ""]
    formatter = parser.formatter_class(prog=parser.prog, width=110)  # fixed: the page must not follow the terminal
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    out += ["```text", formatter.format_help().strip("\n"), "```", ""]
    if parser.description:
        if parser.formatter_class is argparse.RawDescriptionHelpFormatter:
            out += ["```text", parser.description.strip("\n"), "```", ""]
        else:
            out += [escape(" ".join(parser.description.split())), ""]
    rows = _option_rows(parser)
    if rows:
        out += ["| argument | default | meaning |", "|---|---|---|", *rows, ""]
    if parser.epilog == fields_epilog:
        out += ["Every config field is a flag too: `--FIELD VALUE` (see [Config fields](config.md) and "
                "[Token-weighting fields](weighting-fields.md)).", ""]
    elif parser.epilog:
        out += ["```text", parser.epilog.strip("\n"), "```", ""]
    for name, sub_help, sub in _subcommands(parser):
        out += _command([*path, name], sub_help, sub, fields_epilog)
    return out


def cli(only: str = "", skip: str = "") -> str:
    """The command table and each command's arguments. only / skip: comma-separated commands whose arguments this page
    shows / leaves to another page (`skip="compare"`; the table still lists every command, a skipped one linked to
    `cli-<command>.md`)."""
    from grail import cli as grail_cli

    parser = grail_cli._parser()
    fields_epilog = grail_cli._fields_help()
    shown, skipped = set(filter(None, only.split(","))), set(filter(None, skip.split(",")))
    commands = _subcommands(parser)
    here = [c for c in commands if (not shown or c[0] in shown) and c[0] not in skipped]
    out = []
    if not shown:
        out = ["| command | what it does |", "|---|---|"]
        for name, help_text, _ in commands:
            page = f"cli-{name}.md" if name in skipped else ""
            out.append(f"| [`grail {name}`]({page}#grail-{name}) | {escape(help_text)} |")
        out.append("")
    for name, help_text, sub in here:
        out += _command(["grail", name], help_text, sub, fields_epilog)
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- presets

def presets() -> str:
    """Each preset as `grail presets NAME` prints it: its values, with what each `paper` value is for."""
    from grail.options.presets import PRESETS, render

    out = []
    for name in PRESETS:
        out += [f"## `{name}`", "", "```yaml", render([name]).rstrip("\n"), "```", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- TRL options

def trl_options() -> str:
    """The TRL option matrix (`grail.options.trl_matrix.TRL_OPTIONS`): each option, supported or refused, and why."""
    from grail.options.trl_matrix import TRL_OPTIONS

    tested = {"loss": "loss and gradients", "rollout": "the rollout", "seam": "TRL's source"}
    out = ["| option | setting tested | grail-rl | what it does to Â = w · A | formula from | checked on |",
           "|---|---|---|---|---|---|"]
    for row in TRL_OPTIONS:
        setting = ", ".join(f"{name}={value!r}" for name, value in row.setting.items())
        out.append(f"| {escape(row.name)} | {code_span(setting)} | **{row.support}** | {escape(row.why)} | "
                   f"{escape(row.source)} | {tested[row.tested]} |")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- layers

def _layers() -> tuple[dict[str, str], set[tuple[str, str]]]:
    """LAYERS (folder → note, bottom to top) and SIBLINGS, read from the test's source."""
    layers, siblings = {}, set()
    for node in ast.parse(LAYER_TEST.read_text()).body:
        if not isinstance(node, ast.Assign) or not isinstance(node.targets[0], ast.Name):
            continue
        if node.targets[0].id == "LAYERS":
            layers = ast.literal_eval(node.value)
        elif node.targets[0].id == "SIBLINGS":
            siblings = set(ast.literal_eval(node.value))
    return layers, siblings


def _folder(layer: str) -> Path:
    return PACKAGE if layer == "grail" else PACKAGE.joinpath(*layer.split("."))


def _modules(layer: str) -> list[tuple[str, Path]]:
    """(dotted name, file) of each module of a layer's folder, the package's own `__init__` first."""
    folder = _folder(layer)
    package = "grail" if layer == "grail" else f"grail.{layer}"
    out = [(package, folder / "__init__.py")] if (folder / "__init__.py").is_file() else []
    return out + [(f"{package}.{path.stem}", path) for path in sorted(folder.glob("*.py"))
                  if path.stem not in ("__init__", "__main__")]


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def layers() -> str:
    table, siblings = _layers()
    out = ["| layer (folder) | modules | note |", "|---|---|---|"]
    for name, note in reversed(table.items()):
        folder = "src/grail/" + ("" if name == "grail" else name.replace(".", "/") + "/")
        modules = [dotted.rpartition(".")[2] for dotted, path in _modules(name) if path.name != "__init__.py"]
        out.append(f"| **{name}** (`{folder}`) | {', '.join(code_span(m) for m in modules)} | {escape(note)} |")
    out.append("")
    for a, b in sorted(siblings):
        out += [f"`{a}` and `{b}` sit side by side: neither may import the other.", ""]
    return "\n".join(out)


def modules(layers: str = "") -> str:
    """Every module (of the comma-separated `layers`, default all) with the first sentence of its docstring, layer
    by layer from the top."""
    table, _ = _layers()
    chosen = [name.strip() for name in layers.split(",") if name.strip()] or list(table)
    unknown = [name for name in chosen if name not in table]
    if unknown:
        raise ValueError(f"grail:modules layers={layers!r}: {unknown[0]!r} is not a layer of tests/test_layers.py")
    out = ["| module | layer | what it holds |", "|---|---|---|"]
    for name in [n for n in reversed(table) if n in chosen]:
        layer = f"**{name}**"
        for dotted, path in _modules(name):
            out.append(f"| `{dotted}` | {layer} | {escape(first_sentence(_docstring(path)))} |")
            layer = ""
    return "\n".join(out)


def scripts() -> str:
    """perf/README.md (the index of perf/) from its first folder on, linked from docs/reference/; checked complete."""
    text = (ROOT / "perf" / "README.md").read_text()
    listed = set(re.findall(r"^\| `(\w+/\w+\.py)` \|", text, re.MULTILINE))
    on_disk = {p.relative_to(ROOT / "perf").as_posix() for p in (ROOT / "perf").glob("*/*.py")}
    if listed != on_disk:
        raise ValueError(f"perf/README.md: list every script of perf/ (not listed: {sorted(on_disk - listed)}; listed "
                         f"but not there: {sorted(listed - on_disk)}).")
    body = re.sub(r"^## (.+)$", r"**perf/\1**", text[text.index("\n## ") + 1:], flags=re.MULTILINE)
    return re.sub(r"`(benchmarks|experiments|device)/", r"`perf/\1/", body.replace("](../docs/", "](../"))


# ----------------------------------------------------------------------------------------------- the hook

GENERATORS = {"config-fields": config_fields, "cli": cli, "presets": presets, "layers": layers, "modules": modules,
              "scripts": scripts, "methods": methods, "method-contract": method_contract, "trl-options": trl_options}


def generated(name: str, **args: str) -> str:
    return GENERATORS[name](**args)


def expand(markdown: str) -> str:
    """The page with every marker replaced by its generated content."""
    return MARKER.sub(lambda m: generated(m.group(1), **dict(ARG.findall(m.group(2)))), markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return expand(markdown) if "<!-- grail:" in markdown else markdown


# Docstrings index tensors as `x[p][j]`, which Markdown reads as a reference link and mkdocs-autorefs as a
# cross-reference to an object named `j`. An identifier of one or two letters without a dot is never an object of
# the package: put the brackets back as text.
INDEX_REF = re.compile(r'<autoref (?=[^>]*identifier="([A-Za-z_]{1,2})")[^>]*>(.*?)</autoref>', re.DOTALL)


def on_page_content(html: str, page, config, files) -> str:
    return INDEX_REF.sub(lambda m: f"[{m.group(2)}][{m.group(1)}]", html)


__all__ = ["expand", "generated", "on_page_content", "on_page_markdown"]
