"""Screen credit signals: for each method (built-in, a plug-in such as grail_over_surprise, or a candidate of
credit_candidates/, registered here through the public API) on each label set, the position-fixed AUROC of the
method's signal (critical above filler or format tokens; grail.analysis.saliency.fixed_position) with its 95%
bootstrap interval, the shares of labelled critical / contrast tokens that entered it, and the seconds the method's
probe took per row.

    python perf/experiments/credit_screen.py [--model tiny|smollm2-135m|gemma3-270m|DIR] [--seed 0]
        [--methods grail,oar_p,attr_patch,attr_patch_drop,contrastive,contrastive_saliency,grail_over_surprise,ig_patch]
        [--label-sets counterbalanced_filler,counterbalanced_format,chain_rollouts]
        [--rows 8] [--words 14] [--samples 8] [--max-new-tokens 256] [--fixed-group row|all] [--device cpu]
        [--bf16] [--json out.json]
    python perf/experiments/credit_screen.py --render out.json [more.json ...] [--pivot]   # tables again, no run

The label sets are built and scored exactly as `saliency_auroc.py --label-set NAME` builds and scores them (its
`chain_rollout_rows`, grail.analysis.saliency.counterbalanced, `quality.saliency_auroc` with the same options): the
counterbalanced sets with --rows groups and both traces (reference A = +1, corrupted A = −1), chain_rollouts with
--samples completions of each of --rows prompts, their own advantages, reference traces only. Seed --seed builds the
label sets; the bootstrap's seed is quality's default, as in saliency_auroc.py. The model is loaded once.

Time per row: wall seconds inside each method's probe (`weighting.run_probe`, timed by wrapping the name
`quality.saliency_auroc` calls, for this process only) over the rows it probed; methods that share a probe function
(grail and random) are timed once and report the same figure. It is the probe alone on the label set's batches
(--batch-size traces), not a training step: the step-cost benchmarks measure that. A candidate that counts its
fallbacks (contrastive's `COUNTS`, by method) adds them to its cell. A label set with no labelled row (chain_rollouts
on a model never warm-started on the chain task) is reported as skipped, with the reason, and the others still run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from contextlib import contextmanager

from credit_candidates import CANDIDATES, register_candidates
from credit_candidates.contrastive import COUNTS as FALLBACK_COUNTS
from saliency_auroc import chain_rollout_rows, in_precision

LABEL_SETS = ("counterbalanced_filler", "counterbalanced_format", "chain_rollouts")
DEFAULT_METHODS = ("grail,oar_p,attr_patch,attr_patch_drop,contrastive,contrastive_saliency,grail_over_surprise,"
                   "ig_patch")


@contextmanager
def timed_probes(seconds: Counter, rows: Counter):
    """While active, every probe `quality.saliency_auroc` runs adds its wall time and its probed rows under its probe
    function (seconds[probe], rows[probe])."""
    from grail.analysis.saliency import quality

    original = quality.run_probe

    def timed(model, input_ids_BL, attention_mask_BL, spans, mask_BT, rows_B, options, generator=None, spec=None,
              **kwargs):
        start = time.perf_counter()
        out = original(model, input_ids_BL, attention_mask_BL, spans, mask_BT, rows_B, options, generator, spec,
                       **kwargs)
        seconds[spec.probe] += time.perf_counter() - start
        rows[spec.probe] += int(rows_B.sum())
        return out

    quality.run_probe = timed
    try:
        yield
    finally:
        quality.run_probe = original


def label_rows(name: str, model, tokenizer, args) -> tuple[list[dict], str]:
    """(rows, description) of one label set, as saliency_auroc.py builds it."""
    from grail.analysis.saliency.counterbalanced import COUNTERBALANCED_SETS

    if name in COUNTERBALANCED_SETS:
        rows = COUNTERBALANCED_SETS[name](args.rows, args.seed, words=args.words)
        return rows, f"{args.rows} groups ({len(rows)} rows), seed {args.seed}"
    rows, skipped = chain_rollout_rows(model, tokenizer, args.rows, args.samples, args.seed, args.max_new_tokens)
    return rows, (f"{args.rows} prompts x {args.samples} samples ({len(rows)} labelled; skipped {dict(skipped)}), "
                  f"seed {args.seed}")


def _counts():
    """{method: a copy of its fallback counter} (contrastive's and its variant's, `contrastive.COUNTS`)."""
    return {name: Counter(counts) for name, counts in FALLBACK_COUNTS.items()}


def screen(model, tokenizer, methods: list[str], label_sets: list[str], args, on_set=None, weighting=None,
           states=None) -> dict:
    """{label set: {"rows": description, "skipped": reason or None, "methods": {method: cell}}}; `on_set(out)` is
    called after each label set (main writes the JSON then, so a run stopped part-way keeps its finished sets).
    `weighting` (WeightingOptions; None: the released defaults) and `states` ({method: its per-run state}) go to
    `SaliencyQualityOptions` as they are (perf/experiments/oar_p_amortized_auroc.py hands a fitted predictor)."""
    from grail.analysis.saliency.quality import SaliencyQualityOptions, saliency_auroc
    from grail.methods.table import method_spec

    specs = {m: method_spec(m) for m in methods}
    out = {}
    for name in label_sets:
        rows, what = label_rows(name, model, tokenizer, args)
        out[name] = {"rows": what, "skipped": None, "methods": {}}
        if not rows:
            out[name]["skipped"] = "no labelled row (is the model warm-started on the chain task?)"
            continue
        at_token = ("grail",) if args.grail_at_token and "grail" in methods else ()
        extra = {"weighting": weighting} if weighting is not None else {}
        options = SaliencyQualityOptions(traces="reference" if name == "chain_rollouts" else "both",
                                         batch_size=args.batch_size, fixed_group=args.fixed_group,
                                         read_at_token=at_token, states=states or {}, **extra)
        seconds, probed, before = Counter(), Counter(), _counts()
        with timed_probes(seconds, probed):
            results = in_precision(lambda names, own, rows=rows: saliency_auroc(model, tokenizer, rows, names, own),
                                   methods, args.bf16, options)
        after = _counts()
        for m in [*methods, *(f"{m}@token" for m in options.read_at_token)]:
            fixed = results[m]["signal"].fixed
            probe = specs[m.removesuffix("@token")].probe
            cell = {"auroc": fixed.auroc, "ci_low": fixed.ci_low, "ci_high": fixed.ci_high, "units": fixed.n_examples,
                    "critical_entered": fixed.n_critical, "critical_labelled": fixed.labelled_critical,
                    "contrast_entered": fixed.n_filler, "contrast_labelled": fixed.labelled_filler,
                    "pooled_auroc": results[m]["signal"].auroc,
                    "probe_seconds": seconds[probe], "probed_rows": probed[probe],
                    "seconds_per_row": seconds[probe] / probed[probe] if probed[probe] else None}
            if m in after:
                cell["counts"] = {k: after[m][k] - before.get(m, Counter())[k] for k in after[m]}  # zeros kept
            out[name]["methods"][m] = cell
        if on_set is not None:
            on_set(out)
    return out


def _share(entered: int, labelled: int) -> str:
    return f"{100 * entered / labelled:.0f}%" if labelled else "-"


def one_group(args: dict, cell: dict | None = None) -> bool:
    """Whether a cell's bootstrap had a single unit to resample, so its interval (x, x) is not an interval: the
    cell's `units` (the groups, or with `--fixed-group all` the prompts, that held a labelled token) where it has
    them; in a JSON written before cells had them (when `--fixed-group all` resampled its one pooled group), by the
    screen's args: `--fixed-group all`, or `--rows 1` (one counterbalanced group or one prompt)."""
    if cell is not None and "units" in cell:
        return cell["units"] == 1
    return args["fixed_group"] == "all" or args["rows"] == 1


