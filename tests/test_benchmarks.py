"""grail.evaluation.benchmarks: the six local benchmark copies (skipped when ../shared/data/benchmarks is absent), the
release's fixed subsets and seeded subsets, error paths on small files written in the test, the Hub error path offline,
and the synthetic task."""

import json
import re
from pathlib import Path

import pytest

from grail.evaluation.benchmark_sources import HUB_IDS
from grail.evaluation.benchmarks import (
    BENCHMARK_NAMES,
    RELEASE_SUBSET_FILES,
    Problem,
    load_benchmark,
    load_benchmarks,
    parse_benchmark_list,
    seeded_subset,
    strip_math_delimiters,
)

SHARED_BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"
ROWS = {"math500": 500, "aime24": 30, "amc23": 40, "minerva_math": 272, "college_math": 2818, "olympiadbench": 675}

# Three or four rows per benchmark, expected values read off the raw test.jsonl lines (not from the loader).
HAND_CHECKED = {
    "math500": {"test/precalculus/807.json": r"\left( 3, \frac{\pi}{2} \right)",  # line 1
                "test/algebra/1349.json": r"\text{Evelyn}", "test/precalculus/927.json": r"90^\circ"},
    "aime24": {"60": "204", "67": "025", "85": "080"},  # zero padding kept as written
    "amc23": {"0": "27", "3": "3159", "17": "-1"},  # raw 27.0, 3159.0, -1.0
    "minerva_math": {"0": "1.6", "1": "4.5e33", "5": "np.arcsin(10/13)"},  # "... = \boxed{1.6} \mathrm{~cm}"
    "olympiadbench": {"1606": "2",  # ["2"]: no wrapper in the raw file
                      "1610": r"\frac{1}{2 n+2}",  # ["$\frac{1}{2 n+2}$"]
                      "1664": "69, 84",  # ["$69$,$84$"]: two parts in one list element
                      "1970": r"(-\infty, 0) \cup\{1\}"},  # ["$(-\infty, 0) \cup\{1\}$."]
    "college_math": {
        "college_math.Beginning_and_Intermediate_Algebra/exercise.0.4.61": "10-4 n",  # "$10-4 n$"
        "college_math.Beginning_and_Intermediate_Algebra/exercise.7.8.24": r"\$ 3040",  # "$\$ 3040$"
        "college_math.Beginning_and_Intermediate_Algebra/exercise.9.8.12": r"$4 \frac{4}{9}$ days",  # prose kept
        "college_math.Matrix_Theory_and_Linear_Algebra/exercise.1.4.7": "h=4",  # "$h=4$."
    },
}


@pytest.fixture(scope="module")
def data_dir():
    if not (SHARED_BENCHMARKS / "math500" / "test.jsonl").is_file():
        pytest.skip(f"no local benchmark copies at {SHARED_BENCHMARKS}")
    return SHARED_BENCHMARKS


def _write(tmp_path: Path, name: str, lines: list) -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True, exist_ok=True)
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n"
    (folder / "test.jsonl").write_text(text, encoding="utf-8")
    return tmp_path


# ---- the six local copies ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BENCHMARK_NAMES)
def test_release_sizes_ids_and_answers(name, data_dir):
    bench = load_benchmark(name, data_dir=data_dir)
    release = 200 if name in RELEASE_SUBSET_FILES else ROWS[name]  # METHODS.md 6: 200 of CollegeMath, OlympiadBench
    assert (bench.name, len(bench.problems), bench.total_rows, bench.skipped) == (name, release, ROWS[name], ())
    list_path = data_dir / name / RELEASE_SUBSET_FILES.get(name, "")
    assert bench.subset == ("all" if name not in RELEASE_SUBSET_FILES else f"release 200 of {ROWS[name]} ({list_path})")
    everything = load_benchmark(name, data_dir=data_dir, size=None)
    assert len(everything.problems) == ROWS[name] and everything.subset == "all"
    ids = [p.id for p in everything.problems]
    assert len(set(ids)) == len(ids)
    for p in everything.problems:
        assert p.source == name and isinstance(p.answer, str) and p.answer.strip() == p.answer != ""
        assert isinstance(p.problem, str) and p.problem.strip()


