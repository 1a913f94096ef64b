"""How closely does `oar_p_amortized`'s predictor follow exact OAR-P, after how many fitting calls, with which
features? Exact OAR-P and the predictor's features on the regime's rollouts, then the predictor fitted call by call
as a training run fits it, scored on rows it never trained on.

Rollouts: as perf/experiments/precision_fidelity.py samples them, in its stable-prefix order (the preset's model,
default `smollm-chains`: SmolLM2 after its 30-step warm start; groups of 8 with mixed rewards, `--groups` of them,
seeded by `--seed`). The rows a
run probes (OAR-P's bi-level rows) get exact OAR-P (`builtin.oar_p_signal`, the method's own exact path) and the
features of every layer choice (`oar_p_amortized.token_features` at the model's full width; a narrower projection
is the same fixed random projection applied afterwards, so each variant's features are the method's own).

The fit: the first `--heldout-groups` groups are held out; the other groups' probed rows, in order, are the stream,
`--exact-rows` of them per call (the method's `oar_p_amortized_exact_rows`), each call a `Predictor.update` with the
variant's decay, as a run's probe does once a step. After each call count of `--calls` (those the stream reaches),
the predicted importance exp(x · θ) on the held-out rows against their exact OAR-P: per-row Spearman over the scored
tokens (median, lower quartile, worst), and the weights OAR-P's bi-level reshaping makes of each (per-row Spearman of
the weights, the share of live tokens whose Â changes sign: `grail.analysis.fidelity.weight_fidelity`). Beside them,
on the same rows, the Spearman of exact OAR-P with each single cheap feature (surprise, entropy, place in the row):
what a predictor has to beat. Variants: every combination of `--layers`, `--features`, `--ridges`, `--decays`, and
`scalars` (no hidden state, only surprise, entropy, place and a constant) for each ridge and decay.

The rollouts stay those of the start model: a run's policy moves as it trains and the decay discounts older calls
for that; this measures how fast the fit converges and how far it gets on one policy's rows.

`--cache DIR` keeps the rollouts and each group's exact OAR-P and features as they are computed (exact OAR-P is the
cost: about T²/2 forwards of a row's suffix), so a stopped run goes on where it stopped, and a run with more
`--groups` samples the rollouts again (the prompts in one seeded shuffle, so the first groups are the same; checked)
and computes exact values for the new groups only. Everything after the exact values (the fits) takes seconds.

    python perf/experiments/oar_p_amortized_fidelity.py --groups 56 --cache ~/runs/amortized-dev --out dev.json
    python perf/experiments/oar_p_amortized_fidelity.py --render dev.json [TOP]     # the table again, no run
Prints one JSON object (with --render, a Markdown table of the TOP variants, 10 by default).
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import torch

LAYERS = ("embeddings", "first", "middle", "last")
SINGLE_FEATURES = ("surprise", "entropy", "place")  # the scalar columns after the hidden state, in token_features


VARIANT_FORMAT = "LAYER/FEATURES/ridge=R/decay=D"  # a variant's name, as variant_name writes it


def variant_name(layer: str, features: int, ridge: float, decay: float) -> str:
    """A variant's name in the output (`VARIANT_FORMAT`; the features-free one: `scalars/ridge=R/decay=D`)."""
    head = "scalars" if layer == "scalars" else f"{layer}/{features}"
    return f"{head}/ridge={ridge:g}/decay={decay:g}"


def parse_variant(text: str) -> tuple[str, int, float, float]:
    """(layer, features, ridge, decay) of a layer's variant named as `variant_name` writes it. ValueError, naming the
    format, for any other text (the features-free variant included: it has no layer and no width)."""
    parts = text.split("/")
    if len(parts) == 4 and parts[0] != "scalars" and parts[2].startswith("ridge=") and parts[3].startswith("decay="):
        try:
            return (parts[0], int(parts[1]), float(parts[2].removeprefix("ridge=")),
                    float(parts[3].removeprefix("decay=")))
        except ValueError:
            pass
    raise ValueError(f"{text!r} is not a layer's variant: expected {VARIANT_FORMAT} "
                     f"(e.g. last/64/ridge=0.001/decay=0.95)")


