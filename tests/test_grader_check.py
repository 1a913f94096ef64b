"""grail.evaluation.grader_check, the grader's self-test on benchmark-shaped data: on rows written here, on the shared
benchmark copies, and its exit status through the CLI."""

import json
import os
from pathlib import Path

import pytest

from grail.cli import main
from grail.evaluation.grader_check import format_grader_check, grader_check

SHARED_BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"


TINY_ROWS = {
    "math500": [
        {"problem": "p", "solution": "so $\\boxed{\\frac{1}{2}}$", "answer": "0.5", "unique_id": "test/a.json"},
        {"problem": "p", "solution": "so $\\boxed{\\frac{1}{3}}$", "answer": "\\frac12", "unique_id": "test/b.json"},
    ],
    "aime24": [
        {"id": "60", "problem": "p", "solution": "We get 204.", "answer": "204"},  # no box: a disagreement
        {"id": "61", "problem": "p", "solution": "Thus $\\boxed{025}$.", "answer": "025"},
    ],
    "amc23": [{"id": "0", "problem": "p", "answer": 27.0}, {"id": "1", "problem": "p", "answer": 5.5}],
    "minerva_math": [
        {"idx": "0", "problem": "p", "solution": "$s=\\boxed{1.6} \\mathrm{~cm}$"},
        {"idx": "1", "problem": "p", "solution": "\\boxed{x=5}"},
    ],
    "college_math": [
        {"data_source": "b", "question_number": "1", "question": "q", "answer": "$10-4 n$"},
        {"data_source": "b", "question_number": "2", "question": "q", "answer": "$(-3,3)$"},
    ],
    "olympiadbench": [
        {"id": "1", "question": "q", "final_answer": ["$2$"], "context": None},
        {"id": "2", "question": "q", "final_answer": ["$69$,$84$"], "context": None},
    ],
}


@pytest.fixture
def tiny_data(tmp_path):
    for name, rows in TINY_ROWS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return tmp_path


def test_grader_check_on_tiny_data(tiny_data):
    result = grader_check(tiny_data, workers=1)
    benchmarks = result["benchmarks"]
    assert list(benchmarks) == ["math500", "aime24", "amc23", "minerva_math", "college_math", "olympiadbench"]
    math500 = benchmarks["math500"]
    assert (math500["n"], math500["solution"]["agree"], math500["solution"]["n"]) == (2, 1, 2)
    assert math500["solution"]["disagreements"] == [
        {"id": "test/b.json", "reference": "\\frac12", "extracted": "\\frac{1}{3}", "reason": "ok"}]
    assert benchmarks["aime24"]["solution"]["disagreements"] == [
        {"id": "60", "reference": "204", "extracted": None, "reason": "no_box"}]
    for name, entry in benchmarks.items():
        assert entry["round_trip"]["fraction"] == 1.0 and entry["round_trip"]["n"] == 2, name
        assert entry["neighbour"] is None  # not asked for
        if name not in ("math500", "aime24"):
            assert entry["solution"] is None and entry["solution_note"]
    targets = {(t["benchmark"], t["check"]): t["met"] for t in result["targets"]}
    assert targets[("math500", "solution")] is False  # 1 of 2 < 99%
    assert targets[("college_math", "round_trip")] is True
    assert len(targets) == 7
    table = format_grader_check(result)
    assert "| math500 | 2 | 1/2 (50.0%) | 2/2 (100.0%) | — (not run) |" in table
    assert "math500 solution: 50.00% (target >= 99.0%): NOT MET" in table
    assert "| test/b.json | \\frac12 | \\frac{1}{3} | ok |" in table


def test_grader_check_neighbour_and_subset(tiny_data):
    result = grader_check(tiny_data, benchmarks=["minerva_math", "amc23"], workers=2, neighbour=True)
    assert list(result["benchmarks"]) == ["minerva_math", "amc23"]
    minerva = result["benchmarks"]["minerva_math"]["neighbour"]
    assert (minerva["n"], minerva["agree"]) == (2, 2)  # 1.6 vs x=5 and x=5 vs 1.6: both rejected
    assert result["benchmarks"]["amc23"]["neighbour"]["agree"] == 2  # 27 vs 5.5
    assert "| minerva_math | 2 | — (the reference IS the solution's last box" in format_grader_check(result)


def test_format_grader_check_lists_the_first_few(tiny_data):
    result = grader_check(tiny_data, benchmarks=["math500"], workers=1)
    assert "1 disagreement(s)\n" in format_grader_check(result)
    assert "1 disagreement(s) (first 0 listed)" in format_grader_check(result, show=0)


