"""oar_p_amortized (grail.methods.signals.oar_p_amortized): exact OAR-P on a few rows a call, a ridge predictor of
log-importance on the others. With a budget that covers every row it is OAR-P; the exact rows it draws are OAR-P's on
them; the predictor recovers a linear law, discounts older calls, and its state round-trips; the features are the
layer's hidden state, the surprise and the entropy of the model's own logits; it passes the public checker; a trainer
saves its state with every checkpoint, and a run stopped and resumed ends as the uninterrupted one did."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

import grail
from conftest import WARM_STEPS
from grail.methods.signals import oar_p_amortized as amortized
from grail.methods.spec import ProbeBatch
from grail.methods.table import METHODS
from grail.options.choices import WeightingOptions
from probe_batches import probe_batch, probe_model, scored_batch


@pytest.fixture(scope="module")
def model(tokenizer):
    return probe_model(tokenizer)


def _options(**method_options):
    spec = METHODS["oar_p_amortized"]
    return WeightingOptions(token_weighting="oar_p_amortized", temperature=0.7,
                            method_options=spec.resolve_options(method_options))


def _rows(state=None):
    ids, attn, answer, scored = scored_batch()
    return ProbeBatch(ids, attn, answer, scored, state=state)


def _oar_p(model, rows, options):
    oar_p = METHODS["oar_p"]
    return oar_p.probe(model, rows, WeightingOptions(token_weighting="oar_p", temperature=options.temperature,
                                                     method_options=oar_p.resolve_options({})), None)


def test_it_is_a_registered_method_with_state():
    spec = METHODS["oar_p_amortized"]
    assert spec is amortized.SPEC and spec.state is amortized.Predictor and spec.rows == "bilevel"


def test_a_budget_that_covers_every_row_is_oar_p(model):
    options = _options(oar_p_amortized_exact_rows=3)
    rows = _rows()
    got = amortized.SPEC.probe(model, rows, options, torch.Generator().manual_seed(0))
    torch.testing.assert_close(got, _oar_p(model, rows, options).float())


def test_the_exact_rows_are_oar_ps_and_the_others_are_predicted_from_them(model):
    options = _options(oar_p_amortized_exact_rows=1)
    state = amortized.Predictor()
    rows = _rows(state)
    generator = torch.Generator().manual_seed(3)
    exact_B = amortized._exact_rows(3, 1, torch.Generator().manual_seed(3))  # the draw the probe makes
    got = amortized.SPEC.probe(model, rows, options, generator)
    want = _oar_p(model, rows, options).float()
    torch.testing.assert_close(got[exact_B], want[exact_B])
    scored = rows.scored_BT.bool()
    predicted = got[~exact_B]
    assert torch.isfinite(predicted).all() and (predicted[scored[~exact_B]] > 0).all()
    assert predicted[~scored[~exact_B]].eq(0).all()
    assert state.calls == 1 and state.tokens == float(scored[exact_B].sum())
    again = amortized.SPEC.probe(model, _rows(amortized.Predictor()), options, torch.Generator().manual_seed(3))
    torch.testing.assert_close(again, got, rtol=0, atol=0)  # deterministic given the seed


def test_the_predictor_recovers_a_linear_law_discounts_old_calls_and_round_trips():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, generator=generator, dtype=torch.float64)
    theta = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0], dtype=torch.float64)
    predictor = amortized.Predictor()
    predictor.update(x, x @ theta, decay=0.9)
    torch.testing.assert_close(predictor.coefficients(ridge=0.0), theta)
    predictor.update(x, x @ -theta, decay=0.0)  # decay 0 forgets the first call
    torch.testing.assert_close(predictor.coefficients(ridge=0.0), -theta)
    predictor.update(x, x @ theta, decay=1.0)  # two equal calls of opposite laws: their mean, 0
    torch.testing.assert_close(predictor.coefficients(ridge=0.0), torch.zeros(5, dtype=torch.float64))
    copy = amortized.Predictor()
    copy.load_state_dict(predictor.state_dict())
    assert copy.calls == predictor.calls == 3 and copy.tokens == predictor.tokens == 400
    torch.testing.assert_close(copy.coefficients(0.01), predictor.coefficients(0.01), rtol=0, atol=0)
    assert predictor.coefficients(1e6).abs().max() < 1e-3  # a large ridge shrinks θ to 0
    with pytest.raises(RuntimeError, match="no exact token"):
        amortized.Predictor().coefficients(0.0)
    with pytest.raises(ValueError, match="fitted on 5 features a token and this call gives 4"):
        predictor.update(x[:, :4], x @ theta, decay=0.9)  # a resumed run whose features changed: refused, not reset
    assert predictor.calls == 3


def test_the_ridge_leaves_the_constant_alone_so_a_strong_one_keeps_the_rows_order():
    """Log-importance sits far below 0 (log 1e-8 to 0): a penalised constant would leave its mean to the other
    features, and a strong ridge then turned the place coefficient negative, reversing every row's order."""
    place_N = torch.linspace(0, 1, 100, dtype=torch.float64)
    x_NF = torch.stack([place_N, torch.ones_like(place_N)], 1)  # the method's last feature is the constant
    predictor = amortized.Predictor()
    predictor.update(x_NF, -12.0 + 2.0 * place_N, decay=1.0)
    for ridge in (0.0, 0.1, 1.0, 10.0):
        slope, constant = predictor.coefficients(ridge).tolist()
        assert 0 < slope <= 2.0 + 1e-9, (ridge, slope)  # shrunk towards 0, never past it
        assert constant == pytest.approx(-12.0 + (2.0 - slope) * 0.5)  # the constant keeps the mean
    assert predictor.coefficients(1e6)[0] < 1e-3


