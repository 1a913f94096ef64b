"""CPU precision: the per-machine choice, the guard that keeps fp32 master weights, the cast-once regions of CPU bf16
training, and the fidelity of the tiny model's probes in bf16 (grail.models.precision, grail.analysis.fidelity)."""

import contextlib
import json
import warnings

import pytest
import torch
from datasets import Dataset
from torch.utils._python_dispatch import TorchDispatchMode

from grail.analysis.fidelity import ranks, row_spearman_B, weight_fidelity
from grail.models import precision
from grail.training.config import GRAILConfig
from grail.training.trainer import GRAILTrainer

FAST = precision.CpuMatmulSpeeds(fp32_gflops=91.0, bf16_gflops=399.0, threads=1, cpu="AMD EPYC", flags=("avx512_bf16",),
                                 torch=torch.__version__)
SLOW = precision.CpuMatmulSpeeds(fp32_gflops=58.0, bf16_gflops=17.0, threads=1, cpu="Intel Xeon", flags=(),
                                 torch=torch.__version__)


# ---- the choice ------------------------------------------------------------------------------------------------------
def test_bf16_is_chosen_only_where_its_measured_matmul_is_faster(monkeypatch):
    monkeypatch.setenv(precision.ENV, "auto")
    fast = precision.choose_cpu_precision("smollm2-135m", speeds=FAST)
    slow = precision.choose_cpu_precision("smollm2-135m", speeds=SLOW)
    assert fast.bf16 and "399" in fast.reason and "4.38x" in fast.reason and "avx512_bf16" in fast.reason
    assert not slow.bf16 and "0.29x" in slow.reason and "no native bf16 flag" in slow.reason
    edge = precision.CpuMatmulSpeeds(100.0, 100.0 * precision.BF16_MIN_SPEEDUP, 1, "cpu", (), torch.__version__)
    assert precision.choose_cpu_precision("smollm2-135m", speeds=edge).bf16


def test_the_tiny_model_keeps_fp32_on_every_cpu(monkeypatch):
    monkeypatch.setenv(precision.ENV, "auto")
    choice = precision.choose_cpu_precision("tiny", speeds=FAST)
    assert not choice.bf16 and choice.speeds is None and "tiny" in choice.reason


def test_the_environment_pins_the_choice_without_measuring(monkeypatch):
    monkeypatch.setattr(precision, "matmul_gflops", lambda *a, **k: pytest.fail("measured although pinned"))
    for pinned, expected in (("fp32", False), ("bf16", True)):
        monkeypatch.setenv(precision.ENV, pinned)
        assert precision.choose_cpu_precision("smollm2-135m").bf16 is expected
    monkeypatch.setenv(precision.ENV, "fast")
    with pytest.raises(ValueError, match="auto .*fp32 or bf16"):
        precision.choose_cpu_precision("smollm2-135m")


