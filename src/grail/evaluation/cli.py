"""`grail eval`, `grail validity` and `grail grader-check`: the command-line side of the evaluation harness."""

from __future__ import annotations

import argparse
import json
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
from grail.evaluation.validity import ANSWER_ONLY_TOKENS  # light: standard library only
from grail.options.choices import ScoringName
from grail.options.sampling import SamplingParams  # light: the release's sampling defaults, without torch

__all__ = ["add_parsers", "check_no_extra", "RELEASE", "run_eval", "run_grader_check", "run_validity", "SCORING_NAMES",
           "SIX"]

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
                    "--data-dir); needed with --size release and benchmarks from the Hub, which lacks the lists")
    ev.add_argument("--subset-seed", type=int, default=0, help="seed of the seeded subsets (--size N; default 0)")
    ev.add_argument("--samples", "--n", dest="n", type=int, default=RELEASE.n,
                    help=f"samples per problem (release {RELEASE.n}; `grail train --eval_samples`)")
    ev.add_argument("--temperature", type=float, default=RELEASE.temperature,
                    help=f"release {RELEASE.temperature}; 0 = greedy (needs --samples 1)")
    ev.add_argument("--top-p", type=float, default=RELEASE.top_p, help=f"release {RELEASE.top_p}")
    ev.add_argument("--top-k", type=int, default=RELEASE.top_k, help=f"release {RELEASE.top_k}; 0 = off")
    ev.add_argument("--max-new-tokens", type=int, default=RELEASE.max_new_tokens,
                    help=f"release {RELEASE.max_new_tokens}; hf caps it at max_position_embeddings less the prompt")
    ev.add_argument("--seed", type=int, default=0, help="sampling seed (batch b uses seed + b)")
    ev.add_argument("--batch-size", type=int, default=16, help="problems per generation batch")
    ev.add_argument("--bf16", choices=("auto", "true", "false"), default="auto",
                    help="CPU: bf16 or fp32 weights (auto: by a measured matmul)")
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
    ev.add_argument("--response-prefix", help="text the model's response starts with, prefilled right after the "
                    "generation prompt (the chat template's assistant turn start, or the plain format's `Answer:` and "
                    "a space), so the model continues it; the grader and samples.jsonl's completion see prefix + "
                    "generated text, and tokens counts the generated ones. A name: `answer-only` (`\\boxed{`: the "
                    "answer without reasoning, as `grail validity` measures it). Default: none")
    ev.add_argument("--scoring", choices=SCORING_NAMES, default="grail",
                    help="grail: grail's grader, which reads every reference correctly. release: the GRAIL "
                    "release's scoring reproduced (its box extraction, its $...$ parse without normalisation, "
                    "OlympiadBench graded against the text of its answer list, so about 29%% of those references "
                    "cannot match; mean tokens over samples with a box), to put figures next to the paper's. "
                    "results.md says which one produced it")
    ev.add_argument("--workers", type=int, help=WORKERS_HELP)
    ev.add_argument("--output-dir", help="where results go (default runs/eval-<timestamp>); reuse it to resume")
    _add_validity_parser(sub)
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


def _eval_spec(args, loaded=None):
    """The EvalSpec of `grail eval`'s arguments (its prompt format still the default) and the benchmarks it names,
    loaded (unless given): the data first, so a missing file or identity list stops before any model is resolved or
    loaded."""
    from grail.evaluation.benchmarks import parse_benchmark_list
    from grail.evaluation.harness import EvalSpec, parse_size
    from grail.options.prompts import resolve_response_prefix

    params = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_new_tokens=args.max_new_tokens)
    spec = EvalSpec(benchmarks=tuple(parse_benchmark_list(args.benchmarks)), data_dir=args.data_dir,
                    size=parse_size(args.size), subset_seed=args.subset_seed, sampling=params, seed=args.seed,
                    batch_size=args.batch_size, release_subsets_dir=args.release_subsets_dir, scoring=args.scoring,
                    response_prefix=resolve_response_prefix(args.response_prefix))
    return spec, spec.load_benchmarks() if loaded is None else loaded


class _Model:
    """The model of one command: resolved and its tokenizer read at once; its weights loaded when the first batch is
    sampled (so an evaluation already finished, run again, loads none), then kept for the command's other
    evaluations. A `Sampler` (grail.options.sampling)."""

    def __init__(self, model: str, backend: str, batch_size: int, bf16: str = "auto"):
        from transformers import AutoTokenizer

        from grail.models.warmstart import resolve_model

        self.path = resolve_model(model)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.name, self.batch_size, self._sampler = backend, batch_size, None
        self.model_name, self.bf16 = model, bf16

    def generate(self, prompts, params, seed):
        from grail.options.sampling import HFSampler, VLLMSampler

        if self._sampler is None and self.name == "vllm":  # vLLM loads the weights itself: never the HF model
            self._sampler = VLLMSampler(self.path)
        elif self._sampler is None:
            from grail.models.warmstart import load_inference_model

            dtype = _cpu_dtype(self.model_name, self.bf16)  # chosen with the weights' loading, not before
            self._sampler = HFSampler(load_inference_model(self.path, dtype=dtype), self.tokenizer,
                                      batch_size=self.batch_size)
        return self._sampler.generate(prompts, params, seed)


