"""perf/experiments/greedy_flip_null.py: the random update has, tensor by tensor, the norm it is asked for and is
drawn again the same from its seed; on a one-run comparison of the tiny model, the start moved by nothing is
evaluated to the start's own greedy verdicts (no flip), and a moved start's rows count every problem once."""

import json

import pytest
import torch
from greedy_flip_null import null_flips, random_update

from comparing import compare_argv
from grail.cli import main


def _pair():
    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    final = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    final.load_state_dict(start.state_dict())
    with torch.no_grad():
        final[0].weight.add_(0.5)  # the run moved this tensor by 0.5 in each of its 12 entries: norm √3
    return start, final


def test_each_tensor_moves_by_the_asked_multiple_of_the_runs_update_norm():
    start, final = _pair()
    before = {k: v.clone() for k, v in start.state_dict().items()}
    random_update(start, final, 4.0, seed=3)
    moved = {k: v - before[k] for k, v in start.state_dict().items()}
    assert torch.linalg.vector_norm(moved["0.weight"]).item() == pytest.approx(4.0 * 12 ** 0.5 * 0.5, rel=1e-5)
    assert all(torch.count_nonzero(moved[k]) == 0 for k in ("0.bias", "1.weight", "1.bias"))  # the run left them
    again, final = _pair()
    random_update(again, final, 4.0, seed=3)
    assert torch.equal(again[0].weight, start[0].weight)
    other, final = _pair()
    random_update(other, final, 4.0, seed=4)
    assert not torch.equal(other[0].weight, start[0].weight)


@pytest.mark.filterwarnings("ignore")
def test_a_start_moved_by_nothing_keeps_its_greedy_verdicts(tmp_path, warm_cache):
    cache, _ = warm_cache
    out = tmp_path / "cmp"
    assert main(compare_argv(cache, out, "none", "1", "--auroc-rows", "0")) == 0
    result = null_flips(out, "none", [0], [0.0, 100.0], noise_seed=0)
    assert result["null"]["0.0"]["total_flips"] == 0  # the start re-evaluated as the comparison evaluated it
    problems = json.loads((out / "before_rl.json").read_text())
    (start,) = problems["starts"].values()
    total = len(start["evaluations"]["greedy"][0]["problem_ids"])
    for entry in (result["run"], result["null"]["100.0"]):
        assert sum(r["problems"] for r in entry["rows"]) == total
        assert entry["total_flips"] == sum(r["gained"] + r["lost"] for r in entry["rows"])
    with pytest.raises(SystemExit, match="not an arm"):
        null_flips(out, "grail", [0], [1.0], noise_seed=0)
