"""perf/benchmarks/step_overhead.py runs end to end in --smoke mode, on a warm start that closes its boxes, and prints
one JSON object with every field; the JSON shows that GRAIL's probe really ran. The other perf/ scripts run in their
smoke modes too."""

import json
import os
from pathlib import Path

import credit_screen
import gpu_check
import gpu_curves
import grader_fuzz
import oar_p_sharing
import position_claim
import pytest
import shared_prefill_eval
import step_memory
import step_overhead
import tiny_warmstart_paths

BENCHMARKS = Path(__file__).resolve().parents[1] / "perf" / "benchmarks"
PER_METHOD_KEYS = {"median_step_s", "step_s", "time_ratio_to_grpo", "peak_mem_increase_mb_median",
                   "peak_mem_increase_mb", "process_peak_mem_mb_max", "mem_ratio_to_grpo", "weights_seconds_median",
                   "probe_floor_s_median", "probe_floor_rows_mean", "probe_to_floor",
                   "rollout_s_median", "optimizer_s_median", "mean_completion_tokens", "rows_with_box_frac",
                   "probed_rows_frac",
                   "fused_frac", "mean_tokens_before_box", "reward_mean", "ess_ratio_mean"}
# 32 tokens hold a 2-step trace and its box (about 25), which --smoke's 16 do not; 4 groups of 8 completions.
CLOSES_BOXES = ["--completion-tokens", "32", "--rows", "32", "--generations", "8"]


def test_step_overhead_smoke_prints_one_json_object(warm_cache, capsys):
    """On the session's shared warm start (conftest.py: sampled accuracy well inside (0, 1), so groups of 8 have
    mixed rewards and GRAIL probes them)."""
    cache, checkpoint = warm_cache
    steps = json.loads((checkpoint / "warmstart.json").read_text())["steps"]
    argv = ["--smoke", *CLOSES_BOXES, "--warmstart-steps", str(steps), "--cache-dir", str(cache)]
    assert step_overhead.main(argv) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)  # stdout holds the JSON object and nothing else
    assert "warm start: reusing cached checkpoint" in captured.err  # the given cache, not the user's
    config = result["config"]
    assert (config["completion_tokens"], config["rows"], config["generations"], config["rounds"]) == (32, 32, 8, 1)
    assert config["warmstart_steps"] == steps
    assert result["malloc_tuning"] is None  # main() in process leaves pytest's allocator alone, and says so:
    assert result["memory_measure"] in ("cpu_rss_peak_increase_sampled_1ms, default allocator: not a step's own memory",
                                        "cuda_max_allocated")
    assert set(result["methods"]) == {"none", "grail"}
    for method, row in result["methods"].items():
        assert set(row) == PER_METHOD_KEYS, method
        assert row["time_ratio_to_grpo"] > 0 and row["mem_ratio_to_grpo"] > 0
        assert len(row["step_s"]) == 1 and row["median_step_s"] > 0
        assert row["mean_completion_tokens"] == 32.0  # min_new_tokens forces the length
        assert row["rows_with_box_frac"] > 0.5, method  # the model closes its boxes
        assert 0 < row["reward_mean"] < 1, method  # some answers right, some wrong: groups with A != 0
    none, grail = result["methods"]["none"], result["methods"]["grail"]
    assert none["time_ratio_to_grpo"] == 1.0
    assert grail["fused_frac"] == 1.0
    # the weighting work ran: GRAIL probed rows and its weights are not uniform; GRPO probes nothing
    assert grail["probed_rows_frac"] > 0 and none["probed_rows_frac"] == 0
    assert grail["ess_ratio_mean"] < 1.0 and none["ess_ratio_mean"] == pytest.approx(1.0)
    assert 0 < grail["mean_tokens_before_box"] < 32
    # GRAIL's floor ran on its probed rows (an input-only backward of them), GRPO has none
    assert grail["probe_floor_s_median"] > 0 and 0 < grail["probe_floor_rows_mean"] <= 32
    assert grail["probe_to_floor"] == grail["weights_seconds_median"] / grail["probe_floor_s_median"]
    assert none["probe_floor_s_median"] is None and none["probe_to_floor"] is None
    assert [(t["method"], t["ratio"]) for t in result["targets"]] == [
        ("grail", "time_ratio_to_grpo"), ("grail", "probe_to_floor"), ("oar_g", "time_ratio_to_grpo"),
        ("oar_p", "time_ratio_to_grpo"), ("grail", "mem_ratio_to_grpo")]
    assert [t["met"] is None for t in result["targets"]] == [False, False, True, True, True]  # oar: not run;
    # memory: not judged with glibc as a user's run has it (freed pages hide a step's own memory)


