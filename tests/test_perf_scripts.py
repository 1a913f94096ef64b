"""benchmarks/step_overhead.py runs end to end in --smoke mode and prints one JSON object with every field."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "step_overhead.py"
PER_METHOD_KEYS = {"median_step_s", "step_s", "time_ratio_to_grpo", "peak_mem_increase_mb_median",
                   "peak_mem_increase_mb", "peak_mem_mb_max", "mem_ratio_to_grpo", "weights_seconds_median",
                   "rollout_s_median", "mean_completion_tokens", "rows_with_box_frac", "probed_rows_frac",
                   "fused_frac", "mean_tokens_before_box", "reward_mean"}


def _load_script():
    spec = importlib.util.spec_from_file_location("step_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_overhead_smoke_prints_one_json_object(cache_dir, capsys):
    """A 2-step warm start in an empty cache (no box in any completion: the probe is skipped, as the JSON says)."""
    step_overhead = _load_script()
    assert step_overhead.main(["--smoke", "--cache-dir", str(cache_dir)]) == 0
    result = json.loads(capsys.readouterr().out)  # stdout holds the JSON object and nothing else
    assert result["config"]["completion_tokens"] == 16 and result["config"]["rounds"] == 1
    assert result["memory_measure"] in ("cpu_rss_peak_increase_sampled_1ms", "cuda_max_allocated")
    assert result["malloc_tuning"] is None  # main() in process leaves pytest's allocator alone
    assert set(result["methods"]) == {"none", "grail"}
    for method, row in result["methods"].items():
        assert set(row) == PER_METHOD_KEYS, method
        assert row["time_ratio_to_grpo"] > 0 and row["mem_ratio_to_grpo"] > 0
        assert len(row["step_s"]) == 1 and row["median_step_s"] > 0
        assert row["mean_completion_tokens"] == 16.0  # min_new_tokens forces the length
        assert row["rows_with_box_frac"] == pytest.approx(0.0, abs=0.25)  # a 2-step model rarely closes a box
    assert result["methods"]["none"]["time_ratio_to_grpo"] == 1.0
    assert result["methods"]["grail"]["fused_frac"] == 1.0
    assert [(t["method"], t["ratio"]) for t in result["targets"]] == [
        ("grail", "time_ratio_to_grpo"), ("grail", "mem_ratio_to_grpo"), ("oar_g", "time_ratio_to_grpo"),
        ("oar_p", "time_ratio_to_grpo")]
    assert [t["met"] is None for t in result["targets"]] == [False, False, True, True]  # not run in smoke mode
    assert any(cache_dir.glob("tiny-warmstart-*"))  # the warm start went to the test's cache, not the user's
