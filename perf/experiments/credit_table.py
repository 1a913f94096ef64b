"""One table of where the credit lands, from the JSON files `saliency_auroc.py --label-set ... --json` wrote:
one section per label set, one row per method, columns (model) x (pooled, position-matched), each cell the AUROC of
critical over filler (or format) tokens with its 95% bootstrap CI over examples.

    python perf/experiments/credit_table.py A.json B.json ... [--part signal|weights] [--methods grail,oar_g,...]
        [--held matched|fixed] [--json out.json]

--held: which position-held figure fills each model's second column: `matched` (distance to the box,
grail.analysis.saliency.position; the default, as the results page has it) or `fixed` (position fixed in every sense,
grail.analysis.saliency.fixed_position; the cell adds the shares of labelled critical / contrast tokens that entered
it). `fixed` needs files written since saliency_auroc.py reports it; on the counterbalanced and rollout sets it is the
figure to read.

A cell comes from exactly one file: two files holding the same (model, label set, method) are refused, naming both,
so a table never mixes two runs silently. A cell no file holds prints as "not run".
"""

import argparse
import json
import re
import sys
from pathlib import Path

SET_TITLES = {"multi_step_filler": "multi-step stories, critical vs inserted filler",
              "natural_contrast": "the solution's own words, critical vs format tokens",
              "counterbalanced_filler": "counterbalanced groups, critical vs moved filler",
              "counterbalanced_format": "counterbalanced groups, critical vs frame words",
              "chain_rollouts": "the model's own chain rollouts, critical vs format words"}


class TableInputError(ValueError):
    """A JSON file that is not `saliency_auroc.py --label-set` output, or two files for one cell."""


def read_cells(paths: list[str], part: str) -> tuple[dict, dict]:
    """{(model, label_set, method): result dict} and {the same key: file} from the files, refusing duplicates."""
    cells, sources = {}, {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            model, rows, results = Path(data["model"]).name, data["rows"], data["results"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise TableInputError(f"{path}: not a `saliency_auroc.py --json` file ({err!r}); pass the files "
                                  f"that script wrote with --label-set") from err
        found = re.search(r"label set (\w+)", rows)
        if found is None:
            raise TableInputError(f"{path}: rows {rows!r} name no label set; run saliency_auroc.py with "
                                  f"--label-set multi_step_filler or natural_contrast")
        for method, parts in results.items():
            key = (model, found.group(1), method)
            if key in cells:
                raise TableInputError(f"{key} is in both {sources[key]} and {path}; pass one of them")
            if part not in parts:
                raise TableInputError(f"{path}: {method} has no {part!r} result (it has {sorted(parts)})")
            cells[key], sources[key] = parts[part], path
    return cells, sources


def _cell(result: dict | None) -> str:
    if result is None:
        return "not run"
    text = f"{result['auroc']:.3f} [{result['ci_low']:.3f}, {result['ci_high']:.3f}]"
    if result.get("labelled_critical") and result.get("labelled_filler"):  # the fixed AUROC: the shares it used
        text += (f" ({100 * result['n_critical'] / result['labelled_critical']:.0f}% / "
                 f"{100 * result['n_filler'] / result['labelled_filler']:.0f}%)")
    return text


def _held(result: dict, held: str, path: str = "") -> dict:
    if held not in result or result[held] is None:
        raise TableInputError(f"{path}: a result has no {held!r} figure; rerun saliency_auroc.py (it reports "
                              f"'fixed' since the fixed-position estimator) or use --held matched")
    return result[held]


def render(cells: dict, methods: list[str], held: str = "matched") -> str:
    """The markdown table: a header row per label set, a row per method, two columns per model (pooled, and the
    `held` figure)."""
    models = sorted({m for m, _, _ in cells}, key=lambda name: (not name.startswith("smollm"), name))
    sets = [s for s in SET_TITLES if any(k[1] == s for k in cells)]
    head = "| label set, method | " + " | ".join(f"{m} pooled | {m} {held}" for m in models) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(models))]
    for label_set in sets:
        lines.append(f"| **{SET_TITLES[label_set]}** |" + " |" * (2 * len(models)))
        for method in methods:
            row = []
            for model in models:
                result = cells.get((model, label_set, method))
                row += [_cell(result), _cell(_held(result, held) if result else None)]
            lines.append(f"| {method} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--part", default="signal", choices=("signal", "weights"))
    parser.add_argument("--methods", help="comma-separated (default: every method the files hold, in the "
                        "method table's order)")
    parser.add_argument("--held", default="matched", choices=("matched", "fixed"))
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    try:
        cells, sources = read_cells(args.files, args.part)
        for key, result in cells.items():
            _held(result, args.held, sources[key])
    except TableInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from grail.methods.table import method_names

    held = {k for _, _, k in cells}
    order = [m for m in method_names() if m in held] + sorted(held - set(method_names()))
    methods = [m.strip() for m in args.methods.split(",")] if args.methods else order
    what = ("matched = within bins of distance to the box" if args.held == "matched" else
            "fixed = within (group, reasoning length, position), (shares of labelled critical / contrast tokens that "
            "entered)")
    print(f"AUROC of the {args.part} (critical above filler/format = 1, chance = 0.5) [95% CI]; {what}")
    print(render(cells, methods, args.held))
    if args.json:
        Path(args.json).write_text(json.dumps([{"model": m, "label_set": s, "method": k, "part": args.part,
                                                "source": sources[(m, s, k)], **cells[(m, s, k)]}
                                               for (m, s, k) in sorted(cells)], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
