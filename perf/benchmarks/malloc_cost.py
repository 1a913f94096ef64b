"""What step_overhead.py's glibc tuning costs in time: generation and a forward + backward of a real model, with
glibc as a user's run has it (`default`) or tuned as the memory benchmarks tune it (`tuned`: freed blocks of 64 KiB
and more go back to the OS at once, harness.tune_glibc_malloc). The setting is process-wide and must precede the
model's loading, so each setting runs in its own process; run them one after the other on an idle machine:

    for m in default tuned default tuned; do python perf/benchmarks/malloc_cost.py $m; done

Each process loads the model (`--model`, a cached real model's name or a checkpoint directory), then `--reps` times:
samples `--rows` completions of exactly `--tokens` new tokens after random prompts of `--prompt-tokens` tokens, and
runs a forward and backward of the same rows at prompt + `--tokens` length. It prints one line per repetition.
"""

import argparse
import os
import time

from harness import tune_glibc_malloc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("malloc", choices=("default", "tuned"))
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=324)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    tuning = tune_glibc_malloc() if args.malloc == "tuned" else None  # before the model is loaded
    import torch
    from transformers import AutoModelForCausalLM

    from grail.models.pretrained import model_dir

    path = args.model if os.path.isdir(args.model) else str(model_dir(args.model))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(0)
    ids = torch.randint(100, 1000, (args.rows, args.prompt_tokens))
    for rep in range(args.reps):
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), min_new_tokens=args.tokens,
                           max_new_tokens=args.tokens, do_sample=True, top_k=0)
        generate_s = time.perf_counter() - start
        start = time.perf_counter()
        full = torch.cat([ids, ids[:, : args.tokens]], dim=1)
        model(full).logits[:, -args.tokens:].logsumexp(-1).sum().backward()
        backward_s = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        print(f"{args.malloc} ({tuning}) rep {rep}: generate {generate_s:.1f} s, forward+backward {backward_s:.1f} s",
              flush=True)


if __name__ == "__main__":
    main()
