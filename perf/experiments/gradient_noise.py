r"""How noisy is one GRPO step at a starting model? The gradient noise scale of its per-prompt policy gradients.

For `--groups` training prompts of a preset's task (drawn with `--seed`), each prompt's group of `num_generations`
completions is sampled at the run's temperature (the preset's, 1.0 unless `--temperature` says otherwise; top-p 1,
top-k 0, `max_completion_length` new tokens) from the starting model, graded
with the run's reward, and turned into that group's policy gradient as GRPO's first step sees it (ratio 1, so the
clipped objective's gradient is the plain one): advantages r − mean(r) (`scale_rewards none`), token log-prob sums,
divided by (group size × max_completion_length) as Dr. GRPO's loss divides; truncated completions masked if the preset
masks them. A group with one reward has a zero gradient and counts as one. Each gradient is reduced to a count sketch
of 2^`--sketch-log2` buckets (dot products kept to about 1/sqrt(buckets) of the norms), from which the Gram matrix
of the groups gives grail.analysis.gradient_noise's B_simple (bootstrap interval over groups) and the cosines of
disjoint batches of 4, 8, 16 and 32 prompts. What it answers: is a step of 4 prompts mostly noise?

    python perf/experiments/gradient_noise.py --preset smollm-chains --model sft:smollm2-135m --groups 64 \
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


class CountSketch:
    """A model's .grad as a count sketch of `buckets` buckets: each coordinate added, with a random sign, to a random
    bucket. The buckets and signs (drawn once per parameter from `seed`) are kept, since every group and method is
    sketched with the same ones: about 5 bytes per parameter."""

    def __init__(self, model, buckets: int, seed: int):
        self.buckets, self.params, self.hashes = buckets, [q for q in model.parameters() if q.requires_grad], []
        for k, p in enumerate(self.params):
            g = torch.Generator().manual_seed(seed * 100_003 + k)
            idx = torch.randint(buckets, (p.numel(),), generator=g).to(torch.int32)
            sign = torch.randint(0, 2, (p.numel(),), generator=g, dtype=torch.int8).mul_(2).sub_(1)
            self.hashes.append((idx, sign))

    def __call__(self) -> torch.Tensor:
        out = torch.zeros(self.buckets, dtype=torch.float64)
        for p, (idx, sign) in zip(self.params, self.hashes, strict=True):
            if p.grad is not None:
                out.index_add_(0, idx, p.grad.detach().flatten().double().cpu() * sign)
        return out


def group_batch(prompt_ids, completions, *, eos_ids, pad_id, max_len, mask_truncated):
    """One group in TRL's layout: (prompt_ids (G, S), prompt_mask, completion_ids (G, T), completion_mask), the
    completions cut after their first end-of-sequence token, truncated ones masked if the run masks them."""
    kept, masks = [], []
    for comp in completions:
        end = next((i + 1 for i, t in enumerate(comp) if t in eos_ids), None)
        kept.append(comp[:end] if end is not None else comp)
        masks.append(0 if (mask_truncated and end is None and len(comp) >= max_len) else 1)
    G, T = len(kept), max(map(len, kept))
    prompt = torch.tensor([prompt_ids] * G)
    completion_ids = torch.full((G, T), pad_id, dtype=torch.long)
    completion_mask = torch.zeros(G, T, dtype=torch.long)
    for i, (row, m) in enumerate(zip(kept, masks, strict=True)):
        completion_ids[i, : len(row)], completion_mask[i, : len(row)] = torch.tensor(row), m
    return prompt, torch.ones_like(prompt), completion_ids, completion_mask


def group_gradient(model, batch, adv_G: torch.Tensor, weights_GT: torch.Tensor, max_len: int,
                   temperature: float = 1.0) -> None:
    """Backward of one group's policy-gradient loss with token advantages Â = w · A into model .grad (zeroed first),
    as GRPO's first step computes it (ratio 1): −Σ Â log p / (group × max_completion_length), Dr. GRPO's divisor,
    with log p of the logits divided by the sampling temperature, as TRL computes it."""
    model.zero_grad(set_to_none=True)
    prompt, prompt_mask, completion_ids, completion_mask = (t.to(adv_G.device) for t in batch)
    ids = torch.cat([prompt, completion_ids], 1)
    attn = torch.cat([prompt_mask, completion_mask], 1)
    S, T = prompt.shape[1], completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attn).logits[:, S - 1 : S + T - 1].float() / temperature
    logp_GT = torch.log_softmax(logits, -1).gather(-1, completion_ids[..., None])[..., 0]
    adv_GT = weights_GT.to(adv_G.device) * adv_G[:, None] * completion_mask
    loss = -(adv_GT * logp_GT).sum() / (len(adv_G) * max_len)
    loss.backward()


def cross_terms(sk_a: torch.Tensor, sk_b: torch.Tensor) -> float:
    """G_a · G_b from two methods' group sketches (n, K), over pairs of distinct groups (unbiased)."""
    cross = sk_a @ sk_b.T
    n = cross.shape[0]
    return float((cross.sum() - cross.diagonal().sum()) / (n * (n - 1)))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="smollm-chains")
    p.add_argument("--model", help="a model directory (default: the preset's model_name_or_path, resolved)")
    p.add_argument("--groups", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", default="none", help="comma-separated `grail methods` names; `none` is GRPO's own "
                   "gradient, and the first method the others' alignment is measured against")
    p.add_argument("--sketch-log2", type=int, default=22)
    p.add_argument("--prompts-per-call", type=int, default=4, help="prompts per generate call")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature of the run measured (default: the preset's)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.methods.weighting import weights_for
    from grail.training.data import load_prompts
    from grail.training.overrides import build_config, merge
    from grail.training.run import resolve_model_path, resolve_prompt_fields, reward_function

    methods = args.methods.split(",")
    values = merge(None, {"preset": args.preset, **({"model_name_or_path": args.model} if args.model else {}),
                          **({"temperature": args.temperature} if args.temperature is not None else {})})
    cfg = build_config(values)
    options = cfg.weighting_options()
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
    sketch = CountSketch(model, buckets, args.seed)
    dtype = torch.float64 if len(methods) == 1 else torch.float32  # several methods: memory
    sketches = {m: [] for m in methods}
    seconds = dict.fromkeys(methods, 0.0)
    group_rewards, t0 = [], time.perf_counter()
    torch.manual_seed(args.seed)
    for start in range(0, len(picked), args.prompts_per_call):
        chunk = [rows[i] for i in picked[start : start + args.prompts_per_call]]
        texts = [fmt.render(tokenizer, row["prompt"]) for row in chunk]
        batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left",
                          add_special_tokens=False).to(device)
        model.eval()
        with torch.no_grad():
            out = model.generate(**batch, do_sample=True, temperature=cfg.temperature, top_p=1.0, top_k=0,
                                 max_new_tokens=max_len, num_return_sequences=G, pad_token_id=pad_id)
        new = out[:, batch["input_ids"].shape[1] :].tolist()
        for j, row in enumerate(chunk):
            comps = new[j * G : (j + 1) * G]
            decoded = tokenizer.batch_decode(comps, skip_special_tokens=True)
            r = reward(completions=decoded, answer=[row["answer"]] * G)
            group_rewards.append(r)
            adv = torch.tensor(r, dtype=torch.float32, device=device)
            adv = adv - adv.mean()
            prompt_ids = tokenizer(texts[j], add_special_tokens=False)["input_ids"]
            group = group_batch(prompt_ids, comps, eos_ids=eos_ids, pad_id=pad_id, max_len=max_len,
                                mask_truncated=cfg.mask_truncated_completions)
            for method in methods:
                if adv.abs().max() == 0:  # one reward: Â = 0 whatever the weights
                    sketches[method].append(torch.zeros(buckets, dtype=dtype))
                    continue
                tm = time.perf_counter()
                model.train()
                if method == "none":
                    w = torch.ones(group[2].shape, dtype=torch.float32)
                else:
                    w = weights_for(method, model, tokenizer, *(t.to(device) for t in group), adv,
                                    options=options).detach().cpu()
                group_gradient(model, group, adv, w, max_len, cfg.temperature)
                sketches[method].append(sketch().to(dtype))
                seconds[method] += time.perf_counter() - tm
        print(f"{len(group_rewards)}/{args.groups} groups, {time.perf_counter() - t0:.0f} s", flush=True)
    stacked = {m: torch.stack(v).double() for m, v in sketches.items()}
    reference = methods[0]
    grams = {m: (S @ S.T).numpy() for m, S in stacked.items()}
    scales = {m: noise_scale(gram) for m, gram in grams.items()}
    per_method = {}
    for method, S in stacked.items():
        scale, ref_signal = scales[method], scales[reference]["signal"]
        dot = cross_terms(S, stacked[reference])
        per_method[method] = {
            "noise_scale": scale,
            "dot_with_reference": dot,  # G_method · G_reference, unbiased; its cosine needs both signals > 0
            "cosine_with_reference": dot / math.sqrt(scale["signal"] * ref_signal)
            if scale["signal"] > 0 and ref_signal > 0 else None,
            "cosines": {m: {**batch_cosines(grams[method], m), "expected": expected_cosine(scale["b_simple"], m)
                            if math.isfinite(scale["b_simple"]) else 0.0}
                        for m in (4, 8, 16, 32) if 2 * m <= args.groups},
            "seconds": seconds[method],
        }
    mixed = sum(1 for r in group_rewards if len(set(r)) > 1)
    result = {
        "model": str(path), "preset": args.preset, "temperature": cfg.temperature, "groups": args.groups,
        "group_size": G, "seed": args.seed,
        "max_completion_length": max_len, "sketch_buckets": buckets, "device": device, "methods": methods,
        "reference": reference, "mixed_groups": mixed,
        "mean_reward": float(np.mean([x for r in group_rewards for x in r])),
        **({"noise_scale": per_method[reference]["noise_scale"], "cosines": per_method[reference]["cosines"]}
           if methods == ["none"] else {"per_method": per_method}),
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
