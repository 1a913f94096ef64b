"""The docs speak of the software: what it does, what was measured, when and how. Words of how the work was organised
(who worked in which sitting, who lent a machine, who decides, which tracker item asked for it) say nothing about the
software and go stale at once. This test keeps them out of docs/, README.md, perf/ and results/: each pattern below
comes with the reason it is refused, and `process_words` is the one function both the test of the tree and the test
that the check can fail call."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PATTERNS = [
    (r"\bsessions?\b",
     "a sitting of work is not a time: give the date and UTC time, or say what ran, stopped or resumed"),
    (r"\b(?:a|the|one)\s+person(?:'s)?\s+(?:decid\w*|decision|choice|to decide)|\bperson's\s+decision",
     "who decides is not what is decided: state the decision, or the question that is open"),
    (r"\blent\b|\blending\b|\bleases?\b|\bleased\b|\bdevice\s+(?:time|minutes)\b",
     "how a machine was obtained is not a measurement: name the machine (\"on an H200\")"),
    (r"\bissues?[ -]#?\d|\(#\d+\)|\bthe\s+(?:regime\s+|signal\s+|next\s+)?issue(?:'s)?\b|\bitem\s+\d+\s+of\s+the\b",
     "tracker numbers mean nothing to a reader of the docs: say what the work or the requirement is"),
    (r"\bhelpers?\b|\bsub-?agents?\b|\breviewers?\b|\bthe\s+review\b",
     "who did or checked the work is not what the work shows"),
]
_COMPILED = [(re.compile(pattern, re.IGNORECASE), reason) for pattern, reason in PATTERNS]

# Text a person or a script writes as prose. Left out: JSON and round lines (program output of the measurements, kept
# as measured) and images. `grail compare` writes docs/results/**/report.md from its runs; those reports are scanned
# too, as they hold no such words (the code that renders them writes none).
SUFFIXES = {".md", ".py", ".sh", ".yml", ".yaml", ".txt"}
ROOTS = ("docs", "perf", "results")
FILES = ("README.md", "mkdocs.yml")
# results/ holds measurement output; only its prose (the README) is text a person writes
DATA_ROOTS = {"results": {".md"}}


def process_words(text: str) -> list[tuple[int, str, str]]:
    """Every match in text: (line number, the words matched, the pattern's reason)."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, reason in _COMPILED:
            for match in pattern.finditer(line):
                found.append((number, match.group(0), reason))
    return found


def scan(repo: Path) -> dict[str, list[tuple[int, str, str]]]:
    """process_words over every text file of docs/, perf/, results/ (its prose only), README.md and mkdocs.yml."""
    paths = [repo / name for name in FILES if (repo / name).is_file()]
    for root in ROOTS:
        suffixes = DATA_ROOTS.get(root, SUFFIXES)
        paths += [p for p in sorted((repo / root).rglob("*")) if p.is_file() and p.suffix in suffixes
                  and "__pycache__" not in p.parts]
    hits = {}
    for path in paths:
        found = process_words(path.read_text(encoding="utf-8", errors="replace"))
        if found:
            hits[path.relative_to(repo).as_posix()] = found
    return hits


def test_no_words_of_how_the_work_was_organised():
    hits = scan(REPO)
    lines = [f"{path}:{number}: {words!r}: {reason}" for path, found in hits.items() for number, words, reason in found]
    assert not lines, "words of how the work was organised (rephrase):\n" + "\n".join(lines[:60])


def test_the_check_fails_on_planted_words(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "perf").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "README.md").write_text("# a project\n\nNothing to see.\n")
    (tmp_path / "docs" / "plan.md").write_text(
        "Written in session 13, before any step.\n"
        "The budget is a person's decision.\n"
        "On a lent H200 (a 15-minute lease).\n"
        "The next result of issue 45.\n"
        "A helper ran the screen.\n")
    (tmp_path / "perf" / "job.sh").write_text("# issue 45's screen\n")
    (tmp_path / "results" / "rounds.txt").write_text("session 3\n")     # program output: not scanned
    hits = scan(tmp_path)
    assert set(hits) == {"docs/plan.md", "perf/job.sh"}
    assert [number for number, _, _ in hits["docs/plan.md"]] == [1, 2, 3, 3, 4, 5]
    # the same facts, said of the software, pass
    assert not process_words("Written 2026-11-30 02:00 UTC, before any step.\nOn an H200.\n"
                             "A pytest run builds it once. Each person's count in the chain task.\n")
