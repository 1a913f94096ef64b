"""The chain task's sets (grail.tasks.chains): three splits disjoint by construction, the refusal of sets split
differently, the default held-out split's answer statistics against the bars a constant answer must fail, the
`--stats` command, and the docs page that shows its table."""

from collections import Counter
from pathlib import Path

import pytest

from grail.tasks.chain_problems import ChainConfig
from grail.tasks.chains import (
    SPLITS,
    ChainSet,
    ChainSplits,
    answer_stats,
    chain_examples,
    check_heldout_disjoint,
    main,
    stats_table,
)

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "chain-task.md"
# about 200 identities: random draws for two splits would share many
SMALL = ChainConfig(num_steps=2, operand_min=1, operand_max=4, max_value=12)


def small_set(seed: int, splits: ChainSplits | None = None) -> ChainSet:
    return ChainSet(task=SMALL, num_sft=30, num_train=60, num_heldout=10, seed=seed, splits=splits or ChainSplits(),
                    heldout_max_answer_share=1.0)


def identities(chain_set: ChainSet, split: str) -> set[str]:
    examples = chain_set.examples(split)
    found = {e.expression for e in examples}
    assert len(found) == len(examples) == chain_set.size(split)  # distinct within a split
    return found


def test_the_three_splits_are_disjoint_across_seeds_in_a_small_problem_space():
    sets = [small_set(seed) for seed in range(3)]
    by_split = {split: set().union(*(identities(s, split) for s in sets)) for split in SPLITS}
    assert not by_split["heldout"] & by_split["train"]
    assert not by_split["heldout"] & by_split["sft"]
    assert not by_split["sft"] & by_split["train"]
    # the space is small enough that seeds repeat problems within a split, so the disjointness is not luck
    assert len(by_split["train"]) < sum(len(identities(s, "train")) for s in sets)


def test_sets_split_differently_overlap_and_are_refused():
    heldout = small_set(0, ChainSplits(heldout_fraction=0.5, sft_fraction=0.2))
    training = small_set(1)
    shared = identities(heldout, "heldout") & (identities(training, "train") | identities(training, "sft"))
    assert shared  # the reason for the check: these fractions do overlap
    with pytest.raises(ValueError, match="set 1 of the training sets splits problems with .*Give every ChainSet the "
                                         "same splits"):
        check_heldout_disjoint(heldout, small_set(2, heldout.splits), training)
    check_heldout_disjoint(small_set(0), small_set(1), ChainSet(seed=5))  # one ChainSplits: accepted


@pytest.mark.parametrize(("splits", "message"), [
    ({"heldout_fraction": 0.6, "sft_fraction": 0.4}, "heldout_fraction \\+ sft_fraction = 1 leaves the train split "
                                                     "nothing.*lower one of them"),
    ({"heldout_fraction": 0.0}, "heldout_fraction=0.0 must be in \\(0, 1\\)"),
    ({"sft_fraction": 1.5}, "sft_fraction=1.5 must be in \\(0, 1\\)"),
])
def test_overlapping_or_empty_split_requests_are_refused(splits, message):
    with pytest.raises(ValueError, match=message):
        ChainSplits(**splits)


def test_bad_set_sizes_and_split_names_are_refused():
    with pytest.raises(ValueError, match="ChainSet num_heldout=0 must be >= 1"):
        ChainSet(num_heldout=0)
    with pytest.raises(ValueError, match="heldout_max_answer_share=0 must be in"):
        ChainSet(heldout_max_answer_share=0)
    with pytest.raises(ValueError, match="split='test' is not a chain split; choose one of sft, train, heldout"):
        chain_examples(ChainConfig(), 1, "test", seed=0)
    with pytest.raises(ValueError, match="found only .* problem space is too small.*lower n"):
        chain_examples(SMALL, 200, "heldout", seed=0)


def test_the_default_heldout_split_meets_the_bars_a_constant_answer_must_fail():
    examples = ChainSet().examples("heldout")
    counts = Counter(int(e.answer) for e in examples)
    assert len(examples) >= 200
    assert len(counts) >= 100
    assert max(counts.values()) / len(examples) <= 0.03
    assert all(e.solution.count(" = ") >= 3 for e in examples)  # at least three steps in every solution
    # the statistics the page shows are these counts
    stats = answer_stats(examples)
    assert (stats.problems, stats.distinct_answers) == (len(examples), len(counts))
    mode, top = counts.most_common(1)[0]
    assert stats.best_constant_share == top / len(examples) and counts[int(stats.best_constant_answer)] == top
    assert (stats.answer_min, stats.answer_max) == (min(counts), max(counts))
    assert stats.mean_solution_chars == sum(map(len, (e.solution for e in examples))) / len(examples)