def _cpu_dtype(model: str, bf16: str):
    """The weights' dtype on CPU (None on a GPU: `load_inference_model`'s bf16): `--bf16 auto` by the machine
    (grail.models.precision: bf16 where its matmul measures at least 1.5x fp32's), said on stderr; true or false
    as given, with the measured slowdown named when bf16 is forced where it is not faster. Sampling needs no master
    weights: nothing is trained."""
    import torch

    if torch.cuda.is_available():
        return None
    from grail.models import precision

    if bf16 == "auto":
        choice = precision.choose_cpu_precision(model)
        print(f"grail eval: precision: {choice.reason}", file=sys.stderr)
        return torch.bfloat16 if choice.bf16 else torch.float32
    if bf16 == "true" and (slower := precision.forced_bf16_warning(model)):
        print(f"grail eval: warning: {slower}", file=sys.stderr)
    return torch.bfloat16 if bf16 == "true" else torch.float32


def _evaluate(args, model: _Model, spec, loaded, out_dir: str):
    """`run_evaluation` of `spec` (its prompt format resolved for `model`) into `out_dir`."""
    from dataclasses import replace

    from grail.evaluation.harness import run_evaluation

    benchmarks = spec.benchmarks
    spec = replace(spec, prompt=_prompt_format(args, model.path, model.tokenizer,
                                               synthetic=all(b in SYNTHETIC_NAMES for b in benchmarks),
                                               messages=all(b in MESSAGE_BENCHMARKS for b in benchmarks)))
    params = spec.sampling
    print(f"evaluating {args.model} on {', '.join(benchmarks)} (n={params.n}, T={params.temperature}, "
          f"{args.scoring} scoring{', response prefix ' + repr(spec.response_prefix) if spec.response_prefix else ''})"
          f"; output in {out_dir}")
    return run_evaluation(model, model.tokenizer, spec, out_dir, workers=args.workers, loaded=loaded)


def run_eval(args) -> int:
    spec, loaded = _eval_spec(args)
    if args.backend == "vllm" and (missing := _vllm_missing()):
        print(f"grail eval: error: {missing}", file=sys.stderr)
        return 2
    model = _Model(args.model, args.backend, args.batch_size, args.bf16)
    out_dir = args.output_dir or os.path.join("runs", f"eval-{time.strftime('%Y%m%d-%H%M%S')}")
    report = _evaluate(args, model, spec, loaded, out_dir)
    print(report.markdown)
    if (solutions := _chain_solutions(loaded)) is not None:
        print(_write_first_errors(out_dir, solutions))
    print(f"results: {out_dir}/results.json, {out_dir}/results.md; samples: {out_dir}/samples.jsonl")
    return 0


def _write_first_errors(out_dir: str, solutions: dict[tuple[str, str], tuple[str, str]]) -> str:
    """Where the chain task's completions in out_dir/samples.jsonl first go wrong (grail.tasks.chain_errors), as
    shares of them, written to out_dir/first_errors.json; the line that says so."""
    from grail.tasks.chain_errors import FIRST_ERRORS, first_error_counts

    records = [json.loads(line) for line in Path(out_dir, "samples.jsonl").read_text().splitlines() if line]
    counts = first_error_counts((*solutions[key], str(r.get("completion", ""))) for r in records
                                if (key := (r["benchmark"], str(r["problem_id"]))) in solutions)
    total = sum(counts.values())
    shares = {error: counts[error] / total for error in FIRST_ERRORS} if total else {}
    Path(out_dir, "first_errors.json").write_text(json.dumps({"completions": total, "shares": shares}, indent=1))
    listed = ", ".join(f"{error} {share:.1%}" for error, share in shares.items())
    return (f"first errors ({SYNTHETIC_CHAINS}, {total} completions; docs: where a solution first goes wrong): "
            f"{listed} -> {out_dir}/first_errors.json")


