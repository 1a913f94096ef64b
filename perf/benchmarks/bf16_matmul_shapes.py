"""bf16 against fp32 on this CPU at a step's own matmul shapes: SmolLM2's MLP (576 → 1536, 1536 → 576) and its
output layer (576 → 49152), at 16 to 1024 rows (decoding reads a few rows a matmul, the loss a whole batch's tokens).

Per shape and row count, one thread: the forward's GFLOP/s in fp32, in bf16 with the weight already bf16 (what a
weight cast once per phase gives), and under CPU autocast with an fp32 weight that does not require grad (autocast
casts it at every call: the cost the trainer's one cast region avoids); and forward + backward (to the input and the
weight) in fp32 against autocast, in milliseconds. Best of several calls after two warm-ups; nothing else may run.

    python perf/benchmarks/bf16_matmul_shapes.py [--threads 1]
"""

import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = ((576, 1536), (1536, 576), (576, 49152))
ROWS = (16, 64, 256, 1024)


def best(call, repeats: int = 7) -> float:
    for _ in range(2):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(w: torch.Tensor, x: torch.Tensor) -> dict[str, float]:
    """Seconds of F.linear(x, w): fp32, bf16 (both cast before), autocast; forward + backward fp32 and autocast."""
    w16, x16 = w.bfloat16(), x.bfloat16()
    out = {"fp32": best(lambda: F.linear(x, w)), "bf16": best(lambda: F.linear(x16, w16))}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out["autocast"] = best(lambda: F.linear(x, w))
    wg, xg = w.clone().requires_grad_(), x.clone().requires_grad_()

    def both_fp32():
        F.linear(xg, wg).sum().backward()

    def both_autocast():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = F.linear(xg, wg)
        y.float().sum().backward()

    out["both fp32"], out["both autocast"] = best(both_fp32, 5), best(both_autocast, 5)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    for k, n in SHAPES:
        w = torch.randn(n, k, generator=generator) * 0.04
        for m in ROWS:
            t = measure(w, torch.randn(m, k, generator=generator))
            gflop = 2 * m * k * n / 1e9
            print(f"{k}->{n} M={m}: fwd fp32 {gflop / t['fp32']:6.1f} bf16 {gflop / t['bf16']:6.1f} autocast "
                  f"{gflop / t['autocast']:6.1f} GFLOP/s | fwd+bwd fp32 {t['both fp32'] * 1e3:7.2f} ms autocast "
                  f"{t['both autocast'] * 1e3:7.2f} ms ({t['both autocast'] / t['both fp32']:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