def test_the_features_are_the_layers_state_and_the_models_own_surprise_and_entropy(model):
    options = _options(oar_p_amortized_layer="last", oar_p_amortized_features=10_000)  # no projection
    ids, attn, answer = probe_batch()
    rows = ProbeBatch(ids, attn, answer, attn[:, -answer.shape[1]:].bool())
    T = answer.shape[1]
    features = amortized.token_features(model, rows, options)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, output_hidden_states=True)
    width = model.config.hidden_size
    assert features.shape == (3, T, width + amortized.SCALARS)
    real = attn[:, -T:].bool()
    hidden = out.hidden_states[model.config.num_hidden_layers - 1][:, -T:]  # leaf 'last': hidden_states[L − 1]
    hidden = hidden / hidden.pow(2).mean(-1, keepdim=True).add(1e-12).sqrt()
    torch.testing.assert_close(features[..., :width][real], hidden[real], rtol=1e-4, atol=1e-4)
    logp = torch.log_softmax(out.logits[:, -T - 1:-1].float() / 0.7, -1)
    surprise = -logp.gather(-1, ids[:, -T:, None])[..., 0]
    entropy = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(features[..., width][real], surprise[real], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(features[..., width + 1][real], entropy[real], rtol=1e-4, atol=1e-4)
    assert features[..., -1][real].eq(1).all() and features[~real].eq(0).all()
    projected = amortized.token_features(model, rows, _options(oar_p_amortized_features=4))
    assert projected.shape == (3, T, 4 + amortized.SCALARS)


def test_with_exact_every_k_only_every_kth_call_runs_exact_oar_p_and_the_others_are_all_predicted(model, monkeypatch):
    calls = []
    real = amortized.oar_p_signal

    def counted(model, rows, options):
        calls.append(rows.input_ids_BL.shape[0])
        return real(model, rows, options)

    monkeypatch.setattr(amortized, "oar_p_signal", counted)
    options = _options(oar_p_amortized_exact_rows=1, oar_p_amortized_exact_every=3)
    state = amortized.Predictor()
    generator = torch.Generator().manual_seed(3)
    signals = [amortized.SPEC.probe(model, _rows(state), options, generator) for _ in range(5)]
    assert calls == [1, 1] and state.calls == 2 and state.probe_calls == 5  # calls 0 and 3 fitted
    scored = _rows().scored_BT.bool()
    for predicted in signals[1:3]:  # all rows predicted, from the fit of call 0
        assert (predicted[scored] > 0).all() and predicted[~scored].eq(0).all()
    torch.testing.assert_close(signals[1], signals[2], rtol=0, atol=0)
    copy = amortized.Predictor()
    copy.load_state_dict(state.state_dict())
    assert copy.probe_calls == 5
    old = {k: v for k, v in state.state_dict().items() if k != "probe_calls"}  # a state saved before the counter
    copy.load_state_dict(old)
    assert copy.probe_calls == copy.calls == 2

def test_a_token_budget_perturbs_only_that_many_tokens_and_predicts_every_row(model, monkeypatch):
    seen = []
    real = amortized.oar_p_signal

    def counted(model, rows, options):
        seen.append(rows.scored_BT.clone())
        return real(model, rows, options)

    monkeypatch.setattr(amortized, "oar_p_signal", counted)
    options = _options(oar_p_amortized_exact_rows=2, oar_p_amortized_exact_tokens=5)
    state = amortized.Predictor()
    rows = _rows(state)
    scored = rows.scored_BT.bool()
    got = amortized.SPEC.probe(model, rows, options, torch.Generator().manual_seed(3))
    exact_B = amortized._exact_rows(3, 2, torch.Generator().manual_seed(3))
    (perturbed,) = seen
    assert perturbed.shape[0] == 2 and int(perturbed.sum()) == 5  # 5 copies: the budget, not the rows' tokens
    assert int(scored[exact_B].sum()) > 5 and not (perturbed & ~scored[exact_B]).any()
    assert state.tokens == 5.0
    theta_F = state.coefficients(options.method_options["oar_p_amortized_ridge"]).float()
    want = (amortized.token_features(model, rows, options) @ theta_F).exp() * scored  # every row, exact ones too
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    again = amortized.SPEC.probe(model, _rows(amortized.Predictor()), options, torch.Generator().manual_seed(3))
    torch.testing.assert_close(again, got, rtol=0, atol=0)  # the tokens drawn from the seeded generator


def test_the_features_from_a_forwards_reads_are_the_probes_own(model):
    """`features_from` on a plain forward's layer output, log-probs and entropies (what the fused path hands it)
    gives `token_features`."""
    from grail.methods import probes

    options = _options()
    rows = _rows()
    T = rows.scored_BT.shape[1]
    layer = probes.leaf_module(model, options.method_options["oar_p_amortized_layer"])
    with torch.no_grad(), probes.output_of(layer) as captured:
        logits = model(input_ids=rows.input_ids_BL, attention_mask=rows.attention_mask_BL).logits[:, -T - 1:-1]
    logp = torch.log_softmax(logits.float() / options.temperature, -1)
    logps_BT = logp.gather(-1, rows.input_ids_BL[:, -T:, None])[..., 0]
    entropy_BT = -(logp.exp() * logp).sum(-1)
    got = amortized.features_from(captured[0], -logps_BT, entropy_BT, rows.attention_mask_BL, options)
    torch.testing.assert_close(got, amortized.token_features(model, rows, options), rtol=1e-4, atol=1e-5)


def test_passes_the_public_checker():
    report = grail.check_method("oar_p_amortized", raise_on_failure=False)
    assert report.ok, report.text()


def test_a_checkpoint_without_the_state_cannot_resume_the_method(tmp_path):
    from grail.training.resume import load_method_state, save_method_state

    state = amortized.Predictor()
    state.update(torch.ones(3, 2), torch.ones(3), decay=1.0)
    save_method_state(state, tmp_path, rank=0)
    restored = amortized.Predictor()
    load_method_state(restored, tmp_path, rank=0, method="oar_p_amortized")
    assert restored.calls == 1 and torch.equal(restored.xx_FF, state.xx_FF)
    with pytest.raises(ValueError, match="holds no state of token_weighting='oar_p_amortized'.*new run"):
        load_method_state(amortized.Predictor(), tmp_path, rank=1, method="oar_p_amortized")


# ---- a trainer keeps the state across a stop and a resume ------------------------------------------------------

def test_the_trainer_hands_its_state_to_every_probe_call_and_saves_it_with_a_checkpoint(tiny_dir, tmp_path):
    """One Predictor for the run, updated by each micro-batch's probe (a fresh one per call would stay at 1 call),
    written by `_save_rng_state` and read back by `_load_rng_state` (transformers' checkpoint seam, trainer S6)."""
    from batches import loss_and_grads, make_trainer, trl_batch
    from grail.training.trainer import GRAILTrainer

    trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path / "a", token_weighting="oar_p_amortized",
                           method_options={"oar_p_amortized_exact_rows": 1})
    assert isinstance(trainer.method_state, amortized.Predictor) and trainer.method_state.calls == 0
    batch = trl_batch(trainer.processing_class)
    for _ in range(2):
        loss_and_grads(trainer, batch)
    assert trainer.method_state.calls == 2
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    trainer._save_rng_state(str(checkpoint))
    other = make_trainer(GRAILTrainer, tiny_dir, tmp_path / "b", token_weighting="oar_p_amortized",
                         method_options={"oar_p_amortized_exact_rows": 1})
    other._load_rng_state(str(checkpoint))
    assert other.method_state.calls == 2
    torch.testing.assert_close(other.method_state.coefficients(0.01), trainer.method_state.coefficients(0.01),
                               rtol=0, atol=0)