def test_step_overhead_reuse_and_checkpointing_rows(warm_cache, capsys):
    """`--num-iterations 2 --checkpointing non_reentrant`: one timed step is a rollout and its two optimiser steps,
    GRAIL fuses under non-reentrant checkpointing on every pass, and grail_rollout computes its weights once."""
    cache, checkpoint = warm_cache
    steps = json.loads((checkpoint / "warmstart.json").read_text())["steps"]
    argv = ["--smoke", *CLOSES_BOXES, "--warmstart-steps", str(steps), "--cache-dir", str(cache),
            "--num-iterations", "2", "--checkpointing", "non_reentrant", "--methods", "none,grail,grail_rollout"]
    assert step_overhead.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["config"]["num_iterations"], result["config"]["checkpointing"]) == (2, "non_reentrant")
    grail, rollout = result["methods"]["grail"], result["methods"]["grail_rollout"]
    assert grail["fused_frac"] == 1.0 and rollout["fused_frac"] == 0.0
    assert grail["probed_rows_frac"] > 0 and rollout["probed_rows_frac"] > 0


def test_gpu_check_smoke_runs_every_method_on_the_cpu(capsys):
    """perf/benchmarks/gpu_check.py --smoke: the GPU script's code path on a tiny shape in fp32 (no GPU here): every
    method's loss step runs, fused paths are fused, and fused equals separate in fp32."""
    assert gpu_check.main(["--smoke", "--checkpointing", "non_reentrant"]) == 0
    result = json.loads(capsys.readouterr().out)
    (case,) = result["cases"]
    assert set(case["methods"]) == set(gpu_check.DEFAULT_METHODS)
    assert case["methods"]["grail"]["fused"] and not case["methods"]["grail_separate"]["fused"]
    assert all(row["median_step_s"] > 0 and row["tokens_per_s"] > 0 for row in case["methods"].values())
    assert case["fused_vs_separate"]["grail"]["max_abs_diff"] < 1e-4