def test_speeds_are_measured_once_per_machine_and_a_bad_cache_file_is_measured_again(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(precision, "matmul_gflops", lambda dtype, *a, **k: calls.append(dtype) or 10.0 * len(calls))
    first = precision.cpu_matmul_speeds(tmp_path)
    again = precision.cpu_matmul_speeds(tmp_path)
    assert first == again and calls == [torch.float32, torch.bfloat16]
    (cached,) = (tmp_path / "precision").iterdir()
    assert json.loads(cached.read_text())["bf16_gflops"] == 20.0
    cached.write_text("{not json")
    precision.cpu_matmul_speeds(tmp_path)
    assert len(calls) == 4


def test_the_config_resolves_bf16_by_the_machine_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv(precision.ENV, "auto")
    for speeds, expected in ((FAST, True), (SLOW, False)):
        monkeypatch.setattr(precision, "cpu_matmul_speeds", lambda cache_dir=None, s=speeds: s)
        cfg = GRAILConfig(output_dir=str(tmp_path), model_name_or_path="smollm2-135m", use_cpu=True)
        assert cfg.bf16 is expected
        assert cfg.precision_reason.startswith("bf16 mixed precision" if expected else "fp32:")
    given = GRAILConfig(output_dir=str(tmp_path), model_name_or_path="smollm2-135m", use_cpu=True, bf16=False)
    assert given.bf16 is False and "given" in given.precision_reason


def test_forcing_bf16_on_a_cpu_without_native_speed_warns_with_the_measured_slowdown(monkeypatch, tmp_path):
    monkeypatch.setenv(precision.ENV, "auto")
    monkeypatch.setattr(precision, "cpu_matmul_speeds", lambda cache_dir=None: SLOW)
    with pytest.warns(UserWarning, match=r"about 3\.4x slower than in fp32"):
        cfg = GRAILConfig(output_dir=str(tmp_path), model_name_or_path="smollm2-135m", use_cpu=True, bf16=True)
    assert cfg.bf16 is True  # the user's value wins
    monkeypatch.setattr(precision, "cpu_matmul_speeds", lambda cache_dir=None: FAST)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GRAILConfig(output_dir=str(tmp_path), model_name_or_path="smollm2-135m", use_cpu=True, bf16=True)


# ---- master weights --------------------------------------------------------------------------------------------------
def test_pure_bf16_weights_lose_an_adam_step_of_the_regime_learning_rate():
    """The premise of the guard, and the share formula checked against bf16's real rounding."""
    weight = (torch.randn(576, 1536, generator=torch.Generator().manual_seed(0)) * 0.04).to(torch.bfloat16)
    step = 5e-6  # the regime's learning rate: an AdamW step moves a weight by about this much
    stored = (weight.float() + step).to(torch.bfloat16)
    lost = float((stored == weight).float().mean())
    assert lost > 0.9  # most of the update vanishes
    assert precision.bf16_lost_update_share(weight, step) == pytest.approx(lost, abs=2e-3)
    master = weight.float() + step  # fp32 master weights keep it
    assert float((master == weight.float()).float().mean()) < 1e-3


def _trainer(model_dir, out, **fields):
    args = GRAILConfig(**{**dict(output_dir=str(out), per_device_train_batch_size=4, num_generations=4,
                                 max_completion_length=8, max_steps=1, learning_rate=5e-6, loss_type="dr_grpo",
                                 scale_rewards="none", beta=0.0, report_to="none", save_strategy="no", logging_steps=1,
                                 seed=3, use_cpu=True, token_weighting="none"), **fields})
    dataset = Dataset.from_list([{"prompt": "Q: 3+4*5\nA:", "answer": "23"}] * 4)
    return GRAILTrainer(model=str(model_dir), reward_funcs=[lambda completions, **k: [float(i % 2) for i in
                                                                                          range(len(completions))]],
                        args=args, train_dataset=dataset)


def test_cpu_training_refuses_bf16_weights_and_names_the_fix(tiny_dir, tmp_path):
    with pytest.raises(ValueError, match=r"bfloat16 on CPU.*round away.*float32.*bf16=true"):
        _trainer(tiny_dir, tmp_path, bf16=False, model_init_kwargs={"dtype": "bfloat16"})


def test_cpu_bf16_training_keeps_fp32_master_weights_and_a_small_step_lands(tiny_dir, tmp_path):
    with pytest.warns(UserWarning, match="tiny|slower"):
        trainer = _trainer(tiny_dir, tmp_path, bf16=True, optim="adamw_torch")
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert {v.dtype for v in after.values()} == {torch.float32}
    moved = sum(not torch.equal(after[k], v) for k, v in before.items())
    assert moved > len(before) // 2


# ---- one cast per phase ----------------------------------------------------------------------------------------------
class _CastCount(TorchDispatchMode):
    """Counts the bf16 copies made of one fp32 weight."""

    def __init__(self, weight):
        super().__init__()
        self.pointer, self.count = weight.data_ptr(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.ops.aten._to_copy.default and args[0].data_ptr() == self.pointer
                and kwargs.get("dtype") == torch.bfloat16):
            self.count += 1
        return func(*args, **kwargs)


def _prepared(tiny_dir, tmp_path):
    with pytest.warns(UserWarning):
        trainer = _trainer(tiny_dir, tmp_path, bf16=True)
    model = trainer.accelerator.prepare(trainer.model)  # accelerate wraps forward in a per-call autocast here
    weight = trainer.accelerator.unwrap_model(model).model.layers[0].mlp.up_proj.weight
    return trainer, model, weight


def test_generation_casts_each_weight_once_inside_the_region_and_samples_the_same(tiny_dir, tmp_path):
    trainer, model, weight = _prepared(tiny_dir, tmp_path)
    ids = torch.tensor([[5, 6, 7, 8]])
    outputs, counts = [], []
    for region in (trainer._cast_once, None):
        counter = _CastCount(weight)
        torch.manual_seed(0)
        with counter, torch.no_grad(), (region() if region else contextlib.nullcontext()):
            outputs.append(model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=True, top_k=0))
        counts.append(counter.count)
    assert counts[0] == 1 and counts[1] >= 6  # once for the whole generate, against once per new token
    assert torch.equal(outputs[0], outputs[1])  # the same bf16 values either way


def test_cached_casts_still_carry_the_gradient_to_the_fp32_weights(tiny_dir, tmp_path):
    """A probe's no-grad forward first, then the loss's forward, in one region (as in `_compute_loss`): the gradient
    equals per-call autocast's."""
    trainer, model, weight = _prepared(tiny_dir, tmp_path)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    grads = []
    for region in (True, False):
        model.zero_grad()
        counter = _CastCount(weight)
        with counter, (trainer._cast_once() if region else contextlib.nullcontext()):
            with torch.no_grad():
                model(ids)
            loss = model(ids).logits.float().logsumexp(-1).sum()
        loss.backward()
        grads.append(weight.grad.clone())
        assert counter.count == (1 if region else 2)
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


