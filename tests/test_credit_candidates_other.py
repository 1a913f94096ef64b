"""The screened credit candidates outside the gradient family (perf/experiments/credit_candidates/): answer_attention
and teacher_ratio, on tiny models built here (a 2-layer Qwen3; for the attention also a Gemma 3 with sliding windows).
Each passes `grail.check_method`; each signal is checked against a reference computed another way (transformers' own
eager attention weights; separate unpadded forwards of the text with and without the hint), and against a control
that fixes its value (an empty hint adds nothing: r = 0 exactly)."""

import json

import pytest
import torch
from credit_candidates import answer_attention, teacher_ratio

import grail
from grail.analysis.checks import check_batch
from grail.cli import main
from grail.methods.weighting import batch_spans, run_probe
from grail.models.tiny import build_tiny_model
from grail.options.choices import WeightingOptions


@pytest.fixture(scope="module")
def model(tokenizer):
    """A 2-layer tiny Qwen3 (sdpa attention, as training loads it) with sharper distributions than a fresh init."""
    model = build_tiny_model(tokenizer, seed=0, num_layers=2, hidden_size=64, intermediate_size=128,
                             max_positions=128)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(3.0)
    return model.eval()


@pytest.fixture(scope="module")
def gemma3(tokenizer):
    """A float64 4-layer Gemma 3 with sliding-window layers (window 6, shorter than the batch's rows) around a full
    one: right-padding queries beyond the window see no real key, which eager attention turns into NaN weights."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                              sliding_window=6, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                              eos_token_id=tokenizer.eos_token_id, attn_implementation="sdpa",
                              layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                           "sliding_attention"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Gemma3ForCausalLM(config).double().eval()


@pytest.fixture(scope="module")
def batch(tokenizer):
    """`check_batch`: two groups of four rollouts (left-padded prompts, right-padded completions, one row without a
    box, advantages of both signs and 0), and its spans."""
    ids, attn, mask, adv = check_batch(tokenizer)
    return ids, attn, mask, adv, batch_spans(tokenizer, ids[:, -mask.shape[1]:], mask, WeightingOptions())


def _signal(spec, model, tokenizer, batch, **method_options):
    ids, attn, mask, adv, spans = batch
    options = WeightingOptions(token_weighting=spec.name, method_options=method_options)
    rows_B = mask.any(1)  # every row, as the saliency AUROC probes them
    return run_probe(model, ids, attn, spans, mask, rows_B, options, spec=spec, adv_B=adv, tokenizer=tokenizer)


@pytest.mark.parametrize("module", [answer_attention, teacher_ratio], ids=lambda m: m.__name__.split(".")[-1])
def test_candidates_pass_the_method_checker(module, model, tokenizer):
    report = grail.check_method(module.SPEC, model=model, tokenizer=tokenizer)
    assert report.ok and any(r.name == "reweights" and r.passed for r in report.results), report.text()


@pytest.mark.parametrize("module", [answer_attention, teacher_ratio], ids=lambda m: m.__name__.split(".")[-1])
def test_signals_are_per_token_detached_and_zero_on_padding(module, model, tokenizer, batch):
    mask = batch[2]
    signal_BT = _signal(module.SPEC, model, tokenizer, batch)
    assert signal_BT.shape == mask.shape and signal_BT.dtype == torch.float32 and not signal_BT.requires_grad
    assert torch.isfinite(signal_BT).all() and (signal_BT >= 0).all()
    assert (signal_BT[~mask] == 0).all() and (signal_BT[mask] > 0).any()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("module", [answer_attention, teacher_ratio], ids=lambda m: m.__name__.split(".")[-1])
def test_candidates_train_two_steps_through_grail_train(module, tmp_path, warm_cache):
    """Registered from a script, each trains through `grail train` (the trainer's own path: answer_attention per
    micro-batch with the current policy, teacher_ratio at rollout time since it reads whole groups) and reweights."""
    from conftest import WARM_STEPS

    cache, _ = warm_cache
    name = module.SPEC.name
    grail.register_method(module.SPEC, replace=True)
    try:
        out = tmp_path / "run"
        assert main(["train", "--preset", "tiny-cpu", "--token_weighting", name, "--max_steps", "2",
                     "--warmstart_steps", str(WARM_STEPS), "--cache_dir", str(cache), "--output_dir", str(out),
                     "--report_to", "none"]) == 0
    finally:
        grail.unregister_method(name)
    resolved = json.loads((out / "resolved_config.json").read_text())
    assert resolved["weights_from"] == ("rollout_policy" if module is teacher_ratio else "current_policy")
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    described = [line for line in lines if "weights/mean" in line]
    assert described and any(line["weights/ess_ratio"] < 1.0 for line in described), lines


# ---- answer_attention ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("weighting", ["attention", "value_norm"])
@pytest.mark.parametrize("queries", ["predicting", "token"])
@pytest.mark.parametrize("last_layers", [0, 1])
@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_answer_attention_is_the_eager_attention_averaged_by_hand(request, batch, family, queries, last_layers,
                                                                  weighting):
    """Reference: transformers' own `output_attentions` of an eager copy, run on each row alone without its padding,
    averaged with explicit loops over answer queries, layers and heads; for "value_norm" each weight is multiplied by
    ‖W_O^h v^h_k‖, computed head by head from the unpadded forward's `v_proj` output and `o_proj`'s weight. The probe
    runs on the padded batch of the sdpa model and must leave it on sdpa. In float64, the Gemma 3's padded eager
    forward gives NaN on rows whose right padding lies beyond a sliding window (a query with no key): the probe must
    not let it reach the real tokens."""
    import copy

    model = request.getfixturevalue({"qwen3": "model", "gemma3": "gemma3"}[family])
    ids, attn, mask, _, spans = batch
    answer_BT = spans.box_BT
    T, L = answer_BT.shape[1], ids.shape[1]
    S = L - T
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    modules = answer_attention.attention_modules(eager)
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    size = model.config.head_dim
    expected_BT = torch.zeros(answer_BT.shape, dtype=torch.float64)
    for b in range(ids.shape[0]):
        p = int(attn[b, :S].sum())  # the row's real prompt tokens: completion token t is at p + t once unpadded
        values = []  # each layer's v_proj output (1, n, K·E)
        hooks = [m.v_proj.register_forward_hook(lambda _m, _a, out, keep=values.append: keep(out)) for m in modules]
        with torch.no_grad():
            attentions = eager(input_ids=ids[b][attn[b].bool()][None], output_attentions=True).attentions
        for hook in hooks:
            hook.remove()
        chosen = range(len(modules))[-last_layers:] if last_layers else range(len(modules))
        answer = answer_BT[b].nonzero().flatten().tolist()
        queries_b = [p + t - 1 if queries == "predicting" else p + t for t in answer]
        for t in range(int(mask[b].sum())):
            terms = []
            for layer in chosen:
                for h in range(heads):
                    norm = 1.0
                    if weighting == "value_norm":
                        kv = h // (heads // kv_heads)
                        v = values[layer][0, p + t, kv * size:(kv + 1) * size]
                        norm = (modules[layer].o_proj.weight[:, h * size:(h + 1) * size].double() @ v.double()).norm()
                    terms += [attentions[layer][0, h, q, p + t] * norm for q in queries_b]
            expected_BT[b, t] = sum(terms) / len(terms) if terms else 0.0

    got_BL = answer_attention.answer_attention_BL(model, ids, attn, answer_BT, queries=queries,
                                                  last_layers=last_layers, weighting=weighting)
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(got_BL[:, S:].double(), expected_BT, atol=1e-5, rtol=1e-4)
    has_answer_B = answer_BT.any(1)
    assert (got_BL[~has_answer_B] == 0).all()
    if weighting == "attention":  # each query's attention sums to 1 over the L positions, so does their average
        torch.testing.assert_close(got_BL.sum(1)[has_answer_B], torch.ones(int(has_answer_B.sum())))


def test_answer_attention_restores_the_attention_implementation_when_the_forward_fails(model, batch):
    ids, attn, _, _, spans = batch
    with pytest.raises(IndexError):
        answer_attention.answer_attention_BL(model, ids + 10**6, attn, spans.box_BT)  # ids beyond the vocabulary
    assert model.config._attn_implementation == "sdpa"
    assert all(not m._forward_hooks for m in answer_attention.attention_modules(model))


# ---- teacher_ratio -------------------------------------------------------------------------------------------------

def test_group_references_take_the_best_correct_box_of_each_prompt(tokenizer, batch):
    ids, attn, mask, adv, _ = batch
    T = mask.shape[1]
    # check_batch: group 1 (rows 0-3) has correct rows 0 and 3 (\boxed{27}); group 2's only row with A > 0 is row 4
    assert teacher_ratio.group_references(ids, attn, T, adv, tokenizer) == ["27"] * 4 + ["11"] * 4
    no_correct = torch.tensor([-0.5, -0.5, -0.5, -0.5, 0.5, -1.0, -0.5, 0.0])
    assert teacher_ratio.group_references(ids, attn, T, no_correct, tokenizer) == [None] * 4 + ["11"] * 4


def test_with_hints_inserts_each_hint_between_prompt_and_completion(batch):
    ids, attn, mask, _, _ = batch
    T, S = mask.shape[1], ids.shape[1] - mask.shape[1]
    hints = [[101, 102, 103] if b % 2 else [] for b in range(ids.shape[0])]
    new_ids, new_attn = teacher_ratio.with_hints(ids, attn, T, hints, pad_id=0)
    assert new_ids.shape == (ids.shape[0], ids.shape[1] + 3)
    for b, hint in enumerate(hints):
        real = new_ids[b][new_attn[b].bool()].tolist()
        assert real == ids[b, :S][attn[b, :S].bool()].tolist() + hint + ids[b, S:][mask[b]].tolist()
    assert torch.equal(new_ids[:, -T:], ids[:, -T:]) and torch.equal(new_attn[:, -T:], attn[:, -T:])
    same_ids, same_attn = teacher_ratio.with_hints(ids, attn, T, [[] for _ in hints], pad_id=0)
    assert torch.equal(same_ids, ids) and torch.equal(same_attn, attn)


def test_teacher_ratio_is_exactly_zero_when_the_hint_adds_nothing(model, tokenizer, batch):
    """Empty hints: the teacher's forward sees the student's batch (same width, same padding), so r = 0 bitwise; the
    probe with the template "" gives every row the empty hint."""
    ids, attn, mask, _, _ = batch
    empty = [[] for _ in range(ids.shape[0])]
    assert (teacher_ratio.teacher_log_ratio(model, ids, attn, mask.shape[1], empty, pad_id=0) == 0).all()
    assert (_signal(teacher_ratio.SPEC, model, tokenizer, batch, teacher_ratio_hint="") == 0).all()
    # one hint elsewhere in the batch widens it: the rows without one are then 0 by the probe's rule, not by rounding
    no_correct = batch[3].clone()
    no_correct[:4] = -no_correct[:4].abs() - 0.1  # group 1 has no row with A > 0: no reference, no hint
    signal_BT = _signal(teacher_ratio.SPEC, model, tokenizer, batch[:3] + (no_correct, batch[4]))
    assert (signal_BT[:4] == 0).all() and (signal_BT[4:][mask[4:]] > 0).any()


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_teacher_ratio_equals_separate_forwards_of_the_two_texts(request, tokenizer, batch, family):
    """Row 1 (wrong, \\boxed{28}) is told its group's correct answer 27: its signal is |log p(y_t | prompt, hint,
    y_<t) − log p(y_t | prompt, y_<t)| from two unpadded single-row forwards of the token lists."""
    model = request.getfixturevalue({"qwen3": "model", "gemma3": "gemma3"}[family])
    ids, attn, mask, _, _ = batch
    S = ids.shape[1] - mask.shape[1]
    signal_BT = _signal(teacher_ratio.SPEC, model, tokenizer, batch, teacher_ratio_hint="The answer is {answer}. ")
    raw_BT = _signal(teacher_ratio.SPEC, model, tokenizer, batch, teacher_ratio_hint="The answer is {answer}. ",
                     teacher_ratio_sign="positive")
    b = 1
    prompt = ids[b, :S][attn[b, :S].bool()].tolist()
    completion = ids[b, S:][mask[b]].tolist()
    hint = tokenizer.encode("The answer is 27. ", add_special_tokens=False)

    def logps(prefix):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prefix + completion])).logits[0]
        logp = torch.log_softmax(logits[len(prefix) - 1:-1].float(), -1)  # the positions predicting the completion
        return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)

    ratio = logps(prompt + hint) - logps(prompt)
    n = len(completion)
    torch.testing.assert_close(signal_BT[b, :n], ratio.abs(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(raw_BT[b, :n], ratio.clamp(min=0), atol=1e-5, rtol=1e-4)
    assert ratio.abs().max() > 1e-2  # the hint does move this model's predictions: the comparison is not 0 = 0


def test_teacher_ratio_chunks_give_the_rows_of_one_forward(model, tokenizer, batch):
    one = _signal(teacher_ratio.SPEC, model, tokenizer, batch, teacher_ratio_chunk_rows=1)
    torch.testing.assert_close(one, _signal(teacher_ratio.SPEC, model, tokenizer, batch), atol=1e-5, rtol=1e-4)


def test_teacher_ratio_refuses_a_hint_that_is_not_a_template(model, tokenizer):
    options = WeightingOptions(token_weighting="teacher_ratio", method_options={"teacher_ratio_hint": "{reference}"})
    message = teacher_ratio.SPEC.check(options, None)
    assert message is not None and "teacher_ratio_hint" in message
