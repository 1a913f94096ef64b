"""The random-update null of `grail compare --greedy-flips`: where greedy decoding's verdicts flip when the start is
moved by random noise instead of by training, beside where they flipped in the comparison's runs.

    python perf/experiments/greedy_flip_null.py --compare DIR [--arm none] [--seeds 0,1,2] [--scales 1,4,16]
        [--noise-seed 0] [--json FILE]

A greedy answer that most of its samples contradict is a near-tie, which an update in any direction may flip, so
greedy decoding's gains and losses by the start's sampled record (grail.analysis.compare.flips) say something of the
method only beside a null. For each seed, each tensor of the start is moved by Gaussian noise whose norm is --scales
times the norm of that tensor's update in the run (its final model − the start); a random direction changes outputs
far less than a trained one of the same norm, hence the larger scales: read the null at the scale whose total flips
(gained + lost) come closest to the run's. The moved model is evaluated greedily with the comparison's own
evaluation (its protocol and seed), and its flips are counted against the start's greedy and sampled record as the
run's are. Needs each run's `final/` model (kept unless the comparison ran with --drop-checkpoints) and the start
(before_rl.json's model_path). Prints, per scale, the rows of the null beside the run's; --json writes everything.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch

from grail.analysis.compare import run as compare_run
from grail.analysis.compare.flips import flip_rows, flips_text
from grail.analysis.compare.plan import PLAN_FILE
from grail.analysis.compare.summary import RESULT_FILE, load_start, run_path
from grail.training.overrides import build_config


def random_update(start: torch.nn.Module, final: torch.nn.Module, scale: float, seed: int) -> None:
    """Move `start` in place: each parameter by Gaussian noise of norm `scale` × ‖final's − start's‖ (zero where the
    run did not move it), drawn from torch.Generator seeded `seed`, parameter by parameter in `start`'s order."""
    generator = torch.Generator().manual_seed(seed)
    finals = dict(final.named_parameters())
    with torch.no_grad():
        for name, param in start.named_parameters():
            norm = torch.linalg.vector_norm(finals[name].float() - param.float())
            noise = torch.randn(param.shape, generator=generator)
            param.add_((noise * (scale * norm / torch.linalg.vector_norm(noise).clamp_min(1e-30))).to(param.dtype))


def _moved_model(start_dir: Path, final_dir: Path, scale: float, seed: int, into: Path) -> Path:
    """The start moved by `random_update`, saved into `into` with the final model's other files (its tokenizer and
    the prompt format the run was trained with)."""
    from transformers import AutoModelForCausalLM

    into.mkdir(parents=True, exist_ok=True)
    for path in final_dir.iterdir():
        if path.is_file() and not path.name.endswith(".safetensors"):
            shutil.copy2(path, into / path.name)
    start = AutoModelForCausalLM.from_pretrained(start_dir, dtype=torch.float32)
    final = AutoModelForCausalLM.from_pretrained(final_dir, dtype=torch.float32)
    random_update(start, final, scale, seed)
    start.save_pretrained(into)
    return into


def greedy_record(plan: dict, out_dir: Path, seed: int, model_dir: Path, eval_dir: Path) -> list[dict]:
    """The comparison's greedy evaluation of `model_dir` for `seed`: its per-problem record, as runs keep it."""
    from transformers import AutoTokenizer

    from grail.training.heldout import eval_device, eval_specs, heldout_accuracy

    cfg = build_config(compare_run.run_values(plan, None, seed, out_dir))
    specs = eval_specs(cfg, AutoTokenizer.from_pretrained(model_dir))
    (heldout,) = specs["greedy"].load_benchmarks(synthetic_set=cfg.synthetic_set())
    scores = heldout_accuracy(str(model_dir), {"greedy": specs["greedy"]}, heldout, eval_dir, lambda s: None,
                              shared_prompt=cfg.shared_prompt, device=eval_device(cfg))
    return compare_run._per_problem([scores["greedy"]], [heldout])


def null_flips(out_dir: Path, arm: str, seeds: list[int], scales: list[float], noise_seed: int) -> dict:
    """{"arm", "seeds", "noise_seed", "run": {"rows", "total_flips"}, "null": {str(scale): {"rows", "total_flips"}}}
    for `arm`'s runs of `seeds` (total_flips: gained + lost, mean per seed)."""
    plan = json.loads((out_dir / PLAN_FILE).read_text())
    slug = next((a["slug"] for a in plan["arms"] if a["label"] == arm), None)
    if slug is None:
        raise SystemExit(f"--arm {arm!r}: not an arm of {out_dir} ({', '.join(a['label'] for a in plan['arms'])}).")
    start = load_start(out_dir, [arm])
    record = start.starts.get(start.arms.get(arm, "")) or {}
    before = record.get("evaluations") or {}
    if not (before.get("greedy") and before.get("sampled")):
        raise SystemExit(f"{out_dir}: no greedy and sampled evaluation of {arm}'s start in before_rl.json.")
    runs, nulls = [], {scale: [] for scale in scales}
    for seed in seeds:
        run_dir = run_path(out_dir, slug, seed)
        result_file, final_dir = run_dir / RESULT_FILE, run_dir / "final"
        if not result_file.is_file() or not (final_dir / "config.json").is_file():
            raise SystemExit(f"{run_dir}: no finished run with its final/ model (a comparison run with "
                             "--drop-checkpoints keeps none); give --seeds of finished runs.")
        runs.append(json.loads(result_file.read_text())["evaluations"])
        for scale in scales:
            with tempfile.TemporaryDirectory() as tmp:
                model_dir = _moved_model(Path(record["model_path"]), final_dir, scale, noise_seed + seed,
                                         Path(tmp, "model").resolve())
                nulls[scale].append({"greedy": greedy_record(plan, out_dir, seed, model_dir, Path(tmp, "eval"))})
    def flips(evaluations: list[dict]) -> dict:
        rows = flip_rows(before, evaluations)
        return {"rows": rows, "total_flips": sum(r["gained"] + r["lost"] for r in rows)}

    return {"arm": arm, "seeds": seeds, "noise_seed": noise_seed, "run": flips(runs),
            "null": {str(scale): flips(evaluations) for scale, evaluations in nulls.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", required=True, help="a grail compare --output_dir (a folder, with final models)")
    parser.add_argument("--arm", default="none")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--scales", default="1,4,16", help="noise norm ÷ the run's update norm, per tensor")
    parser.add_argument("--noise-seed", type=int, default=0, help="the noise of seed s is drawn with noise-seed + s")
    parser.add_argument("--json", help="also write the result as JSON")
    args = parser.parse_args()
    out_dir = Path(args.compare).expanduser()
    result = null_flips(out_dir, args.arm, [int(s) for s in args.seeds.split(",")],
                        [float(s) for s in args.scales.split(",")], args.noise_seed)

    def table(label: str, rows: list[dict]) -> str:
        return flips_text({label: {"start": "the start", "seeds": result["seeds"], "rows": rows}})

    sections = [f"run ({args.arm}; total flips {result['run']['total_flips']:.1f} a seed):\n\n"
                + table(args.arm, result["run"]["rows"])]
    for scale, null in result["null"].items():
        sections.append(f"random update at {scale} × the run's norm (total flips {null['total_flips']:.1f} a "
                        f"seed):\n\n" + table(f"null × {scale}", null["rows"]))
    print("\n\n".join(sections))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
