"""The random control's saliency AUROC under its own shuffle: how far one draw lands from 0.5, and how often its
bootstrap CI holds 0.5.

    python perf/experiments/random_control_null.py [--model smollm2-135m] [--rows 64] [--draws 1000] [--coverage 300]

Rows: saliency_auroc.py's word-problem rows (held-out, filler rate 0.6, seed 0, the model's prompt format).
GRAIL's weights are computed once on the corrupted traces, the rows the random control reweights under
rollout_symmetry="wrong" (its weights are GRAIL's, shuffled over each row's reasoning tokens). Then they are
shuffled --draws times with the control's own function (grail.methods.core.permuted_weights). Each shuffle is scored
as saliency_auroc scores it: within-trace pairs of labelled reasoning tokens. The script prints the mean, SD and tail
of the null, and the coverage of the 95% bootstrap CI over --coverage draws.
It reuses grail.analysis.saliency.quality's private trace builder and batcher, so its traces are exactly the ones
saliency_auroc scores.
"""

import argparse
import math
from dataclasses import replace

import torch
from transformers import AutoTokenizer

from grail.analysis.saliency import quality
from grail.analysis.saliency.token_labels import CRITICAL, UNLABELLED, auroc_result, synthetic_rows, trace_wins_pairs
from grail.methods.core import permuted_weights
from grail.methods.table import method_spec, options_for
from grail.methods.weighting import batch_spans, probe_rows, run_probe, weights_from_signal
from grail.models.warmstart import load_inference_model, resolve_model
from grail.options.prompts import resolve_prompt_format
from grail.tasks.word_problems import WORDS_TASK


def grail_weights(model, tokenizer, rows, options):
    """(weights_GT, reasoning_GT, labels_GT) of GRAIL on the corrupted traces (G of them, right-padded)."""
    spec = method_spec("grail")
    opts = options_for(spec, options.weighting)
    traces = [t for t in quality.teacher_forced_traces(tokenizer, rows, options) if t.advantage < 0]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    T = max(len(t.completion_ids) for t in traces)
    out = [torch.zeros(len(traces), T), torch.zeros(len(traces), T, dtype=torch.bool),
           torch.full((len(traces), T), UNLABELLED)]
    for start in range(0, len(traces), options.batch_size):
        chunk = traces[start:start + options.batch_size]
        ids_BL, attn_BL, mask_BT, labels_BT = quality.trace_batch(chunk, pad, "cpu")
        adv_B = torch.full((len(chunk),), -1.0)
        spans = batch_spans(tokenizer, ids_BL[:, -mask_BT.shape[1]:], mask_BT, options.weighting)
        rows_B = probe_rows(adv_B, spans, mask_BT, opts, spec)
        signal_BT = run_probe(model, ids_BL, attn_BL, spans, mask_BT, rows_B, opts, None, spec, adv_B=adv_B,
                              tokenizer=tokenizer)
        weights_BT = weights_from_signal(signal_BT, adv_B, spans, mask_BT, rows_B, opts, None, 0.0, spec).weights_BT
        width = mask_BT.shape[1]
        for target, values in zip(out, (weights_BT, spans.reasoning_BT & mask_BT, labels_BT), strict=True):
            target[start:start + len(chunk), :width] = values
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--coverage", type=int, default=300)
    args = parser.parse_args()
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_inference_model(path, "cpu", torch.float32).eval()
    fmt = resolve_prompt_format(tokenizer, synthetic=True, messages=True)
    rows = [{**r, "prompt": fmt.render(tokenizer, r["prompt"])}
            for r in synthetic_rows(replace(WORDS_TASK, filler_rate=0.6), n=args.rows, split="heldout", seed=0)]
    weights_GT, reasoning_GT, labels_GT = grail_weights(model, tokenizer, rows, quality.SaliencyQualityOptions())
    scored_GT = reasoning_GT & (labels_GT != UNLABELLED)
    trace_GT = torch.arange(len(weights_GT))[:, None].expand_as(weights_GT)
    labels, trace = labels_GT[scored_GT], trace_GT[scored_GT]
    G, n_c = len(weights_GT), int((labels == CRITICAL).sum())
    print(f"{args.model}: {G} corrupted traces; per trace {reasoning_GT.sum(1).float().mean():.1f} reasoning tokens "
          f"(shuffled), of which {n_c / G:.2f} critical and {(len(labels) - n_c) / G:.2f} filler (scored)")
    own = auroc_result(weights_GT[scored_GT], labels, trace)
    print(f"GRAIL's weights, unshuffled: {own.auroc:.3f} [{own.ci_low:.3f}, {own.ci_high:.3f}]")
    generator = torch.Generator().manual_seed(0)
    null = []
    for _ in range(args.draws):
        wins_G, pairs_G = trace_wins_pairs(permuted_weights(weights_GT, reasoning_GT, generator)[scored_GT],
                                           labels == CRITICAL, trace)
        null.append(float(wins_G.sum() / pairs_G.sum()))
    null_R = torch.tensor(null, dtype=torch.float64)
    low, high = torch.quantile(null_R, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    print(f"shuffled, {args.draws} draws: mean {null_R.mean():.4f} (SE {null_R.std() / math.sqrt(len(null_R)):.4f}), "
          f"SD {null_R.std():.4f}, central 95% [{low:.3f}, {high:.3f}], share <= 0.375: "
          f"{(null_R <= 0.375).double().mean():.4f}")
    covered = 0
    for k in range(args.coverage):
        draw = permuted_weights(weights_GT, reasoning_GT, generator)[scored_GT]
        result = auroc_result(draw, labels, trace, seed=k)
        covered += result.ci_low <= 0.5 <= result.ci_high
    print(f"95% bootstrap CI holds 0.5 in {covered} of {args.coverage} draws ({covered / max(args.coverage, 1):.1%})")


if __name__ == "__main__":
    main()
