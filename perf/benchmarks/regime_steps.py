"""Wall time of a GRPO step in two training regimes, measured side by side in one process: the few-shot regime of
docs/results/does-it-pay.md (SmolLM2 with worked examples in every prompt) against the warm-started regime of
docs/results/regime.md (SmolLM2 after `grail sft`, the bare question as its prompt).

What is measured: `grail.training.run.train` (the whole `grail train` step: generation, rewards, token weighting, loss,
backward, optimiser) for `--steps` steps of each regime, the regimes alternating round by round (the other one first
in odd rounds); a round's figure is the median over its steps after the first (`TrainResult.seconds_per_step`), and a
regime's figure the median over rounds. Both regimes use the same batch: one prompt x 8 completions per step, shared
prefill, GRPO (`token_weighting none` unless `--method`). Also printed: each regime's mean prompt and completion
lengths in tokens (TRL's logged `completions/mean_length`; the prompt as the run renders it).

    python perf/benchmarks/regime_steps.py --steps 6 --rounds 2
Prints one JSON object on stdout (progress on stderr). Needs the warm start (`grail sft --preset smollm-chains`) and
`grail models fetch smollm2-135m`. Nothing else may run on the machine while it times.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path

SAME_BATCH = {"shared_prompt": True, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
              "learning_rate": 1e-5, "save_steps": 10_000}
REGIMES = {  # name: (preset, fields): the does-it-pay comparison's task, and the regime page's
    "few_shot": ("smollm-words", {"task_num_steps": 2, "task_operand_max": 6, "task_max_value": 12,
                                  "max_completion_length": 96}),
    "warm_start": ("smollm-chains", {"model_name_or_path": "sft:smollm2-135m"}),  # the 40-step start it measured
}


def _config(name: str, method: str, steps: int, seed: int, out: Path):
    from grail.training.overrides import build_config, merge

    preset, fields = REGIMES[name]
    values = merge(None, {"preset": preset})
    return build_config({**values, **fields, **SAME_BATCH, "token_weighting": method, "max_steps": steps,
                         "seed": seed, "output_dir": str(out), "report_to": "none"})


def _lengths(cfg, run_dir: Path, model_path: str) -> dict:
    from transformers import AutoTokenizer

    from grail.training.data import load_prompts
    from grail.training.run import resolve_prompt_fields

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    completion = [r["completions/mean_length"] for r in rows if "completions/mean_length" in r]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    data = load_prompts(cfg)
    fmt = resolve_prompt_fields(cfg, tokenizer, data)
    rendered = [fmt.render(tokenizer, p) for p in data.select(range(min(32, len(data))))["prompt"]]  # as TRL renders
    tokens = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in rendered]
    return {"prompt_tokens_mean": statistics.fmean(tokens), "completion_tokens_mean": statistics.fmean(completion)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="steps per run (the first is not counted)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--method", default="none", help="token_weighting of both regimes (default: GRPO)")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr)

    seconds: dict[str, list[float]] = {name: [] for name in REGIMES}
    lengths: dict[str, dict] = {}
    # stdout holds the JSON object alone: what the libraries print on import and while training goes to stderr
    with contextlib.redirect_stdout(sys.stderr), tempfile.TemporaryDirectory(prefix="regime-steps-") as tmp:
        import torch

        from grail.training.run import resolve_model_path, train

        for r in range(args.rounds):
            order = list(REGIMES) if r % 2 == 0 else list(reversed(REGIMES))
            for name in order:
                out = Path(tmp) / f"{name}-{r}"
                cfg = _config(name, args.method, args.steps, seed=r, out=out)
                model_path = resolve_model_path(cfg, log)
                result = train(cfg, log=log, model_path=model_path)
                seconds[name].append(result.seconds_per_step)
                if name not in lengths:
                    lengths[name] = _lengths(cfg, out, model_path)
    median = {name: statistics.median(v) for name, v in seconds.items()}
    result = {"benchmark": "regime_steps", "method": args.method, "steps": args.steps, "rounds": args.rounds,
              "torch_threads": torch.get_num_threads(), "regimes": {n: {"preset": p, **f} for n, (p, f) in
                                                                    REGIMES.items()},
              "batch": SAME_BATCH, "seconds_per_step": seconds, "median_s": median, "lengths": lengths,
              "time_ratio_warm_start_to_few_shot": median["warm_start"] / median["few_shot"]}
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