def test_fused_with_trls_forward_it_gives_the_separate_probes_weights_and_fits_the_same_predictor(tiny_dir, tmp_path):
    """On the fused path the features come from TRL's training forward (the layer captured there, TRL's log-probs and
    entropies): the same exact rows (the run's generator), the same fit and the same weights as the separate probe's
    own forward, to float rounding, and the loss and gradients with them."""
    from batches import assert_same, loss_and_grads, make_trainer, trl_batch
    from grail.training.trainer import GRAILTrainer

    results = {}
    for path in ("fused", "separate"):
        trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path / path, token_weighting="oar_p_amortized",
                               saliency_path=path, method_options={"oar_p_amortized_exact_rows": 1})
        with torch.no_grad():  # as test_trainer's fused check: embeddings large enough that the signal varies
            trainer.model.get_input_embeddings().weight.mul_(3.0)
        results[path] = (loss_and_grads(trainer, trl_batch(trainer.processing_class)), trainer.last_token_weights,
                         trainer.method_state)
    (fused, w_fused, s_fused), (separate, w_separate, s_separate) = results["fused"], results["separate"]
    assert w_fused.path == "fused" and w_separate.path == "separate"
    assert s_fused.calls == s_separate.calls == 1
    torch.testing.assert_close(s_fused.xx_FF, s_separate.xx_FF, rtol=1e-4, atol=1e-4)
    real = w_separate.weights_BT > 0
    assert real.sum() >= 10 and w_separate.weights_BT[real].std() > 0.02  # weights that vary (≫ the tolerance)
    torch.testing.assert_close(w_fused.weights_BT, w_separate.weights_BT, rtol=0, atol=1e-4)
    assert_same(fused, separate, atol=1e-4)