def main(argv=None) -> dict:
    from precision_fidelity import rollout_arguments

    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--render"]:
        out = json.loads(Path(argv[1]).read_text())
        print(render(out, top=int(argv[2]) if len(argv) > 2 else 10))
        return out
    p = rollout_arguments(__doc__, groups=8)
    p.add_argument("--cache", type=Path, help="keep rollouts and exact values here; a rerun goes on from them")
    p.add_argument("--heldout-groups", type=int, default=3)
    p.add_argument("--exact-rows", type=int, default=2, help="rows a call fits on (oar_p_amortized_exact_rows)")
    p.add_argument("--calls", default="10,50,200", help="call counts after which the fit is scored")
    p.add_argument("--layers", default=",".join(LAYERS))
    p.add_argument("--features", default="64,256", help="projection widths (the model's width or more: none)")
    p.add_argument("--ridges", default="0.001,0.01,0.1,1")
    p.add_argument("--decays", default="0.9,0.95,1.0")
    args = p.parse_args(argv)
    layers = args.layers.split(",")
    if bad := [layer for layer in layers if layer not in LAYERS]:
        p.error(f"--layers {args.layers}: {bad[0]!r} is not one of {', '.join(LAYERS)}")
    if args.heldout_groups < 1 or args.heldout_groups >= args.groups:
        p.error(f"--heldout-groups {args.heldout_groups}: needs 1 <= it < --groups ({args.groups}), so that some "
                f"groups are held out and some are fitted on")
    if args.threads:
        torch.set_num_threads(args.threads)
    calls = sorted(int(c) for c in args.calls.split(","))
    features = [int(f) for f in args.features.split(",")]
    ridges = [float(r) for r in args.ridges.split(",")]
    decays = [float(d) for d in args.decays.split(",")]

    from grail.training.overrides import build_config, merge

    values = merge(None, {"preset": args.preset, **({"model_name_or_path": args.model} if args.model else {})})
    options = build_config({**values, "bf16": False, "token_weighting": "oar_p_amortized"}).weighting_options()
    model, tokenizer, path, groups, rewards, rollout_s = _rollouts(values, args, args.cache)
    if len(groups) <= args.heldout_groups:
        raise SystemExit(f"oar_p_amortized_fidelity: only {len(groups)} mixed groups were found, and "
                         f"--heldout-groups is {args.heldout_groups}; ask for more --groups")
    exact = [_exact_group(model, tokenizer, k, group, adv_G, options, layers, args.cache)
             for k, (group, adv_G) in enumerate(groups)]
    held, stream = exact[:args.heldout_groups], exact[args.heldout_groups:]
    stream_rows = [(g, i) for g in stream for i in range(g["exact_RT"].shape[0])]
    from grail.methods.builtin import oar_p_floor

    floor = max(oar_p_floor(model, options), 1e-12)
    width = held[0]["features"][layers[0]].shape[-1] - 4
    variants = [(layer, f, r, d) for layer, f, r, d in itertools.product(layers, features, ridges, decays)]
    variants += [("scalars", 0, r, d) for r, d in itertools.product(ridges, decays)]
    results = {}
    for layer, f, ridge, decay in variants:
        name = variant_name(layer, f, ridge, decay)
        results[name] = _fit_and_score(held, stream_rows, options, floor, width, layer if layer != "scalars" else
                                       layers[0], f, ridge, decay, args.exact_rows, calls, scalars=layer == "scalars")
        print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
    out = {"preset": args.preset, "model": str(path), "seed": args.seed, "groups": args.groups,
           "mixed_groups": len(groups), "rewards": rewards, "heldout_groups": args.heldout_groups,
           "heldout_rows": sum(g["exact_RT"].shape[0] for g in held), "stream_rows": len(stream_rows),
           "exact_rows_per_call": args.exact_rows, "calls_reachable": len(stream_rows) // args.exact_rows,
           "width": width, "torch_threads": torch.get_num_threads(), "rollout_seconds": rollout_s,
           "exact_seconds_per_row": _per_row(exact, "exact_seconds"),
           "features_seconds_per_row": _per_row(exact, "features_seconds"),
           "single_features": _single_features(held, width), "variants": results}
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return out


