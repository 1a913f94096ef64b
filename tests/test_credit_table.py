"""perf/experiments/credit_table.py: the "where the credit lands" table is assembled from saliency_auroc's JSON files,
one file per cell, and refuses a duplicate or a file that is not such output."""

import json

import credit_table


def _script():
    return credit_table


def _result(auroc, matched):
    inner = {"auroc": matched, "ci_low": matched - 0.1, "ci_high": matched + 0.1}
    return {"auroc": auroc, "ci_low": auroc - 0.05, "ci_high": auroc + 0.05, "matched": inner}


def _write(path, model, label_set, results):
    path.write_text(json.dumps({"model": f"/cache/models/{model}", "rows": f"32 rows of label set {label_set} (seed 0)",
                                "results": {m: {"signal": _result(*v), "weights": _result(*v)}
                                            for m, v in results.items()}}))
    return str(path)


def test_cells_land_under_their_model_and_label_set(tmp_path, capsys):
    files = [_write(tmp_path / "a.json", "smollm2-135m", "multi_step_filler", {"grail": (0.121, 0.132)}),
             _write(tmp_path / "b.json", "gemma3-270m", "multi_step_filler", {"grail": (0.4, 0.45),
                                                                              "position": (0.52, 0.5)}),
             _write(tmp_path / "c.json", "smollm2-135m", "natural_contrast", {"oar_p": (0.81, 0.7)})]
    assert _script().main([*files, "--json", str(tmp_path / "t.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "| label set, method | smollm2-135m pooled | smollm2-135m matched | gemma3-270m pooled |" in lines[1]
    grail = next(line for line in lines if line.startswith("| grail |"))
    assert grail == "| grail | 0.121 [0.071, 0.171] | 0.132 [0.032, 0.232] | 0.400 [0.350, 0.450] | " \
                    "0.450 [0.350, 0.550] |"
    position = [line for line in lines if line.startswith("| position |")]
    assert position[0].startswith("| position | not run | not run | 0.520")
    oar_p = [line for line in lines if line.startswith("| oar_p |")]
    assert oar_p[0] == "| oar_p | not run | not run | not run | not run |"  # multi-step section first
    assert oar_p[1].startswith("| oar_p | 0.810 [0.760, 0.860] | 0.700")
    saved = json.loads((tmp_path / "t.json").read_text())
    assert {(c["model"], c["label_set"], c["method"]) for c in saved} == {
        ("smollm2-135m", "multi_step_filler", "grail"), ("gemma3-270m", "multi_step_filler", "grail"),
        ("gemma3-270m", "multi_step_filler", "position"), ("smollm2-135m", "natural_contrast", "oar_p")}


def test_two_files_for_one_cell_are_refused_naming_both(tmp_path, capsys):
    a = _write(tmp_path / "a.json", "smollm2-135m", "natural_contrast", {"grail": (0.5, 0.5)})
    b = _write(tmp_path / "b.json", "smollm2-135m", "natural_contrast", {"grail": (0.6, 0.5)})
    assert _script().main([a, b]) == 2
    err = capsys.readouterr().err
    assert "a.json" in err and "b.json" in err and "pass one" in err


def test_a_file_that_is_not_label_set_output_is_refused(tmp_path, capsys):
    (tmp_path / "bad.json").write_text('{"model": "m", "rows": "64 held-out problems", "results": {}}')
    assert _script().main([str(tmp_path / "bad.json")]) == 2
    assert "--label-set" in capsys.readouterr().err
    (tmp_path / "torn.json").write_text('{"model": ')
    assert _script().main([str(tmp_path / "torn.json")]) == 2
    assert "torn.json" in capsys.readouterr().err


def test_the_fixed_figure_with_its_shares_fills_the_second_column_on_request(tmp_path, capsys):
    path = tmp_path / "f.json"
    fixed = {"auroc": 0.5, "ci_low": 0.5, "ci_high": 0.5, "n_critical": 90, "n_filler": 60, "labelled_critical": 100,
             "labelled_filler": 80}
    data = {"model": "smollm2-135m", "rows": "8 groups of label set counterbalanced_filler (seed 0)",
            "results": {"position": {"signal": {**_result(0.52, 0.5), "fixed": fixed}}}}
    path.write_text(json.dumps(data))
    assert _script().main([str(path), "--held", "fixed"]) == 0
    out = capsys.readouterr().out
    assert "counterbalanced groups, critical vs moved filler" in out and "smollm2-135m fixed" in out
    assert "| position | 0.520 [0.470, 0.570] | 0.500 [0.500, 0.500] (90% / 75%) |" in out
    old = _write(tmp_path / "old.json", "smollm2-135m", "natural_contrast", {"grail": (0.5, 0.5)})
    assert _script().main([old, "--held", "fixed"]) == 2  # a file from before the fixed estimator: said, not a crash
    assert "--held matched" in capsys.readouterr().err