@pytest.mark.parametrize("name", BENCHMARK_NAMES)
def test_hand_checked_answers(name, data_dir):
    by_id = {p.id: p.answer for p in load_benchmark(name, data_dir=data_dir, size=None).problems}
    assert {i: by_id[i] for i in HAND_CHECKED[name]} == HAND_CHECKED[name]


# The reference text the release's scoring reads (str() of the raw field), read off the same raw lines.
HAND_CHECKED_RELEASE = {
    "amc23": {"0": "27.0", "17": "-1.0"},  # raw floats 27.0, -1.0
    "aime24": {"67": "025"},
    "minerva_math": {"0": "1.6"},  # the solution's last box
    "olympiadbench": {"1606": "['2']", "1610": "['$\\\\frac{1}{2 n+2}$']"},  # str() of the list: backslash doubled
    "college_math": {"college_math.Beginning_and_Intermediate_Algebra/exercise.0.4.61": "$10-4 n$"},
}


@pytest.mark.parametrize("name", list(HAND_CHECKED_RELEASE))
def test_hand_checked_release_answers(name, data_dir):
    by_id = {p.id: p.release_answer for p in load_benchmark(name, data_dir=data_dir, size=None).problems}
    assert {i: by_id[i] for i in HAND_CHECKED_RELEASE[name]} == HAND_CHECKED_RELEASE[name]


@pytest.mark.parametrize(("name", "left_with_dollars"), [("olympiadbench", 2), ("college_math", 402)])
def test_no_dollar_wrappers_left(name, left_with_dollars, data_dir):
    answers = [p.answer for p in load_benchmark(name, data_dir=data_dir, size=None).problems]
    assert all(strip_math_delimiters(a) == a for a in answers)  # nothing left to unwrap
    assert not [a for a in answers if a.startswith("$") and a.endswith("$") and "$" not in a[1:-1]]
    # the rest mix prose and math ("$4 \frac{4}{9}$ days") or are malformed (olympiadbench "$221,$8$")
    assert sum("$" in a.replace("\\$", "") for a in answers) == left_with_dollars


def test_strip_math_delimiters_cases():
    assert strip_math_delimiters(" $x+1$ ") == "x+1"
    assert strip_math_delimiters(r"$\$ 4$") == r"\$ 4"
    assert strip_math_delimiters("$1$, $2$,$3$.") == "1, 2, 3"
    assert strip_math_delimiters("$$\nx^2\n$$") == "x^2"
    for kept in ("27", "1,3,5", "$x=-1$ or $x=1$", "$221,$8$", "$a$; $b$", "No solution : $\\oslash$"):
        assert strip_math_delimiters(kept) == kept


# ---- the release's fixed subsets -----------------------------------------------------------------------------------
def test_release_subsets_are_the_listed_problems_in_the_release_order(data_dir):
    """Read the lists and test.jsonl here, independently of the loader: the ids in list order; for CollegeMath,
    each problem is the raw row on the line the list gives."""
    ids = (data_dir / "olympiadbench" / "release_subset_ids.txt").read_text().split()
    assert [p.id for p in load_benchmark("olympiadbench", data_dir=data_dir).problems] == ids
    lines = (data_dir / "college_math" / "release_subset.jsonl").read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    raw = (data_dir / "college_math" / "test.jsonl").read_text().splitlines()
    loaded = load_benchmark("college_math", data_dir=data_dir).problems
    assert [p.id for p in loaded] == [f"{e['data_source']}/{e['question_number']}" for e in entries]
    assert [p.problem for p in loaded] == [json.loads(raw[e["row"]])["question"] for e in entries]
    seeded = load_benchmark("college_math", data_dir=data_dir, size=200).problems
    assert set(seeded) != set(loaded)  # --size 200 is a seeded subset, not the release's


