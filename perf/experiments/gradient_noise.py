r"""How noisy is one GRPO step at a starting model? The gradient noise scale of its per-prompt policy gradients.

For `--groups` training prompts of a preset's task (drawn with `--seed`), each prompt's group of `num_generations`
completions is sampled at T = 1 (top-p 1, top-k 0, `max_completion_length` new tokens) from the starting model, graded
with the run's reward, and turned into that group's policy gradient as GRPO's first step sees it (ratio 1, so the
clipped objective's gradient is the plain one): advantages r − mean(r) (`scale_rewards none`), token log-prob sums,
divided by (group size × max_completion_length) as Dr. GRPO's loss divides; truncated completions masked if the preset
masks them. A group with one reward has a zero gradient and counts as one. Each gradient is reduced to a count sketch
of 2^`--sketch-log2` buckets (dot products kept to about 1/sqrt(buckets) of the norms), from which the Gram matrix
of the groups gives grail.analysis.gradient_noise's B_simple (bootstrap interval over groups) and the cosines of
disjoint batches of 4, 8, 16 and 32 prompts. What it answers: is a step of 4 prompts mostly noise?

    python perf/experiments/gradient_noise.py --preset smollm-chains --groups 64 \
        --out results/regime/gradient_noise.json

Cost on 2 CPU cores with SmolLM2-135M: the sampling of `--groups` × 8 completions (about a GRPO step's generation
per 4 prompts) plus one backward per group with a mixed reward.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import torch

from grail.analysis.gradient_noise import batch_cosines, expected_cosine, noise_scale


def count_sketch(model, buckets: int, seed: int) -> torch.Tensor:
    """The model's .grad as a count sketch: each coordinate added, with a random sign, to a random bucket (the same
    bucket and sign for every call with this seed)."""
    out = torch.zeros(buckets, dtype=torch.float64)
    for k, p in enumerate(q for q in model.parameters() if q.requires_grad):
        if p.grad is None:
            continue
        g = torch.Generator().manual_seed(seed * 100_003 + k)
        flat = p.grad.detach().flatten().double().cpu()
        idx = torch.randint(buckets, flat.shape, generator=g)
        sign = torch.randint(0, 2, flat.shape, generator=g, dtype=torch.int8).double().mul_(2).sub_(1)
        out.index_add_(0, idx, flat * sign)
    return out


def group_gradient(model, prompt_ids, completions, rewards, *, eos_ids, pad_id, max_len, mask_truncated) -> bool:
    """Backward of one group's policy-gradient loss into model .grad (zeroed first); False when every reward is the
    same (zero gradient, nothing run)."""
    model.zero_grad(set_to_none=True)
    r = torch.tensor(rewards, dtype=torch.float32)
    adv = r - r.mean()
    if adv.abs().max() == 0:
        return False
    rows, masks = [], []
    for comp in completions:
        end = next((i + 1 for i, t in enumerate(comp) if t in eos_ids), None)
        keep = comp[:end] if end is not None else comp
        rows.append(prompt_ids + keep)
        truncated = end is None and len(comp) >= max_len
        masks.append([0] * len(prompt_ids) + [0 if (mask_truncated and truncated) else 1] * len(keep))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    loss_mask = torch.zeros(len(rows), width)
    for i, (row, m) in enumerate(zip(rows, masks, strict=True)):
        ids[i, : len(row)], attn[i, : len(row)], loss_mask[i, : len(row)] = torch.tensor(row), 1, torch.tensor(m)
    device = next(model.parameters()).device
    ids, attn, loss_mask, adv = ids.to(device), attn.to(device), loss_mask.to(device), adv.to(device)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0] * loss_mask[:, 1:]
    loss = -(adv[:, None] * logp).sum() / (len(rows) * max_len)  # Dr. GRPO: sum / (group × max_completion_length)
    loss.backward()
    return True


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="smollm-chains")
    p.add_argument("--model", help="a model directory (default: the preset's model_name_or_path, resolved)")
    p.add_argument("--groups", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sketch-log2", type=int, default=22)
    p.add_argument("--prompts-per-call", type=int, default=4, help="prompts per generate call")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.training.data import load_prompts
    from grail.training.overrides import build_config, merge
    from grail.training.run import resolve_model_path, resolve_prompt_fields, reward_function

    values = merge(None, {"preset": args.preset, **({"model_name_or_path": args.model} if args.model else {})})
    cfg = build_config(values)
    path = args.model or resolve_model_path(cfg)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    rows = load_prompts(cfg)
    fmt = resolve_prompt_fields(cfg, tokenizer, rows)
    picked = random.Random(args.seed).sample(range(len(rows)), args.groups)
    reward = reward_function(cfg)
    G, max_len = cfg.num_generations, cfg.max_completion_length
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list | tuple) else [eos])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids))
    buckets = 2**args.sketch_log2
    sketches, group_rewards, t0 = [], [], time.perf_counter()
    torch.manual_seed(args.seed)
    for start in range(0, len(picked), args.prompts_per_call):
        chunk = [rows[i] for i in picked[start : start + args.prompts_per_call]]
        texts = [fmt.render(tokenizer, row["prompt"]) for row in chunk]
        batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left",
                          add_special_tokens=False).to(device)
        model.eval()
        with torch.no_grad():
            out = model.generate(**batch, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_len,
                                 num_return_sequences=G, pad_token_id=pad_id)
        new = out[:, batch["input_ids"].shape[1] :].tolist()
        model.train()
        for j, row in enumerate(chunk):
            comps = new[j * G : (j + 1) * G]
            decoded = tokenizer.batch_decode(comps, skip_special_tokens=True)
            r = reward(completions=decoded, answer=[row["answer"]] * G)
            prompt_ids = tokenizer(texts[j], add_special_tokens=False)["input_ids"]
            mixed = group_gradient(model, prompt_ids, comps, r, eos_ids=eos_ids, pad_id=pad_id, max_len=max_len,
                                   mask_truncated=cfg.mask_truncated_completions)
            sketches.append(count_sketch(model, buckets, args.seed) if mixed else torch.zeros(buckets,
                                                                                             dtype=torch.float64))
            group_rewards.append(r)
        print(f"{len(sketches)}/{args.groups} groups, {time.perf_counter() - t0:.0f} s", flush=True)
    S = torch.stack(sketches)
    gram = (S @ S.T).numpy()
    scale = noise_scale(gram)
    mixed = sum(1 for r in group_rewards if len(set(r)) > 1)
    result = {
        "model": str(path), "preset": args.preset, "groups": args.groups, "group_size": G, "seed": args.seed,
        "max_completion_length": max_len, "sketch_buckets": buckets, "device": device,
        "mixed_groups": mixed, "mean_reward": float(np.mean([x for r in group_rewards for x in r])),
        "noise_scale": scale,
        "cosines": {m: {**batch_cosines(gram, m), "expected": expected_cosine(scale["b_simple"], m)
                        if math.isfinite(scale["b_simple"]) else 0.0}
                    for m in (4, 8, 16, 32) if 2 * m <= args.groups},
        "seconds": time.perf_counter() - t0, "rewards": group_rewards,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rewards"}, indent=1))
    return result


if __name__ == "__main__":
    main()
