"""`grail explain`: the command-line side of `grail.analysis.explain.compute` (computing) and
`grail.analysis.explain.html` (the page).

The run's settings come from the config system, as for `grail train`: GRAILConfig defaults (for `--model tiny`,
the `tiny-cpu` preset's values, as `grail demo`) < `--preset` < `--config FILE.yaml` < `--FIELD VALUE` flags. So
`--config RUN/config.yaml` explains with a training run's reward, `scale_rewards`, rollout sampling, prompt format
and weighting options. torch and TRL are imported inside `run`, so `grail explain --help` stays light.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from grail.options.fields import TINY_MODEL
from grail.options.presets import PRESETS, TINY_CPU

__all__ = ["DEFAULT_ADVANTAGE", "add_parser", "run"]

DEFAULT_ADVANTAGE = -1.0  # a bare --prompt: A of every completion (a wrong answer: GRAIL's rows by default)
_PROMPT_FIELDS = ("prompt_suffix", "conversational", "chat_template_kwargs")
_OWN_FIELDS = {"model_name_or_path": "--model", "dataset": "--dataset"}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "explain", allow_abbrev=False,
        help="an HTML page of each completion's tokens coloured by each method's weight",
        usage="grail explain --model PATH|tiny --method grail[,oar_g,...] (--prompt TEXT | --dataset FILE --rows K) "
              "[--output out.html] [--FIELD VALUE ...]",
        description="Sample completions (or take given ones), grade them with the run's reward, form GRPO's group "
        "advantages, compute each method's per-token signal and weights as training does, and write one "
        "self-contained HTML page (tokens coloured by weight, white at w = 1; hover for signal, weight and "
        "Â = w·A; answer span underlined; position profile per method) and a PNG of the profiles next to it. "
        "Every config field is accepted as --FIELD VALUE (e.g. --rollout_symmetry both, --oar_variant "
        "grail_release, --scale_rewards group, --temperature 0.7); see grail train --help.")
    p.add_argument("--model", help="a save_pretrained directory, a Hub id, or `tiny` (the warm-started embedded "
                   "model, resolved as by grail train: cached under cache_dir, keyed by the warm-start settings)")
    p.add_argument("--method", default="grail", help="token_weighting methods, comma-separated, shown one above the "
                   "other for each completion (default grail; e.g. grail,oar_g; `grail methods` lists them)")
    p.add_argument("--prompt", help="one problem, rendered in the run's prompt format (prompt_suffix, "
                   "conversational, chat_template_kwargs, `auto` resolved as by grail train: a problem of the "
                   "synthetic task for the tiny model, a real one for any other; or the model's saved "
                   "grail_prompt.json)")
    p.add_argument("--answer", help="the reference answer of --prompt: completions are then graded and get group "
                   "advantages, as with dataset rows (reward math_verify unless --reward says otherwise)")
    p.add_argument("--completion", action="append", help="a completion of --prompt to explain instead of sampling; "
                   "repeat for a group (tokenised as given, nothing appended)")
    p.add_argument("--dataset", help="a .jsonl/.json file (prompt_column, answer_column), a Hub dataset id, or "
                   "`synthetic` (the embedded task's training problems); its first --rows rows are explained")
    p.add_argument("--rows", type=int, default=3, help="rows of --dataset to explain (default 3, from the first)")
    p.add_argument("--samples", type=int, help="completions sampled per prompt (default num_generations, the "
                   "group size training uses), with training's temperature, top_p, top_k and max_completion_length")
    p.add_argument("--seed", type=int, help="sampling seed (prompt i uses seed + i) and the probes' seed "
                   "(random control, OAR-G noise); default the config's seed")
    p.add_argument("--advantage", type=float, help="every completion's advantage A, instead of graded group "
                   f"advantages (default {DEFAULT_ADVANTAGE:g} when no answer is known; the page says which)")
    p.add_argument("--output", help="the HTML file (default runs/explain-<timestamp>/explain.html); the profile "
                   "PNG is written next to it as <name>_profile.png")
    p.add_argument("--config", help="YAML file of field: value, e.g. a training run's config.yaml")
    p.add_argument("--preset", choices=sorted(PRESETS), help="start from these values (file and flags win)")


def _check_args(args) -> None:
    """The command's own arguments, checked before anything heavy is imported."""
    if not args.model:
        raise ValueError("grail explain needs --model: a save_pretrained directory, a Hub id, or `tiny`.")
    if (args.prompt is None) == (args.dataset is None):
        raise ValueError("grail explain needs exactly one of --prompt TEXT or --dataset FILE (with --rows K); "
                         f"got {'both' if args.prompt is not None else 'neither'}.")
    if args.dataset is not None and (args.completion or args.answer is not None):
        raise ValueError("--completion and --answer go with --prompt; dataset rows carry their own answers.")
    if args.rows < 1:
        raise ValueError(f"--rows {args.rows}: give at least 1.")
    if args.samples is not None and args.samples < 1:
        raise ValueError(f"--samples {args.samples}: give at least 1.")
    if args.output is not None and not args.output.endswith((".html", ".htm")):
        raise ValueError(f"--output {args.output!r}: give a file name ending in .html.")


