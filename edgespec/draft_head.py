"""A draft whose output layer knows only the tokens text is mostly made of (FR-Spec, 2025).

A 0.5B draft with a 151,936-token vocabulary spends about a fifth of each step on its output
matrix (76 MB of Q4_0 read per token), and edgespec then scans its 151,936 logits for the argmax
and its probability. Most of those tokens almost never occur: 32,768 of them cover 97 % of the
code and 96 % of the chat the target wrote on the bench prompts. A copy of the draft whose output
matrix has only those rows took 7.2 ms a step instead of 8.6 here.

What the kept set misses is mostly the text's own rare words: the names in a prompt ("indrome"
of is_palindrome). With those lost, chains on code were 8 % slower than the full draft's. So the
tokens outside the set that the draft is fed (the prompt, the answer so far) are scored here too:
the draft's last hidden state (llama.cpp gives it with the logits) times their rows of the full
output matrix, a few dozen dot products a step. Chains on code then ran 2-3 % faster than with
the full draft, and trees 7 %.

llama.cpp sizes both the input and the output table by the vocabulary, so the narrowed file
holds a narrowed vocabulary (its token j is the full draft's `token_ids[j]`), and the draft is fed
embeddings instead of token ids: rows of the full draft's table, read from its file.

Which tokens to keep: the special ones, then those most frequent in the Python standard library
of the interpreter running edgespec (code, and English in its docstrings and comments; a corpus
every device running edgespec has, that knows nothing of the bench's prompts), tokenized by the
draft itself, then the lowest ids.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ModelFileError
from .gguf_info import (
    NARROWED_FROM,
    NARROWED_IDS,
    NARROWED_VOCAB,
    GGUFInfo,
    TensorSpan,
    source_of,
)

PER_TOKEN_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
HEAD_TOKENS = 32768  # tokens kept; FR-Spec's choice for Llama-3's 128k vocabulary, as here
CORPUS_EVERY = 4  # one file in this many of the standard library: ~7 MB, ~2 s to tokenize
# Tokens outside the kept set scored by edgespec: each costs a dot product per draft step.
MAX_EXTRA_TOKENS = 512


def narrowed_path(draft: Path, n_keep: int = HEAD_TOKENS) -> Path:
    """`draft`'s narrowed copy of `n_keep` tokens: `.head32k` for 32,768, `.head9000` for 9,000
    (named by thousands of 1,024 it replaced the copy of 8,192 without a word)."""
    size = f"{n_keep // 1024}k" if n_keep % 1024 == 0 else str(n_keep)
    return draft.with_name(f"{draft.stem}.head{size}.gguf")


def stdlib_corpus(every: int = CORPUS_EVERY) -> list[Path]:
    """Every `every`-th Python file of the standard library, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return files[::every]


def frequent_tokens(
    tokenize: Callable[[str], list[int]],
    n_vocab: int,
    always: Sequence[int],
    n_keep: int = HEAD_TOKENS,
    corpus: Sequence[Path] | None = None,
) -> np.ndarray:
    """The ids of `always`, then of the tokens most frequent in the corpus, then the lowest ids
    (a BPE vocabulary lists tokens in the order they were merged, the most frequent first in its
    training text: other languages' common tokens), `n_keep` in all, sorted."""
    counts = np.zeros(n_vocab, dtype=np.int64)
    for path in stdlib_corpus() if corpus is None else corpus:
        try:
            text = path.read_text("utf-8", errors="replace")
        except OSError:
            continue
        np.add.at(counts, tokenize(text), 1)
    keep = np.zeros(n_vocab, dtype=bool)
    keep[np.asarray(always, dtype=np.int64)] = True
    room = max(n_keep - int(keep.sum()), 0)
    ranked = np.argsort(-counts, kind="stable")
    ranked = ranked[(counts[ranked] > 0) & ~keep[ranked]]
    keep[ranked[:room]] = True
    room = max(n_keep - int(keep.sum()), 0)
    keep[np.flatnonzero(~keep)[:room]] = True
    return np.flatnonzero(keep)


