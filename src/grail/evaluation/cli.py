"""`grail eval` and `grail grader-check`: the command-line side of the evaluation harness."""

from __future__ import annotations

import os
import sys
import time
import typing
from pathlib import Path

from grail.evaluation.benchmarks import (  # light: no torch, math-verify or sympy
    BENCHMARK_NAMES,
    SYNTHETIC_CHAINS,
    SYNTHETIC_NAMES,
    SYNTHETIC_WORDS,
)
from grail.options.choices import ScoringName
from grail.options.sampling import SamplingParams  # light: the release's sampling defaults, without torch

__all__ = ["add_parsers", "check_no_extra", "RELEASE", "run_eval", "run_grader_check", "SCORING_NAMES", "SIX"]

RELEASE = SamplingParams()
SIX = ",".join(BENCHMARK_NAMES)
SCORING_NAMES = typing.get_args(ScoringName)
MESSAGE_BENCHMARKS = (SYNTHETIC_WORDS, SYNTHETIC_CHAINS)  # problems that are chat messages
WORKERS_HELP = ("grading processes (default: one per CPU core, at most 8, grail.evaluation.grader.MAX_WORKERS; "
                "never more than the items waiting)")


def add_parsers(sub) -> None:
    ev = sub.add_parser("eval", help="evaluate a model on the math benchmarks (acc@n, pass@k, 95%% CIs)",
                        description="Sample n completions per problem, grade the last \\boxed{} with math-verify, "
                        "and report acc@n and pass@k per benchmark and averaged, with bootstrap CIs. Rerunning "
                        "with the same arguments resumes an interrupted evaluation.")
    ev.add_argument("--model", required=True, help="a save_pretrained directory, a Hub id, or `tiny` (the warm-started "
                    "embedded model)")
    ev.add_argument("--benchmarks", default=SIX,
                    help="comma-separated: math500, aime24, amc23, minerva_math, college_math, olympiadbench, "
                    "synthetic, synthetic_words (the synthetic task as word problems, for chat models), "
                    "synthetic_chains (the chain task's held-out split, for chat models; `grail sft`) (default: the "
                    "six of the paper)")
    ev.add_argument("--data-dir", help="local copy laid out as DIR/<benchmark>/test.jsonl (default: the Hub)")
    ev.add_argument("--size", default="release", help="problems per benchmark: `release` (default: the release's "
                    "fixed 200-problem subsets of CollegeMath and OlympiadBench, read from the identity lists in "
                    "--data-dir or --release-subsets-dir; all rows of the others), `all`, or a number N (a seeded "
                    "subset of N, deterministic and nested, but not the release's problems)")
    ev.add_argument("--release-subsets-dir", help="folder holding the release subsets' identity lists as "
                    "DIR/olympiadbench/release_subset_ids.txt and DIR/college_math/release_subset.jsonl (default: "
                    "--data-dir). Needed with --size release when the benchmarks come from the Hub: the lists are "
                    "in a local copy of the benchmarks, not in grail-rl or on the Hub")
    ev.add_argument("--subset-seed", type=int, default=0, help="seed of the seeded subsets (--size N; default 0)")
    ev.add_argument("--samples", "--n", dest="n", type=int, default=RELEASE.n,
                    help=f"samples per problem (release {RELEASE.n}; `grail train --eval_samples`)")
    ev.add_argument("--temperature", type=float, default=RELEASE.temperature,
                    help=f"release {RELEASE.temperature}; 0 = greedy (needs --samples 1)")
    ev.add_argument("--top-p", type=float, default=RELEASE.top_p, help=f"release {RELEASE.top_p}")
    ev.add_argument("--top-k", type=int, default=RELEASE.top_k, help=f"release {RELEASE.top_k}; 0 = off")
    ev.add_argument("--max-new-tokens", type=int, default=RELEASE.max_new_tokens,
                    help=f"release {RELEASE.max_new_tokens}; the hf backend caps it at the model's "
                    "max_position_embeddings minus the prompt")
    ev.add_argument("--seed", type=int, default=0, help="sampling seed (batch b uses seed + b)")
    ev.add_argument("--batch-size", type=int, default=16, help="problems per generation batch")
    ev.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="hf: transformers generate (CPU/GPU); "
                    "vllm: vLLM (GPU, `pip install -e '.[vllm]'`)")
    ev.add_argument("--prompt-format", choices=("auto", "plain", "chat"), default="auto",
                    help="auto: the format the model was trained with (grail_prompt.json next to it), else as "
                    "`grail train` resolves conversational=auto: the tokenizer's chat template with thinking off if "
                    "it has one, else plain text (plain text on the synthetic benchmark)")
    ev.add_argument("--prompt-suffix", help="text after each problem, or a name: `paper` (' Please reason step by "
                    "step, and put your final answer within \\boxed{}.', the literal text) or `release` (the same "
                    "with a backspace for \\b, the text the released checkpoints were trained and evaluated with: "
                    "use it to evaluate those). Default: the format saved with the model, else `paper` (none on the "
                    "synthetic benchmark)")
    ev.add_argument("--scoring", choices=SCORING_NAMES, default="grail",
                    help="grail: grail's grader, which reads every reference correctly. release: the GRAIL "
                    "release's scoring reproduced (its box extraction, its $...$ parse without normalisation, "
                    "OlympiadBench graded against the text of its answer list, so about 29%% of those references "
                    "cannot match; mean tokens over samples with a box), to put figures next to the paper's. "
                    "results.md says which one produced it")
    ev.add_argument("--workers", type=int, help=WORKERS_HELP)
    ev.add_argument("--output-dir", help="where results go (default runs/eval-<timestamp>); reuse it to resume")
    check = sub.add_parser("grader-check", help="grade every benchmark's own references: a self-test of the "
                           "loaders and the grader on data nobody here wrote")
    check.add_argument("--data-dir", required=True, help="local copy laid out as DIR/<benchmark>/test.jsonl")
    check.add_argument("--benchmarks", default=SIX)
    check.add_argument("--scoring", choices=SCORING_NAMES, default="grail",
                       help="grade with grail's grader, or the release's scoring reproduced (see grail eval --help)")
    check.add_argument("--workers", type=int, help=WORKERS_HELP)
    check.add_argument("--show", type=int, default=5, help="disagreements to print per benchmark (default 5)")
    check.add_argument("--neighbour", action="store_true",
                       help="also grade each answer against the next row's reference, which should be rejected: it "
                       "catches false accepts (slow: sympy times out on unrelated equations; minutes per benchmark)")


