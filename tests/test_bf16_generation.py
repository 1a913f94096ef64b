"""Generation from bf16 weights under CPU bf16 (grail.models.bf16_weights, `cpu_bf16_generation`): inside, every
floating-point parameter is a bf16 cast; after, on an exception too, the same Parameter objects hold their fp32 master
tensors bit for bit; tied weights stay tied; a bf16 trainer trains in either mode with fp32 weights; and the premise
of its one-process limit (a dtype swap replaces a parameter's gradient accumulator, which DDP hooks)."""

import contextlib

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM
from trl import GRPOTrainer

from grail.models.bf16_weights import bf16_weights
from grail.training.config import GRAILConfig, literal_choices
from grail.training.trainer import GRAILTrainer

PROMPTS = [[5, 6, 7, 8], [5, 6, 7, 8], [9, 10, 11], [9, 10, 11]]  # token ids: two prompts, two samples each


@pytest.fixture
def model(tiny_dir):
    return AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().view(torch.int32).clone()  # fp32's bit pattern: equal bits, not merely equal values


class _BF16Casts(TorchDispatchMode):
    """Counts the bf16 copies made of the tensor at `pointer`."""

    def __init__(self, pointer: int):
        super().__init__()
        self.pointer, self.count = pointer, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.ops.aten._to_copy.default and args[0].data_ptr() == self.pointer
                and kwargs.get("dtype") == torch.bfloat16):
            self.count += 1
        return func(*args, **kwargs)


# ---- the context manager -----------------------------------------------------------------------------------------
def test_inside_every_weight_is_bf16_and_after_the_same_parameters_hold_their_fp32_bits(model):
    params = dict(model.named_parameters())
    bits = {name: _bits(p) for name, p in params.items()}
    tensors = {name: p.data for name, p in params.items()}  # aliases of each parameter's own fp32 storage
    seen = []
    up = model.model.layers[0].mlp.up_proj
    handle = up.register_forward_hook(lambda module, args, out: seen.append((module.weight.dtype, out.dtype)))
    with bf16_weights(model):
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        for name, p in model.named_parameters():  # the cast of the master value, not some other bf16 tensor
            assert torch.equal(p, tensors[name].to(torch.bfloat16)), name
        assert {b.dtype for b in model.buffers()} == {torch.float32}  # rotary inv_freq: buffers stay as they are
        with torch.no_grad():
            logits = model(torch.tensor([[5, 6, 7, 8]])).logits
    handle.remove()
    assert seen == [(torch.bfloat16, torch.bfloat16)] and logits.dtype == torch.bfloat16
    after = dict(model.named_parameters())
    assert after.keys() == params.keys()
    for name, p in after.items():
        assert p is params[name] and p.data_ptr() == tensors[name].data_ptr() and p.dtype == torch.float32, name
        assert torch.equal(_bits(p), bits[name]), name


def test_the_master_weights_come_back_when_the_block_raises(model):
    bits = [_bits(p) for p in model.parameters()]
    with pytest.raises(RuntimeError, match="inside"), bf16_weights(model):
        assert next(model.parameters()).dtype == torch.bfloat16
        raise RuntimeError("inside")
    assert all(torch.equal(_bits(p), b) for p, b in zip(model.parameters(), bits, strict=True))


def test_tied_weights_are_cast_once_and_stay_tied(model):
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert head.weight is embed.weight  # the tiny model ties them, as Qwen3-4B and SmolLM2 do
    counter = _BF16Casts(embed.weight.data_ptr())
    with counter, bf16_weights(model):
        assert head.weight is embed.weight and head.weight.dtype == torch.bfloat16
    assert counter.count == 1
    assert head.weight is embed.weight and head.weight.dtype == torch.float32


def test_a_dtype_swap_replaces_the_gradient_accumulator_that_ddp_hooks():
    """Why `bf16_weights` runs on one plain process only: after a swap and restore the parameter's next backward goes
    through a new gradient accumulator, so a hook on the old one (DDP's reducer registers its all-reduce there) never
    fires; a post-accumulate-grad hook, which lives on the tensor, does, and `.grad` accumulates in place."""
    linear = torch.nn.Linear(3, 3)
    linear(torch.ones(1, 3)).sum().backward()
    grad = linear.weight.grad
    accumulator = linear.weight.view_as(linear.weight).grad_fn.next_functions[0][0]
    old_hook, tensor_hook = [], []
    accumulator.register_hook(lambda *args: old_hook.append(1))
    linear.weight.register_post_accumulate_grad_hook(lambda param: tensor_hook.append(1))
    with bf16_weights(linear):
        assert linear.weight.grad is grad  # the gradient is not touched inside
    assert linear.weight.view_as(linear.weight).grad_fn.next_functions[0][0] is not accumulator
    linear(torch.ones(1, 3)).sum().backward()
    assert old_hook == [] and tensor_hook == [1] and linear.weight.grad is grad


# ---- the option and the trainer ----------------------------------------------------------------------------------
def test_a_bad_choice_is_refused_naming_the_value_and_the_choices(tmp_path):
    assert literal_choices("cpu_bf16_generation") == ("weights", "autocast")
    with pytest.raises(ValueError, match=r"cpu_bf16_generation='bf16' is not a valid choice.*'weights', 'autocast'"):
        GRAILConfig(output_dir=str(tmp_path), cpu_bf16_generation="bf16")


