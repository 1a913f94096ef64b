"""Candidate credit signal (screened): the policy as its own self-distillation teacher, told the answer.

Signal, per row and completion token t (read at the position that predicts t, where log-probs live):

    r_t = log π(y_t | prompt ⊕ hint(answer), y_<t) − log π(y_t | prompt, y_<t)
    s_t = |r_t|  (`teacher_ratio_sign="abs"`, default)   or   max(r_t, 0)  (`"positive"`)

at the sampling temperature. hint(answer) is `teacher_ratio_hint` with `{answer}` replaced, tokenized and inserted
between the prompt's last real token and the completion (after the chat template's assistant header, so the teacher
reads it as the start of its own turn; a placement inside the user message would need each template's structure).
A hint of "" adds nothing: the teacher's input is then the student's, and r = 0 exactly (the test's control).

What the probe can see, and the reference it uses: `ProbeBatch` holds ids, masks, spans, the rows' advantages and the
tokenizer, not the dataset's reference answer. The probe therefore takes, for each row, the content of the LAST box
(what the reward grades) of the highest-advantage row with A > 0 among the probed rows that share its prompt ids (its
group, as KTAE finds groups; the row itself when it is the best correct row). With binary rewards A > 0 means correct,
so this is a graded-correct answer; with graded rewards it is only the group's best. A row whose group has no such row
among the probed rows gets signal 0 (its forwards are skipped), hence uniform weights on its reasoning. Hence two
choices of the spec: `rows="advantaged"` (every row with A ≠ 0), since GRAIL's selection (`rows="saliency"`, wrong
rows only by default) would hide the correct rows whose answers are the hints; and `groups=True`, so the trainer
computes the weights once per rollout batch, where every group is whole (`weights_from="rollout_policy"`), rather
than per micro-batch after TRL's shuffle has scattered the groups. Correct rows that `rollout_symmetry` leaves out
still get weights 1 from GRAIL's pipeline; their forwards are spent only on the probe's contract (a signal on every
row it is given). Passing the dataset's reference answer to probes would need a new `ProbeBatch` field fed by the
trainer from TRL's batch (not done here).

Sign: |r| by default. A token the answer makes more likely (the teacher endorses it) and one it makes less likely (on a
wrong row, the intermediate result that contradicts the answer) both depend on the outcome; filler and format tokens do
not move. GRAIL's pipeline reads the signal as importance (log, z-score), and the AUROC as a ranking of importance, so
the magnitude is what both need; the positive part keeps only the endorsed tokens and would miss a wrong row's errors
(on the tiny model below it ranks filler above the critical tokens: pooled AUROC 0.27).
The answer's own tokens get the largest |r| (the teacher copies them); GRAIL's overrides fix their weights anyway.

Control: |r| measures how much a token's likelihood moves when the context changes, and any change moves the
context-dependent tokens (digits, results) more than filler. A hint without `{answer}` ("Think step by step.\n") or
with a wrong one gives the same kind of ratio without the answer's information; the candidate is only an
answer-aware teacher where it beats that control (the control hint goes to the same rows, those with a reference).
On the warm-started tiny model (perf/experiments/saliency_auroc.py's default set: 64 held-out symbolic problems,
filler rate 0.6; signal AUROC pooled / position-matched) it does not: 0.73 / 0.73 with the answer, 0.76 / 0.71 with
"Think step by step.", 0.75 / 0.72 with "The answer is 12345.".

Cost: once per rollout batch, two no-grad forwards on the rows that have a hint, `teacher_ratio_chunk_rows` rows at a
time, with logits only at the completion (the student's repeats TRL's old log-probs and could be read from them; the
teacher's is longer by the hint's tokens), and a decode of each row with A > 0 to find its box.
"""

from __future__ import annotations

import torch

from grail import MethodOption, MethodSpec
from grail.methods.builtin import SALIENCY_READS, saliency_pipeline
from grail.methods.spans import align_to_completion
from grail.tasks.boxed import last_boxed_content

__all__ = ["SPEC", "completion_logps", "group_references", "teacher_log_ratio", "with_hints"]


