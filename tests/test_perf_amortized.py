"""perf/experiments/oar_p_amortized_fidelity.py on the tiny model's warm start: its features are the method's own, the
fit is scored at each reachable call count on held-out rows, and a rerun from its cache computes nothing again and
gives the same figures, a larger --groups extends it; perf/experiments/oar_p_amortized_auroc.py hands a fitted
predictor to the AUROC and scores every row by prediction."""

import json
from dataclasses import replace

import pytest
import torch


def test_a_variants_features_are_the_methods_own_at_that_projection(warm_cache):
    """The script projects the full-width features afterwards; that must be what `token_features` computes with the
    narrower `oar_p_amortized_features` (the same fixed projection, then the same scalar columns)."""
    from dataclasses import replace

    from oar_p_amortized_fidelity import variant_features
    from transformers import AutoModelForCausalLM

    from grail.methods.signals import oar_p_amortized as amortized
    from grail.methods.spec import ProbeBatch
    from grail.methods.table import METHODS
    from grail.options.choices import WeightingOptions

    model = AutoModelForCausalLM.from_pretrained(warm_cache[1], dtype=torch.float32)
    width = model.config.hidden_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (3, 14), generator=g)
    attention = torch.ones_like(ids)
    attention[0, :2] = 0  # a left-padded prompt
    scored = torch.zeros(3, 6, dtype=torch.bool)
    scored[:, 1:4] = True
    rows = ProbeBatch(ids, attention, scored.clone(), scored)
    base = WeightingOptions(token_weighting="oar_p_amortized",
                            method_options=METHODS["oar_p_amortized"].resolve_options({}))

    def features(f):
        return amortized.token_features(model, rows, replace(base, method_options={**base.method_options,
                                                                                  amortized.FEATURES: f}))

    full = features(1 << 30)
    assert full.shape[-1] == width + amortized.SCALARS
    narrow = width // 4
    torch.testing.assert_close(variant_features(full, width, narrow), features(narrow))
    torch.testing.assert_close(variant_features(full, width, 0, scalars=True), full[..., width:])


@pytest.mark.slow  # samples rollouts and runs exact OAR-P on them; the method's own tests are in the default run
def test_the_fit_is_scored_at_each_reachable_call_count_and_a_rerun_reads_its_cache(warm_cache, tmp_path,
                                                                                    monkeypatch, capsys):
    import oar_p_amortized_fidelity as script

    args = ["--preset", "tiny-cpu", "--model", str(warm_cache[1]), "--groups", "3", "--heldout-groups", "1",
            "--exact-rows", "1", "--calls", "1,2,100000", "--layers", "middle,last", "--features", "8",
            "--ridges", "0.01", "--decays", "0.95", "--cache", str(tmp_path / "cache")]
    out = script.main([*args, "--out", str(tmp_path / "a.json")])
    assert json.loads((tmp_path / "a.json").read_text()) == out
    assert out["mixed_groups"] == 3 and out["heldout_rows"] > 0 and out["stream_rows"] > 2
    assert set(out["variants"]) == {"middle/8/ridge=0.01/decay=0.95", "last/8/ridge=0.01/decay=0.95",
                                    "scalars/ridge=0.01/decay=0.95"}
    for scores in out["variants"].values():
        assert set(scores) == {"1", "2"}  # 100000 calls are beyond the stream: not scored
        for score in scores.values():
            assert score["rows"] > 0 and -1.0 <= score["spearman_min"] <= score["spearman_median"] <= 1.0
            assert 0.0 <= score["weights"]["sign_changed_share"] <= 1.0
    assert set(out["single_features"]) == {"surprise", "entropy", "place"}
    assert out["exact_seconds_per_row"] > 0

    from grail.methods import builtin

    def no_exact(*a, **k):
        raise AssertionError("the cache holds every group's exact OAR-P")

    monkeypatch.setattr(builtin, "oar_p_signal", no_exact)
    again = script.main(args)
    assert again["variants"] == out["variants"] and again["rewards"] == out["rewards"]

    monkeypatch.undo()
    calls = []

    def counted(*a, **k):
        calls.append(1)
        return exact(*a, **k)

    exact = builtin.oar_p_signal
    monkeypatch.setattr(builtin, "oar_p_signal", counted)
    more = script.main([*args, "--groups", "4"])  # the cache extended: exact OAR-P on the new group only
    assert calls == [1] and more["mixed_groups"] == 4 and more["rewards"][:len(out["rewards"])] == out["rewards"]
    fewer = script.main([*args, "--groups", "2", "--heldout-groups", "1"])  # read from the larger cache
    assert calls == [1] and fewer["mixed_groups"] == 2
    import oar_p_amortized_auroc

    variant = ["--cache", str(tmp_path / "cache"), "--variant", "middle/8/ridge=0.01/decay=0.95"]
    auroc = oar_p_amortized_auroc.main([*variant, "--exact-rows", "1", "--label-sets", "counterbalanced_filler",
                                        "--rows", "1", "--words", "3", "--json", str(tmp_path / "auroc.json")])
    assert auroc["predictor"]["calls"] == more["stream_rows"] + more["heldout_rows"]  # every cached row, one a call
    cell = auroc["label_sets"]["counterbalanced_filler"]["methods"]["oar_p_amortized"]
    assert 0.0 <= cell["auroc"] <= 1.0 and cell["critical_entered"] > 0
    with pytest.raises(SystemExit, match="the cache holds"):
        oar_p_amortized_auroc.main([*variant, "--calls", "100000"])
    with pytest.raises(SystemExit, match="holds the rollouts of"):
        script.main([*args, "--seed", "5"])
    with pytest.raises(SystemExit):
        script.main([*args, "--heldout-groups", "3"])
    assert "needs 1 <= it < --groups" in capsys.readouterr().err