def test_oar_p_memory_smoke_measures_each_chunk_size_in_its_own_process():
    """perf/benchmarks/oar_p_memory.py on a short row: one table row and one JSON record per chunk size, with the copies
    per chunk the bound allows and a measured peak (the figures themselves are the script's report, not checked
    here)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(BENCHMARKS / "oar_p_memory.py"), "--length", "64", "--chunks",
                          "80,400", "--stride", "8", "--hidden", "32", "--intermediate", "64"],
                         check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    rows = json.loads(out.strip().splitlines()[-1])
    assert [(r["chunk_tokens"], r["copies_per_chunk"], r["copies"]) for r in rows] == [(80, 1, 8), (400, 5, 8)]
    assert all(r["measured_bytes"] >= 0 and r["bound"]["total"] > 0 for r in rows)
    assert "| 400 | 5 |" in out


def test_grader_fuzz_smoke_grades_the_fuzz_items_through_both_paths(tmp_path, monkeypatch, capsys):
    """perf/benchmarks/grader_fuzz.py --smoke: 100 seeded fuzz items (the same on every run) through GradingPool and the
    training reward, in a temporary directory; the JSON counts every item once per path, and nothing was written."""
    assert grader_fuzz.fuzz_items(30, seed=3) == grader_fuzz.fuzz_items(30, seed=3) != grader_fuzz.fuzz_items(30)
    monkeypatch.chdir(tmp_path)
    assert grader_fuzz.main(["--smoke"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["items"] == 100 and result["files_written"] == [] and result["wrote_files"] is False
    assert os.listdir(tmp_path) == []  # it graded in a temporary directory of its own
    for path in ("eval", "reward"):
        row = result[path]
        assert sum(row["reasons"].values()) == 100 and row["items_per_s"] > 0, path
        assert row["reasons"].get("too_long", 0) > 0, path  # the power towers and factorials of the mix
    for reason in ("no_box", "empty_box", "too_long"):  # decided before any alarm: the same on both paths
        assert result["eval"]["reasons"].get(reason) == result["reward"]["reasons"].get(reason), reason
    slowest = result["reward"]["slowest"]
    assert slowest["seconds"] > 0 and slowest["reason"] in result["reward"]["reasons"]
    assert result["eval"]["workers"] == 2 and result["target"]["eval_items_per_s"] == 50


def test_step_memory_tags_every_phase_of_a_step_and_finds_the_peak(warm_cache, capsys):
    """perf/benchmarks/step_memory.py on one trainer: RSS samples fall in generation, the probe, the loss forward, the
    backward and the optimiser; the step's peak is the highest sample and its phase is named."""
    cache, checkpoint = warm_cache
    steps = json.loads((checkpoint / "warmstart.json").read_text())["steps"]
    argv = ["--smoke", *CLOSES_BOXES, "--warmstart-steps", str(steps), "--cache-dir", str(cache), "--method", "grail"]
    assert step_memory.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    (step,) = result["steps"]
    phases = step["phases"]
    for name in ("generation", "probe", "loss forward", "backward", "optimizer"):
        assert phases[name]["samples"] > 0 and phases[name]["seconds"] > 0, (name, phases[name])
    assert result["last_step_metrics"]["weights/probed_rows"] > 0  # the coin's mixed groups were probed
    peaks = [p["peak_mb"] for p in phases.values() if p["samples"]]
    assert step["peak_mb"] == max(peaks) and phases[step["peak_phase"]]["peak_mb"] == step["peak_mb"]
    assert abs(sum(p["seconds"] for p in phases.values()) - step["seconds"]) < 1e-9


def test_position_claim_reads_a_u_and_its_depth_and_refuses_an_empty_bin():
    claim = position_claim
    counts = [5] * 10
    u = claim.u_shape([1.6, 1.0, 0.9, 0.8, 0.8, 0.8, 0.8, 1.0, 1.1, 1.4], counts)
    assert u["u_shape"] is True and abs(u["depth"] - 0.6) < 1e-9
    rising = claim.u_shape([0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4], counts)
    assert rising["u_shape"] is False and rising["depth"] < 0  # recency alone is not a U
    assert claim.u_shape([1.0] * 10, [5] * 9 + [0])["u_shape"] is None


def _gpu_case(shape: str, length: int, seconds: dict[str, float], rows: int = 4) -> str:
    base = seconds["none"]
    methods = {m: {"median_step_s": s, "time_ratio_to_grpo": s / base, "peak_mem_gb": 1.0, "mem_ratio_to_grpo": 1.0}
               for m, s in seconds.items()}
    return json.dumps({"shape": shape, "device": "test", "length": length, "checkpointing": "off", "rows": rows,
                       "methods": methods})


