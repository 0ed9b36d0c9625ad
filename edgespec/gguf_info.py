"""Read and check GGUF files before llama.cpp opens them.

A GGUF is untrusted input: a truncated download or a crafted file must fail here with a message,
not crash the native loader. The reader also gives what the pairing check and `inspect` need.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import IncompatibleModelsError, ModelFileError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    file_size: int
    version: int
    architecture: str
    name: str
    file_type: str
    n_tensors: int
    n_params: int
    context_length: int | None
    tokenizer_model: str
    n_vocab: int
    bos: int | None
    eos: int | None
    vocab_digest: str  # sha256 of all token texts: equal digests mean identical vocabularies
    chat_template: str | None

    def summary(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "size_mib": round(self.file_size / 2**20, 1),
            "architecture": self.architecture,
            "name": self.name,
            "file_type": self.file_type,
            "parameters": self.n_params,
            "tensors": self.n_tensors,
            "context_length": self.context_length,
            "tokenizer": self.tokenizer_model,
            "vocab_size": self.n_vocab,
            "bos": self.bos,
            "eos": self.eos,
            "chat_template": self.chat_template is not None,
        }


def _scalar(reader, key: str):
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    if field.types and field.types[0].name == "STRING":
        return bytes(value).decode("utf-8", errors="replace")
    return value.tolist()[0]


def read_gguf(path: str | Path) -> GGUFInfo:
    """Check that `path` is a complete, readable GGUF and summarise it (raises ModelFileError)."""
    from gguf import GGUFReader  # imported here: it is slow to import and not always needed

    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"not a file: {path}")
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    try:
        reader = GGUFReader(path, "r")
    except Exception as e:  # the reader raises many kinds on bad input; all mean "broken file"
        raise ModelFileError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from e

    n_params = 0
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise ModelFileError(
                f"{path} is truncated: tensor {tensor.name} needs {end:,} bytes, "
                f"the file has {size:,} (an interrupted download?)"
            )
        n_params += int(tensor.n_elements)

    arch = _scalar(reader, "general.architecture") or "unknown"
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelFileError(f"{path} has no tokenizer (tokenizer.ggml.tokens is missing)")
    # Hash the token texts in one pass over the raw array parts instead of decoding 150k strings.
    digest = hashlib.sha256()
    for i in tokens.data:
        digest.update(np.asarray(tokens.parts[i]).tobytes())
        digest.update(b"\0")
    file_type = _scalar(reader, "general.file_type")
    return GGUFInfo(
        path=path,
        file_size=size,
        version=int(_scalar(reader, "GGUF.version") or 0),
        architecture=arch,
        name=_scalar(reader, "general.name") or path.stem,
        file_type=_file_type_name(file_type),
        n_tensors=len(reader.tensors),
        n_params=n_params,
        context_length=_scalar(reader, f"{arch}.context_length"),
        tokenizer_model=_scalar(reader, "tokenizer.ggml.model") or "unknown",
        n_vocab=len(tokens.data),
        bos=_scalar(reader, "tokenizer.ggml.bos_token_id"),
        eos=_scalar(reader, "tokenizer.ggml.eos_token_id"),
        vocab_digest=digest.hexdigest(),
        chat_template=_scalar(reader, "tokenizer.chat_template"),
    )


def _file_type_name(file_type: int | None) -> str:
    if file_type is None:
        return "unknown"
    try:
        from gguf import LlamaFileType

        return LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except (ImportError, ValueError):
        return str(file_type)


def pairing_problem(
    draft: GGUFInfo, target: GGUFInfo, texts_match: Callable[[], bool] | None = None
) -> str | None:
    """Why `draft` cannot propose tokens for `target`, or None if it can.

    Speculation compares token ids, so both must mean the same thing by every id. Identical
    vocabularies always pass; otherwise llama.cpp's rule applies: same tokenizer type and special
    tokens, sizes within 128, and equal token texts (`texts_match`, from the loaded vocabularies).
    """
    if draft.vocab_digest == target.vocab_digest and draft.bos == target.bos:
        return None
    if draft.tokenizer_model != target.tokenizer_model:
        return f"tokenizer types differ ({draft.tokenizer_model} vs {target.tokenizer_model})"
    if abs(draft.n_vocab - target.n_vocab) > 128:
        return f"vocabulary sizes differ ({draft.n_vocab} vs {target.n_vocab})"
    if draft.bos != target.bos or draft.eos != target.eos:
        return (
            f"special tokens differ (BOS {draft.bos} vs {target.bos}, "
            f"EOS {draft.eos} vs {target.eos})"
        )
    if texts_match is None or not texts_match():
        return "token texts differ"
    return None


def check_pair(
    draft: GGUFInfo, target: GGUFInfo, texts_match: Callable[[], bool] | None = None
) -> None:
    problem = pairing_problem(draft, target, texts_match)
    if problem:
        raise IncompatibleModelsError(
            f"draft {draft.path.name} cannot draft for target {target.path.name}: {problem}; "
            "both models need the same vocabulary"
        )
