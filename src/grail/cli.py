"""Command line: `grail train`, `grail demo`, `grail compare`, `grail eval`, `grail validity`, `grail grader-check`,
`grail explain`, `grail models`, `grail sft`, `grail presets`.

`main(argv) -> exit code`, testable in process. Only the training commands (`train`, `demo`, `compare`, `sft`) and
`explain` (which reads the run's config) import the training layer (TRL, transformers); `--help`, `presets`, `eval`,
`validity` and `grader-check` start without it.

Exit codes: 0 done; 2 a configuration or input problem (the message says what to fix).
Set GRAIL_DEBUG=1 to get the traceback instead of the one-line message.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from dataclasses import fields

from grail import __version__
from grail.analysis.compare import cli as compare_cli
from grail.analysis.explain import cli as explain_cli
from grail.evaluation import cli as eval_cli
from grail.models import cli as models_cli
from grail.options import presets
from grail.options import sft as sft_options
from grail.options.fields import GRAILFields
from grail.options.presets import PRESETS, TINY_CPU

__all__ = ["GRAIL_FIELDS", "main", "run"]

GRAIL_FIELDS = fields(GRAILFields)  # declaration order


def _fields_help() -> str:
    lines = ["grail fields (every TRL GRPOConfig / TrainingArguments field is accepted too; grail resolves "
             "activation_checkpointing per device when it is unset: on for GPU training of real models, off on CPU "
             "and for the tiny model):"]
    for f in GRAIL_FIELDS:
        lines.append(f"  --{f.name} (default {f.default!r})")
        lines += textwrap.wrap(f.metadata.get("help", ""), 96, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


def _parser(methods_epilog: str = "") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grail", description="GRPO with token-level credit assignment.")
    parser.add_argument("--version", action="version", version=f"grail-rl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    epilog = _fields_help() + methods_epilog
    fmt = argparse.RawDescriptionHelpFormatter
    train = sub.add_parser("train", help="train with GRPO on TRL", epilog=epilog, formatter_class=fmt,
                           usage="grail train [--config FILE.yaml] [--preset NAME] [--FIELD VALUE ...]")
    train.add_argument("--config", help="YAML file of field: value (a `preset: NAME` key is allowed)")
    train.add_argument("--preset", choices=sorted(PRESETS), help="start from these values (file and flags win)")
    demo = sub.add_parser("demo", help="the embedded default end to end: warm start, eval, GRPO vs GRAIL, eval",
                          epilog=epilog, formatter_class=fmt, usage="grail demo [--method M1,M2] [--FIELD VALUE ...]")
    demo.add_argument("--method", default="none,grail",
                      help="token_weighting methods to train and compare, comma-separated, from the same start and "
                      "seeds (default: none,grail = GRPO vs GRAIL; `grail methods` lists the methods)")
    eval_cli.add_parsers(sub)
    explain_cli.add_parser(sub)
    compare_cli.add_parser(sub)
    models_cli.add_parser(sub)
    sft_options.add_parser(sub)
    methods = sub.add_parser("methods", help="the token-weighting methods (built-in and plug-ins): what each "
                             "computes, its cost, its own options, its reference")
    methods.add_argument("name", nargs="*", help="only these methods; `grail methods check [NAME ...]` runs the method "
                         "checks (grail.check_method: padding, sign, mass, detach, seeding, option scope, fused = "
                         "separate) on the embedded tiny model, for the named methods or all")
    presets = sub.add_parser("presets", help="print the presets (or one) as YAML")
    presets.add_argument("name", nargs="?", choices=sorted(PRESETS))
    return parser


def _default_run_dir(command: str) -> str:
    return os.path.join("runs", f"{command}-{time.strftime('%Y%m%d-%H%M%S')}")


def _train(args, rest: list[str]) -> int:
    from grail.training.overrides import build_config, merge, parse_flags  # the training layer (TRL) only when training
    from grail.training.run import quiet_libraries, train
    from grail.training.stop import STOPPED_EXIT_CODE, TrainingStopped

    quiet_libraries()

    flags = parse_flags(rest)
    if args.preset:
        flags["preset"] = args.preset
    values = merge(args.config, flags)
    values.setdefault("output_dir", _default_run_dir("train"))
    try:
        result = train(build_config(values), values)
    except TrainingStopped as stopped:  # a signal asked for it: the checkpoint is saved, the same command goes on
        print(f"grail: {stopped}", file=sys.stderr)
        return STOPPED_EXIT_CODE
    finally:
        _close_process_group()
    print(f"done: {result.steps} steps in {result.train_seconds:.1f} s; model saved to {result.final_dir}")
    return 0


def _close_process_group() -> None:
    """Under `accelerate launch`, end the process group before the interpreter exits: left to exit-time teardown,
    gloo's threads can abort a process after its work is done ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _demo(args, rest: list[str]) -> int:
    from grail.methods.table import METHODS, parse_methods, refuse_unread, scoped_values
    from grail.training.demo import run_demo
    from grail.training.overrides import build_config, merge, parse_flags
    from grail.training.run import quiet_libraries

    methods = parse_methods(args.method, example="none,grail")
    quiet_libraries()

    values = merge(None, parse_flags(rest), base=TINY_CPU)
    values.setdefault("output_dir", _default_run_dir("demo"))
    values.setdefault("disable_tqdm", True)
    # each method gets the options it reads; one that none of them reads would do nothing
    refuse_unread(values, [METHODS[m] for m in methods], f"the demo's methods ({', '.join(methods)})")
    shared = {k: v for k, v in values.items() if k != "token_weighting"}
    run_demo(build_config(scoped_values(shared, METHODS["none"])), shared, methods=methods)
    return 0


