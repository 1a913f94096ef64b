r"""The chain task's problem sets: three splits that never share a problem (`sft` for the supervised warm start,
`train` for RL, `heldout` for evaluation), the set a run would use (`ChainSet`), and the statistics of its answers.

Problems are drawn and told by `grail.tasks.chain_problems` (its docstring shows one). Splits (`ChainSplits`): the
sha256 of a problem's identity (its arithmetic, e.g. ``23+15-8+q1``; never its names or object), read as a fraction u
in [0, 1), puts it in ``heldout`` if u < heldout_fraction, in ``sft`` if u < heldout_fraction + sft_fraction, else in
``train``. So the three splits are disjoint by construction whatever the seeds, sizes and tasks, as long as every set
uses the same fractions; `check_heldout_disjoint` refuses sets whose fractions differ from the held-out set's (their
sft or train split could hold a held-out problem).

Statistics (`answer_stats`): a constant answer scores the share of its most common answer, so the held-out split of
the default set has at least 200 problems, at least 100 distinct answers and no answer above 3% (tested). Print them,
or any set's, with ``python -m grail.tasks.chains --stats`` (flags: the `ChainConfig` and `ChainSet` fields).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from collections import Counter
from dataclasses import dataclass, field, fields

from grail.tasks.arithmetic import TaskExample, draw_budget, draw_seeds
from grail.tasks.chain_problems import ChainConfig, identity_of, render_chain, sample_chain, values_of

__all__ = ["answer_stats", "AnswerStats", "chain_examples", "ChainSet", "ChainSplits", "check_heldout_disjoint",
           "main", "SPLITS", "stats_table"]

SPLITS = ("sft", "train", "heldout")


@dataclass(frozen=True)
class ChainSplits:
    """Which split a problem belongs to, from its identity alone (the module docstring's rule)."""

    heldout_fraction: float = 0.1
    sft_fraction: float = 0.3

    def __post_init__(self):
        for name in ("heldout_fraction", "sft_fraction"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"ChainSplits {name}={getattr(self, name)!r} must be in (0, 1), e.g. 0.1; "
                                 "it is the share of all problems that the split owns.")
        if self.heldout_fraction + self.sft_fraction >= 1.0:
            raise ValueError(
                f"ChainSplits heldout_fraction + sft_fraction = {self.heldout_fraction + self.sft_fraction:g} leaves "
                "the train split nothing (the three splits partition [0, 1)); lower one of them so the sum is < 1.")

    def split_of(self, identity: str) -> str:
        digest = hashlib.sha256(identity.encode("utf-8")).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        return "heldout" if u < self.heldout_fraction else "sft" if u < self.heldout_fraction + self.sft_fraction \
            else "train"


def chain_examples(config: ChainConfig, n: int, split: str, seed: int, splits: ChainSplits = ChainSplits(),
                   max_per_answer: int | None = None) -> list[TaskExample]:
    """Exactly `n` problems of `split` with distinct identities, deterministic in the arguments.

    Draws come from ``random.Random(f"chains:{seed}:{split}")``; each draw seeds its own arithmetic RNG
    (``:arithmetic``) and story RNG (``:story``), so filler_rate never changes which problems are drawn. Draws of
    another split, repeats, and (with `max_per_answer`) draws whose answer already has `max_per_answer` problems are
    skipped; after 200 * n + 10000 draws without n problems, ValueError (the problem space is too small for n)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not a chain split; choose one of {', '.join(SPLITS)}.")
    if n < 0:
        raise ValueError(f"n={n} must be >= 0.")
    per_answer: Counter[str] = Counter()
    rng = random.Random(f"chains:{seed}:{split}")
    examples: list[TaskExample] = []
    seen: set[str] = set()
    for draw_seed in draw_seeds(rng, n):
        if len(examples) == n:
            break
        start, steps = sample_chain(config, random.Random(f"{draw_seed}:arithmetic"))
        identity = identity_of(start, steps)
        if identity in seen or splits.split_of(identity) != split:
            continue
        answer = str(values_of(start, steps)[-1])
        if max_per_answer is not None and per_answer[answer] >= max_per_answer:
            continue
        seen.add(identity)
        per_answer[answer] += 1
        examples.append(render_chain(config, start, steps, random.Random(f"{draw_seed}:story")))
    if len(examples) < n:
        capped = "" if max_per_answer is None else f" with at most {max_per_answer} per answer"
        raise ValueError(
            f"found only {len(examples)} distinct {split!r} chain problems{capped} of the n={n} asked in "
            f"{draw_budget(n)} draws: the problem space is too small. Raise num_steps, max_value or widen "
            f"operand_min..operand_max (now {config.num_steps}, {config.max_value}, "
            f"{config.operand_min}..{config.operand_max}), or lower n"
            f"{' or raise heldout_max_answer_share' if capped else ''}.")
    return examples


@dataclass(frozen=True)
class ChainSet:
    """The chain problems of one run: `num_sft` warm-start, `num_train` RL and `num_heldout` evaluation problems of
    `task`, drawn with `seed`, split by `splits`. In the held-out split at most heldout_max_answer_share of the
    problems (rounded down, at least 1) share an answer: 256 problems drawn freely from the default task put up to 3.5%
    on one answer (seeds 0..19), and a constant answer must score at most 3%. The sft and train splits are drawn
    freely."""

    task: ChainConfig = field(default_factory=ChainConfig)
    num_sft: int = 2000
    num_train: int = 2000
    num_heldout: int = 256
    seed: int = 0
    splits: ChainSplits = field(default_factory=ChainSplits)
    heldout_max_answer_share: float = 0.02

    def __post_init__(self):
        for name in ("num_sft", "num_train", "num_heldout"):
            if getattr(self, name) < 1:
                raise ValueError(f"ChainSet {name}={getattr(self, name)} must be >= 1; every split needs a problem.")
        if not 0.0 < self.heldout_max_answer_share <= 1.0:
            raise ValueError(f"ChainSet heldout_max_answer_share={self.heldout_max_answer_share!r} must be in (0, 1], "
                             "e.g. 0.02 (1 = no cap).")

    def size(self, split: str) -> int:
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not a chain split; choose one of {', '.join(SPLITS)}.")
        return {"sft": self.num_sft, "train": self.num_train, "heldout": self.num_heldout}[split]

    def examples(self, split: str) -> list[TaskExample]:
        """`split`'s problems, in generation order."""
        n = self.size(split)
        cap = max(1, int(self.heldout_max_answer_share * n)) if split == "heldout" else None
        return chain_examples(self.task, n, split, self.seed, self.splits, cap)

    def rows(self, split: str) -> list[dict]:
        """`split`'s problems as {prompt, answer} rows (prompt: chat messages), as `grail.tasks.synthetic.SyntheticSet`
        gives them to training and evaluation."""
        return [{"prompt": e.prompt, "answer": e.answer} for e in self.examples(split)]

    def sft_pairs(self, split: str = "sft") -> list[dict]:
        """`split`'s problems as conversational prompt-completion rows for TRL's SFTTrainer:
        {"prompt": [user turn], "completion": [{"role": "assistant", "content": solution}]}. On such rows SFTTrainer
        computes the loss on the completion only (its `completion_only_loss`, None by default, means so for
        prompt-completion data): the model learns the solution's format, not the question's wording."""
        return [{"prompt": e.prompt, "completion": [{"role": "assistant", "content": e.solution}]}
                for e in self.examples(split)]


def check_heldout_disjoint(heldout: ChainSet, *others: ChainSet) -> None:
    """Raise ValueError unless every set of `others` (e.g. the warm start's and the RL run's) splits problems as
    `heldout` does: with one `ChainSplits`, no problem of `heldout`'s held-out split is in the sft or train split of
    any of them, whatever their tasks, seeds and sizes (a problem's split depends on its identity alone). With other
    fractions the intervals of u differ, and a held-out problem can be another set's training problem."""
    for k, other in enumerate(others):
        if other.splits != heldout.splits:
            raise ValueError(
                f"set {k} of the training sets splits problems with {other.splits}, the held-out set with "
                f"{heldout.splits}: its sft or train split can hold held-out problems. Give every ChainSet the same "
                "splits (the default ChainSplits() unless all of them change it).")


@dataclass(frozen=True)
class AnswerStats:
    """What a problem set's answers allow without reasoning. best_constant_share: the share of the most common answer,
    which is the accuracy of always answering it (the best constant answer)."""

    problems: int
    distinct_answers: int
    best_constant_answer: str
    best_constant_share: float
    answer_min: int
    answer_max: int
    mean_solution_chars: float
    mean_prompt_chars: float


def answer_stats(examples: list[TaskExample]) -> AnswerStats:
    if not examples:
        raise ValueError("answer_stats needs at least one example; draw a non-empty split.")
    counts = Counter(e.answer for e in examples)
    mode, count = counts.most_common(1)[0]
    answers = [int(a) for a in counts]
    return AnswerStats(
        problems=len(examples), distinct_answers=len(counts), best_constant_answer=mode,
        best_constant_share=count / len(examples), answer_min=min(answers), answer_max=max(answers),
        mean_solution_chars=sum(len(e.solution) for e in examples) / len(examples),
        mean_prompt_chars=sum(len(m["content"]) for e in examples for m in e.prompt) / len(examples))


def stats_table(stats: AnswerStats) -> str:
    """The statistics as a Markdown table (what ``--stats`` prints and the task's docs page shows)."""
    rows = [("problems", f"{stats.problems}"), ("distinct answers", f"{stats.distinct_answers}"),
            ("largest answer share = best-constant accuracy",
             f"{100 * stats.best_constant_share:.1f}% (answer {stats.best_constant_answer})"),
            ("answer range", f"{stats.answer_min}..{stats.answer_max}"),
            ("mean solution length", f"{stats.mean_solution_chars:.1f} characters"),
            ("mean prompt length", f"{stats.mean_prompt_chars:.1f} characters")]
    return "\n".join(["| statistic | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grail.tasks.chains",
                                     description="Chain word problems: print a split's answer statistics or examples.")
    parser.add_argument("--stats", action="store_true", help="print the split's answer statistics (Markdown)")
    parser.add_argument("--examples", type=int, default=0, help="print this many problems and solutions")
    parser.add_argument("--split", default="heldout", choices=SPLITS)
    defaults = ChainConfig()
    for f in fields(ChainConfig):
        default = getattr(defaults, f.name)
        if isinstance(default, tuple):
            parser.add_argument(f"--{f.name}", nargs="+", default=default, help=f"ChainConfig.{f.name}")
        else:
            parser.add_argument(f"--{f.name}", type=type(default), default=default, help=f"ChainConfig.{f.name}")
    for name in ("num_sft", "num_train", "num_heldout", "seed"):
        parser.add_argument(f"--{name}", type=int, default=getattr(ChainSet, name), help=f"ChainSet.{name}")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        task = ChainConfig(**{f.name: getattr(args, f.name) for f in fields(ChainConfig)}
                           | {"operations": tuple(args.operations)})
        chain_set = ChainSet(task=task, num_sft=args.num_sft, num_train=args.num_train,
                             num_heldout=args.num_heldout, seed=args.seed)
        examples = chain_set.examples(args.split)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for example in examples[:args.examples]:
        print(f"{example.prompt[-1]['content']}\n{example.solution}\n")
    if args.stats or not args.examples:
        print(stats_table(answer_stats(examples)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