def test_gpu_curves_merges_files_by_case_and_fits_the_growth_of_the_extra_time(tmp_path):
    """perf/benchmarks/gpu_curves.py: ratios stay inside their case (OAR-P's file brings its own GRPO), the extra
    seconds per completion are (step - GRPO's) / rows, and an extra time made to grow as T^2 (OAR-P) or T (GRAIL) is
    fitted so."""
    main, slow = tmp_path / "main.jsonl", tmp_path / "oar_p.jsonl"
    main.write_text("\n".join(_gpu_case("m", t, {"none": 1.0, "grail_fused": 1.0 + 4e-4 * t}) for t in (256, 1024))
                    + "\n")
    slow.write_text("\n".join(_gpu_case("m", t, {"none": 2.0, "oar_p": 2.0 + 4e-6 * t * t}) for t in (256, 512, 1024)))
    result = gpu_curves.assemble(gpu_curves.read_cases([str(main), str(slow)]))
    curves = result["curves"]["m checkpointing off"]
    assert [p["tokens"] for p in curves["oar_p"]["points"]] == [256, 512, 1024]
    assert curves["oar_p"]["points"][2]["time_ratio_to_grpo"] == pytest.approx((2.0 + 4e-6 * 1024**2) / 2.0)
    assert curves["grail"]["points"][1]["extra_s_per_completion"] == pytest.approx(4e-4 * 1024 / 4)
    assert curves["oar_p"]["growth_exponent"] == pytest.approx(2.0)
    assert curves["grail"]["growth_exponent"] == pytest.approx(1.0)  # read as gpu_check names it now
    goals = {g["goal"]: g for g in result["goals"]["m checkpointing off"]}
    assert goals["oar_p loss step / GRPO's at T = 1024"]["met"] is False  # 3.1x
    assert goals["grail (fused) loss step / GRPO's, every T"]["measured"] == {256: pytest.approx(1.1024),
                                                                             1024: pytest.approx(1.4096)}


def test_gpu_curves_refuses_a_case_twice_and_a_file_that_is_not_gpu_check_s(tmp_path):
    twice = tmp_path / "twice.jsonl"
    twice.write_text(_gpu_case("m", 256, {"none": 1.0, "oar_p": 3.0}) + "\n" + _gpu_case("m", 256, {"none": 1.0,
                                                                                                    "oar_p": 4.0}))
    with pytest.raises(SystemExit, match="oar_p at T = 256 is in two cases"):
        gpu_curves.assemble(gpu_curves.read_cases([str(twice)]))
    other = tmp_path / "other.jsonl"
    other.write_text('{"benchmark": "step_overhead"}\n')
    with pytest.raises(SystemExit, match="other.jsonl:1: not a gpu_check case"):
        gpu_curves.read_cases([str(other)])


def test_gpu_check_keeps_each_case_for_gpu_curves(tmp_path, capsys):
    """gpu_check --jsonl writes each case as it is measured; gpu_curves reads it and draws the shape's plot."""
    kept = tmp_path / "cases.jsonl"
    assert gpu_check.main(["--smoke", "--checkpointing", "off", "--methods", "grail", "--jsonl",
                           str(kept)]) == 0
    capsys.readouterr()
    assert gpu_curves.main([str(kept), "--plot-dir", str(tmp_path / "plots")]) == 0
    result = json.loads(capsys.readouterr().out)
    (curves,) = result["curves"].values()
    assert set(curves) == {"none", "grail"} and curves["grail"]["growth_exponent"] is None  # one T
    assert (tmp_path / "plots" / "smoke-checkpointing-off.png").stat().st_size > 0


def test_shared_prefill_eval_times_both_ways_and_finds_the_same_samples(warm_cache, capsys):
    cache, checkpoint = warm_cache
    steps = json.loads((checkpoint / "warmstart.json").read_text())["steps"]
    script = shared_prefill_eval
    result = script.main(["--preset", "tiny-cpu", "--problems", "4", "--rounds", "2", "--set", f"cache_dir={cache}",
                          "--set", f"warmstart_steps={steps}"])
    assert json.loads(capsys.readouterr().out) == result  # stdout holds the JSON object
    assert result["same_samples"] is True and result["n"] == 4 and result["problems"] == 4
    assert all(len(times) == 2 and min(times) > 0 for times in result["seconds"].values())
    assert result["time_ratio_shared_to_plain"] == result["median_s"]["shared"] / result["median_s"]["plain"]


