"""Sampling backends behind one interface: Hugging Face `generate` (batched, CPU or GPU) and vLLM (GPU).

`sampler.generate(prompts, params, seed)` returns, for each prompt (already rendered text), `params.n`
`Sample`s: the decoded completion (special tokens dropped) and its number of generated tokens (up to and
including the end-of-sequence token). The same `seed` and prompts give the same samples on the same machine
and backend, which is what makes an interrupted evaluation resumable batch by batch.

SamplingParams' defaults are the release's evaluation settings (docs/guides/evaluation.md), the one home of those
numbers (`grail eval`'s flags and training's checkpoint evaluation read them from here). The HF backend generates at
most what the model can hold: max_new_tokens is capped per batch at max_position_embeddings minus the batch's longest
prompt (`new_token_limit`); the embedded tiny model holds 512 positions, a Qwen3-4B 40960.

torch is imported where it is used, so that the CLI can read the defaults without loading it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

__all__ = [
    "generate_batch", "hf_generation_kwargs", "HFSampler", "new_token_limit", "Sample", "Sampler", "SamplingParams",
    "VLLMSampler"
]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings; the defaults are the release's evaluation protocol (docs/guides/evaluation.md)."""

    n: int = 3
    temperature: float = 0.6  # 0 = greedy
    top_p: float = 0.95
    top_k: int = 20  # 0 = off
    max_new_tokens: int = 8192

    def __post_init__(self):
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError(f"n={self.n} and max_new_tokens={self.max_new_tokens} must both be >= 1.")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0, top_p={self.top_p} in (0, 1], "
                             f"top_k={self.top_k} >= 0.")
        if self.temperature == 0 and self.n > 1:
            raise ValueError(f"greedy decoding (temperature 0) gives n={self.n} identical samples; use n=1 or a "
                             f"temperature > 0.")

    def record(self) -> dict:
        """The settings that apply, for a run's record: greedy decoding (temperature 0) uses no top_p or top_k."""
        values = asdict(self)
        if self.temperature == 0:
            del values["top_p"], values["top_k"]
        return values


@dataclass(frozen=True)
class Sample:
    text: str
    num_tokens: int


class Sampler(Protocol):
    name: str

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[list[Sample]]: ...


def hf_generation_kwargs(tokenizer, params: SamplingParams) -> dict:
    kwargs = dict(max_new_tokens=params.max_new_tokens, do_sample=params.temperature > 0,
                  pad_token_id=tokenizer.pad_token_id)
    if params.temperature > 0:
        kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)
    return kwargs


def new_token_limit(model, prompt_tokens: int, requested: int) -> int:
    """`requested` capped so that prompt + completion fit the model's positions (config.max_position_embeddings;
    no cap when the config has none). ValueError when the prompt alone fills them."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions is None:
        return requested
    if prompt_tokens >= positions:
        raise ValueError(f"a prompt of {prompt_tokens} tokens leaves no room to generate in a model of "
                         f"{positions} positions (max_position_embeddings); shorten the prompts (a shorter "
                         f"--prompt-suffix, fewer benchmarks with long problems) or use a model with a longer context.")
    return min(requested, positions - prompt_tokens)


def generate_batch(model, tokenizer, prompts: Sequence[str], *, n: int, gen_kwargs: dict,
                   generate=None) -> list[list[Sample]]:
    """One `model.generate` call (or `generate`, a stand-in with its signature: grail.training.shared_prompt's
    shared prefill): `n` samples per prompt, prompts tokenised as is (left-padded, no special tokens added: the
    rendered prompt already holds the template's tokens). The caller owns the RNG state.
    gen_kwargs["max_new_tokens"] is capped by `new_token_limit` for the batch's longest prompt."""
    import torch

    device = next(model.parameters()).device
    batch = tokenizer(list(prompts), return_tensors="pt", padding=True, padding_side="left",
                      add_special_tokens=False).to(device)
    prompt_tokens = batch["input_ids"].shape[1]
    gen_kwargs = {**gen_kwargs, "max_new_tokens": new_token_limit(model, prompt_tokens, gen_kwargs["max_new_tokens"])}
    with torch.no_grad():
        ids_BL = (generate or model.generate)(**batch, **gen_kwargs, num_return_sequences=n)
    new_BT = ids_BL[:, prompt_tokens:]
    eos = set(_eos_ids(model, tokenizer))
    texts = tokenizer.batch_decode(new_BT, skip_special_tokens=True)
    samples = []
    for row, text in zip(new_BT.tolist(), texts, strict=True):
        length = next((i + 1 for i, tok in enumerate(row) if tok in eos), len(row))  # through the first eos
        samples.append(Sample(text, length))
    return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]


def _eos_ids(model, tokenizer) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = tokenizer.eos_token_id if eos is None else eos
    return list(eos) if isinstance(eos, list | tuple) else [eos]


class HFSampler:
    """`model.generate` in batches of `batch_size` prompts (each with its n samples); the model is put in eval
    mode for the call and restored after. `synced`: every process keeps running forwards until all processes'
    sequences are done (transformers' `synced_gpus`), for a model sharded over processes (FSDP2, ZeRO-3), where each
    forward gathers parameters from all of them; the callers make as many `generate` calls on every process.
    `generate`: a stand-in for `model.generate` with its signature (a shared prefill, `shared_prompt=true`)."""

    name = "hf"

    def __init__(self, model, tokenizer, batch_size: int = 16, synced: bool = False, generate=None):
        self.model, self.tokenizer, self.batch_size, self.synced = model, tokenizer, batch_size, synced
        self.generate_call = generate

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[list[Sample]]:
        import torch

        was_training = self.model.training
        self.model.eval()
        out: list[list[Sample]] = []
        kwargs = hf_generation_kwargs(self.tokenizer, params) | ({"synced_gpus": True} if self.synced else {})
        try:
            with torch.random.fork_rng(devices=_cuda_devices(self.model)):
                torch.manual_seed(seed)
                for start in range(0, len(prompts), self.batch_size):
                    out.extend(generate_batch(self.model, self.tokenizer, prompts[start : start + self.batch_size],
                                              n=params.n, gen_kwargs=kwargs, generate=self.generate_call))
        finally:
            self.model.train(was_training)
        return out


def _cuda_devices(model) -> list:
    device = next(model.parameters()).device
    return [device] if device.type == "cuda" else []


class VLLMSampler:
    """vLLM offline generation (`pip install -e ".[vllm]"`, GPU). Not exercised on the CPU development machine."""

    name = "vllm"

    def __init__(self, model_path: str, **llm_kwargs):
        try:
            from vllm import LLM
        except ImportError as err:
            raise ImportError("the vllm backend needs vLLM: pip install -c constraints.txt -e '.[vllm]' "
                              "(GPU only); or use --backend hf.") from err
        self.llm = LLM(model=model_path, **llm_kwargs)

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[list[Sample]]:
        from vllm import SamplingParams as VLLMParams

        sampling = VLLMParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                              top_k=params.top_k if params.top_k > 0 else -1, max_tokens=params.max_new_tokens,
                              seed=seed)
        outputs = self.llm.generate(list(prompts), sampling, use_tqdm=False)
        return [[Sample(o.text, len(o.token_ids)) for o in out.outputs] for out in outputs]
