"""The "words" style of the synthetic task (grail.tasks.word_problems): the same arithmetic and splits as the symbolic
style, a natural-language prompt and solution, per-character roles that an independent parser of the solution
text reproduces, and labels that survive tokenisation (grail.analysis.saliency.token_labels)."""

import random
import re
from dataclasses import replace

import pytest

from grail.analysis.saliency.token_labels import (
    CRITICAL,
    FILLER,
    char_labels,
    check_row,
    saliency_row,
    synthetic_rows,
    token_labels,
)
from grail.evaluation.benchmarks import load_benchmark, parse_benchmark_list
from grail.evaluation.rewards import exact_int_reward
from grail.models.tiny import build_tokenizer
from grail.options.fields import GRAILFields
from grail.options.presets import PRESETS
from grail.tasks.arithmetic import CRITICAL_ROLES, FILLER_WORDS, TaskConfig, sample_steps, split_of
from grail.tasks.boxed import last_boxed_content
from grail.tasks.synthetic import WORDS_SET, SyntheticSet, generate
from grail.tasks.word_problems import (
    DEFAULT_PROMPT,
    NAMES,
    OBJECTS,
    WORDS_TASK,
    PromptOptions,
    build_word_example,
)

WORDS = TaskConfig(style="words")
EQUATION = re.compile(r"(?P<left>\d+) (?P<op>[-+*]) (?P<rhs>\d+) = (?P<res>\d+) (?P<objects>[a-z ]+)\.")
FILL = "|".join(FILLER_WORDS)
OBJECT_WORDS = "|".join(o for pair in OBJECTS for o in pair)
SENTENCE = rf"(?:[A-Z][a-z]+|Then (?:he|she)) has \d+ [-+*] \d+ = \d+ (?:{OBJECT_WORDS})\. (?:(?:{FILL}) )*"
SHAPE = re.compile(rf"(?:{SENTENCE})+\\boxed\{{\d+\}}")


def last_user(example) -> str:
    assert example.prompt[-1]["role"] == "user"
    return example.prompt[-1]["content"]


def left_to_right(expression: str) -> int:
    tokens = re.findall(r"\d+|[-+*]", expression)
    value = int(tokens[0])
    for op, operand in zip(tokens[1::2], tokens[2::2], strict=True):
        value = value + int(operand) if op == "+" else value - int(operand) if op == "-" else value * int(operand)
    return value


def check_words_example(ex, config):
    """Everything derivable from the texts, recomputed independently of grail.tasks.word_problems."""
    assert len(ex.roles) == len(ex.solution)
    assert SHAPE.fullmatch(ex.solution), ex.solution
    equations = list(EQUATION.finditer(ex.solution))
    assert len(equations) == config.num_steps, ex.solution
    # the equations chain: each left number is the previous result, each result is computed right
    value = int(re.match(r"\d+", ex.expression).group())
    assert ex.expression == equations[0]["left"] + "".join(m["op"] + m["rhs"] for m in equations)
    for m in equations:
        left, rhs, res = int(m["left"]), int(m["rhs"]), int(m["res"])
        assert left == value
        value = left + rhs if m["op"] == "+" else left - rhs if m["op"] == "-" else left * rhs
        assert res == value and 0 <= res <= config.max_value
    assert ex.answer == str(value) == str(left_to_right(ex.expression))
    # the box holds the answer, and the reward accepts the reference solution
    assert last_boxed_content(ex.solution) == ex.answer
    assert ex.solution.endswith(f"\\boxed{{{ex.answer}}}")
    assert exact_int_reward([ex.solution], answer=[ex.answer]) == [1.0]
    # critical characters: exactly the operator and the result of each equation
    critical = [False] * len(ex.solution)
    for m in equations:
        for group in ("op", "res"):
            critical[m.start(group):m.end(group)] = [True] * (m.end(group) - m.start(group))
    assert ex.critical_mask() == critical
    assert [r in CRITICAL_ROLES for r in ex.roles] == critical
    # filler characters: exactly the letters of lowercase filler words standing between sentences
    filler = [False] * len(ex.solution)
    for gap in re.finditer(rf"(?<=\. )((?:(?:{FILL}) )+)", ex.solution):
        for word in re.finditer(r"[a-z]+", gap.group(1)):
            filler[gap.start(1) + word.start():gap.start(1) + word.end()] = [True] * len(word.group())
    assert ex.filler_mask() == filler
    # the answer role is the box digits only; each number is singular or plural as it should be
    answer_chars = "".join(c for c, r in zip(ex.solution, ex.roles, strict=True) if r == "answer")
    assert answer_chars == ex.answer
    for m in equations:
        assert (m["res"] == "1") == (m["objects"] in {singular for singular, _ in OBJECTS})
    # the prompt: chat turns alternating user / assistant, ending with the question in words and the instruction
    assert [m["role"] for m in ex.prompt] == ["user", "assistant"] * DEFAULT_PROMPT.shots + ["user"]
    assert last_user(ex).endswith("have now? Put the final answer in \\boxed{}.") and "Q: " not in last_user(ex)
    return equations