def test_tiny_warmstart_paths_trains_both_ways_on_the_same_traces(capsys):
    """perf/benchmarks/tiny_warmstart_paths.py for 2 steps: TRL's tokenised traces are the loop's (prompt, solution,
    EOS; labels on solution + EOS only), each way's model has a lower completion loss than the untrained one, and
    the figures printed are the ones derived from the seconds."""
    result = tiny_warmstart_paths.main(["--steps", "2", "--rounds", "1", "--untimed-steps", "1",
                                        "--demo-seconds", "100"])
    assert json.loads(capsys.readouterr().out) == result  # stdout holds the JSON object (not the Trainer's metrics)
    assert result["same_layout"] is True and result["same_checkpoint_files"] is True
    warm = result["warm_start"]
    assert (warm["steps"], warm["batch_size"], warm["lr"], warm["warmup_steps"]) == (2, 64, 3e-3, 30)  # the demo's
    losses = result["completion_loss"]
    # 2 steps: the loop at 1/30 and 2/30 of the peak lr, TRL at 0 and 1/30 (the warm-up departure), so TRL drops less
    assert losses["loop"] < losses["sft_trainer"] < losses["untrained"] - 0.1
    assert all(len(times) == 1 and times[0] > 0 for times in result["seconds"].values())
    median = result["median_s"]
    assert result["time_ratio_sft_trainer_to_loop"] == median["sft_trainer"] / median["loop"]
    assert result["extra_share_of_demo"] == (median["sft_trainer"] - median["loop"]) / 100
    assert result["within_issue_bar"] == (result["extra_share_of_demo"] <= 0.10)


def test_oar_p_sharing_times_both_ways_on_the_same_rows(capsys):
    """perf/benchmarks/oar_p_sharing.py on the tiny Gemma 3 (window 32) in float64, rows of 48-80 tokens and chunks of
    300 tokens (a row's copies over several chunks): both ways give the same importances, the shared way runs fewer
    positions, and the printed figures are the ones derived from the seconds."""
    result = oar_p_sharing.main(["--model", "tiny-gemma", "--rows", "3", "--prompt-tokens", "8", "--min-completion",
                                 "40", "--max-completion", "72", "--chunk-tokens", "300", "--rounds", "2", "--dtype",
                                 "float64"])
    assert json.loads(capsys.readouterr().out) == result  # stdout holds the JSON object
    assert result["row_tokens"] == [48, 64, 80] and result["sliding_window"] < min(result["row_tokens"])
    assert result["sharing_applies"] is True and result["finite"] is True and result["max_rel_diff"] < 1e-5
    work = result["work_per_call"]
    assert work["shared"]["positions"] < work["whole"]["positions"] and work["whole"]["forwards"] > 3
    assert all(len(times) == 2 and min(times) > 0 for times in result["seconds"].values())
    median = result["median_s"]
    assert result["time_ratio_whole_to_shared"] == median["whole"] / median["shared"]
    assert result["min_s"] == {name: min(times) for name, times in result["seconds"].items()}


def test_oar_p_sharing_names_the_fix_for_bad_arguments_and_an_unfetched_model(cache_dir, capsys):
    with pytest.raises(SystemExit):
        oar_p_sharing.main(["--min-completion", "4", "--answer-tokens", "4"])
    assert "raise --min-completion or lower --answer-tokens" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="grail models fetch gemma3-270m"):  # GRAIL_CACHE: an empty folder
        oar_p_sharing.main(["--model", "gemma3-270m"])


