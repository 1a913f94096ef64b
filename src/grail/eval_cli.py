"""`grail eval` and `grail grader-check`: the command-line side of the evaluation harness."""

from __future__ import annotations

import os
import time
from pathlib import Path


def add_parsers(sub) -> None:
    ev = sub.add_parser("eval", help="evaluate a model on the math benchmarks (acc@n, pass@k, 95% CIs)",
                        description="Sample n completions per problem, grade the last \\boxed{} with math-verify, "
                        "and report acc@n and pass@k per benchmark and averaged, with bootstrap CIs. Rerunning "
                        "with the same arguments resumes an interrupted evaluation.")
    ev.add_argument("--model", required=True, help="a save_pretrained directory, a Hub id, or `tiny` (the warm-started "
                    "embedded model)")
    ev.add_argument("--benchmarks", default="math500,aime24,amc23,minerva_math,college_math,olympiadbench",
                    help="comma-separated: math500, aime24, amc23, minerva_math, college_math, olympiadbench, "
                    "synthetic (default: the six of the paper)")
    ev.add_argument("--data-dir", help="local copy laid out as DIR/<benchmark>/test.jsonl (default: the Hub)")
    ev.add_argument("--size", default="release", help="problems per benchmark: `release` (the release's 200-problem "
                    "subsets of CollegeMath and OlympiadBench, all of the others), `all`, or a number (a seeded "
                    "subset)")
    ev.add_argument("--subset-seed", type=int, default=0, help="seed of the subsets (default 0)")
    ev.add_argument("--n", type=int, default=3, help="samples per problem (release 3)")
    ev.add_argument("--temperature", type=float, default=0.6, help="release 0.6; 0 = greedy (needs --n 1)")
    ev.add_argument("--top-p", type=float, default=0.95, help="release 0.95")
    ev.add_argument("--top-k", type=int, default=20, help="release 20; 0 = off")
    ev.add_argument("--max-new-tokens", type=int, default=8192, help="release 8192")
    ev.add_argument("--seed", type=int, default=0, help="sampling seed (batch b uses seed + b)")
    ev.add_argument("--batch-size", type=int, default=16, help="problems per generation batch")
    ev.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="hf: transformers generate (CPU/GPU); "
                    "vllm: vLLM (GPU, `pip install -e '.[vllm]'`)")
    ev.add_argument("--prompt-format", choices=("auto", "plain", "chat"), default="auto",
                    help="auto: the format the model was trained with (grail_prompt.json next to it), else the "
                    "tokenizer's chat template with thinking off if it has one, else plain text")
    ev.add_argument("--prompt-suffix", help="text after each problem (default: the saved format's, else the paper's "
                    "' Please reason step by step, and put your final answer within \\boxed{}.')")
    ev.add_argument("--workers", type=int, help="grading processes (default: one per CPU core)")
    ev.add_argument("--output-dir", help="where results go (default runs/eval-<timestamp>); reuse it to resume")
    check = sub.add_parser("grader-check", help="grade every benchmark's own references: a self-test of the "
                           "loaders and the grader on data nobody here wrote")
    check.add_argument("--data-dir", required=True, help="local copy laid out as DIR/<benchmark>/test.jsonl")
    check.add_argument("--benchmarks", default="math500,aime24,amc23,minerva_math,college_math,olympiadbench")
    check.add_argument("--workers", type=int, help="grading processes (default: one per CPU core)")
    check.add_argument("--show", type=int, default=5, help="disagreements to print per benchmark (default 5)")


def _load_model(name: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "tiny":
        from grail.warmstart import WarmStartConfig, warm_start

        name = str(warm_start(WarmStartConfig(), None))
    elif name.startswith((".", "/", "~")) and not Path(name).expanduser().is_dir():
        raise FileNotFoundError(f"--model {name!r}: no such directory; give a save_pretrained directory, a Hub id, "
                                f"or `tiny`.")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype).to(device)
    return name, model, AutoTokenizer.from_pretrained(name)


def _prompt_format(args, model_path: str, tokenizer):
    from dataclasses import replace

    from grail.prompts import PromptFormat

    saved = PromptFormat.load(model_path) if Path(model_path).is_dir() else None
    fmt = saved or PromptFormat.default_for(tokenizer)
    if args.prompt_format == "plain":
        fmt = replace(fmt, chat=False, chat_template_kwargs={})
    elif args.prompt_format == "chat":
        fmt = replace(fmt, chat=True, chat_template_kwargs=fmt.chat_template_kwargs or {"enable_thinking": False})
    if args.prompt_suffix is not None:
        fmt = replace(fmt, suffix=args.prompt_suffix)
    return fmt


def run_eval(args) -> int:
    from grail.benchmarks import parse_benchmark_list
    from grail.eval_harness import EvalSpec, parse_size, run_evaluation
    from grail.sampling import HFSampler, SamplingParams, VLLMSampler

    benchmarks = tuple(parse_benchmark_list(args.benchmarks))
    params = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_new_tokens=args.max_new_tokens)
    size = parse_size(args.size)
    model_path, model, tokenizer = _load_model(args.model)
    fmt = _prompt_format(args, model_path, tokenizer)
    if args.backend == "vllm":
        del model
        sampler = VLLMSampler(model_path)
    else:
        sampler = HFSampler(model, tokenizer, batch_size=args.batch_size)
    spec = EvalSpec(benchmarks=benchmarks, data_dir=args.data_dir, size=size, subset_seed=args.subset_seed,
                    sampling=params, seed=args.seed, batch_size=args.batch_size, prompt=fmt)
    out_dir = args.output_dir or os.path.join("runs", f"eval-{time.strftime('%Y%m%d-%H%M%S')}")
    print(f"evaluating {args.model} on {', '.join(benchmarks)} (n={params.n}, T={params.temperature}); "
          f"output in {out_dir}")
    report = run_evaluation(sampler, tokenizer, spec, out_dir, workers=args.workers)
    print(report.markdown)
    print(f"results: {out_dir}/results.json, {out_dir}/results.md; samples: {out_dir}/samples.jsonl")
    return 0


def run_grader_check(args) -> int:
    from grail.benchmarks import parse_benchmark_list
    from grail.grader_check import format_grader_check, grader_check

    names = parse_benchmark_list(args.benchmarks)
    result = grader_check(args.data_dir, benchmarks=names, workers=args.workers)
    print(format_grader_check(result, show=args.show))
    return 0


def check_no_extra(command: str, rest: list[str]) -> None:
    if rest:
        raise ValueError(f"grail {command}: unrecognised arguments {' '.join(rest)}; see "
                         f"grail {command} --help.")
