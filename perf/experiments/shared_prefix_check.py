"""Can the G completions of one prompt share the prompt's forward? A check of the idea behind a shared-prompt loss
(not used by training yet): the prompt computed once (`use_cache=True`, its KV cache repeated over the rows with
`batch_repeat_interleave`), each row's suffix [last prompt token, completion] run against it with the full attention
mask, the gradient flowing back through the cache. Compared with the plain forward of prompt ⊕ completion per row:
the completion tokens' log-probs and every parameter's gradient of their masked sum, on small random models of three
families (Llama, which SmolLM2 is; Qwen3, the embedded model's; Gemma 3 with a sliding window shorter than the
prompt). Why it matters: with a 411-token prompt and ~45-token completions (docs/results/does-it-pay.md), about 90%
of a GRPO step's tokens are the same prompt, computed once per completion.

    python perf/experiments/shared_prefix_check.py [--prompt 20] [--completion 7] [--rows 4] [--json out.json]
        [--real MODEL]

`--real smollm2-135m` adds the check of grail.training.shared_prompt (what `shared_prompt=true` runs) on the real
model and the word problems' real prompt, against TRL's own log-prob forward.
"""

from __future__ import annotations

import argparse
import json

import torch


def _models(vocab: int = 97):
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256)
    yield "llama", LlamaForCausalLM(LlamaConfig(**kw))
    yield "qwen3", Qwen3ForCausalLM(Qwen3Config(**kw, head_dim=8))
    yield "gemma3", Gemma3ForCausalLM(Gemma3TextConfig(**kw, head_dim=8, sliding_window=8,
                                                       layer_types=["sliding_attention", "full_attention"]))


def _token_logps(logits_BTV: torch.Tensor, ids_BT: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits_BTV.float(), -1).gather(-1, ids_BT[..., None])[..., 0]


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def compare(model, prompt_1P: torch.Tensor, completion_GT: torch.Tensor, mask_GT: torch.Tensor) -> dict:
    """Max |Δ log-prob| over real completion tokens and max relative |Δ gradient| over parameters, shared vs plain."""
    G, P = completion_GT.shape[0], prompt_1P.shape[1]
    model.train(False)
    ids_GL = torch.cat([prompt_1P.expand(G, P), completion_GT], 1)
    attn_GL = torch.cat([torch.ones(G, P, dtype=torch.long), mask_GT], 1)
    model.zero_grad()
    plain_GT = _token_logps(model(input_ids=ids_GL, attention_mask=attn_GL).logits[:, P - 1:-1], completion_GT)
    (plain_GT * mask_GT).sum().backward()
    plain = _grads(model)
    model.zero_grad()
    cache = model(input_ids=prompt_1P[:, :P - 1], attention_mask=torch.ones(1, P - 1, dtype=torch.long),
                  use_cache=True).past_key_values
    cache.batch_repeat_interleave(G)
    suffix_GS = torch.cat([prompt_1P[:, P - 1:].expand(G, 1), completion_GT], 1)
    shared_GT = _token_logps(model(input_ids=suffix_GS, attention_mask=attn_GL, past_key_values=cache,
                                   use_cache=True).logits[:, :-1], completion_GT)
    (shared_GT * mask_GT).sum().backward()
    shared = _grads(model)
    if plain.keys() != shared.keys():
        raise AssertionError(f"parameters with a gradient differ: {sorted(plain.keys() ^ shared.keys())}")
    return {"logp_max_abs_diff": ((plain_GT - shared_GT).abs() * mask_GT).max().item(),
            "grad_max_rel_diff": max((plain[n] - shared[n]).abs().max().item() / (plain[n].abs().max().item() + 1e-12)
                                     for n in plain),
            "parameters": len(plain)}