# ---- generation -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [WORDS, WORDS_TASK, replace(WORDS, num_steps=4, filler_rate=0.5),
                                   replace(WORDS, num_steps=1, operand_max=40, max_value=60, filler_rate=1.0)])
def test_generated_word_problems_pass_the_independent_checker(config):
    for ex in generate(config, 60, "train", seed=3):
        check_words_example(ex, config)


def test_same_arithmetic_as_the_symbolic_style():
    """Style changes the rendering only: a seed draws the same expressions (hence the same split) in both styles."""
    for config in (TaskConfig(), TaskConfig(num_steps=3, filler_rate=0.5)):
        symbolic = generate(config, 40, "heldout", seed=7)
        words = generate(replace(config, style="words"), 40, "heldout", seed=7)
        assert [e.expression for e in words] == [e.expression for e in symbolic]
        assert [e.answer for e in words] == [e.answer for e in symbolic]


def test_deterministic_by_seed():
    a = generate(replace(WORDS, filler_rate=0.5), 30, "train", seed=11)
    assert a == generate(replace(WORDS, filler_rate=0.5), 30, "train", seed=11)
    b = generate(replace(WORDS, filler_rate=0.5), 30, "train", seed=12)
    assert [e.prompt for e in a] != [e.prompt for e in b]


def test_global_rng_untouched():
    random.seed(5)
    expected = random.random()
    random.seed(5)
    generate(replace(WORDS, filler_rate=0.5), 20, "train", seed=0)
    assert random.random() == expected


def test_train_and_heldout_are_disjoint_and_examples_in_prompts_are_training_problems():
    train = generate(WORDS_TASK, WORDS_SET.num_train, "train", seed=0)  # the default set fits its problem space
    heldout = generate(WORDS_TASK, WORDS_SET.num_heldout, "heldout", seed=1)
    assert not {e.expression for e in train} & {e.expression for e in heldout}
    assert all(split_of(e.expression, 0.1) == "heldout" for e in heldout)
    for ex in train[:50] + heldout:
        shown = [m["content"] for m in ex.prompt if m["role"] == "assistant"]  # the worked examples' solutions
        assert len(shown) == DEFAULT_PROMPT.shots
        for text in shown:
            assert SHAPE.fullmatch(text) and "filler" not in text
            equations = list(EQUATION.finditer(text))
            expression = equations[0]["left"] + "".join(m["op"] + m["rhs"] for m in equations)
            assert split_of(expression, 0.1) == "train"


