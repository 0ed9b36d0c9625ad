"""Read and check GGUF files before llama.cpp opens them.

A GGUF is untrusted input: a truncated download or a crafted file must fail here with a message,
not crash the native loader. The reader also gives what the pairing check and `inspect` need.
"""

from __future__ import annotations

import errno
import hashlib
import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .errors import IncompatibleModelsError, ModelFileError
from .files import user_path

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
    vocab_digest: str  # sha256 of the serialised token list: equal means identical vocabularies
    chat_template: str | None
    n_embd: int | None = None
    # Where the token embedding table lies in the file (type, byte offset, elements), if any.
    token_embd: TensorSpan | None = None
    output: TensorSpan | None = None  # the output matrix, unless tied to the embeddings
    # A draft with a narrowed output layer (draft_head.py): the file it was narrowed from, that
    # file's vocabulary size, and the original id of each of its own tokens.
    narrowed_from: str | None = None
    full_vocab: int | None = None
    token_ids: np.ndarray | None = field(default=None, compare=False, repr=False)
    causal: bool = True  # False: an encoder (BERT and kin), which embeds text but cannot write it
    # The first tensor stored in a type llama.cpp's CPU code cannot compute with, and the type.
    uncomputable: tuple[str, str] | None = None
    kv_bytes_per_token: int = 0  # llama.cpp's KV cache (F16) per context token; 0: not said

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
            "narrowed_from": self.narrowed_from,
        }


class TensorSpan(NamedTuple):
    ggml_type: int
    offset: int  # from the start of the file
    n_elements: int


class _Array(NamedTuple):
    """A metadata array, left unparsed: its element type, length and byte span in the file."""

    element_type: int
    count: int
    start: int
    end: int


# The fixed-size metadata types (GGUFValueType) as struct formats; STRING and ARRAY are variable.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_U32_TYPE = 4
# Metadata of a draft whose output layer edgespec narrowed to frequent tokens (draft_head.py).
NARROWED_FROM = "edgespec.narrowed.source"  # the file name of the full draft, same directory
NARROWED_VOCAB = "edgespec.narrowed.full_vocab"
NARROWED_IDS = "edgespec.narrowed.token_ids"  # the full draft's id of each kept token
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_DEFAULT_ALIGNMENT = 32


class _TooOld(ValueError):
    """A GGUF of a version llama.cpp no longer reads: whole, not damaged."""


