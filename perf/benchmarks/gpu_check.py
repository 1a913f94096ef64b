"""GPU readiness check: every method's loss step on real-size models, as ratios to GRPO, in a few minutes.

For each model shape (Qwen3-0.6B and Qwen3-4B by default; also SmolLM2-135M's and Gemma 3 270M's, the two real models
grail-rl fetches; random-initialised from a config: no download, and neither time nor memory depends on the weights'
values) and each completion length (1024 and 4096 tokens by default), one synthetic TRL micro-batch (prompts
left-padded, completions right-padded, each ending with a `\\boxed{}` answer, advantages of both signs) goes through
`GRAILTrainer._compute_loss` and a backward, for GRPO and every method, fused and separate where fusing applies,
with and without (non-reentrant) activation checkpointing. Methods are interleaved round by round; generation is
not part of the step (on a GPU it is vLLM's or HF generate's cost, the same for every method).

Printed (one JSON object on stdout; progress on stderr), per shape × length × checkpointing:
  * per method: median step seconds (loss + backward, CUDA-synchronised) and every timed round's, ratio to GRPO,
    peak memory (`max_memory_allocated` during the step) and its ratio to GRPO, tokens/s (B·T / step);
  * fused = separate: the largest |w_fused − w_separate| of grail and entropy in bf16, and the fraction of
    reweighted tokens whose weights differ by more than 0.05 (bf16 rounding is ~1e-2 of a weight).

Run on a CUDA machine: `python perf/benchmarks/gpu_check.py` (bf16). `--jsonl FILE` appends each case as it is
measured, so a run cut short keeps its cases; gpu_curves.py turns such files into curves over T. `--smoke` runs a tiny
shape on the CPU in fp32 to test the script. First run: an H200 on 2026-11-26 (docs/results/step-cost.md#on-a-gpu).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time

from harness import METHODS, builtin_methods, log, make_trainer

SHAPES = {  # name → (transformers model_type, the configuration fields that set the cost; the rest default)
    "0.6b": ("qwen3", dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                           intermediate_size=3072, head_dim=128, vocab_size=151936, tie_word_embeddings=True)),
    "4b": ("qwen3", dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=9728, head_dim=128, vocab_size=151936, tie_word_embeddings=False)),
    # the two real models grail-rl fetches (grail models list), as their converted config.json gives them
    "smollm2-135m": ("llama", dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                   intermediate_size=1536, head_dim=64, vocab_size=49152, tie_word_embeddings=True)),
    "gemma3-270m": ("gemma3_text", dict(hidden_size=640, num_hidden_layers=18, num_attention_heads=4,
                                        num_key_value_heads=1, intermediate_size=2048, head_dim=256,
                                        query_pre_attn_scalar=256, vocab_size=262144, sliding_window=512,
                                        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
                                        tie_word_embeddings=True)),
    "smoke": ("qwen3", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=128, head_dim=16, tie_word_embeddings=False)),  # the tiny vocabulary
}
DEFAULT_METHODS = (*builtin_methods(), "grail_separate", "entropy_separate")  # grail and entropy fused by default
PAIRS = (("grail", "grail_separate"), ("entropy", "entropy_separate"))  # fused (the default path), separate
# every method weights rows of both signs (the batch's advantages run from -1 to 1), and OAR-P perturbs a whole
# completion per chunk: each does its full work on every row
CASE_FIELDS = {"rollout_symmetry": "both", "perturbation_chunk_tokens": 65536}


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="0.6b,4b", help=f"comma-separated from {', '.join(SHAPES)}")
    parser.add_argument("--lengths", default="1024,4096", help="completion lengths T, comma-separated")
    parser.add_argument("--rows", type=int, default=4, help="completions per micro-batch B (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up (default 3)")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                        help="comma-separated from harness.METHODS: " + ", ".join(METHODS))
    parser.add_argument("--checkpointing", default="off,non_reentrant", help="off and/or non_reentrant")
    parser.add_argument("--jsonl", help="append each case here as one JSON line as soon as it is measured, so a "
                        "run cut short keeps what it measured")
    parser.add_argument("--smoke", action="store_true", help="tiny shape, 48 tokens, CPU fp32: tests the script")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shapes, args.lengths, args.rows, args.rounds = "smoke", "48", 2, 1
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.lengths = [int(t) for t in args.lengths.split(",") if t]
    args.methods = ["none"] + [m for m in args.methods.split(",") if m and m != "none"]
    args.checkpointing = [c for c in args.checkpointing.split(",") if c]
    bad = [s for s in args.shapes if s not in SHAPES] + [m for m in args.methods if m not in METHODS]
    bad += [c for c in args.checkpointing if c not in ("off", "non_reentrant")]
    if bad:
        parser.error(f"unknown names {bad}; see --help for the choices.")
    return args


def batch(tokenizer, rows: int, length: int, device):
    """B rows in TRL's layout: short prompts, completions of exactly `length` tokens ending in a box."""
    import torch

    prompts = tokenizer([f"Q: {i}+{i + 1}*3\nA:" for i in range(rows)], return_tensors="pt", padding=True,
                        padding_side="left", add_special_tokens=False)
    completions = []
    for i in range(rows):
        answer = tokenizer(f" \\boxed{{{3 * i + 7}}}", add_special_tokens=False)["input_ids"]
        step = tokenizer(f" {i}+{i + 1}={2 * i + 1}, so", add_special_tokens=False)["input_ids"]
        body = (step * (length // len(step) + 1))[: length - len(answer)]
        completions.append(body + answer)
    completion_ids = torch.tensor(completions)
    return {"prompt_ids": prompts["input_ids"].to(device), "prompt_mask": prompts["attention_mask"].to(device),
            "completion_ids": completion_ids.to(device), "completion_mask": torch.ones_like(completion_ids).to(device),
            "advantages": torch.linspace(-1.0, 1.0, rows, device=device),
            "num_items_in_batch": torch.tensor(rows * length, device=device)}


def build(shape: str, cuda: bool):
    """A random-initialised model of `shape` (no download: time and memory do not depend on the weights' values) and
    the embedded tokenizer, whose ids are the first of any of these vocabularies."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from grail.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    model_type, fields = SHAPES[shape]
    fields = {"vocab_size": len(tokenizer), **fields, "max_position_embeddings": 8192,
              "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16 if cuda else torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to("cuda" if cuda else "cpu"), tokenizer


def trainer_for(model, tokenizer, method: str, checkpointing: str, cuda: bool, out: str):
    """harness.make_trainer on this shape's model (shared by every method of a case) and a placeholder dataset: the
    loss step is driven by hand on `batch`'s micro-batch."""
    from datasets import Dataset

    from grail.evaluation.rewards import exact_int_reward

    values = {"output_dir": out, "per_device_train_batch_size": 2, "num_generations": 2, "report_to": "none",
              "beta": 0.0, "loss_type": "dr_grpo", "use_cpu": not cuda, "bf16": cuda,
              "activation_checkpointing": checkpointing == "non_reentrant",
              "activation_checkpointing_kwargs": {"use_reentrant": False}, **CASE_FIELDS}
    trainer, _ = make_trainer(method, values, reward=exact_int_reward, model=model, processing_class=tokenizer,
                              train_dataset=Dataset.from_list([{"prompt": "Q: 1+1\nA:", "answer": "2"}] * 2))
    if trainer.args.activation_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.activation_checkpointing_disable()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def step(trainer, inputs, cuda: bool) -> tuple[float, int]:
    import torch

    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer._compute_loss(trainer.model, inputs).backward()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    trainer.reduce_weight_metrics("train")
    return seconds, peak


def run_case(model, tokenizer, args, length: int, checkpointing: str, cuda: bool, out: str) -> dict:
    import torch

    inputs = batch(tokenizer, args.rows, length, model.device)
    trainers = {m: trainer_for(model, tokenizer, m, checkpointing, cuda, out) for m in args.methods}  # one model
    times = {m: [] for m in args.methods}
    peaks = {m: [] for m in args.methods}
    weights = {}
    for r in range(args.rounds + 1):  # round 0 warms up
        order = args.methods[r % len(args.methods):] + args.methods[: r % len(args.methods)]
        for m in order:
            seconds, peak = step(trainers[m], inputs, cuda)
            weights[m] = trainers[m].last_token_weights
            if r:
                times[m].append(seconds)
                peaks[m].append(peak)
    model.zero_grad(set_to_none=True)
    base_t, base_m = statistics.median(times["none"]), statistics.median(peaks["none"]) or 1
    tokens = args.rows * length
    methods = {m: {"median_step_s": statistics.median(times[m]), "step_s": times[m],  # every timed round
                   "time_ratio_to_grpo": statistics.median(times[m]) / base_t,
                   "peak_mem_gb": statistics.median(peaks[m]) / 2**30,
                   "mem_ratio_to_grpo": statistics.median(peaks[m]) / base_m if cuda else None,
                   "tokens_per_s": tokens / statistics.median(times[m]),
                   "fused": weights[m].path == "fused" if weights[m] is not None else False}
               for m in args.methods}
    agreement = {}
    for fused, separate in PAIRS:
        if fused in weights and separate in weights:
            a, b = weights[fused], weights[separate]
            diff = (a.weights_BT - b.weights_BT).abs()
            agreement[fused.split("_")[0]] = {"max_abs_diff": float(diff.max()),
                                              "frac_over_0.05": float((diff > 0.05).float().mean()),
                                              "paths": [a.path, b.path]}
    del trainers
    if cuda:
        torch.cuda.empty_cache()
    return {"length": length, "checkpointing": checkpointing, "rows": args.rows, "methods": methods,
            "fused_vs_separate": agreement}


def main(argv=None) -> int:
    import torch

    args = parse_args(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        log("gpu_check: no CUDA device; run it on a GPU machine, or with --smoke to test the script on the CPU.")
        return 2
    cases = []
    device = torch.cuda.get_device_name() if cuda else "cpu"
    stdout = sys.stdout
    # libraries' prints (DeepSpeed's accelerator notice, imported with the model classes) must not corrupt the JSON
    with tempfile.TemporaryDirectory(prefix="grail-gpu-check-") as out, contextlib.redirect_stdout(sys.stderr):
        for shape in args.shapes:
            model, tokenizer = build(shape, cuda)
            log(f"{shape}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters")
            for length in args.lengths:
                for checkpointing in args.checkpointing:
                    log(f"{shape} T={length} checkpointing {checkpointing} ...")
                    case = {"shape": shape, "device": device, **run_case(model, tokenizer, args, length,
                                                                          checkpointing, cuda, out)}
                    cases.append(case)
                    if args.jsonl:
                        with open(args.jsonl, "a") as kept:
                            kept.write(json.dumps(case) + "\n")
            del model
    print(json.dumps({"benchmark": "gpu_check", "device": device, "dtype": "bf16" if cuda else "fp32",
                      "torch": torch.__version__, "cases": cases}, indent=1), file=stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