def _check_methods(names: list[str]) -> int:
    """`grail methods check [NAME ...]`: each method's `check_method` report; exit 1 if any check failed."""
    from grail.analysis.checks import check_method
    from grail.methods.table import METHODS, parse_methods

    failed = 0
    for name in parse_methods(",".join(names), example="grail,ktae") if names else tuple(METHODS):
        report = check_method(name, raise_on_failure=False)
        print(report.text(), flush=True)
        failed += not report.ok
    print(f"{failed} method(s) failed" if failed else "every method passed")
    return 1 if failed else 0


def _methods_epilog(argv: list[str]) -> str:
    """For `grail train|demo --help`: the method table with each method's own options (loads torch, so only then)."""
    if len(argv) < 2 or argv[0] not in ("train", "demo") or not {"-h", "--help"} & set(argv):
        return ""
    from grail.methods.table import describe

    return "\n\ntoken_weighting methods and their own options (`grail methods`):\n" + describe()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args, rest = _parser(_methods_epilog(argv)).parse_known_args(argv)
    try:
        if args.command == "methods":
            from grail.methods.table import describe, parse_methods

            eval_cli.check_no_extra(args.command, rest)
            if args.name[:1] == ["check"]:
                return _check_methods(args.name[1:])
            names = parse_methods(",".join(args.name), example="grail,ktae") if args.name else None
            print("token_weighting methods (`--token_weighting NAME`, compare arms `NAME@option=value`):")
            print(describe(names))
            return 0
        if args.command == "presets":
            print(presets.render([args.name] if args.name else list(PRESETS)), end="")
            return 0
        if args.command == "train":
            return _train(args, rest)
        if args.command == "explain":
            return explain_cli.run(args, rest)
        if args.command == "compare":
            return compare_cli.run(args, rest)
        if args.command == "sft":
            eval_cli.check_no_extra(args.command, rest)
            from grail.training.sft import run_command  # TRL only when fine-tuning

            return run_command({k: v for k, v in vars(args).items() if k != "command"})
        if args.command == "models":
            eval_cli.check_no_extra(args.command, rest)
            return models_cli.run(args)
        if args.command in ("eval", "grader-check", "validity"):
            eval_cli.check_no_extra(args.command, rest)
            run = {"eval": eval_cli.run_eval, "grader-check": eval_cli.run_grader_check,
                   "validity": eval_cli.run_validity}[args.command]
            return run(args)
        return _demo(args, rest)
    except (ValueError, OSError) as err:  # ConfigError is a ValueError; OSError: missing files, unreachable Hub ids
        if os.environ.get("GRAIL_DEBUG"):
            raise
        print(f"grail: error: {err}", file=sys.stderr)
        return 2


def run() -> None:  # console-script entry point
    sys.exit(main())
