r"""A label set on the models' own sampled rollouts of the chain task: each token labelled by its role in the
arithmetic the model itself wrote, as saliency rows (`grail.analysis.saliency.token_labels`).

Pure Python (no torch, no model). The sampling is the caller's (perf/experiments/saliency_auroc.py --label-set
chain_rollouts); this module only reads text.

A chain-task completion (`grail.tasks.chain_problems`) looks like
    "Lily has 16 + 26 = 42 toy cars. Max has 42 + 49 = 91 toy cars. Tom has 91 - 14 = 87 toy cars. \boxed{87}"
`rollout_row(prompt, completion)` labels its reasoning (the text before the first complete box, the box that GRAIL's
answer span reads; `answer_box="first"`):
  1. Equations: maximal runs "a op b [op c ...] = r" of integers (`EQUATION`; op one of + - * x ×). CRITICAL: each
     operator and the result r, whatever their truth: the role in the model's OWN arithmetic
     (`grail.tasks.arithmetic.CRITICAL_ROLES`), so a wrong "42 + 49 = 92" labels "+" and "92" too. Operands (copied
     numbers) and "=" are unlabelled, as in the reference sets.
  2. Sentences: the reasoning cut after each ".", "!", "?" or newline. In a sentence that holds an equation, the
     contrast class (`filler_spans`) is its format: the letters of its words (names, "has", objects, any other word)
     outside the equation, and its closing ".". A sentence without an equation ("Let me think.") is left unlabelled:
     it is not the format of a step.
  3. Malformed completions are skipped, each with its reason (`SKIPS`): no complete box ("no box"), no equation
     before it ("no equation"), or an equation but no contrast word ("no format word"). `rollout_rows` counts them.
The row keeps `arithmetic_ok` (every equation true) and, given the reference answer, `correct` (the LAST box equals
it, as the reward reads it), so a caller can split or weight; and `group` (the prompt's index: samples of one prompt
share it), which the fixed-position AUROC (`grail.analysis.saliency.fixed_position`) uses as its strata's group.
Nothing counterbalances role and position here: the estimator pairs what happens to share a (prompt, length,
position) and reports the share of tokens that entered.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from grail.analysis.saliency.token_labels import span_runs
from grail.tasks.boxed import first_boxed, last_boxed

__all__ = ["EQUATION", "rollout_row", "rollout_rows", "SKIPS"]

EQUATION = re.compile(r"(?<![\d.])\d+(?:\s*[-+*x×]\s*\d+)+\s*=\s*\d+(?![\d.]\d)")
_OPERATOR = re.compile(r"(?<=[\d\s])[-+*x×](?=[\s\d])")
_RESULT = re.compile(r"=\s*(\d+)$")
_SENTENCE = re.compile(r"[^.!?\n]*(?:[.!?]|\n|$)")
SKIPS = ("no box", "no equation", "no format word")


def rollout_row(prompt, completion: str, group: int | None = None, answer: str | None = None) -> dict | str:
    """The saliency row of one sampled completion (module docstring), or the reason it is skipped (one of `SKIPS`).

    Args:
        prompt: the prompt as the row should carry it (chat messages or rendered text); completion: the sampled
            text. group: the prompt's index; answer: the reference answer (for `correct`).
    """
    box = first_boxed(completion)
    if box is None:
        return "no box"
    reasoning = completion[:box.start]
    critical = [False] * len(completion)
    in_equation = [False] * len(completion)
    ok = True
    equations = list(EQUATION.finditer(reasoning))
    if not equations:
        return "no equation"
    for eq in equations:
        text = eq.group()
        for i in range(eq.start(), eq.end()):
            in_equation[i] = True
        for op in _OPERATOR.finditer(text):
            critical[eq.start() + op.start()] = True
        result = _RESULT.search(text)
        for i in range(eq.start() + result.start(1), eq.start() + result.end(1)):
            critical[i] = True
        left = re.sub(r"\s", "", text[:text.rindex("=")]).replace("×", "*").replace("x", "*")
        ok &= _value(left) == int(result.group(1))
    contrast = [False] * len(completion)
    for sentence in _SENTENCE.finditer(reasoning):
        a, b = sentence.span()
        if a == b or not any(in_equation[a:b]):
            continue
        for i in range(a, b):
            ch = completion[i]
            contrast[i] = not in_equation[i] and (ch.isalpha() or (ch == "." and i == b - 1))
    if not any(contrast):
        return "no format word"
    row = {"prompt": prompt, "solution": completion, "critical_spans": span_runs(critical),
           "filler_spans": span_runs(contrast), "arithmetic_ok": ok, "label_set": "chain_rollouts"}
    if group is not None:
        row["group"] = group
    if answer is not None:
        last = last_boxed(completion)
        row["correct"] = last is not None and last.content(completion).strip() == str(answer).strip()
    return row


def _value(expression: str) -> int:
    """The value of "a+b*c-d" (integers, + - *, usual precedence) without eval."""
    total, term, sign = 0, None, 1
    for token in re.findall(r"\d+|[-+*]", expression):
        if token == "*":
            continue
        if token in "+-":
            total += sign * term
            sign, term = (1 if token == "+" else -1), None
        else:
            term = int(token) if term is None else term * int(token)
    return total + sign * term


def rollout_rows(samples: Iterable[tuple]) -> tuple[list[dict], Counter]:
    """Rows of the labelled samples, and how many were skipped for each reason of `SKIPS`.

    Args:
        samples: (prompt, completion, group[, answer]) tuples, e.g. every completion of every prompt.
    """
    rows, skipped = [], Counter()
    for sample in samples:
        out = rollout_row(*sample)
        if isinstance(out, str):
            skipped[out] += 1
        else:
            rows.append(out)
    return rows, skipped
