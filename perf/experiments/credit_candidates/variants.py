"""A candidate with one of its own options fixed, as a method of its own name: `saliency_auroc` runs every method
with its default options (an option applies only when `token_weighting` is that method), so a screened variant
needs a name. Training uses the option itself (`--attr_patch_signal drop`), not the variant."""

from __future__ import annotations

from dataclasses import replace

from grail import MethodSpec


def variant(spec: MethodSpec, name: str, **fixed) -> MethodSpec:
    """`spec` under `name`, its own options `fixed` (the others at their defaults), declaring none itself."""
    own = spec.resolve_options(fixed)  # ValueError for an option `spec` does not have or a bad value
    base = spec.probe

    def probe(model, rows, options, generator):
        return base(model, rows, replace(options, method_options=own), generator)  # token_weighting: the variant's

    setting = ", ".join(f"{k}={v!r}" for k, v in fixed.items())
    return replace(spec, name=name, label=f"{spec.label} ({setting})", probe=probe, options=(),
                   title=f"{spec.title} [{setting}]")