def _config(args, rest: list[str], methods=("none",)):
    from grail.training.overrides import build_config, merge, parse_flags

    flags = parse_flags(rest)
    for key, flag in _OWN_FIELDS.items():
        if key in flags:
            raise ValueError(f"--{key}: use {flag} with grail explain.")
    if args.preset:
        flags["preset"] = args.preset
    values = merge(args.config, flags, base=TINY_CPU if args.model == TINY_MODEL else None)
    values["model_name_or_path"] = args.model
    if args.dataset is not None:
        values["dataset"] = args.dataset
    if args.prompt is not None and "reward" not in merge(args.config, flags):  # not set by preset, file or flag
        values["reward"] = "math_verify"  # a user's own problem: any answer, not the synthetic task's integers
    return _scoped_config(values, methods, build_config) + (values,)


def _scoped_config(values: dict, methods, build_config):
    """(the run's config, the weighting options every method is shown with): the config holds what its own
    `token_weighting` reads, and the options add the option fields given for the shown methods (each method reads
    its own, as a compare arm does). An option that none of the shown methods reads is refused."""
    from dataclasses import replace

    from grail.methods.table import METHODS, refuse_unread, scoped_values
    from grail.options.choices import WeightingOptions

    refuse_unread(values, [METHODS[m] for m in methods], f"the methods shown ({', '.join(methods)})")
    cfg = build_config(scoped_values(values, METHODS[values.get("token_weighting", "none")]))
    shared = {k: v for k, v in values.items() if k in WeightingOptions.__dataclass_fields__ and k != "method_options"}
    return cfg, replace(cfg.weighting_options(), **shared)


def _synthetic_task(args, cfg) -> bool:
    """Whether the prompts are the synthetic task's (plain text, no suffix when the format is `auto`): rows of
    `--dataset synthetic`, or a --prompt for the tiny model, which knows only that task."""
    from grail.options.prompts import synthetic_task

    return synthetic_task(cfg) and (args.prompt is None or args.model == TINY_MODEL)


def _raw_rows(args, cfg):
    """The first --rows rows of --dataset as the data has them (no suffix, no chat wrapping); None with --prompt."""
    if args.prompt is not None:
        return None
    from grail.training.data import load_prompts

    raw = load_prompts(cfg)
    if len(raw) < args.rows:
        raise ValueError(f"--rows {args.rows}: dataset {cfg.dataset!r} has only {len(raw)} rows.")
    return raw.select(range(args.rows))


def _prompt_format(args, cfg, values: dict, model_path: str, tokenizer, raw):
    """The model's saved format (grail_prompt.json, written by training) unless a prompt field was set; else the
    config's, `auto` resolved as training resolves it (grail.options.prompts.resolve_prompt_format)."""
    from grail.options.prompts import PromptFormat
    from grail.training.data import prompts_are_messages

    saved = PromptFormat.load(model_path) if Path(model_path).is_dir() else None
    if saved is not None and not any(k in values for k in _PROMPT_FIELDS):
        return saved
    return PromptFormat.from_config(cfg, tokenizer, synthetic=_synthetic_task(args, cfg),
                                    messages=raw is not None and prompts_are_messages(raw))


def _rows(args, cfg, raw, fmt, tokenizer):
    from grail.analysis.explain.compute import ExplainRow

    if raw is None:
        completions = tuple(args.completion) if args.completion else None
        return [ExplainRow(fmt.render(tokenizer, args.prompt), args.answer, completions, "--prompt")]
    return [ExplainRow(fmt.render(tokenizer, row["prompt"]), row["answer"], None, f"{cfg.dataset} row {i}")
            for i, row in enumerate(raw)]


def _empty_completions(ex, rows, tokenizer) -> tuple[int, int]:
    """(sampled completions that are empty, sampled completions): empty = nothing but special tokens and spaces."""
    special = set(tokenizer.all_special_tokens)
    sampled = [c for view, row in zip(ex.rows, rows, strict=True) if row.completions is None for c in view.completions]
    return sum(not "".join(t for t in c.tokens if t not in special).strip() for c in sampled), len(sampled)