class _Header:
    """A GGUF header (metadata and tensor table) read straight from the mapped file.

    gguf-py's reader builds numpy views for every token of the vocabulary (13-15 s for a 151k-token
    vocabulary here, on every start); this walks the same bytes once and leaves arrays unparsed.
    Every read is bounds-checked: a short or damaged header raises struct.error or ValueError.
    """

    def __init__(self, buf: mmap.mmap):
        self.buf = buf
        self.version = _U32.unpack_from(buf, 4)[0]
        if self.version < 2:
            raise _TooOld(
                f"GGUF version {self.version}, too old for llama.cpp (2 or later is needed)"
            )
        n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
        self.offset = 24
        self.fields: dict[str, object] = {}
        for _ in range(self._bounded(n_kv, 12)):
            key = self._string()
            self.fields[key] = self._value(self._u32())
        # Tensor table: name, dims, type, offset from the (aligned) start of the data section.
        self.tensors: list[tuple[str, int, int, int]] = []  # (name, n_elements, type, offset)
        for _ in range(self._bounded(n_tensors, 24)):
            name = self._string()
            n_dims = self._u32()
            dims = struct.unpack_from(f"<{self._bounded(n_dims, 8)}Q", buf, self.offset)
            self.offset += 8 * n_dims
            ggml_type, offset = struct.unpack_from("<IQ", buf, self.offset)
            self.offset += 12
            self.tensors.append((name, math.prod(dims), ggml_type, offset))
        alignment = self.fields.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0:
            raise ValueError(f"bad general.alignment {alignment!r}")
        self.data_start = -(-self.offset // alignment) * alignment

    def _bounded(self, count: int, min_size: int) -> int:
        """`count` items of at least `min_size` bytes each must fit in what is left of the file:
        a damaged count fails here, not after a loop of billions."""
        if count * min_size > len(self.buf) - self.offset:
            raise ValueError(f"it counts {count:,} entries, more than the rest of the file holds")
        return count

    def _u32(self) -> int:
        value = _U32.unpack_from(self.buf, self.offset)[0]
        self.offset += 4
        return value

    def _string(self) -> str:
        n = _U64.unpack_from(self.buf, self.offset)[0]
        start = self.offset + 8
        self.offset = start + self._bounded(n, 1)
        return self.buf[start : self.offset].decode("utf-8", errors="replace")

    def _value(self, value_type: int) -> object:
        if value_type == _STRING:
            return self._string()
        if value_type == _ARRAY:
            element_type = self._u32()
            count = _U64.unpack_from(self.buf, self.offset)[0]
            self.offset += 8
            start = self.offset
            if element_type == _STRING:  # each is a u64 length then the bytes: walk the lengths
                unpack, buf, offset = _U64.unpack_from, self.buf, self.offset
                for _ in range(self._bounded(count, 8)):
                    offset += 8 + unpack(buf, offset)[0]
                if offset > len(buf):
                    raise ValueError("a string array runs past the end of the file")
                self.offset = offset
            elif element_type in _SCALARS:
                size = struct.calcsize(_SCALARS[element_type])
                self.offset += size * self._bounded(count, size)
            else:  # arrays of arrays (no model we know has one): element by element
                for _ in range(self._bounded(count, 1)):
                    self._value(element_type)
            return _Array(element_type, count, start, self.offset)
        if value_type not in _SCALARS:
            raise ValueError(f"unknown metadata type {value_type}")
        fmt = "<" + _SCALARS[value_type]
        value = struct.unpack_from(fmt, self.buf, self.offset)[0]
        self.offset += struct.calcsize(fmt)
        return value

    def get(self, key: str, kind: type) -> object | None:
        value = self.fields.get(key)
        return value if isinstance(value, kind) else None


def missing_model(name: str | Path) -> ModelFileError:
    """The error for a model path that does not lead to a file, saying why where "not found" would
    mislead: a dangling link, a loop of links, a folder on the way that may not be entered."""
    path = user_path(name, "the model path")
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return ModelFileError(f"model file {name} is a loop of symbolic links")
        if e.errno == errno.EACCES:
            return ModelFileError(f"cannot reach model file {name}: permission denied")
        if e.errno == errno.ENOENT and path.is_symlink():
            target = os.readlink(path)
            return ModelFileError(f"model file {name} is a link to {target}, which is not there")
    return ModelFileError(f"model file not found: {name}")


def read_gguf(path: str | Path) -> GGUFInfo:
    """Check that `path` is a complete, readable GGUF and summarise it (raises ModelFileError)."""
    path = Path(path)
    if not path.exists():
        raise missing_model(path)
    if not path.is_file():
        raise ModelFileError(f"not a file: {path}")
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(4)
        if not magic:  # a download or copy that never started
            raise ModelFileError(f"{path} is empty (0 bytes), not a GGUF file")
        if magic != GGUF_MAGIC:
            raise ModelFileError(
                f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')"
            )
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                header = _Header(buf)
            except _TooOld as e:
                raise ModelFileError(f"{path} is {e}") from None
            except (struct.error, ValueError, OverflowError) as e:
                # struct's own words ("unpack_from requires a buffer of at least 1006 bytes")
                # say where Python read, not what is wrong with the file.
                why = "the file ends inside it" if isinstance(e, struct.error) else str(e)
                raise ModelFileError(
                    f"{path} is truncated or damaged: its header cannot be read ({why})"
                ) from e
            tokens = header.fields.get("tokenizer.ggml.tokens")
            if not isinstance(tokens, _Array) or tokens.element_type != _STRING:
                raise ModelFileError(f"{path} has no tokenizer (tokenizer.ggml.tokens is missing)")
            # Equal serialised token lists (lengths and texts) mean identical vocabularies.
            vocab_digest = hashlib.sha256(buf[tokens.start : tokens.end]).hexdigest()
            ids = header.fields.get(NARROWED_IDS)
            token_ids = None
            if isinstance(ids, _Array) and ids.element_type == _U32_TYPE:
                token_ids = np.frombuffer(buf[ids.start : ids.end], dtype="<u4").astype(np.int64)
            arch = header.get("general.architecture", str) or "unknown"
            kv_bytes = _kv_bytes_per_token(header, arch, buf)

    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    n_params = 0
    uncomputable = None
    for name, n_elements, ggml_type, offset in header.tensors:
        n_params += n_elements
        if uncomputable is None and ggml_type in STORAGE_ONLY_TYPES:
            uncomputable = (name, STORAGE_ONLY_TYPES[ggml_type])
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            continue  # a type newer than our gguf package: llama.cpp checks its bounds itself
        end = header.data_start + offset + n_elements // block * block_bytes
        if end > size:
            raise ModelFileError(
                f"{path} is truncated: tensor {name} needs {end:,} bytes, "
                f"the file has {size:,} (an interrupted download?)"
            )

    if problem := hparams_problem(header, arch):
        raise ModelFileError(f"{path} is damaged: {problem}")
    spans = {
        name: TensorSpan(ggml_type, header.data_start + offset, n_elements)
        for name, n_elements, ggml_type, offset in header.tensors
    }
    narrowed_from = header.get(NARROWED_FROM, str)
    full_vocab = header.get(NARROWED_VOCAB, int)
    if narrowed_from is not None and (
        token_ids is None
        or full_vocab is None
        or len(token_ids) != tokens.count
        or not np.all(np.diff(token_ids) > 0)
        or token_ids[-1] >= full_vocab
    ):
        raise ModelFileError(f"{path} is a narrowed draft whose list of token ids is damaged")
    return GGUFInfo(
        path=path,
        file_size=size,
        version=header.version,
        architecture=arch,
        name=header.get("general.name", str) or path.stem,
        file_type=_file_type_name(header.get("general.file_type", int)),
        n_tensors=len(header.tensors),
        n_params=n_params,
        context_length=header.get(f"{arch}.context_length", int),
        tokenizer_model=header.get("tokenizer.ggml.model", str) or "unknown",
        n_vocab=tokens.count,
        bos=header.get("tokenizer.ggml.bos_token_id", int),
        eos=header.get("tokenizer.ggml.eos_token_id", int),
        vocab_digest=vocab_digest,
        chat_template=header.get("tokenizer.chat_template", str),
        n_embd=header.get(f"{arch}.embedding_length", int),
        token_embd=spans.get("token_embd.weight"),
        output=spans.get("output.weight"),
        narrowed_from=narrowed_from,
        full_vocab=full_vocab if narrowed_from else None,
        token_ids=token_ids if narrowed_from else None,
        causal=header.get(f"{arch}.attention.causal", bool) is not False and arch not in ENCODERS,
        uncomputable=uncomputable,
        kv_bytes_per_token=kv_bytes,
    )


def _kv_bytes_per_token(header: _Header, arch: str, buf: mmap.mmap) -> int:
    """Bytes of KV cache a context token takes: each layer's key and value heads, in F16 (the
    type edgespec's contexts keep them in). Key and value heads may be counted per layer (an
    array); 0 where the metadata does not say enough."""
    layers = header.get(f"{arch}.block_count", int)
    heads = header.get(f"{arch}.attention.head_count", int)
    n_embd = header.get(f"{arch}.embedding_length", int)
    kv_heads = header.fields.get(f"{arch}.attention.head_count_kv", heads)
    if not layers or not 1 <= layers <= MAX_LAYERS or not heads or not n_embd:
        return 0
    if isinstance(kv_heads, _Array):  # per layer (OpenELM and kin)
        if kv_heads.element_type not in _SCALARS or kv_heads.count != layers:
            return 0
        fmt = f"<{kv_heads.count}{_SCALARS[kv_heads.element_type]}"
        all_kv_heads = int(sum(struct.unpack_from(fmt, buf, kv_heads.start)))
    elif isinstance(kv_heads, int):
        all_kv_heads = kv_heads * layers
    else:
        return 0
    key = header.get(f"{arch}.attention.key_length", int) or n_embd // heads
    value = header.get(f"{arch}.attention.value_length", int) or n_embd // heads
    return max(all_kv_heads * (key + value) * 2, 0)


# llama.cpp's LLAMA_MAX_LAYERS and LLAMA_MAX_EXPERTS, and the rope scalings it knows: past them
# it aborts on an assertion while loading, taking Python with it.
MAX_LAYERS = 512
MAX_EXPERTS = 1024
ROPE_SCALINGS = frozenset({"none", "linear", "yarn", "longrope"})


def hparams_problem(header: _Header, arch: str) -> str | None:
    """What in a model's hyperparameters would abort llama.cpp (an assertion while loading or at
    the first pass) or make every logit NaN, said by key and value; None if nothing does."""

    def number(key: str) -> float | None:
        value = header.fields.get(f"{arch}.{key}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return value

    def bad(key: str, value: object, allowed: str) -> str:
        return f"{arch}.{key} is {value}, where llama.cpp needs {allowed}"

    layers = number("block_count")
    if layers is not None and not 1 <= layers <= MAX_LAYERS:
        return bad("block_count", layers, f"1 to {MAX_LAYERS}")
    trained = number("context_length")
    if trained is not None and trained > 2**31 - 1:  # llama.cpp reads it into an int32
        return bad("context_length", trained, f"at most {2**31 - 1:,}")
    for key in ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"):
        eps = number(key)
        if eps is not None and not 0 <= eps < 1:  # NaN fails both
            return bad(key, eps, "a number from 0 to below 1")
    base = number("rope.freq_base")
    if base is not None and not 0 < base < math.inf:
        return bad("rope.freq_base", base, "a positive number")
    factor = number("rope.scaling.factor")
    if factor is not None and not 0 <= factor < math.inf:
        return bad("rope.scaling.factor", factor, "a number of 0 or more")
    scaling = header.fields.get(f"{arch}.rope.scaling.type")
    if isinstance(scaling, str) and scaling not in ROPE_SCALINGS:
        return bad("rope.scaling.type", scaling, f"one of {', '.join(sorted(ROPE_SCALINGS))}")
    experts, used = number("expert_count") or 0, number("expert_used_count") or 0
    if experts > MAX_EXPERTS:
        return bad("expert_count", experts, f"at most {MAX_EXPERTS}")
    if (experts or used) and not 1 <= used <= experts:
        return f"{arch}.expert_used_count is {used} of {arch}.expert_count {experts} experts"
    return None


def _file_type_name(file_type: int | None) -> str:
    if file_type is None:
        return "unknown"
    try:
        from gguf import LlamaFileType

        return LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except (ImportError, ValueError):
        return str(file_type)


def source_of(info: GGUFInfo) -> GGUFInfo:
    """The full draft a narrowed one was made from (it lends its embeddings and vocabulary)."""
    assert info.narrowed_from is not None
    name = info.narrowed_from
    if not name or "/" in name or "\\" in name or name in (".", ".."):  # a crafted file's:
        raise ModelFileError(  # with_name raised ValueError, a traceback
            f"{info.path.name} says it was narrowed from {name!r}, which is no file name"
        )
    source = info.path.with_name(name)
    if not source.exists():
        raise ModelFileError(
            f"{info.path.name} is a draft narrowed from {info.narrowed_from}, which is missing "
            f"from {info.path.parent}; delete {info.path.name} and use the full draft"
        )
    return read_gguf(source)


def token_texts(info: GGUFInfo) -> list[bytes]:
    """The text of every token, by id, as the file stores it (tokenizer.ggml.tokens)."""
    with info.path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        tokens = _Header(buf).fields["tokenizer.ggml.tokens"]
        assert isinstance(tokens, _Array)  # read_gguf checked it
        texts, at = [], tokens.start
        for _ in range(tokens.count):
            (n,) = _U64.unpack_from(buf, at)
            texts.append(buf[at + 8 : at + 8 + n])
            at += 8 + n
        return texts


def same_token_texts(draft: GGUFInfo, target: GGUFInfo) -> bool:
    """llama.cpp's rule for a pair whose vocabularies differ: the texts of the ids both have
    are equal, but for the first five (special tokens that may differ harmlessly)."""
    if draft.narrowed_from is not None:
        draft = source_of(draft)
    a, b = token_texts(draft), token_texts(target)
    return all(a[i] == b[i] for i in range(5, min(len(a), len(b))))


def pairing_problem(draft: GGUFInfo, target: GGUFInfo) -> str | None:
    """Why `draft` cannot propose tokens for `target`, or None if it can.

    Speculation compares token ids, so both must mean the same thing by every id. Identical
    vocabularies always pass; otherwise llama.cpp's rule applies: same tokenizer type and special
    tokens, sizes within 128, and equal token texts (same_token_texts, read from the files).
    """
    if target.narrowed_from is not None:  # its logits cover some tokens only (engine.load)
        return f"{target.path.name} is a narrowed draft: it can only draft"
    if draft.narrowed_from is not None:  # it speaks its full draft's vocabulary
        draft = source_of(draft)
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
    if not same_token_texts(draft, target):
        return "token texts differ"
    return None


# Types a GGUF can store that llama.cpp's CPU code has no arithmetic for (ggml type ids): a
# weight in one of them aborts or crashes it at the first pass, taking Python down with it.
STORAGE_ONLY_TYPES = {24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64"}

# Encoders whose header need not say that their attention is not causal (T5's encoder alone).
ENCODERS = frozenset({"t5encoder"})


def check_generates(info: GGUFInfo) -> None:
    """Refuse, by name, a model llama.cpp would load and then fail to run: an embedding model
    "generated" nothing (exit 0) or aborted llama.cpp's profile; weights in a type llama.cpp
    stores but cannot compute with (F64, integers) abort or crash it at the first pass."""
    if not info.causal:
        raise ModelFileError(
            f"{info.path.name} is an embedding model ({info.architecture}, its attention sees "
            "the whole text at once): it cannot generate text"
        )
    if info.uncomputable is not None:
        name, type_name = info.uncomputable
        raise ModelFileError(
            f"{info.path.name} stores tensor {name} as {type_name}, which llama.cpp cannot "
            "compute with on a CPU (convert the model with F32, F16 or a quantized type)"
        )


def check_pair(draft: GGUFInfo, target: GGUFInfo) -> None:
    problem = pairing_problem(draft, target)
    if problem:
        raise IncompatibleModelsError(
            f"draft {draft.path.name} cannot draft for target {target.path.name}: {problem}; "
            "both models need the same vocabulary"
        )
