"""`shared_prompt=true` (grail.training.shared_prompt): each distinct prompt computed once for the rows that share it,
the rows run against its KV cache. It must be TRL's computation to float rounding. In the loss: the completion
log-probs, entropies and parameter gradients on three model families, and through the trainer the GRPO loss, its
gradient and GRAIL's fused saliency weights. In generation and evaluation: every step's logits and the sampled tokens.
Over two optimiser steps of TRL's loop: the losses and parameters. Left padding and two prompts in one batch
included."""

import functools
import json
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from trl.trainer.utils import add_fused_lm_head

from batches import loss_and_grads, make_trainer, trl_batch
from grail.training.shared_prompt import prompt_groups, shared_prefill, shared_prompt_logps
from grail.training.trainer import GRAILTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf"))
from shared_prefix_check import _models, trl_forward  # noqa: E402  (three families' small configs; TRL's forward)


def _batch(vocab: int, generator: torch.Generator):
    """Two prompts of 9 and 6 tokens (the second left-padded), 3 rows each, completions right-padded to 7."""
    prompts = [torch.randint(3, vocab, (9,), generator=generator), torch.randint(3, vocab, (6,), generator=generator)]
    rows, masks = [], []
    for prompt in prompts:
        for length in (7, 4, 5):
            completion = torch.randint(3, vocab, (7,), generator=generator)
            prompt_mask = torch.cat([torch.zeros(9 - len(prompt), dtype=torch.long), torch.ones(len(prompt),
                                                                                                dtype=torch.long)])
            rows.append(torch.cat([torch.cat([torch.zeros(9 - len(prompt), dtype=torch.long), prompt]), completion]))
            masks.append(torch.cat([prompt_mask, (torch.arange(7) < length).long()]))
    return torch.stack(rows), torch.stack(masks)


def _objective_and_grads(model, logps_BT, entropies_BT, mask_BT):
    model.zero_grad(set_to_none=True)
    (logps_BT * mask_BT).sum().backward(retain_graph=True)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps_BT.detach(), entropies_BT.detach(), grads


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_the_shared_forward_is_trls_forward_on_three_families(family):
    torch.manual_seed(0)
    model = dict(_models())[family]
    model.train(False)  # no dropout
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids_BL, mask_BL = _batch(97, torch.Generator().manual_seed(1))
    T = 7
    mask_BT = mask_BL[:, -T:].float()
    plain = _objective_and_grads(model, *trl_forward(model, ids_BL, mask_BL, T, compute_entropy=True)[:2], mask_BT)
    groups = prompt_groups(ids_BL, mask_BL, T)
    assert groups is not None and sorted(groups[0].tolist()) == [0, 3]  # two prompts, their first rows
    shared = _objective_and_grads(model, *shared_prompt_logps(model, ids_BL, mask_BL, T, *groups, True, nullcontext),
                                  mask_BT)
    torch.testing.assert_close(shared[0] * mask_BT, plain[0] * mask_BT, rtol=0, atol=1e-5)
    torch.testing.assert_close(shared[1] * mask_BT, plain[1] * mask_BT, rtol=0, atol=1e-5)
    assert plain[2].keys() == shared[2].keys() and len(plain[2]) > 5
    for name, grad in plain[2].items():  # the prompt's parameters too: the gradient flows back through the cache
        scale = grad.abs().max().clamp(min=1e-6)
        assert (shared[2][name] - grad).abs().max() / scale < 1e-4, name


def test_prompt_groups_need_the_same_ids_and_the_same_padding():
    ids_BL = torch.tensor([[0, 5, 6, 7, 1], [0, 5, 6, 7, 2], [5, 5, 6, 7, 3], [0, 5, 6, 7, 4]])
    mask_BL = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    first_U, inverse_B = prompt_groups(ids_BL, mask_BL, 1)
    # rows 0 and 1 share prompt and padding; row 3 has row 0's ids but no padding: its own prompt
    assert inverse_B[0] == inverse_B[1] and len(set(inverse_B.tolist())) == 3
    assert sorted(first_U.tolist()) == [0, 2, 3]
    assert prompt_groups(ids_BL[[0, 2, 3]], mask_BL[[0, 2, 3]], 1) is None  # no two rows share one
    assert prompt_groups(ids_BL, mask_BL, 4) is None  # a one-token prompt: nothing to cache


