"""The position-fixed AUROC of `oar_p_amortized`'s prediction: its predictor fitted on a model's own rollouts, as a
training run fits it, then every row of the label sets scored by the prediction alone, beside OAR-P's exact cells.

The fit: the rollouts and exact OAR-P that perf/experiments/oar_p_amortized_fidelity.py keeps in its `--cache` (the
model there is the model scored here: the predictor reads that model's hidden states), every cached group's probed
rows in order, `--exact-rows` a call, for `--calls` calls (or as many as the cache holds), with the variant's layer,
projection width, ridge and decay (`--variant` as the fidelity script names it, e.g. `last/64/ridge=0.001/decay=0.95`;
the features-free `scalars` variant is not a configuration of the method and is refused).

The scoring: perf/experiments/credit_screen.py's label sets and cells (`credit_screen.screen`, same options), the
method's probe handed the fitted predictor as its state (`SaliencyQualityOptions.states`) with
`oar_p_amortized_exact_every` beyond any call count, so that no batch computes exact rows: every scored row gets the
prediction, and the script checks afterwards that the predictor was not updated. `--also` adds other methods scored
as the screen scores them (OAR-P's exact cells, GRAIL), on the same rows; in fp32 (a predictor fitted on fp32
features is not read from bf16 ones).

    python perf/experiments/oar_p_amortized_auroc.py --cache ~/runs/amortized-sft40 \\
        --variant last/64/ridge=0.001/decay=0.95 --calls 50 --label-sets counterbalanced_filler --rows 3 --seed 1 \\
        [--also oar_p] [--json out.json]
The JSON is credit_screen.py's (its `--render` and `--pivot` read it), with the fit under "predictor".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from credit_screen import label_set_arguments, label_sets_of, render, screen
from oar_p_amortized_fidelity import parse_variant as fidelity_variant

METHOD = "oar_p_amortized"
PREDICT_ONLY = 1 << 40  # oar_p_amortized_exact_every beyond any call count: no batch computes exact rows


def parse_variant(text: str) -> tuple[str, int, float, float]:
    """(layer, features, ridge, decay) of `--variant`, a fidelity variant's name (`variant_name`); SystemExit naming
    the problem otherwise."""
    try:
        return fidelity_variant(text)
    except ValueError as error:
        if text.split("/")[0] == "scalars":
            raise SystemExit(f"--variant {text}: the features-free variant is not a configuration of {METHOD} (its "
                             f"features always hold a layer's hidden state); choose a layer's variant") from None
        raise SystemExit(f"--variant {text}: {error}, as oar_p_amortized_fidelity.py names its variants") from None


def cached_groups(cache: Path, layer: str) -> tuple[str, list[dict]]:
    """(the model path, the cached groups in order) of a fidelity cache, each holding `layer`'s features."""
    rollouts = cache / "rollouts.pt"
    if not rollouts.exists():
        raise SystemExit(f"--cache {cache}: no rollouts.pt there; run oar_p_amortized_fidelity.py with this --cache "
                         f"first")
    saved = torch.load(rollouts, weights_only=False)
    path, groups = saved["path"], []
    for k in range(len(saved["groups"])):
        file = cache / f"group_{k:03d}.pt"
        if not file.exists():
            break  # a run stopped part-way: the groups before it
        g = torch.load(file, weights_only=False)
        if layer not in g["features"]:
            raise SystemExit(f"--cache {cache}: group {k} holds the features of {sorted(g['features'])}, not "
                             f"{layer!r}; choose one of those layers or run the fidelity script with it")
        groups.append(g)
    if not groups:
        raise SystemExit(f"--cache {cache}: no group's exact OAR-P is cached yet")
    return path, groups


def fitted_predictor(groups: list[dict], layer: str, features: int, decay: float, per_call: int, calls: int | None,
                     floor: float):
    """The predictor after `calls` calls (None: all the cache holds) over the groups' probed rows, in order."""
    from oar_p_amortized_fidelity import fit_call

    from grail.methods.signals.oar_p_amortized import Predictor

    width = groups[0]["features"][layer].shape[-1] - 4
    stream = [(g, i) for g in groups for i in range(g["exact_RT"].shape[0])]
    reachable = len(stream) // per_call
    if calls is not None and calls > reachable:
        raise SystemExit(f"--calls {calls}: the cache holds {len(stream)} probed rows, {reachable} calls of "
                         f"--exact-rows {per_call}; ask for fewer calls or extend the cache (--groups)")
    predictor = Predictor()
    for c in range(reachable if calls is None else calls):
        fit_call(predictor, stream[c * per_call:(c + 1) * per_call], layer, width, features, floor, decay)
    predictor.probe_calls = predictor.calls
    return predictor, len(stream)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, required=True, help="oar_p_amortized_fidelity.py's --cache directory")
    p.add_argument("--variant", default="last/64/ridge=0.001/decay=0.95")
    p.add_argument("--calls", type=int, help="fitting calls (default: all the cache holds)")
    p.add_argument("--exact-rows", type=int, default=2, help="rows a fitting call (oar_p_amortized_exact_rows)")
    p.add_argument("--also", default="", help="comma-separated methods scored beside it (e.g. oar_p,grail)")
    p.add_argument("--threads", type=int)
    p.add_argument("--json", type=Path)
    label_set_arguments(p)
    args = p.parse_args(argv)
    label_sets = label_sets_of(args)
    layer, features, ridge, decay = parse_variant(args.variant)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from grail.methods.builtin import oar_p_floor
    from grail.methods.signals import oar_p_amortized as amortized
    from grail.methods.table import method_spec
    from grail.models.warmstart import load_inference_model
    from grail.options.choices import WeightingOptions

    path, groups = cached_groups(args.cache, layer)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_inference_model(path, "cpu")
    own = method_spec(METHOD).resolve_options({amortized.LAYER: layer, amortized.FEATURES: features,
                                               amortized.RIDGE: ridge, amortized.DECAY: decay,
                                               amortized.EVERY: PREDICT_ONLY})
    weighting = WeightingOptions(token_weighting=METHOD, method_options=own)
    floor = max(oar_p_floor(model, weighting), 1e-12)
    predictor, stream_rows = fitted_predictor(groups, layer, features, decay, args.exact_rows, args.calls, floor)
    fit = {"variant": args.variant, "calls": predictor.calls, "exact_rows_per_call": args.exact_rows,
           "tokens": predictor.tokens, "cached_groups": len(groups), "cached_rows": stream_rows,
           "cache": str(args.cache)}
    methods = [METHOD, *(m.strip() for m in args.also.split(",") if m.strip())]
    start = time.perf_counter()
    result = {"model": str(path), "seed": args.seed, "methods": methods,
              "args": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "bf16": False,
                       "grail_at_token": False},
              "predictor": fit, "label_sets": {}}
    screen_args = argparse.Namespace(**{**vars(args), "bf16": False, "grail_at_token": False})
    calls_before = predictor.calls
    result["label_sets"] = screen(model, tokenizer, methods, label_sets, screen_args, weighting=weighting,
                                  states={METHOD: predictor})
    if predictor.calls != calls_before:
        raise RuntimeError(f"{METHOD}: the predictor was updated during scoring ({calls_before} -> "
                           f"{predictor.calls} calls): some rows were scored by exact OAR-P")
    result |= {"finished": True, "wall_s": time.perf_counter() - start}
    print(f"model {path}; {METHOD} {args.variant} fitted on {fit['calls']} calls of {args.exact_rows} rows "
          f"({fit['tokens']:.0f} discounted tokens); signal AUROC with position fixed")
    print(render(result))
    if args.json:
        import json

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