def test_a_fused_step_with_no_row_to_probe_calls_no_probe_and_leaves_the_predictor_alone(tiny_dir, tmp_path):
    """A micro-batch with no mixed group (every advantage 0): the fused path captures no layer and the probe is not
    called (no exact row, no fit), as the separate path skips it."""
    from batches import loss_and_grads, make_trainer, trl_batch
    from grail.training.trainer import GRAILTrainer

    trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="oar_p_amortized", saliency_path="fused")
    inputs = {**trl_batch(trainer.processing_class), "advantages": torch.zeros(4)}
    loss, _ = loss_and_grads(trainer, inputs)
    assert torch.isfinite(loss)
    assert trainer.last_token_weights.path == "fused" and not trainer.last_token_weights.probed_B.any()
    assert trainer.method_state.calls == 0


def test_the_fused_path_is_refused_where_the_probe_would_call_the_model_inside_an_engines_forward():
    from grail.training.paths import fused_unavailable_reason

    spec = METHODS["oar_p_amortized"]
    common = dict(peft=False, sharded=None, deepspeed=False, reentrant=True, leaf_trainable=lambda: False)
    assert fused_unavailable_reason(spec, "auto", "current_policy", **common) is None  # no gradient query
    for change in ({"peft": True}, {"sharded": "FSDP2"}, {"deepspeed": True}):
        assert "inside the training forward" in fused_unavailable_reason(spec, "auto", "current_policy",
                                                                         **{**common, **change})
    assert "rollout" in fused_unavailable_reason(spec, "auto", "rollout_policy", **common)


STEPS = 4
RUN = ["--preset", "tiny-cpu", "--token_weighting", "oar_p_amortized", "--oar_p_amortized_exact_rows", "1",
       "--max_steps", str(STEPS), "--save_steps", "100", "--logging_steps", "1", "--per_device_train_batch_size", "16",
       "--task_num_train", "64", "--learning_rate", "1e-3", "--warmstart_steps", str(WARM_STEPS), "--seed", "7"]


def _train(cache, out, *extra, wait=True):
    command = [sys.executable, "-m", "grail", "train", *RUN, "--cache_dir", str(cache), "--output_dir", str(out),
               *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    if wait:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # two tiny-model runs and a resume, about a minute; the seam itself is tested just above
def test_a_stopped_run_resumes_its_predictor_to_the_uninterrupted_result(tmp_path, warm_cache):
    """SIGUSR1 after step 1: the checkpoint holds the predictor's state, and the resumed run's weights and final
    parameters equal an uninterrupted run's (with a predictor started afresh they would not: the rows it predicts
    after the stop would be fitted to fewer exact rows)."""
    from grail.training.resume import complete_checkpoints
    from grail.training.stop import STOPPED_EXIT_CODE

    cache, _ = warm_cache
    whole = _train(cache, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]
    stopped = tmp_path / "stopped"
    process = _train(cache, stopped, wait=False)
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        metrics = stopped / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if any(line.endswith("}") and json.loads(line).get("step") == 1 for line in lines):
            process.send_signal(signal.SIGUSR1)
            break
        time.sleep(0.02)
    _, err = process.communicate(timeout=600)
    assert process.returncode == STOPPED_EXIT_CODE, err[-2000:]
    (checkpoint,) = complete_checkpoints(stopped)
    assert 1 <= int(checkpoint.name.split("-")[1]) < STEPS
    state = torch.load(checkpoint / "method_state_0.pt", weights_only=True)
    assert state["calls"] >= 1 and state["xx_FF"] is not None
    resumed = _train(cache, stopped, "--resume_from_checkpoint", "true")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got, want = load_file(stopped / "final" / "model.safetensors"), load_file(tmp_path / "whole" / "final" /
                                                                              "model.safetensors")
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)  # as tests/test_resume.py