def _settings(args, cfg, weighting, model, model_path, fmt, reward_fn, sampling, seed, rows) -> dict[str, str]:
    from dataclasses import asdict

    from grail.options.choices import WeightingOptions

    options = asdict(weighting)
    defaults = asdict(WeightingOptions())
    shown = set(options) - {"token_weighting", "temperature"}  # the temperature is a sampling setting, shown there
    changed = {k: v for k, v in options.items() if k in shown and v != defaults[k]}
    param = next(model.parameters())
    given = all(r.completions is not None for r in rows)
    return {
        "model": f"{args.model} ({model_path}; {param.dtype}, {param.device})",
        "methods": args.method,
        "prompt format": fmt.describe(),
        "completions": "given (--completion)" if given else (
            f"sampled, {sampling.n} per prompt: top_p {sampling.top_p:g}, top_k {sampling.top_k}, at most "
            f"{sampling.max_new_tokens} new tokens, seed {seed} + prompt index"),
        "temperature": f"{cfg.temperature:g} (" + ("" if given else "sampling; ") + "the probes divide the logits by "
                       "it, as training does)",
        "reward": getattr(reward_fn, "__name__", "reward") if all(r.answer is not None for r in rows)
        else "none (no reference answer)",
        "scale_rewards": str(cfg.scale_rewards),
        "weighting options": ", ".join(f"{k}={v!r}" for k, v in changed.items()) or "the released defaults",
    }


def profiles_json(ex) -> dict:
    """The page's position profiles as data (`explain.json` beside the page): per method, pooled over the rows with
    A ≠ 0 and over correct (A > 0) and wrong (A < 0) rows apart, each bin's mean weight and reasoning-token count."""
    return {"advantages": ex.advantage_source, "completions": len(ex.completions()),
            "methods": {m: {"all": {"mean_weight": ex.profiles[m], "tokens": ex.profile_counts[m]},
                            **{o: {"mean_weight": ex.outcome_profiles[m][o], "tokens": ex.outcome_counts[m][o]}
                               for o in ex.outcome_profiles.get(m, {})}} for m in ex.methods}}


def run(args, rest: list[str]) -> int:
    from grail.methods.table import parse_methods

    methods = parse_methods(args.method, example="grail,oar_g")  # checked before TRL is imported
    _check_args(args)
    if args.model != TINY_MODEL:  # a missing directory stops here, before TRL is imported
        from grail.models.warmstart import resolve_model

        resolve_model(args.model)
    cfg, weighting, values = _config(args, rest, methods)
    from transformers import AutoTokenizer

    from grail.analysis.explain.compute import explain
    from grail.analysis.explain.html import render_page, write_profile_png
    from grail.models.warmstart import load_inference_model
    from grail.options.prompts import empty_completions_warning
    from grail.options.sampling import SamplingParams
    from grail.training.run import quiet_libraries, resolve_model_path, reward_function

    quiet_libraries()  # "Loading weights" bars would bury the command's own lines
    model_path = resolve_model_path(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = load_inference_model(model_path)
    raw = _raw_rows(args, cfg)
    fmt = _prompt_format(args, cfg, values, model_path, tokenizer, raw)
    rows = _rows(args, cfg, raw, fmt, tokenizer)
    reward_fn = reward_function(cfg)
    known = all(r.answer is not None for r in rows)
    advantage = args.advantage if args.advantage is not None or known else DEFAULT_ADVANTAGE
    seed = cfg.seed if args.seed is None else args.seed
    sampling = SamplingParams(n=args.samples or cfg.num_generations, temperature=cfg.temperature, top_p=cfg.top_p,
                              top_k=cfg.top_k or 0, max_new_tokens=cfg.max_completion_length)
    ex = explain(model, tokenizer, rows, methods, weighting, sampling=sampling, seed=seed,
                 reward_fn=reward_fn if known else None, scale_rewards=cfg.scale_rewards, advantage=advantage)
    out = Path(args.output or os.path.join("runs", f"explain-{time.strftime('%Y%m%d-%H%M%S')}", "explain.html"))
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = _settings(args, cfg, weighting, model, model_path, fmt, reward_fn, sampling, seed, rows)
    out.write_text(render_page(ex, settings), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(profiles_json(ex), indent=2) + "\n")
    png = out.with_name(out.stem + "_profile.png")
    wrote_png = write_profile_png(ex, png)
    count = len(ex.completions())
    print(f"wrote {out} ({len(rows)} prompts, {count} completions, {len(methods)} methods; advantages "
          f"{ex.advantage_source})")
    print(f"profile: {png}" if wrote_png else "profile PNG skipped: matplotlib is not installed (pip install "
          "matplotlib); the page has the profiles as SVG")
    print(f"open it in a browser: python -m webbrowser {out.resolve().as_uri()}")
    empty, sampled = _empty_completions(ex, rows, tokenizer)
    if 2 * empty > sampled:
        print(empty_completions_warning(f"{empty} of {sampled} sampled completions are empty", fmt))
    return 0
