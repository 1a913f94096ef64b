"""grail-rl: GRPO with token-level credit assignment on top of TRL.

The package's public names, importable from `grail` itself (each loaded on first use, so `import grail` stays light):
the functional API (`weights_for(method, ...)`, `<method>_weights` for every method with a probe such as
`grail_weights`, `token_weights`, ...; grail.methods.weighting), `WeightingOptions` (grail.options.choices), the
method table and its registration (`METHODS`, `register_method`, `MethodSpec`, `MethodOption`, `TokenWeights`;
grail.methods.table, docs/guides/plugins.md), `GRAILConfig` and `GRAILTrainer` (grail.training, TRL).
The folders are the layers, bottom to top: tasks, options, models | methods | evaluation, training, analysis
(saliency, explain, compare), and the command line (grail.cli); docs/reference/layers.md shows them.

Shape letters, one legend for the whole package (suffixes on tensor names, e.g. `weights_BT`, `logits_NV`):
    B  rows of a training batch: completions (G per prompt, each group contiguous)
    T  completion tokens (the right-padded completion block)
    S  prompt tokens (the left-padded prompt block); L = S + T, the model's input positions
    D  hidden size              V  vocabulary
    N  items flattened from several rows, or samples per problem    C  copies of a row (OAR-P's perturbed copies)
    P  problems of a benchmark  R  bootstrap resamples     M  metrics stacked together   K  values of k (pass@k)
Masks are bool with True = real token.
"""

import importlib

__version__ = "0.1.0"

# public name → the module that defines it
_EXPORTS = {
    **{name: "grail.methods.weighting" for name in (
        "batch_spans", "method_function", "probe_rows", "run_probe", "token_weights", "weights_for",
        "weights_from_signal")},
    **{name: "grail.methods.table" for name in (
        "METHODS", "MethodOption", "MethodSpec", "ProbeBatch", "TokenWeights", "method_names", "method_spec",
        "register_method", "unregister_method")},
    **{name: "grail.analysis.checks" for name in ("check_method", "MethodCheckError")},
    "WeightingOptions": "grail.options.choices",
    "GRAILConfig": "grail.training.config",
    "GRAILTrainer": "grail.training.trainer",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # once
        return value
    if name.endswith("_weights") and not name.startswith("_"):  # `grail_weights`, a plug-in's `<method>_weights`
        return getattr(importlib.import_module("grail.methods.weighting"), name)
    raise AttributeError(f"module 'grail' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