def _trainer(tiny_dir, out, peft_config=None, **fields):
    with pytest.warns(UserWarning, match="tiny") if fields["bf16"] else contextlib.nullcontext():  # bf16 is slower
        args = GRAILConfig(**{**dict(output_dir=str(out), per_device_train_batch_size=4, num_generations=4,
                                     max_completion_length=6, max_steps=1, learning_rate=5e-6, loss_type="dr_grpo",
                                     scale_rewards="none", beta=0.0, report_to="none", save_strategy="no",
                                     logging_steps=1, seed=3, use_cpu=True, token_weighting="none",
                                     optim="adamw_torch"), **fields})
    dataset = Dataset.from_list([{"prompt": "Q: 3+4*5\nA:", "answer": "23"}] * 4)
    return GRAILTrainer(model=str(tiny_dir), args=args, train_dataset=dataset, peft_config=peft_config,
                        reward_funcs=[lambda completions, **k: [float(i % 2) for i in range(len(completions))]])


def _weights_in_generation(monkeypatch) -> list[torch.dtype]:
    """The dtypes of the weights TRL's own generation computes with (the first decoder layer's up-projection)."""
    seen = []
    trl_generate = GRPOTrainer._generate_single_turn

    def generate(self, *args, **kwargs):
        model = self.accelerator.unwrap_model(self.model)
        handle = model.get_decoder().layers[0].mlp.up_proj.register_forward_hook(
            lambda module, a, out: seen.append(module.weight.dtype))
        try:
            return trl_generate(self, *args, **kwargs)
        finally:
            handle.remove()

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", generate)
    return seen


@pytest.mark.parametrize("mode, generation_dtype", [("weights", torch.bfloat16), ("autocast", torch.float32)])
def test_a_cpu_bf16_trainer_trains_a_step_in_either_mode_with_fp32_weights(tiny_dir, tmp_path, monkeypatch, mode,
                                                                           generation_dtype):
    seen = _weights_in_generation(monkeypatch)
    trainer = _trainer(tiny_dir, tmp_path, bf16=True, cpu_bf16_generation=mode)
    assert trainer.generate_from_bf16 is (mode == "weights")
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert seen and set(seen) == {generation_dtype}  # generation really ran from bf16 weights, or from fp32 ones
    after = dict(trainer.model.named_parameters())
    assert {p.dtype for p in after.values()} == {torch.float32}
    assert sum(not torch.equal(after[name], p) for name, p in before.items()) > len(before) // 2  # the step landed
    optimized = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert all(any(p is q for q in after.values()) for p in optimized)  # AdamW still holds the model's parameters


def test_the_option_acts_only_under_cpu_bf16(tiny_dir, tmp_path):
    assert not _trainer(tiny_dir, tmp_path, bf16=False, cpu_bf16_generation="weights").generate_from_bf16


def test_generation_restores_the_weights_when_it_raises(tiny_dir, tmp_path, monkeypatch):
    trainer = _trainer(tiny_dir, tmp_path, bf16=True)
    params = list(trainer.model.parameters())
    bits = [_bits(p) for p in params]

    def failing(self, *args, **kwargs):
        assert {p.dtype for p in self.model.parameters()} == {torch.bfloat16}
        raise RuntimeError("generation failed")

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", failing)
    with pytest.raises(RuntimeError, match="generation failed"):
        trainer._generate_single_turn(PROMPTS, None, {}, 2)
    assert list(trainer.model.parameters()) == params
    assert all(torch.equal(_bits(p), b) for p, b in zip(params, bits, strict=True))


@pytest.mark.parametrize("setup", ["shared_prompt", "peft"])
def test_generation_from_bf16_weights_with_a_shared_prefill_and_with_lora(tiny_dir, tmp_path, monkeypatch, setup):
    """shared_prompt's prefill runs inside the same swap (it wraps the model's generate, S5), and a LoRA model's
    adapters are cast with its base weights: each samples and hands back fp32 weights."""
    seen = _weights_in_generation(monkeypatch)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = _trainer(tiny_dir, tmp_path, bf16=True, shared_prompt=setup == "shared_prompt",
                       peft_config=lora if setup == "peft" else None)
    torch.manual_seed(0)
    completions, _ = trainer._generate_single_turn(PROMPTS, None, {}, 2)
    assert len(completions) == 4 and all(completions) and set(seen) == {torch.bfloat16}
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}


def test_the_cast_region_stays_for_fp32_activations_that_meet_bf16_weights(tiny_dir, tmp_path):
    """TRL's cast_lm_head_to_fp32 on tied embeddings casts the embeddings' output back to fp32: over bf16 weights
    that fails without autocast, and the trainer's cast region around generation carries it."""
    trainer = _trainer(tiny_dir, tmp_path, bf16=True, cast_lm_head_to_fp32=True)
    trainer._generate_single_turn(PROMPTS, None, {}, 2)  # the model is not wrapped by accelerate here: the region
    trainer._cast_once = contextlib.nullcontext
    with pytest.raises(RuntimeError, match="dtype"):
        trainer._generate_single_turn(PROMPTS, None, {}, 2)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