def fixed_cell(c: dict, single_group: bool, digits: int) -> str:
    """A cell's fixed AUROC as the tables write it: with its 95% interval, without one when the screen had one group,
    or "no pair" when no stratum held both classes (nothing entered)."""
    if not (c["critical_entered"] and c["contrast_entered"]):
        return "no pair"
    value = f"{c['auroc']:.{digits}f}"
    return f"{value} (one group)" if single_group else f"{value} [{c['ci_low']:.{digits}f}, {c['ci_high']:.{digits}f}]"


def render(result: dict) -> str:
    lines = ["| label set | method | fixed AUROC [95% CI] | critical / contrast entered | pooled AUROC | s per row | "
             "notes |", "|---|---|---|---|---|---|---|"]
    for name, part in result["label_sets"].items():
        if part["skipped"]:
            lines.append(f"| {name} | - | skipped: {part['skipped']} | | | | {part['rows']} |")
            continue
        for m, c in part["methods"].items():
            spr = "-" if c["seconds_per_row"] is None else f"{c['seconds_per_row']:.2f}"
            notes = ", ".join(f"{k} {v}" for k, v in sorted(c.get("counts", {}).items()))
            fixed = fixed_cell(c, one_group(result["args"], c), 3)
            lines.append(f"| {name} | {m} | {fixed} | "
                         f"{_share(c['critical_entered'], c['critical_labelled'])} / "
                         f"{_share(c['contrast_entered'], c['contrast_labelled'])} | {c['pooled_auroc']:.3f} | {spr} | "
                         f"{notes} |")
    return "\n".join(lines)


