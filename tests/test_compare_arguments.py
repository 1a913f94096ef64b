"""`grail compare`'s arguments, checked before any work: bad arms and fields exit 2 and write nothing, a sweep
crosses every arm with every value, `--help` stays light; and the learning curves' moving average."""

import subprocess
import sys

import pytest

from grail.analysis.compare import plan as compare
from grail.cli import main


@pytest.mark.parametrize("arms, extra, named", [
    ("none,,grail", [], "none empty"),
    ("gral", [], "not a method"),
    ("grail@saliency_leaf", [], "field=value"),
    ("grail@learning_rat=1e-4", [], "learning_rate"),  # the unknown key, and the closest field
    ("grail@saliency_leaf=bogus", [], "saliency_leaf"),
    ("grail@seed=3", [], "sets seed"),
    ("random@permute_weights=true", [], "already permuted"),
    ("none,none", [], "two arms"),
    ("grail@learning_rate=1e-4", ["--sweep", "learning_rate=1e-4,2e-4"], "sweep it or set it"),
    ("none", ["--sweep", "learning_rate"], "FIELD=v1,v2"),
    ("none", ["--seed", "3"], "--seeds"),
    ("none", ["--dataset", "data.jsonl"], "--eval_benchmarks"),
    ("none", ["--dataset", "missing.jsonl", "--eval_benchmarks", "synthetic"], "missing.jsonl"),
])
def test_bad_arms_and_fields_exit_2_before_any_work(tmp_path, capsys, arms, extra, named):
    out = tmp_path / "cmp"
    assert main(["compare", "--arms", arms, "--seeds", "2", "--output_dir", str(out), *extra]) == 2
    assert named in capsys.readouterr().err
    assert not (out / "compare.json").exists() and not (out / "runs").exists()  # nothing to refuse a fixed rerun


def test_a_sweep_crosses_every_arm_with_every_value():
    arms = compare.parse_arms("none,grail@saliency_leaf=middle", ["learning_rate=2.5e-5,1e-4", "beta=0,0.1"])
    assert [a.label for a in arms] == [
        f"{arm}@learning_rate={lr}@beta={beta}" for arm in ("none", "grail@saliency_leaf=middle")
        for lr in ("2.5e-5", "1e-4") for beta in ("0", "0.1")]
    assert arms[-1].fields == {"saliency_leaf": "middle", "learning_rate": 1e-4, "beta": 0.1}  # typed
    assert arms[-1].method == "grail" and "/" not in arms[-1].slug


def test_a_methods_permutation_null_is_an_arm():
    arms = compare.parse_arms("none,oar_p,oar_p@permute_weights=true", [])
    assert arms[2].method == "oar_p" and arms[2].fields == {"permute_weights": True}
    assert arms[2].label == "oar_p@permute_weights=true" and arms[2].slug != arms[1].slug


def test_compare_help_imports_neither_torch_nor_trl():
    code = ("from grail.cli import main\ntry:\n    main(['compare', '--help'])\nexcept SystemExit:\n    pass\n"
            "import sys\nprint(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "--arms" in out and not {name.split(".")[0] for name in out.split()} & {"torch", "trl"}


def test_the_learning_curves_are_a_trailing_moving_average():
    from grail.analysis.compare.plots import smoothed

    values = {1: 1.0, 2: 0.0, 3: 1.0, 5: 0.0}  # step 4 not logged: the window counts logged steps
    assert smoothed(values, 2) == {1: 1.0, 2: 0.5, 3: 0.5, 5: 0.5}
    assert smoothed(values, 1) == values