def write_narrowed(src: Path, dst: Path, token_ids: np.ndarray) -> None:
    """A copy of the GGUF `src` whose vocabulary, embedding and output tables keep only
    `token_ids` (sorted), with the metadata that maps them back (gguf_info.NARROWED_*)."""
    import gguf

    tokens = gguf.GGUFReader(src).fields["tokenizer.ggml.tokens"].contents()
    kept_texts = {tokens[i] for i in token_ids}
    new_id = {int(old): new for new, old in enumerate(token_ids)}

    def edit(name: str, value: Any) -> Any:
        if name in PER_TOKEN_FIELDS:
            return [value[i] for i in token_ids]
        if name == "tokenizer.ggml.merges":  # those that make a kept token from kept ones
            return [
                m
                for m in value
                if m.replace(" ", "", 1) in kept_texts
                and all(part in kept_texts for part in m.split(" ", 1))
            ]
        if name.startswith("tokenizer.ggml.") and name.endswith("_token_id"):
            # llama.cpp falls back to its default for one that is gone, never used here
            return new_id.get(int(value), DROP)
        if name == "general.name":
            return f"{value} (output narrowed to {len(token_ids)} tokens)"
        return value

    def added(writer: gguf.GGUFWriter) -> None:
        writer.add_string(NARROWED_FROM, src.name)
        writer.add_uint32(NARROWED_VOCAB, len(tokens))
        writer.add_key_value(
            NARROWED_IDS,
            [int(i) for i in token_ids],
            gguf.GGUFValueType.ARRAY,
            sub_type=gguf.GGUFValueType.UINT32,
        )

    rewrite_gguf(src, dst, edit, token_ids, added)


DROP = object()  # what rewrite_gguf's `edit` returns for a field to leave out


def rewrite_gguf(
    src: Path,
    dst: Path,
    edit: Callable[[str, Any], Any],
    token_rows: Sequence[int] | np.ndarray,
    add: Callable[[Any], None] = lambda writer: None,
) -> None:
    """A copy of the GGUF `src` at `dst`: each metadata field's value as `edit(name, value)` makes
    it (DROP: left out), `add(writer)` writes new ones, and the embedding and output tables keep
    the rows `token_rows`, in that order (one row per token, quantized or not)."""
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        value = edit(field.name, field.contents())
        if value is DROP:
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
    add(writer)
    tensors = []
    for tensor in reader.tensors:
        data = tensor.data
        if tensor.name in ("token_embd.weight", "output.weight"):
            data = np.ascontiguousarray(data[token_rows])
        tensors.append(data)
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data in tensors:
        writer.write_tensor_data(data, tensor_endianess=reader.endianess)
    writer.close()


# llama.cpp's dequantizer of one row: (source address, float32 destination address, values).
RowDequantizer = Callable[[int, int, int], None]


class TableRows:
    """Rows of a tensor of a GGUF (one per token) as float32, dequantized on demand by
    llama.cpp's own function for the type (`dequantize`), so fed as embeddings they give the
    same logits as its own lookup. A row costs a few microseconds: no cache is worth keeping."""

    def __init__(self, path: Path, span: TensorSpan, n_embd: int, dequantize: RowDequantizer):
        from gguf.constants import GGML_QUANT_SIZES

        block, block_bytes = GGML_QUANT_SIZES[span.ggml_type]
        self.n_embd = n_embd
        n_rows = span.n_elements // n_embd
        self._row_bytes = n_embd // block * block_bytes
        self._table = np.memmap(
            path, dtype=np.uint8, mode="r", offset=span.offset, shape=(n_rows, self._row_bytes)
        )
        self._address = self._table.ctypes.data
        self._dequantize = dequantize

    def into(self, tokens: Sequence[int], out: np.ndarray) -> None:
        """out[i] = the row of tokens[i]; `out` is a C-contiguous float32 (>= n, n_embd) array."""
        assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape[-1] == self.n_embd
        self.into_address(tokens, out.ctypes.data)

    def into_address(self, tokens: Sequence[int], dst: int) -> None:
        """`into` an array at address `dst` (a draft step's: its checks and address cost more
        than the row, right after a decode)."""
        address, row_bytes, n = self._address, self._row_bytes, self.n_embd
        for i, token in enumerate(tokens):
            self._dequantize(address + token * row_bytes, dst + i * n * 4, n)


