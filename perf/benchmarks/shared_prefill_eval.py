"""Sampling time of an evaluation with each prompt's prefill shared over its samples (`shared_prompt=true`), beside
transformers' own `generate`, measured side by side in one process.

What is measured: `HFSampler.generate` (grail.options.sampling: batches of `--batch-size` prompts, `--n` samples each,
the runs' sampled-evaluation settings) on the first `--problems` held-out problems of a config's synthetic task,
rendered as the runs' evaluation renders them (grail.training.heldout.eval_specs: the chat template and worked
examples of a chat model). No grading. Rounds alternate the two ways,
starting with the other one each round, after one untimed call of each. Both ways draw from the same seed, so they
must give the same samples (checked, and printed as `same_samples`).

    python perf/benchmarks/shared_prefill_eval.py --preset smollm-words --set task_num_steps=2 \\
        --set task_operand_max=6 --set task_max_value=12 --problems 16 --rounds 2
Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm-words")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a config field")
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--n", type=int, default=None, help="samples per problem (default: the runs' 4)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.options.sampling import HFSampler
    from grail.training.heldout import eval_specs
    from grail.training.overrides import build_config, coerce, merge
    from grail.training.run import resolve_model_path
    from grail.training.shared_prompt import shared_prefill

    fields = {k: coerce(k, v, "--set") for k, _, v in (item.partition("=") for item in args.set)}
    values = merge(None, {"preset": args.preset})
    cfg = build_config({**values, **fields, "output_dir": "/tmp/shared-prefill-eval"})
    path = resolve_model_path(cfg, log=lambda s: print(s, file=sys.stderr))
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    spec = eval_specs(cfg)["sampled"]  # the runs' sampled evaluation: its prompt format and sampling settings
    (heldout,) = spec.load_benchmarks(synthetic_set=cfg.synthetic_set())
    prompts = [spec.prompt.render(tokenizer, p.problem) for p in heldout.problems[: args.problems]]
    params = spec.sampling if args.n is None else dataclasses.replace(spec.sampling, n=args.n)
    samplers = {"plain": HFSampler(model, tokenizer, batch_size=args.batch_size),
                "shared": HFSampler(model, tokenizer, batch_size=args.batch_size,
                                    generate=shared_prefill(model, model.generate))}
    samples = {name: sampler.generate(prompts, params, seed=0) for name, sampler in samplers.items()}  # warm-up
    seconds = {name: [] for name in samplers}
    for r in range(args.rounds):
        for name in (("plain", "shared") if r % 2 == 0 else ("shared", "plain")):
            start = time.perf_counter()
            samplers[name].generate(prompts, params, seed=0)
            seconds[name].append(time.perf_counter() - start)
    tokens = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    result = {"benchmark": "shared_prefill_eval", "model": cfg.model_name_or_path, "problems": len(prompts),
              "n": params.n, "batch_size": args.batch_size, "max_new_tokens": params.max_new_tokens,
              "prompt_tokens_mean": statistics.fmean(tokens), "torch_threads": torch.get_num_threads(),
              "seconds": seconds, "median_s": {k: statistics.median(v) for k, v in seconds.items()},
              "same_samples": samples["plain"] == samples["shared"]}
    result["time_ratio_shared_to_plain"] = result["median_s"]["shared"] / result["median_s"]["plain"]
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