def _rollouts(values: dict, args, cache: Path | None):
    """`precision_fidelity.mixed_groups`' rollouts in its stable-prefix order, read from `cache` when it holds at
    least `--groups` of them for the same preset, model and seed; a cache of fewer is extended (the rollouts are
    sampled again for the larger count, and their first groups must equal the cached ones, so the cached exact values
    stay valid)."""
    from precision_fidelity import mixed_groups
    from transformers import AutoModelForCausalLM, AutoTokenizer

    key = {"preset": args.preset, "model": args.model, "seed": args.seed, "order": "stable_prefix"}
    file = cache / "rollouts.pt" if cache else None
    saved = torch.load(file, weights_only=False) if file is not None and file.exists() else None
    if saved is not None:
        if saved["key"] != key:
            raise SystemExit(f"oar_p_amortized_fidelity: --cache {cache} holds the rollouts of {saved['key']}, not "
                             f"{key}; give another --cache directory, or the same arguments as before")
        if len(saved["groups"]) >= args.groups:
            tokenizer = AutoTokenizer.from_pretrained(saved["path"])
            model = AutoModelForCausalLM.from_pretrained(saved["path"], dtype=torch.float32).train()
            n = args.groups
            drawn = _drawn_through(saved["rewards"], n)
            return model, tokenizer, saved["path"], saved["groups"][:n], saved["rewards"][:drawn], \
                saved["rollout_seconds"]
    model, tokenizer, path, groups, rewards, seconds = mixed_groups(values, args.model, args.groups, args.seed,
                                                                    stable_prefix=True)
    if saved is not None and not all(_same_group(a, b) for a, b in zip(saved["groups"], groups, strict=False)):
        raise SystemExit(f"oar_p_amortized_fidelity: the rollouts sampled again for --groups {args.groups} differ "
                         f"from the {len(saved['groups'])} groups in --cache {cache} (another torch version or "
                         f"machine samples differently); give a new --cache directory")
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        _save(file, {"key": key, "path": str(path), "groups": groups, "rewards": rewards, "rollout_seconds": seconds})
    return model, tokenizer, path, groups, rewards, seconds


def _drawn_through(rewards: list, n: int) -> int:
    """How many drawn groups (mixed or not) it took to reach the n-th mixed one."""
    mixed = 0
    for i, r in enumerate(rewards):
        mixed += len(set(r)) > 1
        if mixed == n:
            return i + 1
    return len(rewards)


def _same_group(a, b) -> bool:
    """Whether two sampled groups ((batch tensors), A_G) hold the same tokens and advantages."""
    (batch_a, adv_a), (batch_b, adv_b) = a, b
    return len(batch_a) == len(batch_b) and all(x.shape == y.shape and torch.equal(x, y)
                                                for x, y in zip(batch_a, batch_b, strict=True)) \
        and torch.equal(adv_a, adv_b)


def _save(file: Path, obj) -> None:
    partial = file.with_name(f".{file.name}.tmp")
    torch.save(obj, partial)
    partial.replace(file)