class NarrowedHead:
    """What a narrowed draft needs beyond llama.cpp: its input embeddings, and the logits of the
    tokens outside its kept set that the text it was fed contains (the prompt's names, say),
    scored here as the draft's last hidden state times their rows of the full output matrix.

    Logits rows come out as the kept tokens' then these extra tokens': row j is token ids[j].
    """

    def __init__(self, info: GGUFInfo, dequantizer: Callable[[int], RowDequantizer]):
        """`dequantizer(ggml_type)`: llama.cpp's row dequantizer for a type (backend.py)."""
        assert info.token_ids is not None and info.full_vocab is not None
        source = source_of(info)
        if source.token_embd is None or not source.n_embd:
            raise ModelFileError(f"{source.path} has no token embedding table")
        self.n_embd = source.n_embd

        def table(span: TensorSpan) -> TableRows:
            return TableRows(source.path, span, self.n_embd, dequantizer(span.ggml_type))

        self.embeddings = table(source.token_embd)
        # The output matrix, or the embedding table where the model ties them.
        self._output = table(source.output or source.token_embd)
        self.n_kept = len(info.token_ids)
        self._known = np.zeros(info.full_vocab, dtype=bool)  # kept, or already an extra
        self._known[info.token_ids] = True
        self.ids: list[int] = info.token_ids.tolist()
        self._id_array = np.empty(self.n_kept + MAX_EXTRA_TOKENS, dtype=np.int64)
        self._id_array[: self.n_kept] = info.token_ids
        self._extra_rows = np.empty((MAX_EXTRA_TOKENS, self.n_embd), dtype=np.float32)
        self.n_extra = 0
        self._row = np.empty(self.n_kept + MAX_EXTRA_TOKENS, dtype=np.float32)
        self._proposable = self.n_kept  # kept columns from here on are never proposed

    def propose_below(self, n_vocab: int) -> None:
        """Never propose a kept token whose id is `n_vocab` or more: a target with a smaller
        vocabulary could not evaluate it. Kept ids are sorted, so those are the last columns."""
        self._proposable = int(np.searchsorted(self._id_array[: self.n_kept], n_vocab))

    def feed_one(self, token: int, dst: int) -> None:
        """`feed` of one token into the float32 row at address `dst`: a draft step."""
        if not self._known[token]:
            self._add_extras([token])
        self.embeddings.into_address((token,), dst)

    def feed(self, tokens: Sequence[int], out: np.ndarray) -> None:
        """out[i] = the embedding of tokens[i]; tokens outside the kept set become extras."""
        assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape[-1] == self.n_embd
        self.feed_at(tokens, out.ctypes.data)

    def feed_at(self, tokens: Sequence[int], dst: int) -> None:
        """`feed` into the float32 rows at address `dst` (a draft batch's). A loop, not numpy:
        the batches of the decode loop are a few tokens (a chain round's first: 142 -> 52 µs here),
        where each numpy call right after a decode costs more than the loop; a prompt's rows
        are a ctypes call each anyway."""
        self.learn(tokens)
        self.embeddings.into_address(tokens, dst)

    def learn(self, tokens: Sequence[int]) -> None:
        """The tokens outside the kept set become extras: the text holds them."""
        known = self._known
        unknown = [int(token) for token in tokens if not known[token]]
        if unknown:
            self._add_extras(list(dict.fromkeys(unknown)))

    def _add_extras(self, tokens: list[int]) -> None:
        if self.n_extra + len(tokens) > MAX_EXTRA_TOKENS:  # a long chat: start again
            self._known[self.id_array[self.n_kept :]] = False
            self.n_extra = 0
            del self.ids[self.n_kept :]
            tokens = tokens[-MAX_EXTRA_TOKENS:]
        at = self.n_extra
        self._output.into(tokens, self._extra_rows[at : at + len(tokens)])
        self._id_array[self.n_kept + at : self.n_kept + at + len(tokens)] = tokens
        self.n_extra += len(tokens)
        self._known[tokens] = True
        self.ids.extend(tokens)

    @property
    def id_array(self) -> np.ndarray:
        """`ids` as an array."""
        return self._id_array[: self.n_kept + self.n_extra]

    def logits(self, kept: np.ndarray, hidden: np.ndarray) -> np.ndarray:
        """The logits of a row (or rows): llama.cpp's for the kept tokens, then the extras'."""
        if self._proposable < self.n_kept:  # rare: a padded vocabulary wider than the target's
            kept[..., self._proposable :] = -np.inf
        n = self.n_extra
        if n == 0:
            return kept
        width = self.n_kept + n
        if kept.ndim == 1:  # a draft step: no temporaries
            combined = self._row[:width]
            combined[: self.n_kept] = kept
            np.dot(self._extra_rows[:n], hidden, out=combined[self.n_kept :])
            return combined
        combined = np.empty((len(kept), width), dtype=np.float32)
        combined[:, : self.n_kept] = kept
        # Row by row, not `hidden @ rows.T`: a matrix product wakes numpy's BLAS thread, which
        # then spins for ~0.1 s on the cores llama.cpp's threads need. Here the two draft steps
        # after a pass of 8 took 48 and 44 ms instead of 24, and the draft's profile (passes
        # with every row's logits, each after a timed step) put a step at 46-60 ms, 0.63 of a
        # target step. A matrix-vector product stays on this thread.
        extra_rows = self._extra_rows[:n]
        for row, state in zip(combined, hidden, strict=True):
            np.dot(extra_rows, state, out=row[self.n_kept :])
        return combined