def _release_lists(tmp_path: Path, olympiad_ids: list, college: list) -> Path:
    (tmp_path / "olympiadbench").mkdir(parents=True, exist_ok=True)
    (tmp_path / "olympiadbench" / "release_subset_ids.txt").write_text("".join(f"{i}\n" for i in olympiad_ids))
    (tmp_path / "college_math").mkdir(parents=True, exist_ok=True)
    (tmp_path / "college_math" / "release_subset.jsonl").write_text("".join(json.dumps(e) + "\n" for e in college))
    return tmp_path


def test_release_subsets_on_small_files_and_their_errors(tmp_path):
    data = _write(tmp_path / "data", "olympiadbench", [{"id": i, "question": f"q{i}", "final_answer": [str(i)]}
                                                       for i in (5, 6, 7)])
    _release_lists(data, [7, 5], [])
    bench = load_benchmark("olympiadbench", data_dir=data)
    assert [p.id for p in bench.problems] == ["7", "5"]  # the list's order, not the file's
    assert bench.subset == f"release 2 of 3 ({data / 'olympiadbench' / 'release_subset_ids.txt'})"
    _release_lists(data, [7, 8], [])
    with pytest.raises(ValueError, match=r"1 of the 2 problems listed .* \['8'\]"):
        load_benchmark("olympiadbench", data_dir=data)
    _release_lists(data, [7, 7], [])
    with pytest.raises(ValueError, match="line 2 lists '7' a second time"):
        load_benchmark("olympiadbench", data_dir=data)
    _write(data, "college_math", [{"data_source": "b", "question_number": "1", "question": "q", "answer": "1"},
                                  {"data_source": "c", "question_number": "1", "question": "q", "answer": "2"}])
    _release_lists(data, [7], [{"data_source": "c", "question_number": "1", "row": 1}])
    assert [p.answer for p in load_benchmark("college_math", data_dir=data).problems] == ["2"]
    _release_lists(data, [7], [{"data_source": "c", "question_number": "1", "row": 0}])  # the pair is on line 1
    with pytest.raises(ValueError, match="not on the line it gives"):
        load_benchmark("college_math", data_dir=data)
    _release_lists(data, [7], [{"question_number": "1", "row": 1}])
    with pytest.raises(ValueError, match="line 1 is not a JSON object with data_source"):
        load_benchmark("college_math", data_dir=data)


def test_release_subset_lists_can_live_apart_from_the_data(tmp_path):
    rows = [{"id": i, "question": "q", "final_answer": ["1"]} for i in (1, 2)]
    data = _write(tmp_path / "data", "olympiadbench", rows)
    lists = _release_lists(tmp_path / "lists", [2], [])
    with pytest.raises(FileNotFoundError, match="no identity list .*release_subset_ids.txt.*--release-subsets-dir"):
        load_benchmark("olympiadbench", data_dir=data)
    bench = load_benchmark("olympiadbench", data_dir=data, release_subsets_dir=lists)
    assert [p.id for p in bench.problems] == ["2"]
    assert len(load_benchmark("olympiadbench", data_dir=data, size=None).problems) == 2  # no list needed


def test_release_subset_of_a_hub_copy_is_matched_by_id(monkeypatch, tmp_path):
    import datasets

    rows = [{"id": i, "question": f"q{i}", "final_answer": [str(i)]} for i in (3, 4, 9)]
    monkeypatch.setattr(datasets, "load_dataset", lambda hub_id: datasets.DatasetDict(
        {"test": datasets.Dataset.from_list(rows)}))
    with pytest.raises(ValueError, match="neither grail-rl nor the Hub copy holds.*--release-subsets-dir"):
        load_benchmark("olympiadbench")
    lists = _release_lists(tmp_path, [9, 3], [])
    bench = load_benchmark("olympiadbench", release_subsets_dir=lists)
    assert [(p.id, p.problem) for p in bench.problems] == [("9", "q9"), ("3", "q3")]
    assert bench.origin == "hub:math-ai/olympiadbench (split test)"


