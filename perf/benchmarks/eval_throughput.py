"""Evaluation throughput of the tiny model: samples per second through `grail.evaluation.harness.run_evaluation`.

What is measured: the wall time of a complete `run_evaluation` (prompt rendering, HF `generate` sampling, grading
with math-verify in `--workers` processes, metrics and file writing) of the warm-started tiny model on the
synthetic task's held-out problems, after one untimed warm-up evaluation; samples/s = problems × n / wall time.
Also the same figure with grading excluded (sampling only), so the two costs can be told apart. Each timed run
writes into a fresh temporary directory (nothing resumed).

Run: `python perf/benchmarks/eval_throughput.py [--problems 200 --n 4 --max-new-tokens 40 --batch-size 16]`.
Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--cache-dir", help="warm-start cache (default: $GRAIL_CACHE or ~/.cache/grail-rl)")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.evaluation.benchmarks import load_benchmark
    from grail.evaluation.harness import EvalSpec, run_evaluation
    from grail.models.warmstart import warm_start
    from grail.options.choices import WarmStartConfig
    from grail.options.prompts import PromptFormat
    from grail.options.sampling import HFSampler, SamplingParams

    path = warm_start(WarmStartConfig(), args.cache_dir, log=lambda s: print(s, file=sys.stderr))
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    loaded = [load_benchmark("synthetic", size=args.problems)]
    spec = EvalSpec(benchmarks=("synthetic",), size=args.problems, batch_size=args.batch_size,
                    sampling=SamplingParams(n=args.n, temperature=1.0, top_p=1.0, top_k=0,
                                            max_new_tokens=args.max_new_tokens),
                    prompt=PromptFormat())  # the synthetic prompt carries its own format, as in training
    sampler = HFSampler(model, tokenizer, batch_size=args.batch_size)
    samples = args.problems * args.n

    def evaluation() -> float:
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            report = run_evaluation(sampler, tokenizer, spec, out, workers=args.workers, log=lambda s: None,
                                    progress=False, loaded=loaded)
            assert report.new_samples == samples
            return time.perf_counter() - start

    def sampling_only() -> float:
        prompts = [spec.prompt.render(tokenizer, p.problem) for p in loaded[0].problems]
        start = time.perf_counter()
        for b in range(0, len(prompts), args.batch_size):
            sampler.generate(prompts[b : b + args.batch_size], spec.sampling, seed=b)
        return time.perf_counter() - start

    evaluation()  # warm-up: caches, grading workers' imports
    full_s, sample_s = evaluation(), sampling_only()
    print(json.dumps({
        "benchmark": "eval_throughput", "model": "tiny (warm-started, 1.7M parameters)", "task": "synthetic held-out",
        "problems": args.problems, "n": args.n, "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
        "grading_workers": args.workers, "device": "cpu", "torch_threads": torch.get_num_threads(),
        "evaluation_s": full_s, "samples_per_s": samples / full_s,
        "sampling_only_s": sample_s, "sampling_only_samples_per_s": samples / sample_s,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