def test_hand_written_story():
    ex = build_word_example(WORDS, 7, [("+", 5), ("-", 3), ("*", 2)], [(), ("so", "well"), ("okay",)],
                            random.Random(0), options=PromptOptions(shots=0))
    ((name, pronoun),) = [n for n in NAMES if last_user(ex).startswith(f"{n[0]} has 7 ")]
    ((singular, plural),) = [o for o in OBJECTS if f" has 7 {o[1]}. " in last_user(ex)]
    assert ex.prompt == [{"role": "user", "content": last_user(ex)}]
    assert last_user(ex).endswith(f"How many {plural} does {name} have now? Put the final answer in \\boxed{{}}.")
    assert ex.solution == (f"{name} has 7 + 5 = 12 {plural}. Then {pronoun} has 12 - 3 = 9 {plural}. so well "
                           f"Then {pronoun} has 9 * 2 = 18 {plural}. okay \\boxed{{18}}")
    assert ex.expression == "7+5-3*2" and ex.answer == "18"
    codes = "".join({"operand": "o", "carry": "c", "operator": "p", "result": "r", "answer": "a", "filler": "f",
                     "format": "_"}[r] for r in ex.roles)
    head = f"{name} has "
    expected = ("_" * len(head) + "o_p_o___rr" + "_" * (len(plural) + 3)
                + "_" * len(f"Then {pronoun} has ") + "cc_p_o___r" + "_" * (len(plural) + 3) + "ff_ffff_"
                + "_" * len(f"Then {pronoun} has ") + "c_p_o___rr" + "_" * (len(plural) + 3) + "ffff_"
                + "_______aa_")
    assert codes == expected
    one = build_word_example(WORDS, 1, [("+", 1)], None, random.Random(1), options=PromptOptions(shots=0))
    assert re.match(rf"\w+ has 1 ({'|'.join(s for s, _ in OBJECTS)})\. ", last_user(one))  # singular for one
    assert re.fullmatch(rf"\w+ has 1 \+ 1 = 2 ({'|'.join(p for _, p in OBJECTS)})\. \\boxed\{{2\}}", one.solution)


def test_prompt_options():
    start, steps = 4, [("+", 2), ("-", 1)]
    bare = build_word_example(WORDS, start, steps, None, random.Random(0), options=PromptOptions(0, ""))
    assert len(bare.prompt) == 1 and last_user(bare).endswith("have now?")
    two = build_word_example(WORDS, start, steps, None, random.Random(0), options=PromptOptions(2))
    assert [m["role"] for m in two.prompt] == ["user", "assistant", "user", "assistant", "user"]
    assert all(m["content"].endswith("\\boxed{}.") for m in two.prompt if m["role"] == "user")
    assert bare.solution == two.solution  # the story is drawn before the examples
    with pytest.raises(ValueError, match="shots=-1"):
        PromptOptions(shots=-1)


def test_filler_rate_zero_has_no_filler_and_stripping_filler_recovers_the_plain_solution():
    plain = generate(replace(WORDS, num_steps=3), 100, "train", seed=9)
    noisy = generate(replace(WORDS, num_steps=3, filler_rate=0.7), 100, "train", seed=9)
    assert not any("filler" in e.roles for e in plain)
    assert any("filler" in e.roles for e in noisy)
    for p, n in zip(plain, noisy, strict=True):
        assert re.sub(rf"(?<=\. )(?:(?:{FILL}) )+", "", n.solution) == p.solution
        assert (p.prompt, p.answer) == (n.prompt, n.answer)


# ---- the style option ---------------------------------------------------------------------------------------------
def test_unknown_style_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"style='prose'.*symbolic, words"):
        TaskConfig(style="prose")
    with pytest.raises(ValueError, match=r"synthetic task setting: style='prose'.*task_"):
        GRAILFields(task_style="prose").task_config()


def test_task_style_field_reaches_the_problems_and_the_benchmark():
    fields = GRAILFields(task_style="words", task_num_train=20, task_num_heldout=5)
    assert fields.task_config() == TaskConfig(style="words")
    rows = fields.synthetic_set().rows("heldout")
    assert len(rows) == 5 and all("How many" in r["prompt"][-1]["content"] for r in rows)
    loaded = load_benchmark("synthetic", synthetic_set=fields.synthetic_set())
    assert [p.answer for p in loaded.problems] == [r["answer"] for r in rows]
    assert GRAILFields().task_config().style == "symbolic"