def trl_forward(model, ids_BL: torch.Tensor, mask_BL: torch.Tensor, T: int, compute_entropy: bool = False):
    """TRL's own log-prob method (the code every GRPO run uses: fused LM head, chunking), on a stand-in trainer that
    only lends autocast; (logps_BT, entropies_BT or None, aux_loss)."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from trl import GRPOTrainer

    stand_in = SimpleNamespace(accelerator=SimpleNamespace(autocast=nullcontext, is_main_process=True))
    return GRPOTrainer._get_per_token_logps_and_entropies(stand_in, model, ids_BL, mask_BL, T,
                                                           compute_entropy=compute_entropy)


def real_check(model_name: str, rows: int = 4, new_tokens: int = 40) -> dict:
    """grail.training.shared_prompt on a real model and the word problems' real prompt (its chat template, worked
    examples and first training problem): `rows` sampled completions, then TRL's log-prob forward (fused head) and the
    shared one, each followed by the backward of the completions' summed log-probs."""
    from contextlib import nullcontext

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.utils import add_fused_lm_head

    from grail.options.presets import SMOLLM_WORDS
    from grail.training.data import load_prompts
    from grail.training.overrides import build_config
    from grail.training.run import resolve_model_path, resolve_prompt_fields
    from grail.training.shared_prompt import prompt_groups, shared_prompt_logps

    cfg = build_config({**SMOLLM_WORDS, "model_name_or_path": model_name, "task_num_steps": 2, "task_operand_max": 6,
                        "task_max_value": 12, "output_dir": "/tmp/shared-prefix-check"})
    path = resolve_model_path(cfg)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    model.train(False)
    rows_data = load_prompts(cfg)
    fmt = resolve_prompt_fields(cfg, tokenizer, rows_data)
    text = fmt.render(tokenizer, rows_data[0]["prompt"])
    prompt_1P = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(input_ids=prompt_1P.expand(rows, -1), attention_mask=torch.ones(rows, prompt_1P.shape[1],
                             dtype=torch.long), do_sample=True, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             pad_token_id=tokenizer.pad_token_id)
    ids_BL, T = out, new_tokens
    mask_BL = torch.ones_like(ids_BL)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    results = {}
    for name in ("plain", "shared"):
        model.zero_grad(set_to_none=True)
        if name == "plain":
            logps_BT = trl_forward(model, ids_BL, mask_BL, T)[0]
        else:
            groups = prompt_groups(ids_BL, mask_BL, T)
            logps_BT = shared_prompt_logps(model, ids_BL, mask_BL, T, *groups, False, nullcontext)[0]
        logps_BT.sum().backward()
        results[name] = (logps_BT.detach(), {n: q.grad.clone() for n, q in model.named_parameters()
                                             if q.grad is not None})
    (plain, plain_g), (shared, shared_g) = results["plain"], results["shared"]
    return {"model": model_name, "prompt_tokens": prompt_1P.shape[1], "completion_tokens": T, "rows": rows,
            "logp_max_abs_diff": (plain - shared).abs().max().item(),
            "grad_max_rel_diff": max((plain_g[n] - shared_g[n]).abs().max().item() / (plain_g[n].abs().max().item()
                                                                                       + 1e-12) for n in plain_g),
            "parameters": len(plain_g)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=20)
    parser.add_argument("--completion", type=int, default=7)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--json")
    parser.add_argument("--real", metavar="MODEL",
                        help="also check grail.training.shared_prompt on a real model (e.g. smollm2-135m) and the word "
                             "problems' prompt: TRL's fused-head forward against the shared one")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    results = {}
    for name, model in _models():
        prompt = torch.randint(3, 97, (1, args.prompt))
        completion = torch.randint(3, 97, (args.rows, args.completion))
        mask = torch.ones_like(completion)
        mask[1::2, args.completion // 2:] = 0  # every other row ends early (right padding)
        results[name] = compare(model, prompt, completion, mask)
        r = results[name]
        print(f"{name}: max |Δ log-prob| {r['logp_max_abs_diff']:.1e}, max relative |Δ gradient| "
              f"{r['grad_max_rel_diff']:.1e} over {r['parameters']} parameters")
    if args.real:
        r = results[args.real] = real_check(args.real)
        print(f"{args.real} ({r['prompt_tokens']}-token prompt, {r['rows']} x {r['completion_tokens']} tokens): max "
              f"|Δ log-prob| {r['logp_max_abs_diff']:.1e}, max relative |Δ gradient| {r['grad_max_rel_diff']:.1e} "
              f"over {r['parameters']} parameters")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
