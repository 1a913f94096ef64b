"""How closely does OAR-P on spans of k tokens follow token-level OAR-P, and what does it save? The span baseline
(`oar_p_span_tokens`, docs/methods/oar_p.md) against k = 1 on the same rollouts.

Rollouts as perf/experiments/precision_fidelity.py samples them (the preset's model, default `smollm-chains`: SmolLM2
after its 30-step warm start; `--groups` groups of 8 with mixed rewards). For k = 1 and each k of `--spans`: OAR-P's
weights through `grail.methods.weighting.weights_for`, with the options a run of the preset resolves and
`oar_p_span_tokens` = k, in fp32, timed; then `grail.analysis.fidelity.weight_fidelity` of each k against k = 1
(per-row Spearman over the real tokens, median and worst; the share of live tokens whose Â changes sign), and each k's
probe seconds over k = 1's, measured in the same process one after another.

    python perf/experiments/oar_p_spans.py --groups 3 --spans 2,4,8 --out spans.json
Prints one JSON object.
"""

from __future__ import annotations

import json
import sys
import time

import torch


def main(argv=None) -> dict:
    from precision_fidelity import mixed_groups, pool, rollout_arguments

    p = rollout_arguments(__doc__, groups=3)
    p.add_argument("--spans", default="2,4,8", help="comma-separated k > 1")
    args = p.parse_args(argv)
    spans = [int(k) for k in args.spans.split(",")]
    if any(k < 2 for k in spans):
        p.error(f"--spans {args.spans}: each k must be >= 2 (k = 1 is the reference every k is compared with)")
    if args.threads:
        torch.set_num_threads(args.threads)
    from grail.analysis.fidelity import weight_fidelity
    from grail.methods.weighting import weights_for
    from grail.training.overrides import build_config, merge

    values = merge(None, {"preset": args.preset, **({"model_name_or_path": args.model} if args.model else {})})
    model, tokenizer, path, groups, group_rewards, rollout_s = mixed_groups(values, args.model, args.groups,
                                                                            args.seed)

    def weights(k: int):
        options = build_config({**values, "bf16": False, "token_weighting": "oar_p",
                                "oar_p_span_tokens": k}).weighting_options()
        tick, out = time.perf_counter(), []
        for group, adv_G in groups:
            out.append(weights_for("oar_p", model, tokenizer, *group, adv_G, options=options).float())
        return out, time.perf_counter() - tick

    exact, exact_s = weights(1)
    results = {}
    for k in spans:
        approx, seconds = weights(k)
        pooled = pool(exact, approx, [adv for _, adv in groups], [group[3].bool() for group, _ in groups],
                      weight_fidelity)
        results[str(k)] = {**pooled, "seconds": seconds, "seconds_over_token_level": seconds / exact_s}
        print(f"k={k}: {json.dumps(results[str(k)])}", file=sys.stderr, flush=True)
    out = {"preset": args.preset, "model": str(path), "groups": args.groups, "seed": args.seed,
           "mixed_groups": len(groups), "rewards": group_rewards, "torch_threads": torch.get_num_threads(),
           "rollout_seconds": rollout_s, "token_level_seconds": exact_s, "spans": results}
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return out


if __name__ == "__main__":
    main()