def test_the_cap_binds_where_free_draws_exceed_it():
    # 64 problems drawn freely from a narrow task repeat answers; a 5% cap allows 3 problems per answer
    narrow = ChainConfig(operand_min=1, operand_max=9, max_value=30)
    free = Counter(e.answer for e in chain_examples(narrow, 64, "heldout", seed=0))
    assert max(free.values()) > 3
    capped = ChainSet(task=narrow, num_heldout=64, heldout_max_answer_share=0.05).examples("heldout")
    assert max(Counter(e.answer for e in capped).values()) == 3
    # the cap is the held-out split's only: the train split is drawn freely
    assert ChainSet(task=narrow, num_train=64, heldout_max_answer_share=0.05).examples("train") == \
        chain_examples(narrow, 64, "train", seed=0)


def test_rows_are_chat_prompts_with_answers_in_generation_order():
    chain_set = ChainSet(num_train=5)
    rows = chain_set.rows("train")
    assert rows == [{"prompt": e.prompt, "answer": e.answer} for e in chain_set.examples("train")]
    assert all(r["prompt"][0]["role"] == "user" and "\\boxed{}" in r["prompt"][0]["content"] for r in rows)


def test_stats_command_prints_the_table_the_docs_page_shows(capsys):
    assert main(["--stats"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == stats_table(answer_stats(ChainSet().examples("heldout")))
    assert printed in PAGE.read_text(), f"{PAGE.name} shows stale statistics: paste the output of " \
                                        "`python -m grail.tasks.chains --stats`"


def test_stats_command_takes_the_knobs_and_reports_bad_ones(capsys):
    assert main(["--examples", "1", "--num_steps", "4", "--operations", "add", "subtract", "--split", "train"]) == 0
    out = capsys.readouterr().out
    question, solution = out.splitlines()[:2]
    assert question.count(" more ") + question.count(" fewer ") == 4 and solution.count(" = ") == 4
    assert "| statistic |" not in out  # --examples alone prints no table
    assert main(["--max_value", "20"]) == 2
    assert "ChainConfig max_value=20 is below" in capsys.readouterr().err


def test_sft_pairs_give_trl_a_completion_that_is_the_solution_after_the_prompt():
    # What SFTTrainer does with a conversational prompt-completion row: it renders the prompt with the generation
    # prompt and prompt + completion without, and trains on the tokens after their common prefix. The tiny
    # tokenizer merges "\nA" (from the symbolic task's "\nA:"), so a solution that starts with "Ava" takes the
    # prompt's last newline with it: TRL then warns and trains on that newline too.
    from trl.data_utils import is_conversational

    from grail.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    chain_set = ChainSet(num_sft=8)
    pairs = chain_set.sft_pairs()
    assert pairs == chain_set.sft_pairs("sft") and len(pairs) == 8
    merged = 0
    for pair, example in zip(pairs, chain_set.examples("sft"), strict=True):
        assert set(pair) == {"prompt", "completion"} and is_conversational(pair)
        assert pair["prompt"] == example.prompt and pair["completion"][0]["role"] == "assistant"
        prompt_ids = tokenizer.apply_chat_template(pair["prompt"], add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"]
        full_ids = tokenizer.apply_chat_template(pair["prompt"] + pair["completion"], tokenize=True,
                                                 return_dict=True)["input_ids"]
        pairs_of_ids = zip(prompt_ids, full_ids, strict=False)
        common = next((i for i, (x, y) in enumerate(pairs_of_ids) if x != y), len(prompt_ids))
        dropped = tokenizer.decode(prompt_ids[common:])
        assert dropped == "" or (dropped == "\n" and example.solution.startswith("A")), dropped
        merged += bool(dropped)
        assert tokenizer.decode(full_ids[common:]) == dropped + example.solution + "<|im_end|>\n"
        assert example.solution.endswith(f"\\boxed{{{example.answer}}}")
    assert 0 < merged < len(pairs)  # both cases occur in these 8
    # warm-start targets come from the sft split only: none is a held-out problem
    held = {e.expression for e in chain_set.examples("heldout")}
    assert not held & {e.expression for e in chain_set.examples("sft")}
