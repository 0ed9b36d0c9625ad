"""Shared fixtures: real GGUF models through the real llama.cpp, kept small.

The target is SmolLM2-135M (fetched by `make test` into the edgespec cache). Drafts are the same
file (acceptance near 1) and requantized copies made here with llama.cpp's quantizer, which
disagree with the target often enough to exercise rejections.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

import edgespec
from edgespec import catalogue

SMOL = "smollm2-135m"
N_CTX = 1024


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory) -> Iterator[Path]:
    """An EDGESPEC_HOME of the test session's own (no profiles or config of the developer's
    leak in, none leak out), sharing the real home's downloaded models."""
    models = catalogue.models_dir()
    models.mkdir(parents=True, exist_ok=True)
    home = tmp_path_factory.mktemp("edgespec-home")
    (home / "models").symlink_to(models, target_is_directory=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EDGESPEC_HOME", str(home))
        yield home


@pytest.fixture(autouse=True)
def collections_between_tests() -> Iterator[None]:
    """Python's cycle collector runs between tests, not inside them. A full collection of this
    process (the session's engines, results and models' vocabularies) paused it for 0.18-0.37 s
    (245 collections over 20 ms in one run of the suite), and one landing inside what a test
    times is that test's noise, not edgespec's: a tree round's draft step was priced at 0.23 s
    where the draft took 0.04 (a CI run, 2026-11-30). In a process running edgespec alone a full
    collection takes 4-7 ms. Counting references frees everything else as usual."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture(scope="session")
def smol_path() -> Path:
    return catalogue.local_path(SMOL) or catalogue.fetch(SMOL)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma-3-270M: a SentencePiece vocabulary, unlike SmolLM2's and Qwen's byte-level BPE."""
    return catalogue.local_path("gemma3-270m") or catalogue.fetch("gemma3-270m")


def _requantized(tmp_path_factory, src: Path, type_name: str) -> Path:
    import llama_cpp

    from edgespec.backend import quantize

    dest = tmp_path_factory.mktemp("drafts") / f"smollm2-135m-{type_name}.gguf"
    quantize(src, dest, getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}"))
    return dest


@pytest.fixture(scope="session")
def smol_without_template(tmp_path_factory, smol_path) -> Path:
    """A copy of SmolLM2 whose GGUF has no chat template."""
    import subprocess
    import sys

    bare = tmp_path_factory.mktemp("bare") / "smollm2-135m-no-template.gguf"
    remove = ["--force", "--remove-metadata", "tokenizer.chat_template"]
    command = [sys.executable, "-m", "gguf.scripts.gguf_new_metadata", *remove]
    subprocess.run([*command, str(smol_path), str(bare)], check=True, capture_output=True)
    return bare


@pytest.fixture(scope="session")
def smol_q4_0(tmp_path_factory, smol_path) -> Path:
    return _requantized(tmp_path_factory, smol_path, "Q4_0")


@pytest.fixture(scope="session")
def smol_q2_k(tmp_path_factory, smol_path) -> Path:
    return _requantized(tmp_path_factory, smol_path, "Q2_K")


@pytest.fixture(scope="session")
def plain_engine(smol_path) -> edgespec.Engine:
    return edgespec.load(smol_path, n_ctx=N_CTX)


@pytest.fixture(scope="session")
def self_draft_engine(smol_path) -> edgespec.Engine:
    return edgespec.load(smol_path, draft=smol_path, n_ctx=N_CTX)


@pytest.fixture(scope="session")
def q4_draft_engine(smol_path, smol_q4_0) -> edgespec.Engine:
    return edgespec.load(smol_path, draft=smol_q4_0, n_ctx=N_CTX)


@pytest.fixture(scope="session")
def q2_draft_engine(smol_path, smol_q2_k) -> edgespec.Engine:
    return edgespec.load(smol_path, draft=smol_q2_k, n_ctx=N_CTX)