def _vllm_missing() -> str | None:
    """Why the vllm backend cannot run here (None: it can), found before any model is resolved or loaded."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        return (f"--backend vllm needs vLLM ({err}): pip install -c constraints.txt -e '.[vllm]' (GPU only); or use "
                f"--backend hf.")
    return None


def _prompt_format(args, model_path: str, tokenizer, synthetic: bool = False, messages: bool = False):
    """The saved format of a model grail trained, else `auto` (grail.options.prompts.resolve_prompt_format, as training
    resolves it); --prompt-format and --prompt-suffix win. `synthetic`: every benchmark is the synthetic task;
    `messages`: every problem is chat messages (synthetic_words, synthetic_chains)."""
    from grail.options.prompts import AUTO, PromptFormat, resolve_prompt_format

    saved = PromptFormat.load(model_path) if Path(model_path).is_dir() else None
    chat = {"auto": saved.chat if saved else AUTO, "plain": False, "chat": True}[args.prompt_format]
    suffix = args.prompt_suffix if args.prompt_suffix is not None else saved.suffix if saved else AUTO
    kwargs = saved.chat_template_kwargs if saved and saved.chat and args.prompt_format != "plain" else None
    return resolve_prompt_format(tokenizer, synthetic, chat, suffix, kwargs, messages=messages)


def run_eval(args) -> int:
    from dataclasses import replace

    from grail.evaluation.benchmarks import parse_benchmark_list
    from grail.evaluation.harness import EvalSpec, parse_size, run_evaluation
    from grail.options.sampling import HFSampler, VLLMSampler

    benchmarks = tuple(parse_benchmark_list(args.benchmarks))
    params = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_new_tokens=args.max_new_tokens)
    size = parse_size(args.size)
    spec = EvalSpec(benchmarks=benchmarks, data_dir=args.data_dir, size=size, subset_seed=args.subset_seed,
                    sampling=params, seed=args.seed, batch_size=args.batch_size,
                    release_subsets_dir=args.release_subsets_dir, scoring=args.scoring)
    loaded = spec.load_benchmarks()  # the data first: a missing file or identity list stops before the model loads
    if args.backend == "vllm" and (missing := _vllm_missing()):
        print(f"grail eval: error: {missing}", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    from grail.models.warmstart import load_inference_model, resolve_model

    model_path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    spec = replace(spec, prompt=_prompt_format(args, model_path, tokenizer,
                                               synthetic=all(b in SYNTHETIC_NAMES for b in benchmarks),
                                               messages=all(b in MESSAGE_BENCHMARKS for b in benchmarks)))
    if args.backend == "vllm":  # vLLM loads the weights itself: the HF model is never loaded (nor its GPU memory)
        sampler = VLLMSampler(model_path)
    else:
        sampler = HFSampler(load_inference_model(model_path), tokenizer, batch_size=args.batch_size)
    out_dir = args.output_dir or os.path.join("runs", f"eval-{time.strftime('%Y%m%d-%H%M%S')}")
    print(f"evaluating {args.model} on {', '.join(benchmarks)} (n={params.n}, T={params.temperature}, "
          f"{args.scoring} scoring); output in {out_dir}")
    report = run_evaluation(sampler, tokenizer, spec, out_dir, workers=args.workers, loaded=loaded)
    print(report.markdown)
    print(f"results: {out_dir}/results.json, {out_dir}/results.md; samples: {out_dir}/samples.jsonl")
    return 0


def run_grader_check(args) -> int:
    from grail.evaluation.benchmarks import parse_benchmark_list
    from grail.evaluation.grader_check import format_grader_check, grader_check

    names = parse_benchmark_list(args.benchmarks)
    result = grader_check(args.data_dir, benchmarks=names, workers=args.workers, scoring=args.scoring,
                          neighbour=args.neighbour)
    print(format_grader_check(result, show=args.show))
    missed = [t for t in result["targets"] if not t["met"]]
    if missed:  # a self-test that misses its targets must not look like a pass to a script or CI
        print(f"grail grader-check: {len(missed)} of {len(result['targets'])} targets NOT MET ("
              + ", ".join(f"{t['benchmark']} {t['check']}" for t in missed) + "); exit status 1", file=sys.stderr)
        return 1
    return 0


def check_no_extra(command: str, rest: list[str]) -> None:
    if rest:
        raise ValueError(f"grail {command}: unrecognised arguments {' '.join(rest)}; see "
                         f"grail {command} --help.")