def test_seeded_subsets_deterministic_nested_and_ordered(data_dir):
    full = load_benchmark("college_math", data_dir=data_dir, size=None).problems
    position = {p.id: k for k, p in enumerate(full)}
    s200 = load_benchmark("college_math", data_dir=data_dir, size=200, seed=3).problems
    assert s200 == load_benchmark("college_math", data_dir=data_dir, size=200, seed=3).problems
    assert s200 != load_benchmark("college_math", data_dir=data_dir, size=200, seed=4).problems
    s50 = load_benchmark("college_math", data_dir=data_dir, size=50, seed=3)
    assert len(s50.problems) == 50 and set(s50.problems) < set(s200) and s50.subset == "seeded 50 of 2818 (seed 3)"
    for subset in (s50.problems, s200):
        indices = [position[p.id] for p in subset]
        assert indices == sorted(indices)  # file order
    assert load_benchmark("aime24", data_dir=data_dir, size=30, seed=9).subset == "all"


def test_seeded_subset_is_a_pure_function_of_seed_and_ids():
    problems = [Problem(str(i), f"q{i}", str(i), "x") for i in range(100)]
    picked = seeded_subset(problems, 10, seed=0)
    assert seeded_subset(list(reversed(problems)), 10, seed=0) == tuple(reversed(picked))  # ids decide, not order
    assert seeded_subset(problems, 10, seed=1) != picked and len(set(picked)) == 10


@pytest.mark.parametrize("size", [0, -1, 31, True, "all"])
def test_bad_sizes(size, data_dir):
    with pytest.raises(ValueError, match="size="):
        load_benchmark("aime24", data_dir=data_dir, size=size)


# ---- error paths on files written here -----------------------------------------------------------------------
def test_unknown_name_lists_the_names():
    with pytest.raises(ValueError, match="math500, aime24, amc23, minerva_math, college_math, olympiadbench"):
        load_benchmark("gsm8k", data_dir=".")


def test_missing_folder_names_the_expected_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "aime24" / "test.jsonl"))):
        load_benchmark("aime24", data_dir=tmp_path)


def test_malformed_line_names_file_and_line(tmp_path):
    _write(tmp_path, "aime24", [{"id": 1, "problem": "p", "answer": "1"}, "", '{"id": 2, "problem": '])
    with pytest.raises(ValueError, match=r"aime24/test\.jsonl: line 3 is not valid JSON"):
        load_benchmark("aime24", data_dir=tmp_path)


def test_unusable_rows_are_reported_in_skipped(tmp_path):
    _write(tmp_path, "minerva_math", [
        {"idx": 0, "problem": "p0", "solution": r"so \boxed{1} then \boxed{\frac{1}{2}} m"},
        {"idx": 1, "problem": "p1", "solution": r"unclosed \boxed{3"},
        {"idx": 2, "solution": r"\boxed{2}"},
        {"idx": 3, "problem": "p3", "solution": r"\boxed{ }"},
        {"idx": 4, "problem": "p4"},
    ])
    bench = load_benchmark("minerva_math", data_dir=tmp_path, size=None)
    assert [(p.id, p.answer) for p in bench.problems] == [("0", r"\frac{1}{2}")]  # the LAST box
    assert bench.total_rows == 5
    assert bench.skipped == (("1", "'solution' has no complete \\boxed{...}"), ("2", "no 'problem' field"),
                             ("3", "empty reference answer after normalisation"), ("4", "no 'solution' field"))
    with pytest.raises(ValueError, match="between 1 and 1"):
        load_benchmark("minerva_math", data_dir=tmp_path, size=2)