def test_symbolic_style_is_unchanged():
    """Pinned output of the symbolic style from before styles existed (prompts, fillers and solutions)."""
    assert TaskConfig().style == "symbolic"
    examples = generate(TaskConfig(num_steps=3, filler_rate=0.5), 3, "heldout", 0)
    assert [(e.prompt, e.solution) for e in examples] == [
        ("Q: 4-1-2*6\nA:", " 4-1=3, 3-2=1, okay then 1*6=6. \\boxed{6}"),
        ("Q: 7+2*8*2\nA:", " 7+2=9, so okay okay 9*8=72, 72*2=144. then \\boxed{144}"),
        ("Q: 6-6+9*5\nA:", " 6-6=0, 0+9=9, 9*5=45. \\boxed{45}")]
    assert SyntheticSet().task.style == "symbolic"


def test_sample_steps_is_shared():
    """The words style draws its arithmetic with the same sample_steps (what the splits and de-duplication see)."""
    drawn = sample_steps(WORDS_TASK, random.Random(3))
    assert drawn == sample_steps(replace(WORDS_TASK, style="symbolic"), random.Random(3))


# ---- labels through a tokenizer -----------------------------------------------------------------------------------
def _token_round_trip(tokenizer, row):
    enc = tokenizer(row["solution"], add_special_tokens=False, return_offsets_mapping=True)
    labels_C = char_labels(len(row["solution"]), row["critical_spans"], row["filler_spans"])
    labels = token_labels(row["solution"], labels_C, enc["offset_mapping"])
    pieces = [row["solution"][a:b] for a, b in enc["offset_mapping"]]
    return labels, pieces


def test_saliency_rows_survive_the_tiny_tokenizer():
    tokenizer = build_tokenizer()
    rows = synthetic_rows(replace(WORDS_TASK, filler_rate=0.6), n=20, split="heldout", seed=0)
    n_critical = n_filler = 0
    for i, row in enumerate(rows):
        check_row(row, i)
        labels, pieces = _token_round_trip(tokenizer, row)
        assert "".join(pieces) == row["solution"]  # exact offsets
        for label, piece in zip(labels, pieces, strict=True):
            if label == CRITICAL:
                assert re.fullmatch(r"[-+*0-9]+", piece.strip()), piece
                n_critical += 1
            elif label == FILLER:
                assert piece.strip() and piece.strip() in "".join(FILLER_WORDS), piece
                n_filler += 1
        crit_text = "".join(row["solution"][a:b] for a, b in row["critical_spans"])
        assert crit_text == "".join(m["op"] + m["res"] for m in EQUATION.finditer(row["solution"]))
    assert n_critical and n_filler


