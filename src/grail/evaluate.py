"""Held-out evaluation: sample completions, score them with a reward function, report acc@n.

Stands alone (it never imports the trainer); training's evaluation and `grail demo` call it.
acc@n = mean over problems of (correct samples / n).  Greedy decoding is `temperature=0`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from grail.sampling import SamplingParams, generate_batch, hf_generation_kwargs

RewardFn = Callable[..., list[float]]


@dataclass(frozen=True)
class EvalResult:
    acc_at_n: float  # mean over problems of correct/n
    n: int  # samples per problem
    num_problems: int
    correct_P: tuple[int, ...]  # correct samples per problem
    completions: tuple[str, ...]  # P*n completions, problem-major

    def as_metrics(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}/acc@{self.n}": self.acc_at_n, f"{prefix}/num_problems": float(self.num_problems)}


def sample_completions(
    model,
    tokenizer,
    prompts: Sequence[str],
    n: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_new_tokens: int = 64,
    batch_size: int = 64,
    seed: int = 0,
) -> list[str]:
    """`n` completions per prompt (problem-major order), decoded without special tokens.

    Prompts are plain strings, tokenised as is (no chat template). Each prompt is repeated n times and the rows
    are generated `batch_size` at a time after one `manual_seed(seed)` (the demo's figures depend on this order).
    """
    was_training = model.training
    model.eval()
    rows = [p for p in prompts for _ in range(n)]
    params = SamplingParams(n=1, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens)
    kwargs = hf_generation_kwargs(tokenizer, params)
    out: list[str] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(rows), batch_size):
            batch = generate_batch(model, tokenizer, rows[start : start + batch_size], n=1, gen_kwargs=kwargs)
            out.extend(samples[0].text for samples in batch)
    model.train(was_training)
    return out


def evaluate(
    model,
    tokenizer,
    prompts: Sequence[str],
    answers: Sequence[str],
    reward_fn: RewardFn,
    n: int = 1,
    **sample_kwargs,
) -> EvalResult:
    """Sample `n` completions per prompt and score them with `reward_fn` (TRL reward-function contract)."""
    if len(prompts) != len(answers):
        raise ValueError(f"evaluate: {len(prompts)} prompts but {len(answers)} answers; they must pair up.")
    if not prompts:
        raise ValueError("evaluate: no prompts to evaluate.")
    completions = sample_completions(model, tokenizer, prompts, n=n, **sample_kwargs)
    repeated_answers = [a for a in answers for _ in range(n)]
    rewards = reward_fn(completions=completions, answer=repeated_answers)
    correct_P = tuple(int(sum(r >= 1.0 for r in rewards[i * n : (i + 1) * n])) for i in range(len(prompts)))
    acc = sum(c / n for c in correct_P) / len(prompts)
    return EvalResult(acc, n, len(prompts), correct_P, tuple(completions))


def paired_bootstrap_ci(correct_a_P: Sequence[int], correct_b_P: Sequence[int], n: int, *,
                        resamples: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Difference of acc@n, b − a, on the SAME problems, with a percentile bootstrap CI over problems.

    Each resample draws problems with replacement and takes the mean of (c_b − c_a)/n over them, so the
    pairing (both models answered the same problems) is kept. Returns (difference, low, high).
    """
    if len(correct_a_P) != len(correct_b_P) or not correct_a_P:
        raise ValueError("paired_bootstrap_ci: both results must cover the same, non-empty list of problems.")
    diff_P = torch.tensor([(b - a) / n for a, b in zip(correct_a_P, correct_b_P, strict=True)], dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    index_RP = torch.randint(len(diff_P), (resamples, len(diff_P)), generator=generator)
    means_R = diff_P[index_RP].mean(1)
    tail = (1 - level) / 2
    low, high = torch.quantile(means_R, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return float(diff_P.mean()), low, high