def completion_logps(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, T: int,
                     temperature: float, chunk_rows: int = 8) -> torch.Tensor:
    """(B, T) float32 log π(y_t | ·) of the last T columns' tokens at `temperature`: no-grad forwards of `chunk_rows`
    rows at a time, with logits only at the T positions that predict them (`logits_to_keep`; K = T + 1 kept)."""
    parts = []
    for start in range(0, input_ids_BL.shape[0], chunk_rows):
        ids_BL, mask_BL = input_ids_BL[start:start + chunk_rows], attention_mask_BL[start:start + chunk_rows]
        with torch.no_grad():
            logits_BKV = model(input_ids=ids_BL, attention_mask=mask_BL, logits_to_keep=T + 1).logits  # K = T + 1
        logits_BTV = align_to_completion(logits_BKV, T, at="predicting")  # the kept positions S − 1 .. L − 2
        logp_BTV = torch.log_softmax(logits_BTV.float() / temperature, -1)
        parts.append(logp_BTV.gather(-1, ids_BL[:, -T:, None]).squeeze(-1))
    return torch.cat(parts)


def with_hints(input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, T: int, hints: list[list[int]],
               pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch with `hints[b]`'s ids inserted between row b's prompt and its completion: each row becomes
    pad × (H − h_b) ⊕ its original prompt columns ⊕ hint ⊕ its completion columns, H = the longest hint, so the
    prompt stays left-padded and the completion stays the last T columns. With every hint empty the result is the
    input itself (same tensors' values, same width)."""
    B, L = input_ids_BL.shape
    S = L - T
    width = max((len(h) for h in hints), default=0)
    ids_BL = input_ids_BL.new_full((B, S + width + T), pad_id)
    mask_BL = attention_mask_BL.new_zeros((B, S + width + T))
    for b, hint in enumerate(hints):
        start = width - len(hint)
        ids_BL[b, start:start + S], mask_BL[b, start:start + S] = input_ids_BL[b, :S], attention_mask_BL[b, :S]
        ids_BL[b, S + start:S + width] = torch.tensor(hint, dtype=ids_BL.dtype)
        mask_BL[b, S + start:S + width] = 1
    ids_BL[:, -T:], mask_BL[:, -T:] = input_ids_BL[:, -T:], attention_mask_BL[:, -T:]
    return ids_BL, mask_BL


def teacher_log_ratio(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, T: int,
                      hints: list[list[int]], pad_id: int, temperature: float = 1.0,
                      chunk_rows: int = 8) -> torch.Tensor:
    """(B, T) float32 r_t = log π(y_t | prompt ⊕ hint, y_<t) − log π(y_t | prompt, y_<t), 0 on padding. No-grad
    forwards of the student's and the teacher's batch; with every hint empty they see the same batch and r = 0
    exactly."""
    student_BT = completion_logps(model, input_ids_BL, attention_mask_BL, T, temperature, chunk_rows)
    teacher_ids_BL, teacher_mask_BL = with_hints(input_ids_BL, attention_mask_BL, T, hints, pad_id)
    teacher_BT = completion_logps(model, teacher_ids_BL, teacher_mask_BL, T, temperature, chunk_rows)
    return (teacher_BT - student_BT) * attention_mask_BL[:, -T:].to(teacher_BT.dtype)


def group_references(input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, T: int, adv_B: torch.Tensor,
                     tokenizer) -> list[str | None]:
    """Per row: the last box's content of the highest-advantage row with A > 0 and a box among the rows with the
    same prompt ids (ties: the first such row), or None (module docstring)."""
    S = input_ids_BL.shape[1] - T
    ids, masks, advs = input_ids_BL.tolist(), attention_mask_BL.tolist(), adv_B.tolist()
    best: dict[tuple[int, ...], tuple[float, str]] = {}
    keys = []
    for b in range(len(ids)):
        key = tuple(i for i, m in zip(ids[b][:S], masks[b][:S], strict=True) if m)
        keys.append(key)
        if advs[b] <= 0:
            continue
        completion = [i for i, m in zip(ids[b][S:], masks[b][S:], strict=True) if m]
        answer = last_boxed_content(tokenizer.decode(completion, skip_special_tokens=True))
        if answer and (key not in best or advs[b] > best[key][0]):
            best[key] = (advs[b], answer)
    return [best[key][1] if key in best else None for key in keys]


def _probe(model, rows, options, generator) -> torch.Tensor:
    """(rows, T): |r_t| (or its positive part) with the group's best correct answer as the hint; 0 on the rows with
    none, whose forwards are skipped."""
    if rows.adv_B is None or rows.tokenizer is None:
        raise ValueError("teacher_ratio: the probe needs the rows' advantages and the tokenizer (to find a correct "
                         "answer in each group); call it through grail.token_weights / weights_for.")
    own = options.method_options
    T = rows.answer_BT.shape[1]
    references = group_references(rows.input_ids_BL, rows.attention_mask_BL, T, rows.adv_B, rows.tokenizer)
    template = own["teacher_ratio_hint"]
    hints = [rows.tokenizer.encode(template.format(answer=ref), add_special_tokens=False)
             if ref is not None and template else [] for ref in references]
    signal_BT = torch.zeros(rows.answer_BT.shape, dtype=torch.float32, device=rows.input_ids_BL.device)
    index = [b for b, hint in enumerate(hints) if hint]
    if not index:
        return signal_BT
    pad = rows.tokenizer.pad_token_id if rows.tokenizer.pad_token_id is not None else rows.tokenizer.eos_token_id
    ratio_BT = teacher_log_ratio(model, rows.input_ids_BL[index], rows.attention_mask_BL[index], T,
                                 [hints[b] for b in index], pad, options.temperature, own["teacher_ratio_chunk_rows"])
    signal_BT[index] = ratio_BT.abs() if own["teacher_ratio_sign"] == "abs" else ratio_BT.clamp(min=0)
    return signal_BT


def _check(options, config) -> str | None:
    template = options.method_options.get("teacher_ratio_hint", "")
    try:
        template.format(answer="")
    except (KeyError, IndexError, ValueError) as err:
        return (f"teacher_ratio_hint={template!r}: not a str.format template with only {{answer}} ({err}); "
                f"e.g. 'The answer is {{answer}}.\\n'")
    return None


SPEC = MethodSpec(
    "teacher_ratio", "teacher ratio", _probe, saliency_pipeline, rows="advantaged", groups=True,
    reads=SALIENCY_READS, preserves_mass=False, check=_check,
    options=(
        MethodOption("teacher_ratio_hint", "The answer is {answer}.\n", "text inserted between the prompt and the "
                     "completion for the teacher's forward, {answer} replaced by the group's best correct answer; "
                     "'' adds nothing (signal 0)"),
        MethodOption("teacher_ratio_sign", "abs", "how the log-ratio becomes importance: its absolute value (tokens "
                     "the answer makes more or less likely) or its positive part (only tokens it makes more likely)",
                     choices=("abs", "positive")),
        MethodOption("teacher_ratio_chunk_rows", 8, "rows per forward: the probe gets the whole rollout batch at once "
                     "(it reads whole groups), so this bounds its memory", minimum=1),
    ),
    title="Teacher ratio: |log π(token | answer in context) − log π(token)|, through GRAIL's normalisation",
    summary="The same model as a self-distillation teacher that is told a correct answer of the group (a hint "
            "between prompt and completion): the per-token log-likelihood ratio against the plain policy, its "
            "magnitude turned into weights by GRAIL's pipeline.",
    example="teacher_ratio_sign='positive'",
    cost="once per rollout batch (weights_from='rollout_policy', as it reads whole groups): two no-grad forwards on "
         "every row with A ≠ 0 whose group has a correct row (the student's repeats TRL's old log-probs; the "
         "teacher's is longer by the hint), logits only at the completion, and a decode per row",
    reference="self-distillation with privileged information (answer-conditioned teacher), a screened candidate",
    open_choices=("The hint is the group's best correct completion's last box, not the dataset's reference answer, "
                  "which probes cannot see.",
                  "The hint goes after the prompt (the assistant's turn), not inside the user message.",
                  "Needs its control in any screen: the same ratio with a hint that carries no answer "
                  "(teacher_ratio_hint='Think step by step.\\n').",),
)