def _shared_batch(tokenizer):
    """Two prompts (the shorter left-padded), two completions each; rows 0 and 2 answer in a box."""
    batch = trl_batch(tokenizer, prompts=["Q: 1+2\nA:", "Q: 1+2\nA:", "Q: 12*3+4-5\nA:", "Q: 12*3+4-5\nA:"],
                      completions=[" 1+2=3. \\boxed{3}", " 3*4=1", " 12*3=36. 36+4=40. \\boxed{35}", " 2+2"])
    assert batch["prompt_mask"][0].sum() < batch["prompt_mask"][2].sum()  # left padding in the batch
    return batch


@pytest.mark.parametrize("method, leaf", [("none", "embeddings"), ("grail", "embeddings"), ("grail", "middle"),
                                          ("random", "embeddings"), ("position", "embeddings")])
def test_a_micro_batch_with_shared_prompts_gives_trls_loss_gradient_and_fused_weights(tiny_dir, tmp_path, method,
                                                                                      leaf):
    results = {}
    for shared in (False, True):
        trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path / str(shared), token_weighting=method,
                               saliency_leaf=leaf, rollout_symmetry="both", shared_prompt=shared)
        with torch.no_grad():  # a signal that varies (see tests/test_trainer.py, test_fused_equals_separate)
            trainer.model.get_input_embeddings().weight.mul_(3.0)
        results[shared] = (loss_and_grads(trainer, _shared_batch(trainer.processing_class)),
                           trainer.last_token_weights, trainer.forward_passes)
    (plain, w_plain, passes_plain), (shared, w_shared, passes_shared) = results[False], results[True]
    assert (passes_plain, passes_shared) == (1, 2)  # the shared path ran: the prompts' pass, then the suffixes
    torch.testing.assert_close(shared[0], plain[0], rtol=0, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in plain[1]) and len(shared[1]) == len(plain[1])
    for g, g_ref in zip(shared[1], plain[1], strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-6)
    if method in ("grail", "random"):  # the fused saliency (random permutes it with the trainers' equal seeds)
        assert w_plain.path == w_shared.path == "fused"
        assert w_plain.weights_BT[w_plain.normalised_BT].std() > 0.02  # real, varying saliency weights
        torch.testing.assert_close(w_shared.weights_BT, w_plain.weights_BT, rtol=0, atol=1e-5)


def test_a_micro_batch_without_shared_prompts_takes_trls_forward(tiny_dir, tmp_path):
    trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail", shared_prompt=True)
    loss_and_grads(trainer, trl_batch(trainer.processing_class))  # four different prompts
    assert trainer.forward_passes == 1 and trainer.last_token_weights.path == "fused"


def test_shared_prompt_is_refused_with_activation_checkpointing(tiny_dir, tmp_path):
    with pytest.raises(ValueError, match="activation_checkpointing"):
        make_trainer(GRAILTrainer, tiny_dir, tmp_path, shared_prompt=True, activation_checkpointing=True)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("sample", [False, True])
def test_the_shared_prefill_generates_what_generate_generates(family, sample):
    """Greedy and sampled (the same seed): the same tokens and the same logits at every step, left padding and two
    prompts in the batch included."""
    torch.manual_seed(0)
    model = dict(_models())[family]
    model.train(False)
    ids_BL, mask_BL = _batch(97, torch.Generator().manual_seed(2))
    prompts_BP, masks_BP = ids_BL[:, :9], mask_BL[:, :9]
    settings = dict(max_new_tokens=12, do_sample=sample, top_k=0, top_p=1.0, pad_token_id=0, eos_token_id=1,
                    output_logits=True, return_dict_in_generate=True)
    torch.manual_seed(3)
    plain = model.generate(input_ids=prompts_BP, attention_mask=masks_BP, **settings)
    calls = []
    counted = model.forward

    @functools.wraps(counted)  # generate reads the forward's signature
    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape)
        return counted(*args, **kwargs)

    model.forward = counting
    torch.manual_seed(3)
    shared = shared_prefill(model, model.generate)(input_ids=prompts_BP, attention_mask=masks_BP, **settings)
    del model.forward
    assert calls[0] == (2, 8) and calls[1] == (6, 1)  # the two prompts once, then each row's last prompt token
    assert torch.equal(shared.sequences, plain.sequences)
    for step_shared, step_plain in zip(shared.logits, plain.logits, strict=True):  # every step's logits, every row
        torch.testing.assert_close(step_shared, step_plain, rtol=0, atol=1e-5)


