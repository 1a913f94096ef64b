"""OAR-P's memory against its bound: peak memory of `oar_p_importance` on one long completion, per
`perturbation_chunk_tokens`, next to the bound its docstring states.

    python perf/benchmarks/oar_p_memory.py [--length 4096] [--chunks 4096,16384,65536] [--stride 16]

For each chunk size a fresh process (so that one measurement's freed pages do not hide the next one's) builds a tiny
Qwen3 model (float32, --hidden/--layers; the embedded tokenizer's vocabulary), one prompt of 8 tokens and a
completion of --length tokens ending in a 4-token answer span, and runs OAR-P with the release's "answer_mean"
distribution on every --stride-th completion token (256 copies at the defaults, spread over the whole completion,
so the early copies run nearly every position: the worst case for activations; scoring all 4096 tokens gives the
same chunks and takes 16 times longer). Measured: the increase of the process's peak resident memory during the
call over before it (sampled every 1 ms, glibc told to return freed memory: harness.RssPeakSampler),
a lower bound on what the call allocated. Bound (oar_probes.oar_p_importance's docstring), in float32 bytes:
    KV cache   chunk_tokens × layers × 2 × kv_heads × head_dim × 4, twice one layer's share while it is extended,
    activations one layer's for chunk_tokens positions: chunk_tokens × (q + 2 kv + attention out + 3 × intermediate
               + 2 × hidden) × 4 (the attention itself runs in SDPA's memory-efficient kernel),
    logits     copies per chunk × vocabulary × 4,
plus the clean row's own forward (its cache and one layer's activations for n positions). The ratio measured /
bound is printed per chunk size; the bound holds where it is <= 1. Without the bound, the 256 copies of this row
would need 256 × n ≈ 1.05 M positions at once.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _bound_bytes(args, n: int, chunk_tokens: int, vocab: int) -> dict[str, int]:
    head_dim = args.hidden // args.heads
    kv_per_token = args.layers * 2 * args.kv_heads * head_dim * 4
    layer_per_token = (args.heads * head_dim + 2 * args.kv_heads * head_dim + args.hidden + 3 * args.intermediate
                       + 2 * args.hidden) * 4
    copies = max(1, chunk_tokens // n)
    parts = {
        "kv_cache": chunk_tokens * kv_per_token + 2 * chunk_tokens * kv_per_token // args.layers,
        "activations": chunk_tokens * layer_per_token,
        "logits": copies * vocab * 4,
        "clean_row": n * (kv_per_token + layer_per_token) + vocab * 4,
    }
    parts["total"] = sum(parts.values())
    return parts


def measure_one(args) -> dict:
    import torch
    from harness import RssPeakSampler, tune_glibc_malloc

    from grail.methods.oar_probes import oar_p_importance
    from grail.models.tiny import build_tiny_model, build_tokenizer

    malloc = tune_glibc_malloc()
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                             num_kv_heads=args.kv_heads, intermediate_size=args.intermediate,
                             max_positions=args.length + 64).eval()
    vocab, S, T = len(tokenizer), 8, args.length
    ids_BL = torch.randint(1, vocab, (1, S + T))
    mask_BL = torch.ones_like(ids_BL)
    answer_BT = torch.zeros(1, T, dtype=torch.bool)
    answer_BT[0, -4:] = True
    scored_BT = torch.zeros(1, T, dtype=torch.bool)
    scored_BT[0, : T - 4 : args.stride] = True
    with torch.no_grad():  # warm up the kernels on a short row, outside the measurement
        oar_p_importance(model, ids_BL[:, : S + 64], mask_BL[:, : S + 64], scored_BT[:, :64], answer_BT[:, -64:],
                         distribution="answer_mean", pad_token_id=0, temperature=1.0, chunk_tokens=args.one)
    start = time.perf_counter()
    with RssPeakSampler() as rss:
        importance_BT = oar_p_importance(model, ids_BL, mask_BL, scored_BT, answer_BT, distribution="answer_mean",
                                         pad_token_id=0, temperature=1.0, chunk_tokens=args.one)
    seconds = time.perf_counter() - start
    assert torch.isfinite(importance_BT).all()
    bound = _bound_bytes(args, S + T, args.one, vocab)
    measured = rss.peak_bytes - rss.start_bytes
    return {"chunk_tokens": args.one, "copies": int(scored_BT.sum()), "copies_per_chunk": max(1, args.one // (S + T)),
            "measured_bytes": measured, "bound": bound, "ratio": measured / bound["total"], "seconds": seconds,
            "malloc": malloc, "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096, help="completion tokens T")
    parser.add_argument("--chunks", default="4096,16384,65536", help="perturbation_chunk_tokens values")
    parser.add_argument("--stride", type=int, default=16, help="score every stride-th completion token")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: measure this chunk size here
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure_one(args)))
        return 0
    rows = []
    for chunk in (int(c) for c in args.chunks.split(",")):
        command = [sys.executable, __file__, "--one", str(chunk)] + [
            f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("one", "chunks")]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    mib = 2 ** 20
    print(f"OAR-P, one completion of T={args.length} tokens, {rows[0]['copies']} copies (every {args.stride}th "
          f"token), hidden {args.hidden}, {args.layers} layers, float32, {rows[0]['threads']} threads")
    print("| perturbation_chunk_tokens | copies per chunk | peak increase (MiB) | bound (MiB) | measured / bound "
          "| seconds |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['chunk_tokens']} | {r['copies_per_chunk']} | {r['measured_bytes'] / mib:.1f} "
              f"| {r['bound']['total'] / mib:.1f} | {r['ratio']:.2f} | {r['seconds']:.1f} |")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