def test_perf_loads_shared_code_one_way_and_never_the_tests():
    """A script of perf/ imports the package or its own folder's modules (harness.py): no sys.path edits, no loading
    by file path, nothing from tests/ and no hypothesis (whose internals grader_fuzz once patched)."""
    import ast

    found = []
    for path in BENCHMARKS.parent.glob("*/*.py"):
        source = path.read_text()
        found += [(path.name, call) for call in ("sys.path.insert(", "sys.path.append(", "spec_from_file_location(")
                  if call in source]
        for node in ast.walk(ast.parse(source)):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [(path.name, name) for name in names if name.split(".")[0] in ("tests", "hypothesis", "conftest")
                      or name.startswith("test_")]
    assert not found, found


def test_regime_steps_times_both_regimes_at_the_same_batch(tmp_path):
    """The two regimes differ in task, prompt and model, never in the batch a step trains on."""
    import regime_steps

    configs = {name: regime_steps._config(name, "none", steps=3, seed=0, out=tmp_path / name)
               for name in regime_steps.REGIMES}
    few, warm = configs["few_shot"], configs["warm_start"]
    assert (few.task_style, warm.task_style) == ("words", "chains")
    assert warm.model_name_or_path == "sft:smollm2-135m" and few.model_name_or_path == "smollm2-135m"
    for cfg in configs.values():
        assert cfg.max_steps == 3 and cfg.token_weighting == "none"
        assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps, cfg.num_generations) == (8, 1, 8)
        assert cfg.shared_prompt and cfg.learning_rate == regime_steps.SAME_BATCH["learning_rate"]


def test_credit_screen_scores_every_method_on_each_label_set_and_times_its_probe(warm_cache, tmp_path, capsys):
    """perf/experiments/credit_screen.py on the warm-started tiny model, one small group per counterbalanced set and
    a two-sample chain set (which a model never trained on chains cannot label: reported as skipped, not fatal)."""
    _, checkpoint = warm_cache
    out = tmp_path / "screen.json"
    methods = ["grail", "random", "attr_patch", "contrastive", "grail_over_surprise"]
    from grail import unregister_method
    from grail.methods.table import METHODS

    try:
        assert credit_screen.main(["--model", str(checkpoint), "--methods", ",".join(methods), "--rows", "1",
                                   "--words", "2", "--samples", "2", "--max-new-tokens", "24", "--grail-at-token",
                                   "--json", str(out)]) == 0
    finally:  # the script registers the candidates in this process's method table: leave it as the other tests see it
        for name in credit_screen.CANDIDATES:
            if name in METHODS:
                unregister_method(name)
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    sets = result["label_sets"]
    assert result["finished"] and list(sets) == list(credit_screen.LABEL_SETS)
    for name in ("counterbalanced_filler", "counterbalanced_format"):
        assert sets[name]["skipped"] is None and list(sets[name]["methods"]) == [*methods, "grail@token"]
        # the same probe read one position later: another signal (GRAIL's shift), timed as GRAIL's
        at_token, grail = sets[name]["methods"]["grail@token"], sets[name]["methods"]["grail"]
        assert at_token["seconds_per_row"] == grail["seconds_per_row"] and at_token["auroc"] != grail["auroc"]
        for method, cell in sets[name]["methods"].items():
            assert 0 <= cell["auroc"] <= 1 and cell["ci_low"] <= cell["auroc"] <= cell["ci_high"], (name, method)
            assert 0 < cell["critical_entered"] <= cell["critical_labelled"], (name, method)
            assert cell["probed_rows"] > 0 and cell["seconds_per_row"] > 0, (name, method)
            assert f"| {name} | {method} | {cell['auroc']:.3f}" in printed
        # grail and the random control share GRAIL's probe: timed once, the same figure
        assert sets[name]["methods"]["random"]["seconds_per_row"] == sets[name]["methods"]["grail"]["seconds_per_row"]
        counts = sets[name]["methods"]["contrastive"]["counts"]
        assert counts["rows"] == sets[name]["methods"]["contrastive"]["probed_rows"] > 0
        assert counts["contrasted"] + counts["fallback"] + counts["no_box"] == counts["rows"]
    chain = sets["chain_rollouts"]
    assert chain["skipped"] or list(chain["methods"]) == [*methods, "grail@token"]
    # --render prints the same rows again from the file, running nothing
    assert credit_screen.main(["--render", str(out)]) == 0
    again = capsys.readouterr().out
    assert f"{out}: model {checkpoint}, seed 0, --rows 1, --fixed-group row" in again
    for name in ("counterbalanced_filler", "counterbalanced_format"):
        cell = sets[name]["methods"]["grail@token"]
        # --rows 1: one group, so the bootstrap over groups has nothing to resample and no interval is written
        assert f"| {name} | grail@token | {cell['auroc']:.3f} (one group) |" in again
    # --pivot: one row per method, a column per label set, in LABEL_SETS' order
    assert credit_screen.main(["--render", str(out), "--pivot"]) == 0
    table = capsys.readouterr().out
    filler, fmt = (sets[n]["methods"]["grail"] for n in ("counterbalanced_filler", "counterbalanced_format"))
    assert f"| grail | {filler['auroc']:.2f} (one group) | {fmt['auroc']:.2f} (one group) |" in table
    assert "[" not in table.split("\n\n")[0]  # no interval anywhere in a one-group table
    assert credit_screen.main(["--methods", "nope"]) == 2 and "not a method with a probe" in capsys.readouterr().err