def test_the_trainer_generates_the_same_completions_with_the_prefill_shared(tiny_dir, tmp_path, monkeypatch):
    """TRL's own generation path (`_generate_single_turn`, transformers' generate, sampling at temperature 1) gives
    the same completions with shared_prompt, whose prefill ran; model.generate is the class's again afterwards."""
    from grail.training import shared_prompt

    wrapped, called = [], []
    real = shared_prompt.shared_prefill

    def counting_prefill(model, generate):
        wrapped.append(1)
        call = real(model, generate)
        return lambda *args, **kwargs: called.append(1) or call(*args, **kwargs)

    monkeypatch.setattr(shared_prompt, "shared_prefill", counting_prefill)
    completions = {}
    for shared in (False, True):
        trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path / str(shared), shared_prompt=shared)
        tokenizer = trainer.processing_class
        prompts = [tokenizer(text, add_special_tokens=False)["input_ids"]
                   for text in ("Q: 1+2\nA:", "Q: 1+2\nA:", "Q: 12*3+4-5\nA:", "Q: 12*3+4-5\nA:")]
        torch.manual_seed(11)
        completions[shared] = trainer._generate_single_turn(prompts, None, {}, 2)[0]
        assert "generate" not in vars(trainer.model)
    assert wrapped == called == [1]  # only the shared trainer wrapped generate, and TRL called the wrapper (S5)
    assert completions[True] == completions[False] and len(completions[True]) == 4
    assert len({tuple(c) for c in completions[True]}) > 1  # sampled, not one repeated completion