def test_render_ranks_the_variants_at_the_largest_count_each_reached(tmp_path, capsys):
    from oar_p_amortized_fidelity import main

    def score(median):
        return {"rows": 3, "spearman_median": median, "spearman_q25": median - 0.1, "spearman_min": median - 0.2,
                "weights": {"spearman_median": median - 0.05}}

    out = {"heldout_rows": 3, "stream_rows": 40, "exact_rows_per_call": 2,
           "variants": {"middle/8/ridge=0.01/decay=0.95": {"10": score(0.5), "20": score(0.6)},
                        "last/8/ridge=0.01/decay=0.95": {"10": score(0.7), "20": score(0.4)},
                        "scalars/ridge=0.01/decay=0.95": {"10": score(0.3), "20": score(0.2)}},
           "single_features": {"surprise": {"spearman_median": 0.25, "spearman_min": -0.1}}}
    (tmp_path / "out.json").write_text(json.dumps(out))
    main(["--render", str(tmp_path / "out.json"), "1"])
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| middle") or line.startswith("| last")
            or line.startswith("| scalars")]
    assert [row.split(" |")[0] for row in rows] == ["| middle/8/ridge=0.01/decay=0.95",
                                                     "| scalars/ridge=0.01/decay=0.95"]  # top 1 at 20 calls, then
    assert "0.60 [0.50, 0.40] / 0.55" in rows[0] and "| surprise | 0.25 | -0.10 |" in table  # the features-free one


def test_a_fitted_predictor_handed_to_the_auroc_scores_every_row_by_prediction(tokenizer, monkeypatch):
    """`SaliencyQualityOptions.states` reaches the method's probe on every batch: with the AUROC script's options
    (exact rows on no call) exact OAR-P never runs and the fit is not touched; without a state each batch fits on its
    own exact rows."""
    from oar_p_amortized_auroc import PREDICT_ONLY

    from grail.analysis.saliency.counterbalanced import counterbalanced_filler_rows
    from grail.analysis.saliency.quality import SaliencyQualityOptions, saliency_auroc
    from grail.methods.signals import oar_p_amortized as amortized
    from grail.methods.table import METHODS
    from grail.models.tiny import build_tiny_model
    from grail.options.choices import WeightingOptions

    model = build_tiny_model(tokenizer, seed=0)
    rows = counterbalanced_filler_rows(1, seed=0, words=3, shots=0)
    own = METHODS["oar_p_amortized"].resolve_options({amortized.FEATURES: 8, amortized.EVERY: PREDICT_ONLY})
    weighting = WeightingOptions(token_weighting="oar_p_amortized", method_options=own)
    calls = []
    real = amortized.oar_p_signal
    monkeypatch.setattr(amortized, "oar_p_signal", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(0)
    predictor = amortized.Predictor()
    predictor.update(torch.randn(40, 8 + amortized.SCALARS, generator=g), torch.randn(40, generator=g), 1.0)
    predictor.probe_calls = predictor.calls
    before = {k: v.clone() if torch.is_tensor(v) else v for k, v in predictor.state_dict().items()}
    options = SaliencyQualityOptions(num_bootstrap=0, batch_size=2, weighting=weighting,
                                     states={"oar_p_amortized": predictor})
    results = saliency_auroc(model, tokenizer, rows, ["oar_p_amortized"], options)
    batches = -(-2 * len(rows) // 2)  # both traces of each row, two a batch
    assert calls == [] and predictor.probe_calls == predictor.calls + batches
    assert all(torch.equal(v, before[k]) if torch.is_tensor(v) else v == before[k]
               for k, v in predictor.state_dict().items() if k != "probe_calls")
    assert results["oar_p_amortized"]["signal"].n_critical > 0
    saliency_auroc(model, tokenizer, rows, ["oar_p_amortized"], replace(options, states={}))
    assert len(calls) == batches  # a fresh state each batch: its exact rows first


def test_the_auroc_script_reads_a_variant_and_refuses_the_features_free_one():
    from oar_p_amortized_auroc import parse_variant

    assert parse_variant("middle/256/ridge=0.01/decay=0.95") == ("middle", 256, 0.01, 0.95)
    with pytest.raises(SystemExit, match="not a configuration"):
        parse_variant("scalars/ridge=0.01/decay=0.95")
    with pytest.raises(SystemExit, match="expected LAYER/FEATURES"):
        parse_variant("middle/256")


def test_a_fidelity_variants_name_reads_back_as_its_configuration():
    """The variant's name has one home (the fidelity script writes it, the AUROC script reads it with the same
    parser): every layer's variant round-trips; the features-free one is not a configuration."""
    from oar_p_amortized_fidelity import parse_variant, variant_name

    for variant in (("last", 64, 0.001, 0.95), ("middle", 256, 0.01, 0.9), ("embeddings", 8, 1.0, 1.0)):
        assert parse_variant(variant_name(*variant)) == variant
    with pytest.raises(ValueError, match="LAYER/FEATURES"):
        parse_variant(variant_name("scalars", 0, 0.01, 0.95))