def test_grader_check_under_the_release_scoring(tiny_data):
    """The references become the release's text (AMC23's str(27.0) = "27.0"); the boxed answers stay grail's."""
    result = grader_check(tiny_data, benchmarks=["amc23", "college_math"], workers=1, scoring="release",
                          neighbour=True)
    assert result["scoring"] == "release" and format_grader_check(result).startswith("Scoring: release\n")
    amc23 = result["benchmarks"]["amc23"]
    assert (amc23["round_trip"]["agree"], amc23["round_trip"]["n"]) == (2, 2)  # 27 = 27.0 and 5.5 = 5.5
    assert (amc23["neighbour"]["agree"], amc23["neighbour"]["n"]) == (2, 2)  # 27 vs 5.5: rejected both ways
    college = result["benchmarks"]["college_math"]["round_trip"]  # "$$10-4 n$$" is display math around 10 - 4n
    assert (college["agree"], college["n"]) == (2, 2)
    with pytest.raises(ValueError, match="scoring='paper'"):
        grader_check(tiny_data, benchmarks=["amc23"], scoring="paper")


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_BENCHMARKS.is_dir(), reason="../shared/data/benchmarks is not present")
def test_grader_check_on_the_shared_benchmarks_meets_the_targets():
    """Every row of the six local benchmark copies: >= 99% MATH500 solution-vs-answer, >= 99.5% round trip."""
    result = grader_check(SHARED_BENCHMARKS, workers=os.cpu_count())
    assert {name: entry["n"] for name, entry in result["benchmarks"].items()} == {
        "math500": 500, "aime24": 30, "amc23": 40, "minerva_math": 272, "college_math": 2818, "olympiadbench": 675}
    assert len(result["targets"]) == 7
    assert all(t["met"] for t in result["targets"]), format_grader_check(result)


def test_grader_check_exit_status_says_whether_its_targets_are_met(tiny_data, capsys):
    from grail.cli import main

    # amc23 and minerva_math round-trip every reference: targets met, exit 0
    assert main(["grader-check", "--data-dir", str(tiny_data), "--benchmarks", "amc23,minerva_math",
                 "--workers", "1"]) == 0
    # math500's second worked solution boxes 1/3 against the answer 1/2: 50% < the 99% target, exit 1
    assert main(["grader-check", "--data-dir", str(tiny_data), "--benchmarks", "math500", "--workers", "1"]) == 1
    assert "targets NOT MET (math500 solution)" in capsys.readouterr().err


def test_grader_check_counts_and_lists_references_read_as_text_or_in_part(tmp_path):
    """Before = boxed as written, after = grail's normalisation: the \\mathrm{e} reference parses only in part before
    and fully after; the multi-letter \\mathrm name stays partial; the code-like reference stays text."""
    rows = [{"data_source": "b", "question_number": str(i), "question": "q", "answer": answer}
            for i, answer in enumerate(["1 - \\frac{1}{\\mathrm{e}}", "x=\\frac{\\mathrm{gb}}{f}", "np.arcsin(10/13)",
                                        "4"])]
    (tmp_path / "college_math").mkdir()
    (tmp_path / "college_math" / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    parse = grader_check(tmp_path, benchmarks=["college_math"], workers=1)["benchmarks"]["college_math"]["parse"]
    assert parse["before"] == {"math": 1, "partial": 2, "text": 1, "none": 0}
    assert parse["after"] == {"math": 2, "partial": 1, "text": 1, "none": 0}
    assert [(d["reference"], d["before"], d["after"]) for d in parse["listed"]] == [
        ("1 - \\frac{1}{\\mathrm{e}}", "partial", "math"), ("x=\\frac{\\mathrm{gb}}{f}", "partial", "partial"),
        ("np.arcsin(10/13)", "text", "text")]
    table = format_grader_check(grader_check(tmp_path, benchmarks=["college_math"], workers=1))
    assert "| college_math | 2 | 1 | 1 | 1 | 0 | 0 |" in table
    assert "college_math: 3 reference(s) not read as mathematics before or after" in table


def test_grader_check_cli_runs_the_neighbour_check_on_request(tiny_data, capsys):
    argv = ["grader-check", "--data-dir", str(tiny_data), "--benchmarks", "amc23", "--workers", "1"]
    assert main(argv) == 0
    assert "| amc23 | 2 | — (no worked solution in the data) | 2/2 (100.0%) | — (not run) |" in capsys.readouterr().out
    assert main([*argv, "--neighbour"]) == 0
    assert "| amc23 | 2 | — (no worked solution in the data) | 2/2 (100.0%) | 2/2 (100.0%) |" in capsys.readouterr().out
