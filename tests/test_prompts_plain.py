"""grail.options.prompts.render_plain and plain_prefix: chat-message prompts for a tokenizer without a chat template
(a base model), tokenised as TRL tokenises plain text."""

import pytest
from transformers import PreTrainedTokenizerFast

from grail.options.prompts import PromptFormat, plain_prefix, render_plain, resolve_prompt_format
from grail.tasks.arithmetic import TaskConfig
from grail.tasks.synthetic import generate

FEW_SHOT = [{"role": "user", "content": "Ann has 2 pens. She buys 1 more. How many?"},
            {"role": "assistant", "content": "Ann has 2 + 1 = 3 pens. \\boxed{3}"},
            {"role": "user", "content": "Tom has 5 cards. He loses 4. How many?"}]


def test_turns_become_labelled_paragraphs_ending_in_the_answer_cue():
    text = render_plain(FEW_SHOT)
    assert text == ("Question: Ann has 2 pens. She buys 1 more. How many?\n\n"
                    "Answer: Ann has 2 + 1 = 3 pens. \\boxed{3}\n\n"
                    "Question: Tom has 5 cards. He loses 4. How many?\n\nAnswer:")
    # the answer cue is the prefix of a worked answer: a completion continues the pattern
    assert render_plain(FEW_SHOT[:2]).startswith(render_plain(FEW_SHOT[:1]))
    assert render_plain(FEW_SHOT, answer_end="<eos>").count("\\boxed{3}<eos>\n\n") == 1
    assert render_plain(FEW_SHOT[:2]).endswith("\\boxed{3}")  # no cue after an assistant turn
    with pytest.raises(ValueError, match="role 'tool'"):
        render_plain([{"role": "tool", "content": "x"}])


def test_the_words_task_renders_plain_for_a_tokenizer_without_a_template():
    """The words task's prompts are chat messages; without a template (or with conversational=false) a run trains on
    render_plain's text, with the suffix on the question."""
    example = generate(TaskConfig(num_steps=1, operand_max=9, style="words"), 1, "train", 0)[0]
    fmt = resolve_prompt_format(None, True, False, "", messages=True)
    assert fmt == PromptFormat("", False, {})
    text = fmt.training_prompt(example.prompt)
    assert text == render_plain(example.prompt) and text.endswith("have now? Put the final answer in \\boxed{}."
                                                                  "\n\nAnswer:")
    assert text.count("Question: ") == len([m for m in example.prompt if m["role"] == "user"])


def _tokenizer_with_bos(tokenizer, adds: bool) -> PreTrainedTokenizerFast:
    """The embedded tokenizer with a BOS token that encoding adds (like Gemma's) or not (like SmolLM2's)."""
    from tokenizers.processors import TemplateProcessing

    backend = tokenizer.backend_tokenizer.__class__.from_str(tokenizer.backend_tokenizer.to_str())
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token=tokenizer.eos_token,
                                   pad_token=tokenizer.pad_token)
    fast.add_special_tokens({"bos_token": "<s>"})
    if adds:
        fast.backend_tokenizer.post_processor = TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", fast.convert_tokens_to_ids("<s>"))])
    return fast


@pytest.mark.parametrize("adds", [True, False])
def test_a_rendered_plain_prompt_tokenises_as_trl_feeds_it(tokenizer, adds):
    """render() without special tokens gives exactly the ids TRL gets from the plain prompt with them: BOS once."""
    tok = _tokenizer_with_bos(tokenizer, adds)
    assert plain_prefix(tok) == ("<s>" if adds else "")
    fmt = PromptFormat(" go.")
    ours = tok(fmt.render(tok, "Q: 1+1"), add_special_tokens=False)["input_ids"]
    trls = tok(fmt.training_prompt("Q: 1+1"))["input_ids"]  # TRL: processing_class(text=prompts)
    assert ours == trls
    assert (ours[0] == tok.bos_token_id) is adds and ours.count(tok.bos_token_id) == int(adds)
    assert plain_prefix(None) == ""