def _add_validity_parser(sub) -> None:
    va = sub.add_parser("validity", help="is a model in a regime where RL credit can matter? four evaluations and "
                        "the criteria, pass or fail", description="Evaluate the model four times into "
                        "DIR/sampled (n samples at T=1, top-p 1, top-k 0), DIR/greedy, DIR/answer-only-greedy and "
                        "DIR/answer-only-sampled (the response prefilled with \\boxed{, "
                        f"{ANSWER_ONLY_TOKENS} new tokens), each resumable as `grail eval` is; then write "
                        "DIR/validity.json and DIR/validity.md and print "
                        "the table: accuracies with 95% intervals, the share of mixed groups, the best constant "
                        "answer, completion lengths, and each criterion (grail.evaluation.validity.Thresholds) with "
                        "its value, threshold and pass or fail.")
    va.add_argument("--model", help="as grail eval --model (needed unless --from)")
    va.add_argument("--benchmarks", default=SYNTHETIC_CHAINS, help=f"as grail eval (default {SYNTHETIC_CHAINS})")
    va.add_argument("--size", default="all", help="as grail eval (default all)")
    va.add_argument("--samples", type=int, default=8, help="samples per problem of the sampled evaluations: GRPO's "
                    "group size (default 8)")
    va.add_argument("--max-new-tokens", type=int, default=128, help="of the evaluations with reasoning (default 128; "
                    f"the answer-only ones: {ANSWER_ONLY_TOKENS})")
    va.add_argument("--seed", type=int, default=0, help="sampling seed, as grail eval (default 0)")
    va.add_argument("--batch-size", type=int, default=16, help="problems per generation batch (default 16)")
    va.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="as grail eval (default hf)")
    va.add_argument("--workers", type=int, help=WORKERS_HELP)
    va.add_argument("--output-dir", help="DIR, holding the four evaluations and the table (needed unless --from); "
                    "rerun with the same arguments to resume. An existing `grail eval --benchmarks synthetic_chains "
                    "--size all --samples 8 --temperature 1.0 --top-p 1.0 --top-k 0 --max-new-tokens 128` directory "
                    "moved to DIR/sampled is reused")
    va.add_argument("--from", dest="from_dir", metavar="DIR", help="print and rewrite the table from DIR's four "
                    "finished evaluations, generating nothing (no model is loaded)")


def _eval_args(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed by `grail eval`'s own parser: its defaults for everything `argv` leaves out."""
    sub = argparse.ArgumentParser(prog="grail").add_subparsers(dest="command")
    add_parsers(sub)
    return sub.choices["eval"].parse_args(argv)


def _references(loaded) -> dict[tuple[str, str], str]:
    return {(p.source, p.id): p.answer for bench in loaded for p in bench.problems}


def _chain_solutions(loaded) -> dict[tuple[str, str], tuple[str, str]] | None:
    """The reference solutions of the chain task's held-out problems among `loaded` (the first-error table), or None
    where no benchmark is the chain task's."""
    from grail.evaluation.benchmark_rows import SYNTHETIC_CHAINS
    from grail.evaluation.benchmark_sources import chain_solutions
    from grail.evaluation.benchmarks import synthetic_problems

    if not any(bench.name == SYNTHETIC_CHAINS for bench in loaded):
        return None
    chains = synthetic_problems(SYNTHETIC_CHAINS)  # the set `grail eval` loaded for it (no run's set here)
    return {(SYNTHETIC_CHAINS, pid): pair for pid, pair in chain_solutions(chains).items()}


def _loaded_from_run(path: Path, all_rows: bool = False):
    """The benchmarks an evaluation's run.json names, loaded as it loaded them (`all_rows`: every row instead)."""
    from grail.evaluation.benchmarks import load_benchmarks

    if not path.is_file():
        raise ValueError(f"{path} is missing: {path.parent} is not a grail eval directory; make it with grail "
                         f"validity --model M --output-dir {path.parent.parent}.")
    run = json.loads(path.read_text())
    return load_benchmarks(run["benchmarks"], data_dir=run["data_dir"], size=None if all_rows else run["size"],
                           seed=run["subset_seed"],
                           release_subsets_dir=run["release_subsets_dir"])


def run_validity(args) -> int:
    from grail.evaluation.validity import LEGS, read_leg, validity_table, write_table

    if args.from_dir and (args.model or args.output_dir):
        raise ValueError("grail validity --from DIR re-renders a finished table; drop --model and --output-dir, or "
                         "drop --from to evaluate.")
    if not args.from_dir and not (args.model and args.output_dir):
        raise ValueError("grail validity needs --model and --output-dir (or --from DIR to re-render a table).")
    directory = Path(args.from_dir or args.output_dir)
    if not args.from_dir:
        if args.backend == "vllm" and (missing := _vllm_missing()):
            print(f"grail validity: error: {missing}", file=sys.stderr)
            return 2
        loaded, model = None, None
        for leg in LEGS:
            leg_args = _eval_args(["--model", args.model, "--benchmarks", args.benchmarks, "--size", args.size,
                                   *leg.eval_flags(args.samples, args.max_new_tokens), "--seed", str(args.seed),
                                   "--batch-size", str(args.batch_size), "--backend", args.backend,
                                   "--output-dir", str(directory / leg.name)]
                                  + (["--workers", str(args.workers)] if args.workers else []))
            spec, loaded = _eval_spec(leg_args, loaded)
            # fp32 as every validity table was measured: its figures stay comparable on any CPU
            model = model or _Model(args.model, args.backend, args.batch_size, bf16="false")
            report = _evaluate(leg_args, model, spec, loaded, leg_args.output_dir)
            print(f"{leg.name}: {report.new_samples} new samples")
    legs = {leg.name: read_leg(directory / leg.name) for leg in LEGS}
    run_json = directory / "sampled" / "run.json"
    whole = list(_references(_loaded_from_run(run_json, all_rows=True)).values())  # the best constant's split
    loaded = _loaded_from_run(run_json)
    table = validity_table(legs, _references(loaded), split_references=whole, solutions=_chain_solutions(loaded))
    print(write_table(directory, table))
    print(f"table: {directory}/validity.json, {directory}/validity.md")
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