# ---- the tiny model's probes in bf16 -------------------------------------------------------------------------------
def test_ranks_and_spearman_by_hand():
    assert ranks(torch.tensor([3.0, 1.0, 1.0, 2.0])).tolist() == [4.0, 1.5, 1.5, 3.0]
    a = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    b = torch.tensor([[10.0, 20.0, 30.0, 40.0], [3.0, 2.0, 1.0, 9.0], [1.0, 2.0, 3.0, 4.0]])
    mask = torch.tensor([[True] * 4, [True, True, True, False], [True] * 4])
    rho = row_spearman_B(a, b, mask)
    assert rho[0] == pytest.approx(1.0) and rho[1] == pytest.approx(-1.0) and torch.isnan(rho[2])
    fid = weight_fidelity(torch.tensor([[1.0, 2.0, -0.5]]), torch.tensor([[1.0, 2.0, 0.5]]), torch.tensor([2.0]),
                          torch.ones(1, 3, dtype=torch.bool))
    assert fid.sign_changed_share == pytest.approx(1 / 3) and fid.max_abs_weight_diff == pytest.approx(1.0)


# The tiny model's probes in bf16, by the fidelity rule (median Spearman ≥ 0.9, no sign change): as on SmolLM2
# (docs/results/cpu-step.md), OAR-G's weights do not hold (median 0.68 here) and GRAIL's, OAR-P's and the entropy
# control's do; the methods that fail are the ones whose probe runs in fp32 under CPU bf16.
TINY_HOLDS = {"grail": True, "oar_g": False, "oar_p": True, "entropy": True}


@pytest.mark.parametrize("method", sorted(TINY_HOLDS))
def test_tiny_model_probe_weights_in_bf16_against_fp32(warm_cache, method):
    """The warm-started tiny model's weights in CPU bf16 autocast against fp32, on rollouts whose boxes close: whether
    the rows' rankings agree as the rule asks, and that no token's advantage changes sign either way."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.methods.weighting import weights_for

    path = str(warm_cache[1])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt = tokenizer(["Q: 3+4*5\nA:"] * 8, return_tensors="pt", add_special_tokens=False)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**prompt, do_sample=True, max_new_tokens=32, top_k=0,
                             pad_token_id=tokenizer.pad_token_id)
    completion = out[:, prompt["input_ids"].shape[1]:]
    mask = torch.ones_like(completion)
    adv = torch.tensor([1.0, -1.0] * 4)
    sides = []
    for enabled in (False, True):
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            sides.append(weights_for(method, model, tokenizer, prompt["input_ids"], prompt["attention_mask"],
                                     completion, mask, adv).float())
    fid = weight_fidelity(sides[0], sides[1], adv, mask.bool())
    assert fid.rows >= 4  # the probe ranked tokens on most rows (a comparison of uniform rows passes anything)
    assert (fid.spearman_median >= 0.9) is TINY_HOLDS[method] and fid.sign_changed_share == 0.0, fid
    assert (method in precision.FP32_PROBES) is not TINY_HOLDS[method]


def test_a_method_whose_weights_do_not_hold_is_probed_in_fp32_under_cpu_bf16(tiny_dir, tmp_path, monkeypatch):
    """A method of precision.FP32_PROBES (OAR-G: its weights do not hold on SmolLM2): inside its probe region the
    model computes in fp32 (no bf16 cast of any weight) while the loss keeps bf16; GRAIL, whose weights hold, keeps
    its probe in bf16 and its fused path. And GRAIL put on the list loses the fused path, with the reason."""
    assert "oar_g" in precision.FP32_PROBES and "grail" not in precision.FP32_PROBES
    with pytest.warns(UserWarning):
        trainer = _trainer(tiny_dir, tmp_path / "oar_g", bf16=True, token_weighting="oar_g")
    assert trainer.fp32_probe
    model = trainer.accelerator.prepare(trainer.model)
    weight = trainer.accelerator.unwrap_model(model).model.layers[0].mlp.up_proj.weight
    ids = torch.tensor([[5, 6, 7, 8]])
    wrapped = model.__dict__["forward"]  # accelerate's autocast wrapper
    for region, casts in ((trainer._probe_precision, 0), (trainer._cast_once, 1)):
        counter = _CastCount(weight)
        with counter, (region(model) if region == trainer._probe_precision else region()):
            hidden = model(ids, output_hidden_states=True).hidden_states[-1]
        assert counter.count == casts
        if casts == 0:
            assert hidden.dtype == torch.float32
    assert model.__dict__["forward"] is wrapped  # put back after the probe
    with pytest.warns(UserWarning):
        grail = _trainer(tiny_dir, tmp_path / "grail", bf16=True, token_weighting="grail")
    assert not grail.fp32_probe and grail.fused_unavailable is None
    monkeypatch.setattr("grail.training.cpu_precision.FP32_PROBES", frozenset({"grail"}))
    with pytest.warns(UserWarning):
        listed = _trainer(tiny_dir, tmp_path / "listed", bf16=True, token_weighting="grail")
    assert listed.fp32_probe and "fp32" in listed.fused_unavailable
