"""No plan is committed whose rule cannot answer: every results page that declares a decision rule carries it in a
`<!-- plan-rule: ... -->` line (test, seed count, comparisons under Holm, threshold), and the smallest p that test can
give at that seed count, after Holm, is below the threshold (grail.analysis.compare.stats.rule_attainable)."""

import re
from pathlib import Path

import pytest

from grail.analysis.compare.stats import rule_attainable, smallest_p

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
RULE = re.compile(r"<!-- plan-rule:((?:\s+\w+=\"[^\"]*\")+)\s*-->")
ARG = re.compile(r"(\w+)=\"([^\"]*)\"")


def declared_rules() -> list[tuple[str, dict[str, str]]]:
    found = []
    for page in sorted(RESULTS.rglob("*.md")):
        for match in RULE.finditer(page.read_text()):
            found.append((page.relative_to(RESULTS).as_posix(), dict(ARG.findall(match.group(1)))))
    return found


def test_the_credit_pays_plan_declares_its_rule():
    assert any(page == "credit-pays-plan.md" for page, _ in declared_rules())


@pytest.mark.parametrize(("page", "rule"), declared_rules(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_declared_rule_can_be_met_at_its_seed_count(page, rule):
    assert set(rule) == {"test", "seeds", "comparisons", "alpha"}, f"{page}: {rule}"
    seeds, comparisons, alpha = int(rule["seeds"]), int(rule["comparisons"]), float(rule["alpha"])
    floor = comparisons * smallest_p(rule["test"], seeds)
    assert rule_attainable(rule["test"], seeds, comparisons, alpha), (
        f"{page}: a {rule['test']} test over {seeds} seeds with Holm over {comparisons} comparisons cannot give a p "
        f"below {floor:.3g}, so its rule (p < {alpha}) can never be met; add seeds or choose another test")