def pivot(paths: list[str]) -> str:
    """One row per method, one column per label set (--render ... --pivot): the fixed AUROC of each cell (`fixed_cell`)
    from whichever file holds it (a later file's cell replaces an earlier one's), the probe's seconds per row on each
    label set (in the columns' order), then one line per label set with the shares of labelled tokens that entered and
    the files that hold it."""
    cells, sources = {}, {}
    for path in paths:
        result = _load(path)
        for name, part in result["label_sets"].items():
            if part["skipped"]:
                continue
            paths_, _, _ = sources.get(name, ([], None, None))
            sources[name] = ([*paths_, path], part["rows"], result["args"]["fixed_group"])
            for m, c in part["methods"].items():
                cells.setdefault(m, {})[name] = (c, one_group(result["args"], c))
    sets = [s for s in LABEL_SETS if s in sources]
    lines = ["| method | " + " | ".join(sets) + " | s per row (each set) |", "|---|" + "---|" * (len(sets) + 1)]
    for m, by_set in cells.items():
        row = ["-" if name not in by_set else fixed_cell(*by_set[name], 2) for name in sets]
        per_row = " / ".join("-" if name not in by_set or by_set[name][0]["seconds_per_row"] is None
                             else f"{by_set[name][0]['seconds_per_row']:.2f}" for name in sets)
        lines.append(f"| {m} | " + " | ".join(row) + f" | {per_row} |")
    lines.append("")
    for name in sets:
        c = next(by_set[name][0] for by_set in cells.values() if name in by_set)
        files, rows, group = sources[name]
        lines.append(f"- {name}: {rows}; fixed group {group}; entered: critical "
                     f"{_share(c['critical_entered'], c['critical_labelled'])} of {c['critical_labelled']}, contrast "
                     f"{_share(c['contrast_entered'], c['contrast_labelled'])} of {c['contrast_labelled']} "
                     f"({', '.join(files)})")
    return "\n".join(lines)


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def render_files(paths: list[str]) -> str:
    """One table of several screens' JSON files (--render): each file's label sets under a heading line naming its
    model, seed, rows and fixed-AUROC group, in the order given; a file of a run stopped part-way says so."""
    out = []
    for path in paths:
        result = _load(path)
        a = result["args"]
        state = "" if result.get("finished", True) else " (stopped part-way: its finished label sets)"
        out += [f"{path}: model {result['model']}, seed {result['seed']}, --rows {a['rows']}, --fixed-group "
                f"{a['fixed_group']}, {result['wall_s'] / 60:.0f} min{state}", "", render(result), ""]
    return "\n".join(out)


