"""The CPU-precision perf scripts run end to end: perf/benchmarks/step_phases.py in --smoke mode (every precision on the
tiny model), perf/experiments/precision_fidelity.py and perf/experiments/oar_p_spans.py on the shared warm start."""

import json

import pytest


def test_step_phases_smoke_times_every_phase_and_counts_the_flops(tmp_path, capsys):
    """Every precision on the tiny model (fp32, bf16 generating from bf16 weights, bf16 generating under autocast):
    each phase timed in every timed step, the counted step's FLOPs where the model computes (generation, loss forward,
    backward), and the ratios printed from the same run."""
    import step_phases

    out = step_phases.main(["--smoke", "--precisions", "fp32,bf16,bf16-autocast-generation",
                            "--json", str(tmp_path / "phases.json")])
    assert json.loads((tmp_path / "phases.json").read_text()) == out
    assert not (tmp_path / "phases.json.partial").exists()  # kept only while the run goes on
    assert set(out["results"]) == {f"{method}/{precision}" for method in ("none", "grail")
                                   for precision in ("fp32", "bf16", "bf16-autocast-generation")}
    for key, result in out["results"].items():
        assert result["generation_from_bf16_weights"] is key.endswith("/bf16"), key
        phases = result["phases"]
        assert set(phases) == set(step_phases.PHASES)
        assert all(phase["gflop"] > 0 for name, phase in phases.items() if name in ("generation", "loss forward",
                                                                                   "backward")), key
        total = sum(phase["seconds_median"] for phase in phases.values())
        assert total == pytest.approx(result["step_s_median"], rel=1e-6)  # "other" is the remainder
        assert result["parameter_dtypes"] == ["torch.float32"]  # bf16 too: fp32 master weights
    peak = out["matmul_peak_gflops"]
    assert peak["fp32"] > 0 and peak["bf16"] > 0
    assert set(out["ratios"]) == {"none bf16/fp32", "grail bf16/fp32", "none bf16-autocast-generation/fp32",
                                  "grail bf16-autocast-generation/fp32", "grail/none fp32", "grail/none bf16",
                                  "grail/none bf16-autocast-generation"}
    with pytest.raises(SystemExit):
        step_phases.parse_args(["--precisions", "fp32,bf32"])
    assert "'bf32' is not one of fp32, bf16, bf16-autocast-generation" in capsys.readouterr().err



def test_step_phases_takes_a_methods_own_fields_in_the_arm_syntax(tmp_path):
    """METHOD@field=value: the method with its own option set (here the amortized OAR-P's exact rows on every
    second call), keyed and compared with GRPO under its label."""
    import step_phases

    arm = "oar_p_amortized@oar_p_amortized_exact_every=2"
    out = step_phases.main(["--smoke", "--methods", f"none,{arm}", "--precisions", "fp32"])
    assert set(out["results"]) == {"none/fp32", f"{arm}/fp32"}
    assert out["results"][f"{arm}/fp32"]["phases"]["probe"]["seconds_median"] > 0
    assert set(out["ratios"]) == {f"{arm}/none fp32"}

@pytest.mark.slow  # a perf script on real sampling; the fidelity functions' own tests are in the default run
def test_precision_fidelity_compares_each_method_on_the_same_rollouts(warm_cache, tmp_path, capsys):
    import precision_fidelity

    out = precision_fidelity.main(["--preset", "tiny-cpu", "--model", str(warm_cache[1]), "--groups", "2",
                                   "--methods", "none,oar_g", "--out", str(tmp_path / "f.json")])
    assert json.loads((tmp_path / "f.json").read_text()) == out
    assert out["mixed_groups"] == 2 and all(len(r) == out["group_size"] for r in out["rewards"])
    uniform, probed = out["methods"]["none"], out["methods"]["oar_g"]
    assert uniform["rows"] == 0 and uniform["sign_changed_share"] == 0.0  # w = 1 on both sides: nothing to rank
    assert probed["bf16_seconds"] > 0 and probed["max_abs_weight_diff"] > 0  # bf16 really ran: its rounding shows


def test_oar_p_spans_compares_each_k_with_token_level_oar_p_on_the_same_rollouts(warm_cache, tmp_path, capsys):
    import oar_p_spans

    out = oar_p_spans.main(["--preset", "tiny-cpu", "--model", str(warm_cache[1]), "--groups", "1", "--spans", "2,4",
                            "--out", str(tmp_path / "s.json")])
    assert json.loads((tmp_path / "s.json").read_text()) == out
    assert out["mixed_groups"] == 1 and set(out["spans"]) == {"2", "4"}
    for k in ("2", "4"):
        result = out["spans"][k]
        assert result["rows"] > 0 and -1.0 <= result["spearman_median"] <= 1.0 and result["seconds"] > 0
    assert out["spans"]["4"]["max_abs_weight_diff"] > 0  # spans of 4 really differ from token-level OAR-P
    with pytest.raises(SystemExit):
        oar_p_spans.main(["--spans", "1"])
    assert "each k must be >= 2" in capsys.readouterr().err


def test_saliency_auroc_bf16_runs_each_probe_as_a_bf16_cpu_run_does():
    """--bf16: every method's probe under CPU bf16 autocast but those a bf16 run keeps in fp32 (FP32_PROBES), each
    result in the order the methods were asked for ('@token' rows beside their method); without it, no autocast."""
    import torch
    from saliency_auroc import in_precision

    from grail.analysis.saliency.quality import SaliencyQualityOptions
    from grail.models.precision import FP32_PROBES

    seen = {}

    def score(names, options):  # as quality.saliency_auroc: a method read at its token must be among the methods
        assert set(options.read_at_token) <= set(names), (names, options.read_at_token)
        for name in names:
            seen[name] = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        return {out: out for name in names
                for out in ((name, f"{name}@token") if name in options.read_at_token else (name,))}

    methods = ["oar_g", "grail", "oar_p"]
    options = SaliencyQualityOptions(read_at_token=("grail",))
    assert "oar_g" in FP32_PROBES and not {"grail", "oar_p"} & FP32_PROBES
    assert list(in_precision(score, methods, True, options)) == ["oar_g", "grail", "grail@token", "oar_p"]
    assert seen == {"oar_g": False, "grail": True, "oar_p": True}
    seen.clear()
    assert list(in_precision(score, methods, False, options)) == ["oar_g", "grail", "grail@token", "oar_p"]
    assert seen == {"oar_g": False, "grail": False, "oar_p": False}
