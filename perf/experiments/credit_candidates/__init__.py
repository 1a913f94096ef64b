"""Credit-signal candidates, as method plug-ins for the screen of credit signals (not shipped methods): each module
holds one `MethodSpec` (SPEC) registered through the public API (`grail.register_method`). The screen's choice,
`grail_over_surprise`, is not here: it ships with grail-rl (grail.methods.signals).

    from credit_candidates import CANDIDATES, register_candidates
    register_candidates()          # every candidate, once per process (again: nothing happens)
"""

from __future__ import annotations

from credit_candidates import answer_attention, attr_patch, contrastive, ig_patch, teacher_ratio
from credit_candidates.variants import variant
from grail import register_method
from grail.methods.table import METHODS

# variants: an option fixed, under a name the screening can run
CANDIDATES = {spec.name: spec for spec in (
    attr_patch.SPEC, variant(attr_patch.SPEC, "attr_patch_drop", attr_patch_signal="drop"),
    contrastive.SPEC, variant(contrastive.SPEC, "contrastive_saliency", contrastive_read="saliency"),
    ig_patch.SPEC, answer_attention.SPEC, teacher_ratio.SPEC)}


def register_candidates(names=None) -> list[str]:
    """Register the candidates named (default: all) that are not registered yet; returns the names."""
    names = list(CANDIDATES) if names is None else list(names)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise ValueError(f"unknown candidates {unknown}; choose from {', '.join(CANDIDATES)}")
    for name in names:
        if name not in METHODS:
            register_method(CANDIDATES[name])
    return names
