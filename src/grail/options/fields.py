"""`GRAILFields`: the fields `grail.training.config.GRAILConfig` adds to TRL's `GRPOConfig`, with their help (their only
documentation: `grail train --help` prints it, docs/reference/config.md is generated from it). A plain dataclass without
torch or TRL, so that the CLI's help, `grail presets` and the config loader's checks stay light; `GRAILConfig`
inherits it and adds the device-dependent resolution that needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from grail.options.choices import (
    CpuBf16Generation,
    RewardName,
    SaliencyPath,
    ScoringName,
    WarmStartConfig,
    WeightingFields,
    WeightsFrom,
)
from grail.options.sampling import SamplingParams
from grail.tasks.arithmetic import TaskConfig
from grail.tasks.chain_problems import OPERATIONS, ChainConfig
from grail.tasks.chains import ChainSet
from grail.tasks.synthetic import SyntheticSet

__all__ = ["CHAIN_ONLY_FIELDS", "GRAILFields", "SFT_MODEL_PREFIX", "SYNTHETIC_DATASET", "TaskStyleChoice",
           "TINY_MODEL"]

TINY_MODEL = "tiny"
SFT_MODEL_PREFIX = "sft:"  # model_name_or_path `sft:NAME`: the `grail sft` warm start of NAME (grail.models.sft_cache)
SYNTHETIC_DATASET = "synthetic"
# grail.tasks.arithmetic.TASK_STYLES and ChainConfig.style, the chain task (tests/test_chain_config.py keeps them equal)
TaskStyleChoice = Literal["symbolic", "words", "chains"]
CHAIN_ONLY_FIELDS = ("task_operations", "task_factor_max", "task_num_sft")
# task_* fields whose default differs between styles: field name -> the attribute of (TaskConfig | SyntheticSet,
# ChainConfig | ChainSet) it stands for; None in the field = that default
_STYLE_DEFAULTS = {"num_steps": (TaskConfig, ChainConfig), "operand_min": (TaskConfig, ChainConfig),
                   "operand_max": (TaskConfig, ChainConfig), "max_value": (TaskConfig, ChainConfig),
                   "num_heldout": (SyntheticSet, ChainSet)}


def _defaults(name: str) -> str:
    arithmetic, chains = _STYLE_DEFAULTS[name]
    return f"symbolic and words {getattr(arithmetic, name)}, chains {getattr(chains, name)}"


@dataclass
class GRAILFields(WeightingFields):
    """The fields `grail.training.config.GRAILConfig` adds to TRL's `GRPOConfig`: the token-weighting options
    (`grail.options.choices.WeightingFields`, first) and these, in the order `grail train --help` lists them. A plain
    dataclass (no TRL): `GRAILConfig` inherits it."""

    # ---- model and data -------------------------------------------------------------------------------
    model_name_or_path: str = field(
        default=TINY_MODEL,
        metadata={"help": "`tiny` = the embedded ~1.7M-parameter Qwen3-architecture model, built in code and "
                  "warm-started on the synthetic task (cached, no download); otherwise a local checkpoint "
                  "directory or a Hub id such as `Qwen/Qwen3-4B`; `sft:NAME` = the cached `grail sft` warm start of "
                  "NAME (a built-in real model or a directory) on this run's chain task (task_style chains, its task_* "
                  "values, the default SFT settings; `sft:NAME:sft_steps=100` names others, any `grail sft` field "
                  "that shapes the model), refused with the `grail sft` command that makes it when it is not cached "
                  "(docs/getting-started/warm-start.md). `model` is accepted as an alias (--model, "
                  "as `grail eval` and `grail explain` take it)."},
    )
    dataset: str = field(
        default=SYNTHETIC_DATASET,
        metadata={"help": "`synthetic` = the embedded arithmetic task (see the task_* fields); a path to a "
                  ".jsonl/.json file; or a Hub dataset id. Needs a prompt column and an answer column."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    dataset_split: str = field(default="train", metadata={"help": "Split of a Hub dataset to train on."})
    prompt_column: str = field(
        default="prompt",
        metadata={"help": "Column holding the prompt: a string, or a list of chat messages."},
    )
    answer_column: str = field(
        default="answer",
        metadata={"help": "Column holding the reference answer that the reward compares the last "
                  "\\boxed{} of a completion against (renamed to `answer` for the reward function)."},
    )
    prompt_suffix: str = field(
        default="auto",
        metadata={"help": "Text appended to every prompt (to the last user message of a chat prompt), or a name: "
                  "`auto` = `paper`, except '' on the synthetic task (grail.options.prompts.resolve_prompt_format, "
                  "shared with `grail eval` and `grail explain`); "
                  "`paper` = ' Please reason step by step, and put your final answer within \\boxed{}.' (the "
                  "literal text); `release` = the text the released models were trained and evaluated with, "
                  "whose \\b is a backspace (chr(8) + 'oxed{}', a non-raw string in the release). Use `release` "
                  "only to reproduce the released runs exactly. Resolved by grail.options.prompts.resolve_suffix; the "
                  "resolved text is saved with the model (grail_prompt.json) for `grail eval`."},
    )
    dataset_shuffle_seed: int | None = field(
        default=None,
        metadata={"help": "Shuffle the training set once with this seed before training (the GRAIL release does, "
                  "with 42), on top of TRL's own per-epoch sampler shuffle (shuffle_dataset, seeded by seed). "
                  "None = keep the file's order for TRL's sampler."},
    )
    conversational: bool | Literal["auto"] = field(
        default="auto",
        metadata={"help": "Wrap string prompts as a single user chat message, so TRL applies the model's chat "
                  "template (pass template options such as enable_thinking via chat_template_kwargs; unset = "
                  "enable_thinking false). `auto`: true iff the tokenizer has a chat template, false on the "
                  "synthetic task, the tiny model's plain-text task (grail.options.prompts.resolve_prompt_format, "
                  "shared with `grail eval` and `grail explain`). Prompts that already are "
                  "message lists are used as they are (and recorded as chat). The resolved values go to "
                  "resolved_config.json and final/grail_prompt.json."},
    )
    reward: RewardName = field(
        default="auto",
        metadata={"help": "`math_verify`: 1.0 iff the last \\boxed{} is equivalent to the answer under "
                  "math-verify (5 s timeout). `exact_int`: 1.0 iff the last \\boxed{} is the answer as an "
                  "integer (the synthetic task). `math_verify_all_boxes`: math_verify with the opt-in all-boxes rule "
                  "(every "
                  "\\boxed{} of the completion, and of the reference, read as one list: `\\boxed{1}, \\boxed{2}` is "
                  "`1, 2`). `auto`: exact_int for the synthetic task, else math_verify."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Allow output_dir to hold a previous run: its files (metrics.jsonl, checkpoint-N/, final/, "
                  "eval/, the config files) are removed first. Without it, a run into a directory that holds one "
                  "stops before any work; --resume_from_checkpoint true continues that run instead (TRL's field: a "
                  "checkpoint directory, or true for the last complete one)."},
    )
    # ---- token weighting: how the trainer computes the weights (the options: grail.options.choices) ----
    method_options: dict | None = field(
        default=None,
        metadata={"help": "The chosen method's own options (declared by the method: `grail methods`), as a mapping "
                  "in YAML, or each as a flag of its own on the command line (`--ktae_top 0.5`) and in compare arms "
                  "(`ktae@ktae_top=0.5`). Unset options take the method's defaults; the run records them all in "
                  "resolved_config.json."},
    )
    weights_from: WeightsFrom = field(
        default="current_policy",
        metadata={"help": "`current_policy` (the GRAIL release): recompute weights on every micro-batch and "
                  "every reuse pass (num_iterations), with the policy being trained. `rollout_policy`: compute "
                  "them once per rollout batch, right after generation, and reuse them on every pass (cheaper "
                  "when num_iterations > 1; no fused saliency)."},
    )
    saliency_path: SaliencyPath = field(
        default="auto",
        metadata={"help": "For the methods that can read their signal from TRL's forward (`grail methods` marks "
                  "them 'fuses with TRL's forward'), with weights_from=current_policy. `fused`: take the "
                  "saliency (or entropy) from the training step's own forward pass: the answer NLL is a sum of "
                  "the log-probs TRL computes, and the gradient to the leaf comes from that graph (saves a "
                  "forward). `separate`: a second forward and backward, as the release does. `auto`: fused "
                  "unless it cannot work (frozen embeddings, PEFT/LoRA, DeepSpeed, FSDP, reentrant activation "
                  "checkpointing), then separate; the metric weights/fused says which ran."},
    )
    shared_prompt: bool = field(
        default=False,
        metadata={"help": "Compute each prompt once for the completions that share it: in the loss's log-prob "
                  "forward (the prompt runs once with a KV cache, each completion of the micro-batch runs against "
                  "it, and the gradient flows back through the cache), in generation's prefill, and in the sampled "
                  "evaluation (`grail compare`, `grail demo`, and `grail train`'s `eval_benchmarks` checkpoints). "
                  "Exact to float rounding (log-probs, entropies, gradients, the fused saliency and the sampled "
                  "tokens, tested on Llama, Qwen3 and Gemma 3); it pays where prompts are long beside completions. "
                  "One process only, activation checkpointing off."},
    )
    # ---- CPU precision (bf16 itself is TRL's field, chosen per machine when left unset: grail.models.precision) ----
    cpu_bf16_generation: CpuBf16Generation = field(
        default="weights",
        metadata={"help": "How generation computes in CPU bf16 training: it acts only when bf16 is on and the policy "
                  "is on the CPU (fp32 runs and GPUs are unchanged). `weights`: from bf16 weights: for each "
                  "generation call every floating-point parameter holds a bf16 cast of its fp32 master weight, put "
                  "back after (grail.models.bf16_weights), so the activations and the KV cache are bf16 and autocast "
                  "casts none (SmolLM2 sampled 16 rows of 64 tokens in 11.9 s from a bf16 copy against 14.4-15.6 s "
                  "under autocast: docs/results/cpu-step-native.md). One plain process only: a DDP, DeepSpeed or FSDP "
                  "run generates under autocast whatever this says (under DDP a change of a weight's dtype stops its "
                  "gradient all-reduce). `autocast`: one autocast region over the fp32 weights, each weight cast to "
                  "bf16 once per generation and the activations at every layer. The loss's forward and backward run "
                  "under autocast over the fp32 master weights either way."},
    )
    # ---- embedded synthetic task and tiny model -------------------------------------------------------
    # Fields shared by the arithmetic styles and the chain task default to None: the style's own default (one home:
    # TaskConfig / SyntheticSet for symbolic and words, ChainConfig / ChainSet for chains).
    task_num_steps: int | None = field(
        default=None, metadata={"help": "Synthetic task: arithmetic steps per problem (chains: steps after the given "
                                f"quantity). None = the style's default: {_defaults('num_steps')}."})
    task_operand_min: int | None = field(
        default=None, metadata={"help": "Synthetic task: smallest operand (chains: also the floor of every "
                                f"quantity). None = the style's default: {_defaults('operand_min')}."})
    task_operand_max: int | None = field(
        default=None, metadata={"help": f"Synthetic task: largest operand. None = the style's default: "
                                f"{_defaults('operand_max')}."})
    task_filler_rate: float = field(
        default=TaskConfig.filler_rate,
        metadata={"help": "Synthetic task: probability of non-informative filler words after each step of "
                  "the reference traces (they shape the warm-started policy's style)."},
    )
    task_style: TaskStyleChoice = field(
        default=TaskConfig.style,
        metadata={"help": "Synthetic task: how problems are written. `symbolic`: `Q: 7+5*3-4` with a left-to-right "
                  "trace (the tiny model's task). `words`: the same arithmetic as a short word problem with a "
                  "solution in words ending in \\boxed{}, as chat messages with worked examples, for pretrained chat "
                  "models (grail.tasks.word_problems; the preset smollm-words holds the measured task_* values: "
                  "1 step, operands 1..20, values <= 40). `chains`: word problems in which each person's count is "
                  "defined from an earlier one, so the answer needs every step (grail.tasks.chains), one user turn "
                  "without worked examples, for chat models warm-started on the task's sft split (`grail sft`); "
                  "its own fields: task_operations, task_factor_max, task_num_sft."},
    )
    task_max_value: int | None = field(
        default=None,
        metadata={"help": "Synthetic task: upper bound on every running value (results, and so products; all stay "
                  f">= 0; chains: >= operand_min). None = the style's default: {_defaults('max_value')}."},
    )
    task_operations: str = field(
        default=",".join(ChainConfig.operations),
        metadata={"help": "Chain task only: comma-separated operations a step may use, among "
                  f"{', '.join(OPERATIONS)} (add and subtract are required; grail.tasks.chain_problems)."},
    )
    task_factor_max: int = field(
        default=ChainConfig.factor_max,
        metadata={"help": "Chain task only: multiply's factors are 2..task_factor_max (with `multiply` in "
                  "task_operations)."},
    )
    task_num_sft: int = field(
        default=ChainSet.num_sft,
        metadata={"help": "Chain task only: problems of the sft split, the supervised warm start's (`grail sft`); "
                  "disjoint from the training and held-out splits."},
    )
    task_num_train: int = field(default=SyntheticSet.num_train,
                                metadata={"help": "Synthetic task: distinct training prompts."})
    task_num_heldout: int | None = field(
        default=None,
        metadata={"help": "Synthetic task: held-out problems for evaluation (never in the training split). None = "
                  f"the style's default: {_defaults('num_heldout')}."},
    )
    task_seed: int = field(default=SyntheticSet.seed,
                           metadata={"help": "Synthetic task: seed of the problem generator."})
    warmstart_steps: int = field(
        default=WarmStartConfig.steps,
        metadata={"help": "Tiny model: supervised warm-start steps on task traces (cached on disk, keyed by "
                  "every warm-start setting). The default lands held-out sampled accuracy in the 20-60% band GRPO "
                  "needs (measured figure: grail.models.warmstart.WarmStartConfig)."},
    )
    warmstart_lr: float = field(default=WarmStartConfig.lr, metadata={"help": "Tiny model: warm-start learning rate."})
    tiny_hidden_size: int = field(
        default=WarmStartConfig.hidden_size, metadata={"help": "Tiny model: hidden size (192 → ~1.7M params)."}
    )
    tiny_num_layers: int = field(
        default=WarmStartConfig.num_layers, metadata={"help": "Tiny model: number of decoder layers."}
    )
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "Where warm-started tiny models are cached (default: $GRAIL_CACHE or "
                  "~/.cache/grail-rl)."},
    )
    # ---- benchmark evaluation at checkpoints (grail.evaluation.harness, the same code as `grail eval`) --------
    eval_benchmarks: str = field(
        default="",
        metadata={"help": "Comma-separated benchmarks (math500, aime24, amc23, minerva_math, college_math, "
                  "olympiadbench, synthetic) evaluated at every checkpoint (save_steps) with the model being trained; "
                  "results in <output_dir>/eval/checkpoint-N/ and eval/* keys in metrics.jsonl. Empty = off."},
    )
    eval_data_dir: str | None = field(
        default=None, metadata={"help": "Local benchmark copy laid out as DIR/<benchmark>/test.jsonl (None = Hub)."}
    )
    eval_size: str = field(
        default="release",
        metadata={"help": "Problems per benchmark at checkpoints, as `grail eval --size`: `release` (the "
                  "release's fixed 200-problem subsets of CollegeMath and OlympiadBench, identified by the lists "
                  "in eval_data_dir, so it needs a local copy for those two; all rows of the others), `all`, or a "
                  "number (a seeded subset, not the release's; small numbers keep checkpoints fast)."},
    )
    eval_release_subsets_dir: str | None = field(
        default=None,
        metadata={"help": "Folder holding the release subsets' identity lists (as `grail eval "
                  "--release-subsets-dir`), for eval_size release with Hub copies of CollegeMath or "
                  "OlympiadBench; None = eval_data_dir."},
    )
    eval_scoring: ScoringName = field(
        default="grail",
        metadata={"help": "How checkpoint samples are graded (as `grail eval --scoring`): `grail` (the grader: "
                  "every reference read correctly), `grail_all_boxes` (the grader with the opt-in all-boxes rule) "
                  "or `release` (the GRAIL release's own scoring, for figures "
                  "comparable with the paper's; it cannot match 197 of 675 OlympiadBench references)."},
    )
    eval_samples: int = field(
        default=SamplingParams.n,
        metadata={"help": f"Samples per problem at checkpoints (as `grail eval --samples`; release "
                  f"{SamplingParams.n}), at the release's temperature {SamplingParams.temperature}, "
                  f"top-p {SamplingParams.top_p}, top-k {SamplingParams.top_k} "
                  "(grail.options.sampling.SamplingParams)."})
    eval_max_new_tokens: int | None = field(
        default=SamplingParams.max_new_tokens,
        metadata={"help": "New-token limit at checkpoints. Default: the release's evaluation limit "
                  f"({SamplingParams.max_new_tokens}, grail.options.sampling.SamplingParams), "
                  "not max_completion_length "
                  "(training's limit, often shorter: a checkpoint scored at the training length loses the answers "
                  "of longer completions). None = max_completion_length (faster checkpoints). Generation is capped "
                  "at what the model holds (max_position_embeddings minus the prompt; 512 positions for the tiny "
                  "model)."},
    )

    # ---- the option groups the lower layers take (each validates its fields) ------------------------------
    def resolved_task_fields(self) -> dict[str, int]:
        """The task_* fields whose default is the style's own, as this run uses them (resolved_config.json records
        these, not the None that stands for the default)."""
        return {f"task_{name}": self._task_value(name) for name in _STYLE_DEFAULTS}

    def _task_value(self, name: str):
        """task_<name>, or the style's default where it is None."""
        value = getattr(self, f"task_{name}")
        if value is not None:
            return value
        arithmetic, chains = _STYLE_DEFAULTS[name]
        return getattr(chains if self.task_style == ChainConfig.style else arithmetic, name)

    def task_config(self) -> TaskConfig:
        """The arithmetic generator's settings (styles symbolic and words)."""
        if self.task_style == ChainConfig.style:
            raise ValueError("task_style='chains' is not the arithmetic generator's; its settings are chain_config().")
        try:
            return TaskConfig(num_steps=self._task_value("num_steps"), operand_min=self._task_value("operand_min"),
                              operand_max=self._task_value("operand_max"), filler_rate=self.task_filler_rate,
                              max_value=self._task_value("max_value"), style=self.task_style)
        except ValueError as err:
            raise ValueError(f"synthetic task setting: {err} (config fields carry the prefix task_, "
                             f"e.g. task_num_steps)") from err

    def chain_config(self) -> ChainConfig:
        """The chain task's generator settings (task_style chains)."""
        ops = self.task_operations
        operations = tuple(op.strip() for op in (ops.split(",") if isinstance(ops, str) else ops) if op.strip())
        try:
            return ChainConfig(num_steps=self._task_value("num_steps"), operand_min=self._task_value("operand_min"),
                               operand_max=self._task_value("operand_max"), operations=operations,
                               factor_max=self.task_factor_max, max_value=self._task_value("max_value"),
                               filler_rate=self.task_filler_rate)
        except ValueError as err:
            raise ValueError(f"chain task setting: {err} (config fields carry the prefix task_, e.g. task_num_steps, "
                             f"task_operations)") from err

    def synthetic_set(self) -> SyntheticSet | ChainSet:
        """The synthetic task's problems this run trains and evaluates on (task_* fields): a `ChainSet` for
        task_style chains, else a `SyntheticSet`. Both give `rows(split)` for "train" and "heldout"."""
        if self.task_style == ChainConfig.style:
            try:
                return ChainSet(task=self.chain_config(), num_sft=self.task_num_sft, num_train=self.task_num_train,
                                num_heldout=self._task_value("num_heldout"), seed=self.task_seed)
            except ValueError as err:
                if str(err).startswith("chain task setting"):
                    raise
                raise ValueError(f"chain task setting: {err} (set task_num_sft / task_num_train / "
                                 f"task_num_heldout)") from err
        given = [f"{name}={getattr(self, name)!r}" for name in CHAIN_ONLY_FIELDS
                 if getattr(self, name) != getattr(GRAILFields, name)]
        if given:
            raise ValueError(f"{', '.join(given)}: chain task settings, but task_style is {self.task_style!r}, which "
                             f"would ignore them; remove them, or set task_style chains.")
        try:
            return SyntheticSet(task=self.task_config(), num_train=self.task_num_train,
                                num_heldout=self._task_value("num_heldout"), seed=self.task_seed)
        except ValueError as err:
            if str(err).startswith("synthetic task setting"):
                raise
            raise ValueError(f"synthetic task setting: {err} (set task_num_train / task_num_heldout)") from err

    def warm_start_config(self) -> WarmStartConfig:
        """The tiny model's warm-start settings (warmstart_*, tiny_* and task_* fields)."""
        return WarmStartConfig(task=self.task_config(), steps=self.warmstart_steps, lr=self.warmstart_lr,
                               hidden_size=self.tiny_hidden_size, num_layers=self.tiny_num_layers)
