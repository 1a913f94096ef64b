"""What the probe tests share (tests/test_probes.py, tests/test_oar_p_sharing.py, and the signal tests that read text:
test_credit_candidates_grad.py, test_grail_over_surprise.py, test_against_captum.py): the tiny Qwen3 they probe
(float32 and a float64 copy), the test batches in TRL's layout, and references computed from full logits."""

import torch

from grail.models.tiny import build_tiny_model

PAD = 0  # the tiny tokenizer's pad (= eos) id
P, T = 6, 10  # prompt and completion widths of the test batch


def probe_model(tokenizer, max_positions: int = 64):
    """The tiny Qwen3 the probes are tested on (the `model` fixture of each probe test module; the text batches of
    `text_rows` need max_positions=96)."""
    model = build_tiny_model(tokenizer, seed=0, hidden_size=64, intermediate_size=128, max_positions=max_positions)
    # Random init gives near-uniform distributions; sharper weights make KLs and saliencies less tiny.
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(8.0)
    return model.eval()


def float64_copy(model):
    """A float64 copy: references then agree to rounding far below the 1e-5 tolerances used below."""
    import copy

    return copy.deepcopy(model).double().eval()


def padded_rows(prompt_width: int, completion_width: int, seed: int, layout: list[tuple[int, int]]):
    """(ids, attn) of rows in TRL's layout, random tokens from `seed`: row i's prompt left-padded by layout[i][0], its
    completion layout[i][1] tokens long and right-padded after them; padding holds PAD."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (len(layout), prompt_width + completion_width), generator=g)
    attn = torch.ones_like(ids)
    for i, (left, completion) in enumerate(layout):
        attn[i, :left], attn[i, prompt_width + completion :] = 0, 0
    ids[attn == 0] = PAD
    return ids, attn


# two worked answers: the prompts and the completions of the text batches
WORKED = (["Q: 7*5-8\nA:", "Q: 9+6-4\nA:"], [" 7*5=35, 35-8=27. so \\boxed{27}", " 9+6=15 \\boxed{15}"])


def text_rows(tokenizer, prompts, completions):
    """(ids_BL, attn_BL, T) of texts in TRL's layout: prompts left-padded, completions right-padded."""
    p = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    c = tokenizer(completions, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    return (torch.cat([p["input_ids"], c["input_ids"]], 1), torch.cat([p["attention_mask"], c["attention_mask"]], 1),
            c["input_ids"].shape[1])


def probe_batch():
    """Three rows in TRL's layout (P = 6 left-padded prompt, T = 10 right-padded completion):
    row 0 full; row 1 prompt left-padded by 2, completion of 7; row 2 prompt left-padded by 1, completion of 5.
    Answers: row 0 tokens 6..7, row 1 token 4, row 2 none."""
    ids, attn = padded_rows(P, T, 0, [(0, T), (2, 7), (1, 5)])
    answer = torch.zeros(3, T, dtype=torch.bool)
    answer[0, 6:8], answer[1, 4] = True, True
    return ids, attn, answer


def completion_mask(attn):
    return attn[:, P:].bool()


def reference_logits(model, ids, attn, **kwargs):
    return model(input_ids=ids, attention_mask=attn, **kwargs).logits


def reference_answer_logits(logits_LV, attn_L, answer_T, distribution, temperature):
    """P_final's logits from full logits of one row: last real position, or the mean over the predicting positions
    of the answer tokens (completion token t at P + t, predicted at P + t − 1)."""
    if distribution == "last_position":
        chosen = logits_LV[attn_L.nonzero().max()]
    else:
        chosen = logits_LV[P - 1 : -1][answer_T].mean(0)
    return chosen.float() / temperature


def scored_batch():
    ids, attn, answer = probe_batch()
    scored = completion_mask(attn).clone()
    scored[0, 2] = False  # one unscored real token
    scored[2] = False  # a row with nothing scored
    return ids, attn, answer, scored


def influencing_tokens(scored, answer, distribution):
    """Scored tokens that can change P_final: all of them for the last position; for the answer mean, those at or
    before the last position predicting an answer token (completion t' at P + t', predicted at P + t' − 1)."""
    if distribution == "last_position":
        return scored.clone()
    last = torch.where(answer.any(1), T - 1 - answer.flip(1).int().argmax(1), -1)  # last answer token t'
    return scored & (torch.arange(T)[None] <= (last - 1)[:, None])