@pytest.mark.parametrize("method, micro_batch, fields", [
    ("none", 8, {}), ("grail", 8, {}), ("grail", 2, {}),
    ("none", 8, {"beta": 0.04}),  # the KL term: the reference model's log-probs through the same method
    ("grail", 8, {"num_iterations": 2}),  # the old policy's log-probs, computed once after generation
])
def test_shared_prompt_trains_as_the_plain_forward(warm_cache, tmp_path, method, micro_batch, fields):
    """Two optimiser steps through TRL's own loop (generation, loss, backward, optimiser), 2 prompts × 8 completions,
    as one micro-batch of 8 or 4 of 2, and with the KL term or two iterations per generation: the same losses and
    parameters with and without shared_prompt."""
    from test_micro_batch import _train

    accumulation = 8 // micro_batch
    start, plain, plain_losses, _ = _train(warm_cache[1], tmp_path / "plain", method, micro_batch, accumulation,
                                           **fields)
    _, shared, shared_losses, trainer = _train(warm_cache[1], tmp_path / "shared", method, micro_batch, accumulation,
                                               shared_prompt=True, **fields)
    assert trainer.forward_passes == 2  # the last micro-batch's loss shared its prompt
    torch.testing.assert_close(torch.tensor(shared_losses), torch.tensor(plain_losses), rtol=1e-5, atol=1e-7)
    moved = 0
    for name, value in plain.items():
        torch.testing.assert_close(shared[name], value, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        moved += int(not torch.equal(value, start[name]))
    assert moved > len(plain) // 2  # the steps trained


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_shared_prefill_applies_num_return_sequences_as_generate_does(family):
    """Two distinct prompts with 3 samples each: the wrapper repeats each row in place, as generate does, so each
    prompt's prefill runs once for its samples; the same tokens and logits as generate's own expansion."""
    torch.manual_seed(0)
    model = dict(_models())[family]
    model.train(False)
    ids_BL, mask_BL = _batch(97, torch.Generator().manual_seed(4))
    prompts_BP, masks_BP = ids_BL[[0, 3], :9], mask_BL[[0, 3], :9]
    settings = dict(max_new_tokens=10, do_sample=True, top_k=0, pad_token_id=0, eos_token_id=1,
                    num_return_sequences=3, output_logits=True, return_dict_in_generate=True)
    torch.manual_seed(5)
    plain = model.generate(input_ids=prompts_BP, attention_mask=masks_BP, **settings)
    torch.manual_seed(5)
    shared = shared_prefill(model, model.generate)(input_ids=prompts_BP, attention_mask=masks_BP, **settings)
    assert shared.sequences.shape[0] == 6 and torch.equal(shared.sequences, plain.sequences)
    for step_shared, step_plain in zip(shared.logits, plain.logits, strict=True):
        torch.testing.assert_close(step_shared, step_plain, rtol=0, atol=1e-5)


def test_an_evaluation_samples_the_same_with_the_prefill_shared(tiny_dir):
    """The harness's sampler (4 samples per problem at temperature 1, one seed): the same samples either way."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.options.sampling import HFSampler, SamplingParams

    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)
    prompts = ["Q: 1+2\nA:", "Q: 12*3+4-5\nA:", "Q: 7-2\nA:"]
    params = SamplingParams(n=4, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=16)
    plain = HFSampler(model, tokenizer, batch_size=2).generate(prompts, params, seed=9)
    shared = HFSampler(model, tokenizer, batch_size=2,
                       generate=shared_prefill(model, model.generate)).generate(prompts, params, seed=9)
    assert shared == plain and len({s.text for row in plain for s in row}) > 3


@pytest.mark.parametrize("shared", [False, True])
def test_the_fused_saliency_refuses_a_log_prob_forward_in_chunks(tiny_dir, tmp_path, monkeypatch, shared):
    """Were TRL to split its log-prob forward into chunks, the leaf's captures would cover one chunk each: the fused
    path must stop (plain chunks [1, 1] and shared ones [2, 2] alike), not read the last chunk's rows."""
    original = GRAILTrainer._get_per_token_logps_and_entropies
    monkeypatch.setattr(GRAILTrainer, "_get_per_token_logps_and_entropies",
                        lambda self, *args, **kwargs: original(self, *args, **{**kwargs, "batch_size": 2}))
    trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail", shared_prompt=shared)
    with pytest.raises(RuntimeError, match="2 chunk"):
        loss_and_grads(trainer, _shared_batch(trainer.processing_class))
    assert trainer.forward_chunks == ([2, 2] if shared else [1, 1])


def test_grail_trains_checkpoint_evaluation_shares_the_prefill(tiny_dir, tmp_path, monkeypatch):
    """`grail train --eval_benchmarks` with shared_prompt: the checkpoint evaluation calls the shared prefill and
    samples what it samples without it (the synthetic held-out set, 3 samples each)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import grail.training.shared_prompt as module
    from grail.training.config import GRAILConfig
    from grail.training.run import CheckpointEval

    calls = []

    def counted(model, generate):
        wrapped = shared_prefill(model, generate)
        return lambda **kwargs: calls.append(1) or wrapped(**kwargs)

    monkeypatch.setattr(module, "shared_prefill", counted)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)
    state = type("State", (), {"global_step": 1, "is_world_process_zero": True})()
    results = {}
    for shared in (False, True):
        cfg = GRAILConfig(output_dir=str(tmp_path / str(shared)), eval_benchmarks="synthetic", eval_size="5",
                          eval_samples=3, eval_max_new_tokens=12, shared_prompt=shared)
        CheckpointEval(cfg, tmp_path / str(shared), log=lambda _: None).on_save(None, state, None, model=model,
                                                                                processing_class=tokenizer)
        assert bool(calls) == shared
        (path,) = (tmp_path / str(shared) / "eval" / "checkpoint-1").rglob("samples.jsonl")
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        results[shared] = sorted((r["problem_id"], r["sample_index"], r["completion"]) for r in rows)
    assert results[True] == results[False] and len(results[True]) == 15