@pytest.mark.real
def test_saliency_rows_survive_a_byte_level_bpe_tokenizer(real_model_dir):
    """SmolLM2's tokenizer merges a leading space into words (" so") and splits digits: each critical token is a
    (space +) operator or digit, each filler token a (space +) filler word or a piece of one, as
    grail.analysis.saliency.token_labels' rules expect."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    rows = [saliency_row(e) for e in generate(replace(WORDS_TASK, filler_rate=0.6), 20, "heldout", seed=0)]
    kinds = set()
    for row in rows:
        labels, pieces = _token_round_trip(tokenizer, row)
        for label, piece in zip(labels, pieces, strict=True):
            if label == CRITICAL:
                assert re.fullmatch(r"[-+*0-9]+", piece.strip()), piece
            elif label == FILLER:  # " so", or a piece of one: "hmm" is " h" + "mm"
                assert re.fullmatch("[a-z]+", piece.strip()) and any(piece.strip() in w for w in FILLER_WORDS), piece
            kinds.add(label)
    assert {CRITICAL, FILLER} <= kinds


def test_message_prompts_reach_the_saliency_traces_through_the_chat_template():
    """grail.analysis.saliency.quality renders a words row's chat messages with the tokenizer's chat template, as
    training does; the completion is the solution alone."""
    from grail.analysis.saliency.quality import SaliencyQualityOptions, teacher_forced_traces

    tokenizer = build_tokenizer()
    rows = synthetic_rows(replace(WORDS_TASK, filler_rate=1.0), n=3, split="heldout", seed=0)
    traces = teacher_forced_traces(tokenizer, rows, SaliencyQualityOptions(traces="reference"))
    for row, trace in zip(rows, traces, strict=True):
        prompt = tokenizer.decode(trace.prompt_ids)
        assert prompt == tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        assert prompt.endswith("<|im_start|>assistant\n") and prompt.count("<|im_start|>user") == 5
        assert tokenizer.decode(trace.completion_ids) == row["solution"]
        assert {CRITICAL, FILLER} <= set(trace.labels)


# ---- the synthetic_words benchmark and the run's settings ------------------------------------------------------------
def test_synthetic_words_benchmark():
    loaded = load_benchmark("synthetic_words")  # no run: the measured default set
    assert len(loaded.problems) == WORDS_SET.num_heldout and loaded.subset == "all"
    assert [p.answer for p in loaded.problems] == [r["answer"] for r in WORDS_SET.rows("heldout")]
    assert all(p.problem[-1]["role"] == "user" and len(p.problem) == 2 * DEFAULT_PROMPT.shots + 1
               for p in loaded.problems)
    run = SyntheticSet(task=replace(WORDS, num_steps=3), num_heldout=7)
    assert len(load_benchmark("synthetic_words", synthetic_set=run).problems) == 7  # a words run: its own set
    symbolic_run = SyntheticSet(num_heldout=7)
    assert len(load_benchmark("synthetic_words", synthetic_set=symbolic_run).problems) == WORDS_SET.num_heldout
    assert load_benchmark("synthetic", synthetic_set=symbolic_run).problems[0].problem.startswith("Q: ")
    assert parse_benchmark_list("synthetic, synthetic_words") == ["synthetic", "synthetic_words"]


def test_the_tiny_model_refuses_the_words_style(tmp_path):
    from grail.training.config import GRAILConfig

    with pytest.raises(ValueError, match="task_style='words' is for pretrained chat models.*smollm2-135m"):
        GRAILConfig(output_dir=str(tmp_path), task_style="words")
    with pytest.raises(ValueError, match="task_style"):
        GRAILConfig(output_dir=str(tmp_path), task_style="prose")


def test_the_preset_holds_the_measured_default():
    values = PRESETS["smollm-words"]
    fields = GRAILFields(**{k: v for k, v in values.items() if k.startswith("task_")})
    assert fields.synthetic_set() == WORDS_SET
    assert values["model_name_or_path"] != "tiny" and values["dataset"] == "synthetic"


def test_the_held_out_evaluation_gives_the_prompts_in_the_format_training_used(real_model_dir, tmp_path):
    """`grail compare` and `grail demo` evaluate a words run through its chat template, as TRL trained it: rendered
    as plain "Question:/Answer:" text instead, SmolLM2 went on to write the next question, whose empty box the
    grader read (greedy 3% before RL instead of 23%)."""
    import shutil

    from transformers import AutoTokenizer

    from grail.options.prompts import PromptFormat
    from grail.training.data import load_prompts
    from grail.training.heldout import eval_specs, heldout_accuracy
    from grail.training.overrides import build_config, merge
    from grail.training.run import resolve_prompt_fields

    values = merge(None, {"preset": "smollm-words", "task_num_steps": "2", "output_dir": str(tmp_path / "run")})
    cfg = build_config(values)
    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    trained = resolve_prompt_fields(build_config(values), tokenizer, load_prompts(cfg))
    specs = eval_specs(cfg, tokenizer)
    assert trained.chat and all(spec.prompt == trained for spec in specs.values())
    (heldout,) = specs["greedy"].load_benchmarks(synthetic_set=cfg.synthetic_set())
    text = specs["greedy"].prompt.render(tokenizer, heldout.problems[0].problem)
    assert text.endswith("<|im_start|>assistant\n") and "\n\nAnswer:" not in text

    # a model trained in another format is refused before it is loaded, naming both formats
    model_dir = tmp_path / "trained"
    model_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (real_model_dir / name).is_file():
            shutil.copy(real_model_dir / name, model_dir / name)
    PromptFormat(chat=False).save(model_dir)
    with pytest.raises(ValueError, match="trained with prompts in plain text.*chat template"):
        heldout_accuracy(str(model_dir), specs, heldout, tmp_path / "eval", log=lambda s: None)
