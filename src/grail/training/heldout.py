"""Held-out accuracy of a run's model, as `grail demo` and `grail compare` measure it: two evaluations by the
harness (`grail.evaluation.harness.run_evaluation`) on the synthetic task's held-out split, "greedy" (n=1 at
temperature 0) and "sampled" (acc@4 at the run's sampling settings). Shared by both commands, so that neither
imports the other's module.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from grail.evaluation.benchmarks import SYNTHETIC, LoadedBenchmark
from grail.evaluation.harness import EvalSpec, run_evaluation
from grail.evaluation.scores import BenchmarkScore
from grail.models.warmstart import load_inference_model
from grail.options.prompts import PromptFormat
from grail.options.sampling import HFSampler, SamplingParams
from grail.training.config import GRAILConfig
from grail.training.run import Log
from grail.training.shared_prompt import shared_prefill

__all__ = ["eval_device", "ROWS_PER_CALL", "SAMPLES_PER_PROBLEM", "eval_specs", "heldout_accuracy"]

SAMPLES_PER_PROBLEM = 4  # sampled accuracy: acc@4 at the training temperature
ROWS_PER_CALL = 64  # completions per `generate` call: batches of 64 problems greedy, 16 sampled


def eval_specs(cfg: GRAILConfig, tokenizer=None) -> dict[str, EvalSpec]:
    """The two held-out evaluations of a run: "greedy" (n=1 at temperature 0) and "sampled" (acc@4 at the run's
    temperature, top_p and top_k). Both: every problem of the synthetic held-out split, the run's prompt format,
    max_completion_length and seed. The prompt format is the one training resolves (grail.training.run
    .resolve_prompt_fields) for `tokenizer` (the model's; None: a chat template is assumed where `auto` asks for one):
    the words and chains tasks' chat messages through the chat template, the symbolic task's plain text."""
    fmt = PromptFormat.from_config(cfg, tokenizer, messages=cfg.task_style != "symbolic")  # words, chains: messages
    common = dict(benchmarks=(SYNTHETIC,), size=None, seed=cfg.seed, prompt=fmt)
    sampling = {
        "greedy": SamplingParams(n=1, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=cfg.max_completion_length),
        "sampled": SamplingParams(n=SAMPLES_PER_PROBLEM, temperature=cfg.temperature, top_p=cfg.top_p,
                                  top_k=cfg.top_k, max_new_tokens=cfg.max_completion_length),
    }
    return {name: EvalSpec(sampling=params, batch_size=ROWS_PER_CALL // params.n, **common)
            for name, params in sampling.items()}


def eval_device(cfg: GRAILConfig) -> str | None:
    """Where a run's evaluations sample: on the CPU when the run trains there (`use_cpu`, set whenever no GPU is
    visible), else None: `load_inference_model`'s default, the GPU (in bf16)."""
    return "cpu" if cfg.use_cpu else None


def heldout_accuracy(model_path: str, specs: dict[str, EvalSpec], heldout: LoadedBenchmark, out_dir: Path,
                     log: Log = print, shared_prompt: bool = False, device: str | None = None
                     ) -> dict[str, BenchmarkScore]:
    """Each of `specs` (see `eval_specs`) run by the harness on `heldout` into out_dir/<name>/; its score by name.
    `shared_prompt`: each prompt's prefill computed once for its samples (grail.training.shared_prompt). `device`:
    as `load_inference_model` takes it (`eval_device(cfg)` for a run's)."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    trained = PromptFormat.load(model_path)  # a model grail trained saved the format it was trained with
    for name, spec in specs.items():
        if trained is not None and trained != spec.prompt:
            raise ValueError(f"{model_path} was trained with prompts in {trained.describe()}, but the {name} "
                             f"evaluation would give them in {spec.prompt.describe()}: evaluate it with the "
                             f"config it was trained with (its resolved_config.json).")
    model = load_inference_model(model_path, device)
    generate = shared_prefill(model, model.generate) if shared_prompt else None
    scores = {}
    for name, spec in specs.items():
        sampler = HFSampler(model, tokenizer, batch_size=spec.batch_size, generate=generate)
        # one grading process (this one): short integer answers grade faster than worker processes start
        report = run_evaluation(sampler, tokenizer, spec, out_dir / name, workers=1, log=log, progress=False,
                                loaded=[heldout])
        (scores[name],) = report.scores  # with the per-problem accuracies that `paired_difference` needs
    return scores
