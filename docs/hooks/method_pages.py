"""The method pages' generated parts (docs hooks): the method table and one section per method
(`<!-- grail:methods -->`: the built-ins' on one page, the plug-ins' on another), and the contract a method's author
writes to (`<!-- grail:method-contract -->`), from grail.methods' `MethodSpec`s and grail.analysis.checks.
generate.py, the hook mkdocs loads, imports this module from its own folder."""

from __future__ import annotations

from hook_text import escape

PLUGIN_PAGE = "plugin-methods.md"  # the plug-ins' sections (`sections="plug-ins"`); the built-ins' are on table.md


def methods(sections: str = "built-in", table: str = "yes") -> str:
    """The method table (`table="yes"`: every method of the table, built-in and plug-ins, each linked to its section)
    and one section per method of `sections` ("built-in" or "plug-ins"; two pages, so that neither grows past the
    page limit): what it computes, cost, options, properties, reference, the choices its paper leaves open; from each
    `MethodSpec`."""
    from grail.methods.spec import ROW_SELECTIONS
    from grail.methods.table import BUILTIN_SOURCE, METHODS

    if sections not in ("built-in", "plug-ins") or table not in ("yes", "no"):
        raise ValueError(f"<!-- grail:methods sections={sections!r} table={table!r} -->: sections is built-in or "
                         f"plug-ins, table is yes or no")
    builtin = {name for name in METHODS if METHODS.source.get(name) == BUILTIN_SOURCE}

    def link(name: str) -> str:
        here = (name in builtin) == (sections == "built-in")
        return f"#{name}" if here else (f"{PLUGIN_PAGE}#{name}" if name not in builtin else f"table.md#{name}")

    out = []
    if table == "yes":
        out += ["| `--token_weighting` | method | cost per step | own options |", "|---|---|---|---|"]
        out += [f"| [`{name}`]({link(name)}) | {escape(spec.label)} | {escape(spec.cost)} | "
                f"{', '.join(f'`{o.name}`' for o in spec.options) or '—'} |" for name, spec in METHODS.items()]
    chosen = {name: spec for name, spec in METHODS.items() if (name in builtin) == (sections == "built-in")}
    for name, spec in chosen.items():
        out += ["", f"## {name}", "", f"**{escape(spec.title)}**", ""]
        if spec.summary:
            out += [escape(spec.summary), ""]
        out += [f"* Cost per step: {escape(spec.cost or 'not stated')}.",
                f"* Rows probed (`{spec.rows}`): {escape(ROW_SELECTIONS[spec.rows])}"
                + ("; fused with TRL's forward when it can be" if spec.fuse else "") + ".",
                "* Option fields: " + (", ".join(f"`{r}`" for r in spec.reads) or "none of its own") + "."
                + (" No model call." if spec.probe is not None and not spec.calls_model else ""),
                f"* Row mass (Σ Â = Σ A per row) {'kept' if spec.preserves_mass else 'not kept'}; sign of A on every "
                f"token {'kept' if spec.preserves_sign else 'not kept'}."]
        if spec.groups:
            out.append("* Reads every rollout of a group: weights at rollout time (`weights_from: rollout_policy`).")
        if spec.config:
            out.append("* Sets " + ", ".join(f"`{k}: {v}`" for k, v in spec.config.items()) + " (where left at the "
                       "default).")
        if spec.unshardable:
            out.append(f"* Refused on sharded models (ZeRO-3, FSDP): {escape(spec.unshardable)}.")
        if spec.reference:
            out.append(f"* Reference: {escape(spec.reference)}.")
        if spec.options:
            out += ["", "| option | default | meaning |", "|---|---|---|"]
            out += [f"| `{o.name}` | `{o.default!r}` | {escape(o.help)} |" for o in spec.options]
        if spec.open_choices:
            out += ["", "Choices the paper leaves open, as implemented here:", ""]
            out += [f"{i}. {escape(c)}" for i, c in enumerate(spec.open_choices, 1)]
    return "\n".join(out)


def method_contract() -> str:
    """The contract a method's author writes to: `MethodSpec`'s fields, the probe's and the pipeline's arguments, the
    row selections, what "reasoning" means, the option fields, and the checks of `check_method`; all from
    grail.methods.spec and grail.analysis.checks."""
    import dataclasses as dc

    from grail.analysis import checks
    from grail.methods import spec

    def table(header: str, rows: dict[str, str]) -> list[str]:
        return [f"| {header} | meaning |", "|---|---|", *(f"| `{k}` | {escape(v)} |" for k, v in rows.items())]

    out = ["### `MethodSpec` fields", "", "| field | default | meaning |", "|---|---|---|"]
    for f in dc.fields(spec.MethodSpec):
        if f.default is not dc.MISSING:
            default = f"`{f.default!r}`"
        elif f.default_factory is not dc.MISSING:
            default = f"`{f.default_factory()!r}`"
        else:
            default = "required"
        out.append(f"| `{f.name}` | {default} | {escape(f.metadata.get('help', ''))} |")
    out += ["", "### `probe(model, rows, options, generator)`", "", *table("argument", spec.PROBE_ARGUMENTS),
            "", "`rows`, a `ProbeBatch`:", "", *table("field", spec.PROBE_BATCH_FIELDS),
            "", "### `pipeline(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance)`",
            "", *table("argument", spec.PIPELINE_ARGUMENTS),
            "", "### Row selections (`rows`)", "", *table("rows", spec.ROW_SELECTIONS),
            "", "### Reasoning tokens", "", escape(spec.REASONING),
            "", "### Option fields", "",
            "Every method reads " + ", ".join(f"`{o}`" for o in spec.UNIVERSAL_OPTIONS) + ". The others belong to the "
            "methods whose `reads` name them; setting one with a method that does not read it is refused: "
            + ", ".join(f"`{o}`" for o in spec.SCOPED_OPTIONS) + ".",
            "", "### What `check_method` checks", ""]
    doc = checks.__doc__
    out += [line.strip() for line in doc[doc.index("  1."):doc.index('"""', doc.index("  1.")) if '"""' in doc[
        doc.index("  1."):] else None].strip().splitlines()]
    return "\n".join(out)


__all__ = ["method_contract", "methods"]
