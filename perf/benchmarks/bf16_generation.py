"""Where CPU generation's time goes, fp32 against bf16: SmolLM2's 30-step warm start samples 16 rows of exactly 64
tokens after an 88-token prompt (the regime's shape at 2 prompts × 8), with transformers' generate, one thread.

Three ways, each timed twice after a warm-up: fp32; under one CPU autocast region over the fp32 weights (what a bf16
run's generation does: each weight cast once, the activations cast at every layer); and a bf16 copy of the model
(no casts at all). Then torch's profiler over one autocast generation, its top operators by self time: how much is
matmul, and how much the KV cache's concatenation, attention, casts and sampling. Nothing else may run.

    python perf/benchmarks/bf16_generation.py [--model DIR] [--threads 1]
"""

import argparse
import copy
import time

import torch


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="sft:smollm2-135m:sft_steps=30")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from grail.models.warmstart import resolve_model

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=torch.float32).eval()
    ids = torch.randint(100, 1000, (16, 88), generator=torch.Generator().manual_seed(0))

    def generate(m):
        return m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, min_new_tokens=64,
                          do_sample=True, top_k=0, top_p=1.0, temperature=1.0, pad_token_id=0)

    def autocast():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return generate(model)

    bf16 = copy.deepcopy(model).bfloat16()
    with torch.no_grad():
        for label, call in (("fp32", lambda: generate(model)), ("autocast over fp32 weights", autocast),
                            ("bf16 copy", lambda: generate(bf16))):
            call()
            times = []
            for _ in range(2):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            print(f"{label}: {', '.join(f'{t:.2f}' for t in times)} s", flush=True)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            autocast()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
