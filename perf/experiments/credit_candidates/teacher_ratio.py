"""Candidate credit signal (issue 45): the policy as its own self-distillation teacher, told the answer.

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
group; the row itself when it is the best correct row). With binary rewards A > 0 means correct, so this is a graded-
correct answer; with graded rewards it is only the group's best. A row whose group has no such row (a group with no
row above its mean among the probed rows, or a lone wrong trace) gets signal 0, hence uniform weights on its
reasoning. That is why the method selects `rows="advantaged"` (every row with A ≠ 0): GRAIL's selection
(`rows="saliency"`, wrong rows only by default) would hide the correct rows whose answers are the hints. Wrong rows
that `rollout_symmetry` leaves out still get weights 1 from GRAIL's pipeline; their forwards are spent only on the
probe's contract (a signal on every row it is given). Passing the dataset's reference answer to probes would need a
new `ProbeBatch` field fed by the trainer from TRL's batch (not done here).

Sign: |r| by default. A token the answer makes more likely (the teacher endorses it) and one it makes less likely (on a
wrong row, the intermediate result that contradicts the answer) both depend on the outcome; filler and format tokens do
not move. GRAIL's pipeline reads the signal as importance (log, z-score), and the AUROC as a ranking of importance, so
the magnitude is what both need; the positive part keeps only the endorsed tokens and would miss a wrong row's errors.
The answer's own tokens get the largest |r| (the teacher copies them); GRAIL's overrides fix their weights anyway.

Cost: two no-grad forwards on the probed rows (the student's equals TRL's own log-prob forward and could be read from
it; the teacher's is longer by the hint's tokens), and a decode of each probed row to find its box.
"""

from __future__ import annotations

import torch

from grail import MethodOption, MethodSpec
from grail.methods.builtin import SALIENCY_READS, saliency_pipeline
from grail.methods.spans import align_to_completion
from grail.tasks.boxed import last_boxed_content

__all__ = ["SPEC", "completion_logps", "group_references", "teacher_log_ratio", "with_hints"]


def completion_logps(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, T: int,
                     temperature: float) -> torch.Tensor:
    """(B, T) float32 log π(y_t | ·) of the last T columns' tokens at `temperature`, one no-grad forward."""
    with torch.no_grad():
        logits_BLV = model(input_ids=input_ids_BL, attention_mask=attention_mask_BL).logits
    logp_BTV = torch.log_softmax(align_to_completion(logits_BLV, T, at="predicting").float() / temperature, -1)
    return logp_BTV.gather(-1, input_ids_BL[:, -T:, None]).squeeze(-1)


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
                      hints: list[list[int]], pad_id: int, temperature: float = 1.0) -> torch.Tensor:
    """(B, T) float32 r_t = log π(y_t | prompt ⊕ hint, y_<t) − log π(y_t | prompt, y_<t), 0 on padding. Two
    no-grad forwards (student, teacher); with every hint empty they see the same batch and r = 0 exactly."""
    student_BT = completion_logps(model, input_ids_BL, attention_mask_BL, T, temperature)
    teacher_ids_BL, teacher_mask_BL = with_hints(input_ids_BL, attention_mask_BL, T, hints, pad_id)
    teacher_BT = completion_logps(model, teacher_ids_BL, teacher_mask_BL, T, temperature)
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
    """(rows, T): |r_t| (or its positive part) with the group's best correct answer as the hint; 0 on rows with
    none."""
    if rows.adv_B is None or rows.tokenizer is None:
        raise ValueError("teacher_ratio: the probe needs the rows' advantages and the tokenizer (to find a correct "
                         "answer in each group); call it through grail.token_weights / weights_for.")
    own = options.method_options
    T = rows.answer_BT.shape[1]
    references = group_references(rows.input_ids_BL, rows.attention_mask_BL, T, rows.adv_B, rows.tokenizer)
    template = own["teacher_ratio_hint"]
    hints = [rows.tokenizer.encode(template.format(answer=ref), add_special_tokens=False)
             if ref is not None and template else [] for ref in references]
    pad = rows.tokenizer.pad_token_id if rows.tokenizer.pad_token_id is not None else rows.tokenizer.eos_token_id
    ratio_BT = teacher_log_ratio(model, rows.input_ids_BL, rows.attention_mask_BL, T, hints, pad,
                                 options.temperature)
    has_hint_B = torch.tensor([bool(h) for h in hints], device=ratio_BT.device)
    ratio_BT = torch.where(has_hint_B[:, None], ratio_BT, torch.zeros_like(ratio_BT))  # no hint: exactly 0
    return ratio_BT.abs() if own["teacher_ratio_sign"] == "abs" else ratio_BT.clamp(min=0)


def _check(options, config) -> str | None:
    template = options.method_options.get("teacher_ratio_hint", "")
    try:
        template.format(answer="")
    except (KeyError, IndexError, ValueError) as err:
        return (f"teacher_ratio_hint={template!r}: not a str.format template with only {{answer}} ({err}); "
                f"e.g. 'The answer is {{answer}}.\\n'")
    return None


SPEC = MethodSpec(
    "teacher_ratio", "teacher ratio", _probe, saliency_pipeline, rows="advantaged", reads=SALIENCY_READS,
    preserves_mass=False, check=_check,
    options=(
        MethodOption("teacher_ratio_hint", "The answer is {answer}.\n", "text inserted between the prompt and the "
                     "completion for the teacher's forward, {answer} replaced by the group's best correct answer; "
                     "'' adds nothing (signal 0)"),
        MethodOption("teacher_ratio_sign", "abs", "how the log-ratio becomes importance: its absolute value (tokens "
                     "the answer makes more or less likely) or its positive part (only tokens it makes more likely)",
                     choices=("abs", "positive")),
    ),
    title="Teacher ratio: |log π(token | answer in context) − log π(token)|, through GRAIL's normalisation",
    summary="The same model as a self-distillation teacher that is told a correct answer of the group (a hint "
            "between prompt and completion): the per-token log-likelihood ratio against the plain policy, its "
            "magnitude turned into weights by GRAIL's pipeline.",
    example="teacher_ratio_sign='positive'",
    cost="two no-grad forwards on every row with A ≠ 0 (the student's is TRL's own log-prob forward, not yet shared; "
         "the teacher's is longer by the hint) and a decode per row",
    reference="self-distillation with privileged information (answer-conditioned teacher), issue 45 candidate",
    open_choices=("The hint is the group's best correct completion's last box, not the dataset's reference answer, "
                  "which probes cannot see.",
                  "The hint goes after the prompt (the assistant's turn), not inside the user message."),
)