def _exact_group(model, tokenizer, k: int, group, adv_G, options, layers, cache: Path | None) -> dict:
    """One group's probed rows: exact OAR-P (R, T), the scored tokens, and the unprojected features of each layer
    (R, T, D + 4); with the group's batch, advantages and probed-row mask for the weights. Cached per group."""
    file = cache / f"group_{k:03d}.pt" if cache else None
    if file is not None and file.exists():
        saved = torch.load(file, weights_only=False)
        if set(layers) <= set(saved["features"]) and _same_group((saved["group"], saved["adv_G"]), (group, adv_G)):
            return saved
    from dataclasses import replace

    from grail.methods.builtin import oar_p_signal
    from grail.methods.signals import oar_p_amortized
    from grail.methods.table import method_spec, probed_rows
    from grail.methods.weighting import batch_spans, probe_batch

    prompt_ids, prompt_mask, completion_ids, completion_mask = group
    mask_BT = completion_mask.bool()
    spans = batch_spans(tokenizer, completion_ids, mask_BT, options)
    rows_B = probed_rows(method_spec("oar_p_amortized"), adv_G, spans, mask_BT, options)
    rows = probe_batch(torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1),
                       spans, mask_BT, rows_B, options, adv_B=adv_G, tokenizer=tokenizer)
    tick = time.perf_counter()
    with torch.no_grad():
        exact_RT = oar_p_signal(model, rows, options).float()
    exact_s = time.perf_counter() - tick
    tick, feats = time.perf_counter(), {}
    for layer in layers:
        full = replace(options, method_options={**options.method_options, oar_p_amortized.LAYER: layer,
                                                oar_p_amortized.FEATURES: 1 << 30})  # no projection
        feats[layer] = oar_p_amortized.token_features(model, rows, full)
    features_s = time.perf_counter() - tick
    saved = {"exact_RT": exact_RT, "scored_RT": rows.scored_BT.bool(), "features": feats, "rows_B": rows_B,
             "spans": spans, "group": group, "adv_G": adv_G, "exact_seconds": exact_s, "features_seconds": features_s}
    print(f"group {k}: {int(rows_B.sum())} probed rows, exact OAR-P {exact_s:.1f} s", file=sys.stderr, flush=True)
    if file is not None:
        _save(file, saved)
    return saved


def variant_features(full_RTF: torch.Tensor, width: int, features: int, scalars: bool = False) -> torch.Tensor:
    """The method's features from the unprojected ones: the hidden state's fixed projection to `features`
    dimensions (`oar_p_amortized._projection`, as `token_features` applies it), then the 4 scalar columns; only the
    scalars with `scalars`."""
    from grail.methods.signals.oar_p_amortized import _projection

    hidden, extra = full_RTF[..., :width], full_RTF[..., width:]
    if scalars:
        return extra
    return torch.cat([hidden @ _projection(width, features, hidden.device), extra], -1)


def _fit_and_score(held, stream_rows, options, floor, width, layer, features, ridge, decay, per_call, calls,
                   scalars=False) -> dict:
    from grail.methods.signals.oar_p_amortized import Predictor

    predictor, scores, done = Predictor(), {}, 0
    for c in calls:
        while done < c and (done + 1) * per_call <= len(stream_rows):
            fit_call(predictor, stream_rows[done * per_call:(done + 1) * per_call], layer, width, features, floor,
                     decay, scalars)
            done += 1
        if done < c:
            break  # the stream is shorter than c calls
        theta_F = predictor.coefficients(ridge).float()
        scores[str(c)] = _score(held, options, floor, width, layer, features, scalars, theta_F)
    return scores


def fit_call(predictor, rows, layer, width, features, floor, decay, scalars=False) -> None:
    """One probe call's update of `predictor` from `rows` [(cached group, row index)]: the variant's features of
    their scored tokens against log max(exact OAR-P, floor), as the method's probe updates it."""
    xs, ys = [], []
    for g, i in rows:
        x_TF = variant_features(g["features"][layer][i], width, features, scalars)
        keep_T = g["scored_RT"][i] & torch.isfinite(g["exact_RT"][i]) & torch.isfinite(x_TF).all(-1)
        xs.append(x_TF[keep_T])
        ys.append(g["exact_RT"][i][keep_T].clamp(min=floor).log())
    if torch.cat(xs).shape[0]:
        predictor.update(torch.cat(xs), torch.cat(ys), decay)


