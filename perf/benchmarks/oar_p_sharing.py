"""OAR-P's time with the clean prefix's KV cache shared, beside OAR-P with whole forwards, on the same rows, side by
side in one process.

The two ways: `oar_probes._oar_p_prefix_shared` (what `oar_p_importance` runs: one clean forward per row, then each
chunk of copies runs only the positions from its first substitution on, against the clean row's cache) and
`oar_probes._oar_p_batched` (every copy a whole forward, chunks of copies right-padded to their longest row: the path
Gemma 3 took before the sharing covered sliding-window layers). Both on the same rows, with the same chunk bound
(`--chunk-tokens`, default the config's `perturbation_chunk_tokens`), `answer_mean` over each completion's last
`--answer-tokens` tokens, temperature 1, every completion token scored.

Models (`--model`):
  tiny-gemma   a random Gemma 3 built here: 4 layers (sliding, full, sliding, sliding), hidden 64, window 32, so the
               window cuts the rows; the embedded tiny tokenizer's vocabulary.
  gemma3-270m  the real Gemma 3 270M from the cache (`grail models fetch gemma3-270m --accept_gemma_terms` once):
               18 layers, every sixth full, window 512 (longer than these rows: before the sharing covered sliding
               layers it fell back because of its cache's layer type, not because the window cut).
The rows: `--rows` rows of a `--prompt-tokens` prompt and completions whose lengths spread evenly over
[`--min-completion`, `--max-completion`] (right-padded, as TRL lays them out; default rows of 128-256 tokens), token ids
drawn at random from `--seed` (the time depends on the lengths, not the text).

Rounds alternate the two ways, starting with the other one each round, after one untimed call of each. Printed: each
round's seconds, the min and median per way, the ratio whole / shared of the medians (the speed-up), the backbone
forwards and positions each way runs per call, and the largest difference between the two ways' importances relative
to the row's largest (float rounding only: the sharing is exact, tests/test_oar_p_sharing.py).

    python perf/benchmarks/oar_p_sharing.py --model tiny-gemma
    python perf/benchmarks/oar_p_sharing.py --model gemma3-270m --rows 4 --rounds 5
Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

MODELS = ("tiny-gemma", "gemma3-270m")
DTYPES = ("float32", "float64", "bfloat16")


def tiny_gemma(vocab: int, pad_token_id: int, window: int = 32, max_positions: int = 1024):
    """A random float32 Gemma 3 small enough for a CPU benchmark, with sliding layers before and after a full one."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=vocab, hidden_size=64, intermediate_size=256, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                              max_position_embeddings=max_positions, sliding_window=window, pad_token_id=pad_token_id,
                              bos_token_id=None, layer_types=["sliding_attention", "full_attention",
                                                              "sliding_attention", "sliding_attention"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Gemma3ForCausalLM(config)


def _load(args):
    """(model in eval mode, pad token id)."""
    import torch

    dtype = getattr(torch, args.dtype)
    if args.model == "tiny-gemma":
        from grail.models.tiny import build_tokenizer

        tokenizer = build_tokenizer()
        model = tiny_gemma(len(tokenizer), tokenizer.pad_token_id)
        return model.to(device=args.device, dtype=dtype).eval(), tokenizer.pad_token_id
    from grail.models.pretrained import resolve
    from grail.models.warmstart import load_inference_model

    model = load_inference_model(resolve(args.model), device=args.device, dtype=dtype).eval()
    return model, model.config.pad_token_id


def _batch(args, vocab: int, pad_token_id: int, device):
    """(ids_BL, mask_BL, scored_BT, answer_BT): TRL's layout, completions right-padded."""
    import torch

    g = torch.Generator().manual_seed(args.seed)
    S, T = args.prompt_tokens, args.max_completion
    lengths = torch.linspace(args.min_completion, args.max_completion, args.rows).round().long()
    ids_BL = torch.randint(3, vocab, (args.rows, S + T), generator=g)
    mask_BL = torch.ones_like(ids_BL)
    mask_BL[:, S:] = (torch.arange(T)[None] < lengths[:, None]).long()
    ids_BL[mask_BL == 0] = pad_token_id
    scored_BT = mask_BL[:, S:].bool()
    answer_BT = scored_BT & (torch.arange(T)[None] >= (lengths - args.answer_tokens)[:, None])
    return ids_BL.to(device), mask_BL.to(device), scored_BT.to(device), answer_BT.to(device)


def _count_forwards(model):
    """A hook on the backbone counting its forwards and the positions they run; returns (counts, handle)."""
    from grail.methods.probes import backbone

    counts = {"forwards": 0, "positions": 0}

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        counts["forwards"] += 1
        counts["positions"] += ids.numel() if ids is not None else 0

    return counts, backbone(model).register_forward_pre_hook(hook, with_kwargs=True)


def main(argv: list[str] | None = None) -> dict:
    import torch

    from grail.options.choices import WeightingOptions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="tiny-gemma")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--min-completion", type=int, default=96)
    parser.add_argument("--max-completion", type=int, default=224)
    parser.add_argument("--answer-tokens", type=int, default=4)
    parser.add_argument("--chunk-tokens", type=int, default=WeightingOptions().perturbation_chunk_tokens)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("rows", "prompt_tokens", "min_completion", "rounds", "chunk_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.answer_tokens < args.min_completion <= args.max_completion:
        parser.error(f"need --answer-tokens < --min-completion <= --max-completion, got {args.answer_tokens}, "
                     f"{args.min_completion}, {args.max_completion}: raise --min-completion or lower --answer-tokens")

    from grail.methods import kv_prefix, oar_probes

    model, pad_token_id = _load(args)
    batch = _batch(args, model.config.vocab_size, pad_token_id, args.device)
    kwargs = dict(distribution="answer_mean", pad_token_id=pad_token_id, temperature=1.0,
                  chunk_tokens=args.chunk_tokens)
    ways = {"shared": oar_probes._oar_p_prefix_shared, "whole": oar_probes._oar_p_batched}
    counts, handle = _count_forwards(model)
    importance, work = {}, {}
    try:
        with torch.no_grad():
            for name, way in ways.items():  # untimed: kernels warmed up, the importances and the work per call
                counts.update(forwards=0, positions=0)
                importance[name] = way(model, *batch, **kwargs)
                work[name] = dict(counts)
    finally:
        handle.remove()
    seconds = {name: [] for name in ways}
    with torch.no_grad():
        for r in range(args.rounds):
            for name in (("shared", "whole") if r % 2 == 0 else ("whole", "shared")):
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                start = time.perf_counter()
                ways[name](model, *batch, **kwargs)
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                seconds[name].append(time.perf_counter() - start)
    shared, whole = importance["shared"].double(), importance["whole"].double()
    scale = whole.amax(dim=1, keepdim=True).clamp(min=1e-30)
    median = {name: statistics.median(times) for name, times in seconds.items()}
    config = model.config.get_text_config(decoder=True)
    result = {"benchmark": "oar_p_sharing", "model": args.model, "device": args.device, "dtype": args.dtype,
              "torch_threads": torch.get_num_threads(), "rows": args.rows,
              "row_tokens": batch[1].sum(dim=1).tolist(), "scored_tokens": int(batch[2].sum()),
              "chunk_tokens": args.chunk_tokens, "sliding_window": getattr(config, "sliding_window", None),
              "layer_types": sorted(set(getattr(config, "layer_types", None) or ["full_attention"])),
              "sharing_applies": kv_prefix.shareable(model), "work_per_call": work, "seconds": seconds,
              "min_s": {name: min(times) for name, times in seconds.items()}, "median_s": median,
              "time_ratio_whole_to_shared": median["whole"] / median["shared"],
              "max_rel_diff": float(((shared - whole).abs() / scale).max()),
              "finite": bool(torch.isfinite(shared).all() and torch.isfinite(whole).all())}
    print(json.dumps(result, indent=2))
    print(f"{args.model}: shared median {median['shared']:.3f} s, whole {median['whole']:.3f} s, "
          f"whole / shared {result['time_ratio_whole_to_shared']:.2f}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