def test_credit_screen_writes_a_cell_with_its_interval_only_when_groups_were_resampled():
    """credit_screen.fixed_cell / one_group: an interval for several groups, none for one, "no pair" when nothing
    entered."""
    cell = {"auroc": 0.7123, "ci_low": 0.64, "ci_high": 0.81, "critical_entered": 5, "contrast_entered": 7}
    assert credit_screen.fixed_cell(cell, False, 2) == "0.71 [0.64, 0.81]"
    assert credit_screen.fixed_cell(cell, True, 3) == "0.712 (one group)"
    assert credit_screen.fixed_cell({**cell, "contrast_entered": 0}, False, 2) == "no pair"
    assert credit_screen.one_group({"fixed_group": "all", "rows": 8})
    assert credit_screen.one_group({"fixed_group": "row", "rows": 1})
    assert not credit_screen.one_group({"fixed_group": "row", "rows": 3})
    # cells that say how many units their bootstrap resampled (a pooled group of 8 prompts has 8)
    assert not credit_screen.one_group({"fixed_group": "all", "rows": 8}, {**cell, "units": 8})
    assert credit_screen.one_group({"fixed_group": "row", "rows": 3}, {**cell, "units": 1})


def test_position_signals_scores_every_position_only_signal_by_both_estimators(tmp_path):
    """The tiny tokenizer, 3 groups: on a counterbalanced set the position-fixed AUROC of every position-only signal
    is exactly 0.5; the distance-matched one moves on at least one (the prior over positions), as the credit page
    says; shares are counted against the labelled tokens."""
    import position_signals

    out = position_signals.main(["--rows", "3", "--bootstrap", "50", "--label-sets",
                                 "counterbalanced_filler,natural_contrast", "--json", str(tmp_path / "p.json")])
    cells = out["sets"]["counterbalanced_filler"]
    assert json.loads((tmp_path / "p.json").read_text())["sets"]["counterbalanced_filler"] == cells
    assert {c["position_fixed"]["auroc"] for c in cells.values()} == {0.5}
    assert cells["P(critical | position)"]["distance_matched"]["auroc"] > 0.55
    entered, labelled = map(int, cells["increasing"]["position_fixed"]["critical_entered"].split("/"))
    assert 0 < entered <= labelled
    with pytest.raises(SystemExit):
        position_signals.main(["--label-sets", "no_such_set"])