def _score(held, options, floor, width, layer, features, scalars, theta_F) -> dict:
    """The fit's predictions on the held-out rows against exact OAR-P: signal and weights."""
    from dataclasses import asdict

    from grail.analysis.fidelity import row_spearman_B, weight_fidelity

    rho, exact_w, predicted_w, advs, masks = [], [], [], [], []
    for g in held:
        x_RTF = variant_features(g["features"][layer], width, features, scalars)
        predicted_RT = torch.where(g["scored_RT"], (x_RTF @ theta_F).clamp(max=30.0).exp(), 0.0)
        rho.append(row_spearman_B(predicted_RT, g["exact_RT"], g["scored_RT"]))
        exact_w.append(_weights(g, g["exact_RT"], options, floor))
        predicted_w.append(_weights(g, predicted_RT, options, floor))
        advs.append(g["adv_G"])
        masks.append(g["group"][3].bool())
    rho_R = torch.cat(rho)
    kept = rho_R[~torch.isnan(rho_R)]
    from precision_fidelity import pool

    weights = pool(exact_w, predicted_w, advs, masks, weight_fidelity)
    return {"rows": int(kept.numel()), "spearman_median": _q(kept, 0.5), "spearman_q25": _q(kept, 0.25),
            "spearman_min": float(kept.min()) if kept.numel() else None,
            "weights": weights if isinstance(weights, dict) else asdict(weights)}


def _weights(g, signal_RT, options, floor) -> torch.Tensor:
    """OAR-P's bi-level weights of the group from a signal on its probed rows (others uniform), as a run makes them."""
    from grail.methods.table import method_spec
    from grail.methods.weighting import weights_from_signal

    mask_BT = g["group"][3].bool()
    full_BT = torch.zeros(mask_BT.shape)
    full_BT[g["rows_B"]] = signal_RT
    return weights_from_signal(full_BT, g["adv_G"], g["spans"], mask_BT, g["rows_B"], options, None, floor,
                               method_spec("oar_p_amortized")).weights_BT.float()


def _single_features(held, width) -> dict:
    """Spearman of exact OAR-P with each cheap feature alone on the held-out rows (median, worst)."""
    from grail.analysis.fidelity import row_spearman_B

    layer = next(iter(held[0]["features"]))
    out = {}
    for j, name in enumerate(SINGLE_FEATURES):
        rho_R = torch.cat([row_spearman_B(g["features"][layer][..., width + j], g["exact_RT"], g["scored_RT"])
                           for g in held])
        kept = rho_R[~torch.isnan(rho_R)]
        out[name] = {"rows": int(kept.numel()), "spearman_median": _q(kept, 0.5),
                     "spearman_min": float(kept.min()) if kept.numel() else None}
    return out


def render(out: dict, top: int = 10) -> str:
    """A Markdown table of a run's output: the `top` variants by median signal Spearman at the largest call count
    every variant reached, each at every call count, then each cheap feature alone."""
    variants = out["variants"]
    counts = sorted({int(c) for scores in variants.values() for c in scores})
    if not counts:
        return "no call count was reached: the stream holds fewer rows than the smallest --calls"
    last = str(max(c for c in counts if all(str(c) in scores for scores in variants.values())))
    ranked = sorted(variants, key=lambda name: -(variants[name][last]["spearman_median"] or -2))
    head = " | ".join(f"after {c} calls" for c in counts)
    lines = [f"{out['heldout_rows']} held-out rows, {out['stream_rows']} stream rows, "
             f"{out['exact_rows_per_call']} a call; each cell: signal Spearman median [lower quartile, worst] / "
             "weights' Spearman median",
             "", f"| variant | {head} |", "|---|" + "---|" * len(counts)]
    for name in ranked[:top] + [n for n in ranked[top:] if n.startswith("scalars/")][:1]:
        cells = []
        for c in counts:
            score = variants[name].get(str(c))
            cells.append("—" if score is None else f"{score['spearman_median']:.2f} [{score['spearman_q25']:.2f}, "
                         f"{score['spearman_min']:.2f}] / {score['weights']['spearman_median']:.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| one feature alone | Spearman median | worst |", "|---|---|---|"]
    for name, score in out["single_features"].items():
        lines.append(f"| {name} | {score['spearman_median']:.2f} | {score['spearman_min']:.2f} |")
    return "\n".join(lines)


def _q(t: torch.Tensor, q: float) -> float | None:
    return float(t.quantile(q)) if t.numel() else None


def _per_row(groups, key) -> float | None:
    rows = sum(g["exact_RT"].shape[0] for g in groups)
    return sum(g[key] for g in groups) / rows if rows else None


if __name__ == "__main__":
    main()