def label_set_arguments(parser) -> None:
    """The arguments that build and score the label sets (`screen` reads them; shared with
    perf/experiments/oar_p_amortized_auroc.py)."""
    parser.add_argument("--label-sets", default=",".join(LABEL_SETS),
                        help="comma-separated, of " + ", ".join(LABEL_SETS))
    parser.add_argument("--seed", type=int, default=0, help="the label sets' seed (0: the development seed)")
    parser.add_argument("--rows", type=int, default=8, help="counterbalanced groups, or chain prompts")
    parser.add_argument("--words", type=int, default=14, help="counterbalanced sets: the moved block's words")
    parser.add_argument("--samples", type=int, default=8, help="chain_rollouts: completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="chain_rollouts: sampling limit")
    parser.add_argument("--batch-size", type=int, default=8, help="traces per probe call")
    parser.add_argument("--fixed-group", default="row", choices=("row", "all"),
                        help="the fixed AUROC's group: the rows' own (a counterbalanced group, a prompt) or one; "
                             "`all` lets more of chain_rollouts' tokens enter, its interval resampling the prompts "
                             "(docs/guides/position-fixed.md)")


def label_sets_of(args) -> list[str]:
    """--label-sets as a list; SystemExit naming the choices when one is not a label set."""
    label_sets = [s.strip() for s in args.label_sets.split(",") if s.strip()]
    bad = [s for s in label_sets if s not in LABEL_SETS]
    if bad or not label_sets:
        raise SystemExit(f"error: --label-sets {bad or label_sets}: choose from {', '.join(LABEL_SETS)}")
    return label_sets


def main(argv: list[str] | None = None) -> int:
    from grail.options.fields import TINY_MODEL

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=TINY_MODEL, help="tiny (the warm-started tiny model), a real model's name "
                        "(`grail models fetch` it first) or a save_pretrained directory")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated: methods with a probe, built-in "
                        f"or candidates ({', '.join(CANDIDATES)})")
    label_set_arguments(parser)
    parser.add_argument("--grail-at-token", action="store_true",
                        help="also report GRAIL's saliency read at the token's own position (as grail@token; its "
                             "default read is at the position that predicts the token); same probe, no extra cost")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="probes under CPU bf16 autocast over the fp32 weights, as "
                        "a bf16 CPU run computes them (FP32_PROBES methods in fp32, as such a run keeps them); the "
                        "label sets' rollouts are sampled in fp32 either way")
    parser.add_argument("--json")
    parser.add_argument("--render", nargs="+", metavar="JSON", help="print the table of these screens' JSON files "
                        "(this script's --json) and run nothing")
    parser.add_argument("--pivot", action="store_true", help="with --render: one row per method, one column per "
                        "label set (a later file's cell replaces an earlier one's)")
    args = parser.parse_args(argv)
    if args.render:
        print(pivot(args.render) if args.pivot else render_files(args.render))
        return 0
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        print("error: --methods is empty: give at least one method", file=sys.stderr)
        return 2
    try:
        label_sets = label_sets_of(args)
    except SystemExit as error:
        print(error, file=sys.stderr)
        return 2
    register_candidates([m for m in methods if m in CANDIDATES])
    from grail.methods.table import method_names

    unknown = [m for m in methods if m not in method_names(probed=True)]
    if unknown:
        print(f"error: --methods {unknown}: not a method with a probe; choose from "
              f"{', '.join(method_names(probed=True))}", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    from grail.models.warmstart import load_inference_model, resolve_model

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_inference_model(path, args.device)
    start = time.perf_counter()
    result = {"model": str(path), "seed": args.seed, "methods": methods, "args": vars(args), "label_sets": {}}

    def save(partial: dict) -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**result, "label_sets": partial, "finished": False,
                           "wall_s": time.perf_counter() - start}, f, indent=1)

    result["label_sets"] = screen(model, tokenizer, methods, label_sets, args, on_set=save)
    result["finished"] = True
    result["wall_s"] = time.perf_counter() - start
    print(f"model {path}; seed {args.seed}; signal AUROC with position fixed (critical above contrast = 1, chance "
          f"0.5); shares of labelled tokens that entered it; the probe's seconds per row on {args.device}")
    print(render(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