def test_id_fallback_number_answers_and_olympiad_lists(tmp_path):
    _write(tmp_path, "math500", [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": 2.5}])
    assert [(p.id, p.answer) for p in load_benchmark("math500", data_dir=tmp_path).problems] == [("0", "1"),
                                                                                             ("1", "2.5")]
    _write(tmp_path, "olympiadbench", [{"id": 7, "question": "q", "context": "c", "final_answer": ["$1$", "$x$"]},
                                       {"id": 8, "question": "q", "final_answer": ["$ $"]}])
    bench = load_benchmark("olympiadbench", data_dir=tmp_path, size=None)
    assert bench.problems[0] == Problem("7", "c\nq", "1, x", "olympiadbench", release_answer="['$1$', '$x$']")
    assert bench.skipped == (("8", "empty reference answer after normalisation"),)


def test_duplicate_ids_and_all_unusable_rows_raise(tmp_path):
    _write(tmp_path, "amc23", [{"id": 1, "problem": "p", "answer": 1.0}, {"id": 1, "problem": "q", "answer": 2.0}])
    with pytest.raises(ValueError, match="share the id '1'"):
        load_benchmark("amc23", data_dir=tmp_path)
    _write(tmp_path, "aime24", [{"id": 1, "question": "p", "answer": "1"}])
    with pytest.raises(ValueError, match="none of its 1 rows"):
        load_benchmark("aime24", data_dir=tmp_path)


# ---- the Hub -------------------------------------------------------------------------------------------------
def test_hub_offline_raises_a_clear_error(monkeypatch):
    import datasets
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read at import: also patch the constants already read
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError, match="--data-dir") as info:
        load_benchmark("math500")
    assert HUB_IDS["math500"] in str(info.value) and "math500/test.jsonl" in str(info.value)
    with pytest.raises(ValueError, match="no known Hub id.*local directory"):
        load_benchmark("college_math")


def test_hub_uses_the_only_split_when_there_is_no_test_split(monkeypatch):
    import datasets

    fake = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"id": 5, "problem": "p", "answer": 3.0}])})
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda hub_id: calls.append(hub_id) or fake)
    bench = load_benchmark("amc23")
    assert calls == ["math-ai/amc23"] and bench.origin == "hub:math-ai/amc23 (split train)"
    assert bench.problems == (Problem("5", "p", "3", "amc23", release_answer="3.0"),)


# ---- synthetic task and name lists ----------------------------------------------------------------------------
def test_synthetic_through_the_same_interface():
    from grail.tasks.arithmetic import TaskConfig
    from grail.tasks.synthetic import generate

    bench = load_benchmark("synthetic", size=None)
    expected = generate(TaskConfig(), 200, "heldout", 0)  # GRAILConfig's defaults: task_num_heldout 200, seed 0
    assert [(p.problem, p.answer) for p in bench.problems] == [(e.prompt, e.answer) for e in expected]
    assert [p.id for p in bench.problems] == [str(i) for i in range(200)] and bench.skipped == ()
    assert bench.problems[0].problem.startswith("Q: ") and bench.problems[0].problem.endswith("\nA:")
    assert len(load_benchmark("synthetic", size=20, seed=1).problems) == 20


def test_parse_benchmark_list():
    assert parse_benchmark_list(" math500, aime24 ") == ["math500", "aime24"]
    assert parse_benchmark_list("all") == list(BENCHMARK_NAMES)
    assert parse_benchmark_list("synthetic") == ["synthetic"]
    for bad, message in [("math500,gsm8k", "unknown benchmark.*'gsm8k'.*choose from math500"), (" , ", "empty"),
                         ("aime24,aime24", "listed twice")]:
        with pytest.raises(ValueError, match=message):
            parse_benchmark_list(bad)


def test_load_benchmarks_accepts_names_or_a_list_string(data_dir):
    loaded = load_benchmarks("aime24,amc23", data_dir=data_dir)
    assert [b.name for b in loaded] == ["aime24", "amc23"]
    assert [b.problems for b in load_benchmarks(["amc23"], data_dir=data_dir)] == [loaded[1].problems]
