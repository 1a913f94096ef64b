"""Do a method's token weights hold in bf16? Each method's weights on the same rollouts, computed in fp32 and under CPU
bf16 autocast (fp32 weights, bf16 matmuls: what a bf16 training run computes), compared row by row.

Rollouts: prompts of the preset's training split (seeded order), 8 completions each, sampled from the preset's model
(default: `smollm-chains`, SmolLM2 after its 30-step warm start) in fp32 at the run's temperature, rewarded by the
run's reward, A = r − mean(group) (the preset's dr_grpo, scale_rewards none), until `--groups` groups with mixed
rewards are found (a group with one reward has A = 0 on every row, and no probe runs on it; at most 10 × `--groups`
prompts are drawn). `rewards` in the output lists every group drawn, `mixed_groups` how many were kept. Then for
every method of the table (`--methods`, default all): `grail.methods.weighting.weights_for` with the method's
options as a run of the preset resolves them, once in fp32 and once inside `torch.autocast("cpu", torch.bfloat16)`
(the generator reseeded alike, so `random` draws the same permutations), and
`grail.analysis.fidelity.weight_fidelity` of the pair: per-row Spearman over the real tokens (median and worst of
the rows whose weights are not constant), the share of live tokens whose Â = w · A changes sign, and the largest
weight difference; with each side's seconds.

    python perf/experiments/precision_fidelity.py --groups 4 --out fidelity.json
Prints one JSON object. Its figures do not depend on whether the CPU computes bf16 natively (the rounding is the
format's), only its seconds do.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch


def main(argv=None) -> dict:
    p = rollout_arguments(__doc__, groups=4)
    p.add_argument("--methods", default="", help="comma-separated methods (default: every method of the table)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from grail.analysis.fidelity import weight_fidelity
    from grail.methods.table import METHODS
    from grail.methods.weighting import weights_for
    from grail.training.overrides import build_config, merge

    methods = args.methods.split(",") if args.methods else list(METHODS)
    values = merge(None, {"preset": args.preset, **({"model_name_or_path": args.model} if args.model else {})})
    model, tokenizer, path, groups, group_rewards, rollout_s = mixed_groups(values, args.model, args.groups,
                                                                            args.seed)
    results = {}
    for method in methods:
        options = build_config({**values, "bf16": False, "token_weighting": method}).weighting_options()
        sides = {}
        for precision in ("fp32", "bf16"):
            weights, seconds = [], 0.0
            for k, (group, adv_G) in enumerate(groups):
                torch.manual_seed(args.seed * 1000 + k)  # `random` and any noise draw the same on both sides
                tick = time.perf_counter()
                region = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
                          else torch.autocast("cpu", enabled=False))
                with region:
                    weights.append(weights_for(method, model, tokenizer, *group, adv_G, options=options).float())
                seconds += time.perf_counter() - tick
            sides[precision] = (weights, seconds)
        pooled = pool(sides["fp32"][0], sides["bf16"][0], [adv for _, adv in groups],
                      [group[3].bool() for group, _ in groups], weight_fidelity)
        results[method] = {**pooled, "fp32_seconds": sides["fp32"][1], "bf16_seconds": sides["bf16"][1]}
        print(f"{method}: {json.dumps(results[method])}", file=sys.stderr, flush=True)
    out = {"preset": args.preset, "model": str(path), "groups": args.groups,
           "group_size": len(group_rewards[0]) if group_rewards else 0, "seed": args.seed,
           "mixed_groups": len(groups), "rewards": group_rewards,
           "torch_threads": torch.get_num_threads(), "rollout_seconds": rollout_s, "methods": results}
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return out


def rollout_arguments(doc: str, groups: int) -> argparse.ArgumentParser:
    """The arguments of a script on `mixed_groups`' rollouts (this one's and perf/experiments/oar_p_spans.py's)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--preset", default="smollm-chains")
    p.add_argument("--model", help="a model directory (default: the preset's model_name_or_path, resolved)")
    p.add_argument("--groups", type=int, default=groups)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path)
    return p


def mixed_groups(values: dict, model_dir: str | None, n_groups: int, seed: int, stable_prefix: bool = False):
    """The rollouts (module docstring): (model, tokenizer, model path, [(group batch, A_G)], every group's rewards,
    seconds), the model in fp32 and in train mode, as the trainer probes (dropout is 0 in these models).
    `stable_prefix`: the prompts in one seeded shuffle of the whole split, so that a call for more groups draws the
    same first groups (the default order, `random.sample` of 10 × n_groups prompts, depends on n_groups; the
    published figures of this script and oar_p_spans.py were drawn with it)."""
    from gradient_noise import group_batch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.training.data import load_prompts
    from grail.training.overrides import build_config
    from grail.training.run import resolve_model_path, resolve_prompt_fields, reward_function

    cfg = build_config({**values, "bf16": False})
    path = model_dir or resolve_model_path(cfg)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = load_prompts(cfg)
    fmt = resolve_prompt_fields(cfg, tokenizer, rows)
    reward = reward_function(cfg)
    G, max_len = cfg.num_generations, cfg.max_completion_length
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list | tuple) else [eos])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids))
    torch.manual_seed(seed)
    groups, group_rewards = [], []
    start = time.perf_counter()
    if stable_prefix:
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        order = order[:10 * n_groups]
    else:
        order = random.Random(seed).sample(range(len(rows)), min(len(rows), 10 * n_groups))
    for index in order:
        if len(groups) == n_groups:
            break
        row = rows[index]
        text = fmt.render(tokenizer, row["prompt"])
        batch = tokenizer([text], return_tensors="pt", add_special_tokens=False)
        model.eval()
        with torch.no_grad():
            out = model.generate(**batch, do_sample=True, temperature=cfg.temperature, top_p=1.0, top_k=0,
                                 max_new_tokens=max_len, num_return_sequences=G, pad_token_id=pad_id)
        completions = out[:, batch["input_ids"].shape[1]:].tolist()
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        r = reward(completions=texts, answer=[row["answer"]] * G)
        group_rewards.append(r)
        if len(set(r)) < 2:  # one reward: A = 0 on every row, and no probe runs on it
            continue
        adv_G = torch.tensor(r, dtype=torch.float32)
        groups.append((group_batch(batch["input_ids"][0].tolist(), completions, eos_ids=eos_ids, pad_id=pad_id,
                                   max_len=max_len, mask_truncated=cfg.mask_truncated_completions),
                       adv_G - adv_G.mean()))
    rollout_s = time.perf_counter() - start
    print(f"{len(groups)} groups sampled in {rollout_s:.0f} s", file=sys.stderr, flush=True)
    model.train()
    return model, tokenizer, path, groups, group_rewards, rollout_s


def pool(w32, w16, advs, masks, weight_fidelity) -> dict:
    """The groups' rows pooled: one fidelity over every row (rows are padded to the widest group's T)."""
    width = max(w.shape[1] for w in w32)

    def pad(t, value=0):
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    pooled = weight_fidelity(torch.cat([pad(w) for w in w32]), torch.cat([pad(w) for w in w16]), torch.cat(advs),
                             torch.cat([pad(m, False) for m in masks]))
    return asdict(pooled)


if __name__ == "__main__":
    main()
