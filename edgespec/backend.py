"""The one seam to llama.cpp (through llama-cpp-python's low-level ctypes API, version 0.3.36).

Everything edgespec asks of llama.cpp goes through `Model` and `Context`: load a GGUF, decode a
batch of rows (token, position, sequence ids, wants-logits), read logits as numpy, edit the KV
cache per sequence, tokenize and detokenize. Nothing here knows about speculation.
"""

from __future__ import annotations

import ctypes
import functools
import math
import re
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import llama_cpp as ll
import numpy as np

from .cores import PinnedThread
from .draft_head import NarrowedHead, RowDequantizer
from .errors import ContextOverflowError, ModelFileError
from .gguf_info import GGUFInfo, read_gguf
from .governor import ThreadGovernor
from .interrupts import interrupts_held
from .text import valid_text

_verbose = False
GOVERNED_UP_TO = 32  # tokens: longer passes (prompts) tell the governor nothing it can use
PREFILL_ROWS_NARROWED = 64  # rows of a narrowed draft's prompt batches (Context.decode)
# ggml's log levels (ggml.h; llama-cpp-python's _logger.py numbers them one lower).
_LOG_WARN, _LOG_ERROR = 3, 4


class _NativeLog(threading.local):
    """What llama.cpp said went wrong on this thread since `clear`, to explain a failed load:
    the target and the draft load at once, on two threads, and each failure names its own."""

    def __init__(self) -> None:
        self.errors: deque[str] = deque(maxlen=8)
        self.warnings: deque[str] = deque(maxlen=8)

    def clear(self) -> None:
        self.errors.clear()
        self.warnings.clear()

    def reason(self, default: str) -> str:
        # The first error is the cause ("unknown model architecture: 'x'"); those after it say
        # what failed because of it ("failed to load model").
        said = self.errors[0] if self.errors else self.warnings[-1] if self.warnings else None
        if said is None:
            return default
        return re.sub(r"^\w+: ", "", said)  # the C function's name says nothing to a user


_native_log = _NativeLog()


@ll.llama_log_callback
def _on_native_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace")
    if _verbose:
        sys.stderr.write(message)
    if level == _LOG_ERROR:
        _native_log.errors.append(message.strip())
    elif level == _LOG_WARN:
        _native_log.warnings.append(message.strip())


_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        # The callback object lives at module level: a collected ctypes callback crashes llama.cpp.
        ll.llama_log_set(_on_native_log, ctypes.c_void_p(0))
        ll.llama_backend_init()
        _backend_ready = True


def set_verbose(verbose: bool) -> None:
    """Let llama.cpp's own log through to stderr (quiet by default)."""
    global _verbose
    _verbose = verbose
    _init_backend()


# llama_get_logits returning a plain int (the buffer's address): the binding's own returns a
# ctypes pointer object, whose making and casting cost more than the call. `_lib` is the loaded
# library of the pinned llama-cpp-python (pyproject.toml); indexing makes a function of our own.
_logits_address = ll.llama_cpp._lib["llama_get_logits"]
_logits_address.argtypes = [ctypes.c_void_p]
_logits_address.restype = ctypes.c_void_p
_hidden_address = ll.llama_cpp._lib["llama_get_embeddings"]
_hidden_address.argtypes = [ctypes.c_void_p]
_hidden_address.restype = ctypes.c_void_p


def row_dequantizer(ggml_type: int) -> RowDequantizer:
    """llama.cpp's function turning one row of a tensor of `ggml_type` into float32:
    f(source address, destination address, number of values). F32 rows are copied."""
    from gguf.constants import GGMLQuantizationType
    from llama_cpp._ggml import libggml

    name = GGMLQuantizationType(ggml_type).name
    if name == "F32":
        return lambda src, dst, n: ctypes.memmove(dst, src, n * 4)
    symbol = {"F16": "ggml_fp16_to_fp32_row", "BF16": "ggml_bf16_to_fp32_row"}.get(
        name, f"dequantize_row_{name.lower()}"
    )
    try:
        function = libggml[symbol]
    except AttributeError:
        raise ModelFileError(f"this llama.cpp cannot read {name} tensors") from None
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    function.restype = None
    return function


class Model:
    """A GGUF model loaded into memory by llama.cpp, with its vocabulary."""

    def __init__(
        self,
        path: str | Path,
        info: GGUFInfo | None = None,
        use_mmap: bool = False,
        vocab_only: bool = False,
        *,
        progress: Callable[[float], object] | None = None,
        cancel: threading.Event | None = None,
    ):
        """`progress` is told the fraction loaded as each tensor is read (from the loading
        thread). The load stops at the next tensor once `cancel` is set, or at a Ctrl+C (held
        until then: a Pi's SD card takes ~30 s for the 1.5B target) which sets it; a cancelled
        load raises KeyboardInterrupt."""
        _init_backend()
        self._model = None  # close() may run on a half-made Model
        self._contexts = 0  # open contexts on it: llama.cpp frees each with the model's help
        self._close_when_unused = False
        self.path = Path(path)
        self.info = info or read_gguf(self.path)
        # A draft narrowed to frequent tokens (draft_head.py): its logits row j is token
        # head.ids[j], and it is fed the full draft's embeddings, not token ids.
        self.head: NarrowedHead | None = None
        if self.info.narrowed_from is not None and not vocab_only:
            self.head = NarrowedHead(self.info, row_dequantizer)
        params = ll.llama_model_default_params()
        params.n_gpu_layers = 0
        params.vocab_only = vocab_only
        # Read the weights into memory instead of mapping the file: mapped pages are page cache,
        # which the OS may reclaim while we generate (seen here: decoding fell from 23 to 0.4
        # tokens/s as weights were re-read from disk every step). Anonymous memory stays.
        params.load_mode = ll.LLAMA_LOAD_MODE_MMAP if use_mmap else ll.LLAMA_LOAD_MODE_NONE
        cancel = cancel or threading.Event()

        def on_progress(fraction: float, _user_data: ctypes.c_void_p) -> bool:
            if progress is not None:
                progress(fraction)
            return not cancel.is_set()  # False: llama.cpp stops loading

        params.progress_callback = ll.llama_progress_callback(on_progress)  # alive: a local
        _native_log.clear()
        with interrupts_held(on_signal=cancel.set):
            self._model = ll.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model and cancel.is_set():  # on the main thread the signal's handler
            raise KeyboardInterrupt  # has raised already
        if not self._model:
            reason = _native_log.reason("unknown reason")
            raise ModelFileError(f"llama.cpp could not load {self.path}: {reason}")
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.n_vocab: int = ll.llama_vocab_n_tokens(self._vocab)  # rows of logits
        # Ids a token can have: the full draft's vocabulary for a narrowed one.
        self.vocab_size: int = self.info.full_vocab or self.n_vocab
        self._eog_ids: frozenset[int] | None = None
        if self.info.token_ids is not None:  # ids in the full vocabulary
            ids = self.info.token_ids
            self._eog_ids = frozenset(
                int(ids[j]) for j in range(self.n_vocab) if ll.llama_vocab_is_eog(self._vocab, j)
            )
        self.bos: int = ll.llama_vocab_bos(self._vocab)
        self.eos: int = ll.llama_vocab_eos(self._vocab)
        self.add_bos: bool = bool(ll.llama_vocab_get_add_bos(self._vocab))
        self.n_ctx_train: int = ll.llama_model_n_ctx_train(self._model)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._piece_cache: dict[int, bytes] = {}
        self._eog_memo: dict[int, bool] = {}
        self._control_text_memo: dict[tuple[int, int], bool] = {}
        # Most SentencePiece vocabularies (Llama 2's, Mistral's; not Gemma's) put a space
        # before the text a tokenization starts with, so a text cut in pieces does not tokenize
        # as it does whole. Seen, not read from the vocabulary's type.
        self.spaces_pieces = self.detokenize(self.tokenize("a", add_special=False)) != "a"

    @property
    def name(self) -> str:
        return self.info.name or self.path.name

    @functools.cached_property
    def longest_token_bytes(self) -> int:
        """The most bytes one token covers (at most: a token's text as GGUF stores it is never
        shorter than the text it stands for), so that n bytes are at least n / this tokens."""
        from .gguf_info import token_texts

        return max(1, max(map(len, token_texts(self.info)), default=1))

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # bytes that were not UTF-8 where the text came from
            data = valid_text(text).encode("utf-8")
        capacity = len(data) + 8
        out = (ll.llama_token * capacity)()
        n = ll.llama_tokenize(
            self._vocab, data, len(data), out, capacity, add_special, parse_special
        )
        if n < 0:  # buffer too small: llama.cpp tells how many it needs
            capacity = -n
            out = (ll.llama_token * capacity)()
            n = ll.llama_tokenize(
                self._vocab, data, len(data), out, capacity, add_special, parse_special
            )
        return list(out[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token (control tokens render as nothing). May be part of a character."""
        cached = self._piece_cache.get(token)
        if cached is None:
            cached = self._piece_cache[token] = self._text(token, control_text=False)
        return cached

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        if self._eog_ids is not None:
            return token in self._eog_ids
        # Asked for every committed token and every n-gram proposal's: a dict lookup, not a
        # call into llama.cpp each time.
        known = self._eog_memo.get(token)
        if known is None:
            known = self._eog_memo[token] = bool(ll.llama_vocab_is_eog(self._vocab, token))
        return known

    def tokenize_pieces(
        self, pieces: Sequence[tuple[str, bool]], *, add_bos: bool
    ) -> list[int] | None:
        """The tokens of a text given in pieces, each with whether it is typed: its control
        tokens' texts (a chat's `<|im_end|>`) are read as text, the others' as the tokens. Each
        piece tokenizes as it would in the whole text; None where that cannot be made sure of
        (the text is then best tokenized whole)."""
        tokens = [self.bos] if add_bos else []
        for text, typed in pieces:
            # A vocabulary that puts a space before a tokenization's text does so after each
            # special token (llama.cpp tokenizes the text between them apart), nowhere else.
            if not self.spaces_pieces or not tokens or self._splits_text(tokens[-1]):
                tokens += self.tokenize(text, add_special=False, parse_special=not typed)
                continue
            within = self._tokenize_within(text, parse_special=not typed)
            if within is None:
                return None
            tokens += within
        return tokens

    def _splits_text(self, token: int) -> bool:
        """Whether llama.cpp tokenizes the texts either side of `token` apart: special tokens,
        and user-defined ones (Gemma's "\n"), which it finds in a text before anything else."""
        kinds = ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_USER_DEFINED
        kinds |= ll.LLAMA_TOKEN_ATTR_UNKNOWN
        return bool(ll.llama_vocab_get_attr(self._vocab, token) & kinds)

    def _tokenize_within(self, text: str, *, parse_special: bool) -> list[int] | None:
        """`text`'s tokens where it follows other text, for a vocabulary that puts a space
        before the text a tokenization starts with: tokenized after a text whose tokens are
        then dropped, if they came out as that text's alone and left no space before `text`."""
        start = text.encode("utf-8", errors="replace")
        for before in ("\n", ".", "~"):  # the first whose tokens stay apart from `text`'s
            lead = self.tokenize(before, add_special=False, parse_special=False)
            both = self.tokenize(before + text, add_special=False, parse_special=parse_special)
            rest = both[len(lead) :]
            if both[: len(lead)] == lead and (not rest or start.startswith(self._text(rest[0]))):
                return rest
        return None

    def _text(self, token: int, *, control_text: bool = True) -> bytes:
        """What a token stands for in a text; a control token's text, or nothing."""
        n = ll.llama_token_to_piece(self._vocab, token, self._piece_buf, 256, 0, control_text)
        if n < 0:  # a longer text (Qwen's longest is 256 bytes): -n is its length
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self._vocab, token, buf, -n, 0, control_text)
            return buf.raw[: max(n, 0)]
        return self._piece_buf.raw[:n]

    def reads_control_tokens(self, text: str) -> bool:
        """Whether tokenizing `text` with special tokens parsed reads control tokens in it (a
        chat's `<|im_end|>`), which as text it would not. Remembered for the last texts: a
        chat renders its whole history for every question (by hash: a text may be a file)."""
        key = (len(text), hash(text))
        known = self._control_text_memo.get(key)
        if known is None:
            ids = set(self.tokenize(text, add_special=False, parse_special=True))
            kinds = ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_UNKNOWN
            known = any(ll.llama_vocab_get_attr(self._vocab, i) & kinds for i in ids)
            if len(self._control_text_memo) >= 256:
                self._control_text_memo.clear()
            self._control_text_memo[key] = known
        return known

    def special_tokens(self) -> list[int]:
        """Control, user-defined and byte tokens: those a narrowed draft always keeps."""
        kinds = ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_USER_DEFINED
        kinds |= ll.LLAMA_TOKEN_ATTR_BYTE
        attr = ll.llama_vocab_get_attr
        return [i for i in range(self.n_vocab) if attr(self._vocab, i) & kinds]

    def token_text(self, token: int) -> bytes:
        """The token's text; none for an id the vocabulary lacks (-1: a model without a BOS,
        whose chat template still asks for it: llama.cpp aborted the process)."""
        if not 0 <= token < self.n_vocab:
            return b""
        return ll.llama_vocab_get_text(self._vocab, token) or b""

    def close(self) -> None:
        """Free the model, or, while a context on it is open, once the last one closes. The
        garbage collector finalises the objects of a cycle in any order (an engine and its last
        stream are one): a context freed after its model crashed the test run once, in
        llama_free."""
        if self._contexts:
            self._close_when_unused = True
            return
        if self._model:
            ll.llama_model_free(self._model)
            self._model = None

    def _context_closed(self) -> None:
        self._contexts -= 1
        if self._close_when_unused and not self._contexts:
            self.close()

    def __del__(self) -> None:
        self.close()


class Context:
    """A llama.cpp context on a model: a KV cache shared by up to `n_seq_max` sequences.

    `kv_unified` lets one batch row belong to several sequences, which is how a token tree is
    evaluated in one pass (each branch a sequence id; a shared prefix stored once).
    """

    def __init__(
        self,
        model: Model,
        *,
        n_ctx: int,
        n_threads: int,
        n_batch: int = 512,
        n_seq_max: int = 1,
        pinned: PinnedThread | None = None,
        flash_attn: bool | None = None,
        vocab_limit: int | None = None,
    ):
        """`flash_attn`: attention by llama.cpp's flash attention kernel or by matrix products;
        None: llama.cpp's choice (on, for the CPU). Which is faster depends on the CPU
        (profile.measure_attention). `vocab_limit`: no token with this id or more can come out
        of the logits (a draft's, where its target has fewer tokens and could not evaluate
        them): they are cut off the rows, or, in a narrowed draft's kept columns, score -inf.
        Where the target has more tokens (ids this model lacks: tokens added to a fine-tuned
        target, which its chat template or its answer may hold), they are fed as token 0."""
        self._ctx = self._batch = None  # close() may run on a half-made Context (Ctrl+C)
        self.model = model
        self.pinned = pinned  # if set, every decode runs on this thread (and its CPUs)
        self.n_seq_max = n_seq_max
        self.flash_attn = flash_attn
        params = ll.llama_context_default_params()
        if flash_attn is not None:
            on, off = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED, ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
            params.flash_attn_type = on if flash_attn else off
        # llama.cpp pads a context to at least 256 cells but clamps the batch to the size asked
        # for; ask for the padded size so a batch always fits, and enforce `n_ctx` ourselves.
        params.n_ctx = max(n_ctx, 256)
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq_max
        params.kv_unified = True
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.no_perf = True
        if model.head:  # the last hidden state too, to score the tokens outside the head
            params.embeddings = True
            params.pooling_type = ll.LLAMA_POOLING_TYPE_NONE
        _native_log.clear()
        try:
            with interrupts_held():
                self._ctx = ll.llama_init_from_model(model._model, params)
        finally:
            if self._ctx:  # made, even if a Ctrl+C came during it
                model._contexts += 1
        if not self._ctx:
            reason = _native_log.reason("out of memory?")
            raise ModelFileError(f"llama.cpp could not create a context for {model.path}: {reason}")
        self.n_ctx: int = min(n_ctx, ll.llama_n_ctx(self._ctx))
        self.n_batch: int = ll.llama_n_batch(self._ctx)
        self._mem = ll.llama_get_memory(self._ctx)
        self._n_vocab = model.n_vocab
        # A narrowed draft outputs a row of logits and a hidden state for every row of a batch,
        # wanted or not (hidden states on): a prompt's batches of 512 rows took 163 MB more
        # memory for good (a chat's catch-up of 1,500 tokens), in batches of 64 rows 42 MB.
        self._prefill_rows = PREFILL_ROWS_NARROWED if model.head else n_batch
        # Only a draft's guesses depend on what it is fed for a token it lacks, and any id of its
        # own serves; the id itself made llama.cpp refuse the batch (a traceback mid-answer).
        lacks = vocab_limit is not None and vocab_limit > model.vocab_size
        self._lacks_from: int | None = model.vocab_size if lacks else None
        self._columns = model.n_vocab  # of each logits row
        if vocab_limit is not None and model.head is not None:  # its row j is token ids[j]
            model.head.propose_below(vocab_limit)
        elif vocab_limit is not None:
            self._columns = min(vocab_limit, model.n_vocab)
        # One batch for the life of the context: the decode loop allocates nothing.
        self._head = model.head
        n_embd = model.head.n_embd if model.head else 0
        self._batch = ll.llama_batch_init(n_batch, n_embd, n_seq_max)
        if model.head:
            self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(n_batch, n_embd))
            self._embd_address: int = self._embd.ctypes.data
        else:
            self._tokens = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._n_seq_id = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n_batch,))
        self._wants_logits = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        self._seq_id_rows = [
            np.ctypeslib.as_array(self._batch.seq_id[i], shape=(n_seq_max,)) for i in range(n_batch)
        ]
        for row in self._seq_id_rows:
            row[0] = 0
        self._n_seq_id[:] = 1
        self._rows_off_seq0 = 0  # rows [0, this) may carry ids other than [0] from a tree batch
        self._offsets = np.arange(n_batch, dtype=np.int32)
        # Views of llama.cpp's logits buffer by (address, rows): making one costs more than a
        # draft step's other Python work, and the buffer moves only when llama.cpp regrows it.
        self._logits_views: dict[tuple[int, int], np.ndarray] = {}
        self._narrowed_views: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.decode_s = 0.0  # seconds spent inside llama_decode, ever: the rest is our overhead
        self.max_threads = self.threads = n_threads
        self.governor: ThreadGovernor | None = None  # see govern
        self._relative_costs: list[float] = []

    def decode(
        self,
        tokens: Sequence[int],
        start_pos: int,
        *,
        positions: Sequence[int] | None = None,
        seq_ids: Sequence[Sequence[int]] | None = None,
        logits: str = "last",
    ) -> np.ndarray:
        """Evaluate tokens; their logits as an (n_rows, n_vocab) view of llama.cpp's memory, valid
        until the next call and only while this context lives (keep it named, not a temporary).

        Rows sit at `start_pos + i`, or at explicit `positions`; all in sequence 0 unless `seq_ids`
        gives each row its own list. `logits` is "last", "all" or "none". Inputs longer than the
        batch are split, which only makes sense with "last" or "none" (prefill).
        """
        if self._lacks_from is not None:
            tokens = [t if t < self._lacks_from else 0 for t in tokens]
        n = len(tokens)
        per_row = logits == "all" or seq_ids is not None or positions is not None
        chunk = self.n_batch if per_row else self._prefill_rows
        if n > chunk:
            if per_row:
                raise ValueError("a batch with per-row outputs must fit in n_batch")
            cut = n - (n - 1) % chunk - 1  # the last chunk is never empty
            for lo in range(0, cut, chunk):
                self.decode(tokens[lo : lo + chunk], start_pos + lo, logits="none")
            return self.decode(tokens[cut:], start_pos + cut, logits=logits)
        # In a tree's batch the last row need not be the deepest.
        last_pos = (max(positions) if positions is not None else start_pos + n - 1) if n else 0
        if last_pos >= self.n_ctx:
            raise ContextOverflowError(f"position {last_pos} is beyond the context ({self.n_ctx})")
        batch = self._batch
        batch.n_tokens = n
        if n == 1 and positions is None and (seq_ids is None or len(seq_ids[0]) == 1):
            # A draft or plain step (in a tree: on one branch), the loop's most frequent call.
            # Right after a decode that streamed the weights through the caches every Python
            # object is cold, so each numpy call costs microseconds: scalar stores instead.
            seq = 0 if seq_ids is None else seq_ids[0][0]
            if seq or self._rows_off_seq0:
                self._n_seq_id[0] = 1
                self._seq_id_rows[0][0] = seq
                self._rows_off_seq0 = max(self._rows_off_seq0, 1)
            if self._head is None:
                self._tokens[0] = tokens[0]
            else:
                self._head.feed_one(tokens[0], self._embd_address)
            self._pos[0] = start_pos
            self._wants_logits[0] = logits != "none" or self._head is not None
            return self._run(batch, 0 if logits == "none" else 1)
        if self._head is None:
            self._tokens[:n] = tokens
        else:
            self._head.feed_at(tokens, self._embd_address)
        if positions is None:
            np.add(self._offsets[:n], start_pos, out=self._pos[:n])
        else:
            self._pos[:n] = positions
        if seq_ids is None:
            if self._rows_off_seq0:
                self._n_seq_id[: self._rows_off_seq0] = 1
                for row in self._seq_id_rows[: self._rows_off_seq0]:
                    row[0] = 0
                self._rows_off_seq0 = 0
        else:
            for i, ids in enumerate(seq_ids):
                self._n_seq_id[i] = len(ids)
                self._seq_id_rows[i][: len(ids)] = ids
            self._rows_off_seq0 = max(self._rows_off_seq0, n)
        n_out = 1 if logits == "last" else n if logits == "all" else 0
        # With hidden states on (a narrowed draft) llama.cpp outputs every row anyway; saying so
        # spares a warning per batch, each a call into Python through the log callback (a
        # chain round's first draft batch, every round: 3 % of our Python time in one).
        self._wants_logits[:n] = 1 if logits == "all" or self._head is not None else 0
        if logits == "last":
            self._wants_logits[n - 1] = 1
        return self._run(batch, n_out)

    def verify(self, tokens: Sequence[int], start_pos: int) -> np.ndarray:
        """`decode` with logits for every row: a verification pass."""
        return self.decode(tokens, start_pos, logits="all")

    def govern(
        self, governor: ThreadGovernor | None, relative_cost: Callable[[int], float]
    ) -> None:
        """Let `governor` choose the threads of each decode from the times of the last ones,
        judging a pass of k tokens by `relative_cost(k)` (its cost in plain steps); None: always
        `max_threads`. Passes longer than GOVERNED_UP_TO tokens (prompts) are not judged."""
        self.governor = governor
        self._relative_costs = [0.0] + [relative_cost(k) for k in range(1, GOVERNED_UP_TO + 1)]
        self.set_threads(governor.threads if governor else self.max_threads)

    def set_threads(self, n_threads: int) -> None:
        """Decode with `n_threads` from the next decode on (llama.cpp reads it at each one)."""
        if n_threads != self.threads:
            # It logs through _on_native_log: a Ctrl+C there was dropped mid-answer (the governor
            # changes threads while a chat answers) and printed as a traceback.
            with interrupts_held():
                ll.llama_set_n_threads(self._ctx, n_threads, n_threads)
                self.threads = n_threads

    @contextmanager
    def fixed_threads(self) -> Iterator[None]:
        """`max_threads` and no governor inside (a measurement of this device's costs)."""
        governor, self.governor = self.governor, None
        self.set_threads(self.max_threads)
        try:
            yield
        finally:
            self.governor = governor
            if governor is not None:
                self.set_threads(governor.threads)

    def _run(self, batch: ll.llama_batch, n_out: int) -> np.ndarray:
        """llama_decode on the filled batch; a view of its `n_out` logits rows."""
        t0 = time.perf_counter()
        if self.pinned is None:
            status = ll.llama_decode(self._ctx, batch)
        else:
            status = self.pinned.call(ll.llama_decode, self._ctx, batch)
        elapsed = time.perf_counter() - t0
        self.decode_s += elapsed
        if status != 0:  # before the governor: a failed decode's time says nothing of threads
            raise RuntimeError(f"llama_decode failed with status {status}")
        n = batch.n_tokens
        if self.governor is not None and n <= GOVERNED_UP_TO:
            self.set_threads(self.governor.observe(elapsed, self._relative_costs[n]))
        if n_out == 0:
            return np.empty((0, self._columns), dtype=np.float32)
        if self._head is not None:
            return self._narrowed_logits(batch.n_tokens, n_out)
        # Outputs are stored contiguously in batch order (llama_get_logits reorders them).
        key = (_logits_address(self._ctx) or 0, n_out)
        view = self._logits_views.get(key)
        if view is None:
            if len(self._logits_views) > 256:
                self._logits_views.clear()
            pointer = ll.llama_get_logits(self._ctx)
            view = np.ctypeslib.as_array(pointer, shape=(n_out, self._n_vocab))[:, : self._columns]
            self._check_finite(view[-1])
            self._logits_views[key] = view
        return view

    def _check_finite(self, row: np.ndarray) -> None:
        """Weights that are not numbers (a file damaged inside, its size intact) make every row
        NaN: a target then "generated" nothing with exit 0, a draft ended in a ZeroDivisionError.
        Checked where a logits buffer is first seen (rarely: views are kept), not every step."""
        largest = float(row.max())  # NaN if any logit is
        if not math.isfinite(largest):
            raise ModelFileError(
                f"{self.model.path.name} computed {largest} logits: its weights are damaged "
                "(a corrupt copy?); fetch or make it again"
            )

    def _narrowed_logits(self, n_rows: int, n_out: int) -> np.ndarray:
        """A narrowed draft's last `n_out` rows of logits, its extra tokens' included. With
        hidden states asked for, llama.cpp outputs every row of the batch, whatever it is told."""
        assert self._head is not None
        key = (_logits_address(self._ctx) or 0, _hidden_address(self._ctx) or 0, n_rows)
        views = self._narrowed_views.get(key)
        if views is None:
            if len(self._narrowed_views) > 256:
                self._narrowed_views.clear()
            logits = ll.llama_get_logits(self._ctx)
            hidden = ll.llama_get_embeddings(self._ctx)
            views = (
                np.ctypeslib.as_array(logits, shape=(n_rows, self._n_vocab)),
                np.ctypeslib.as_array(hidden, shape=(n_rows, self._head.n_embd)),
            )
            self._check_finite(views[0][-1])
            self._narrowed_views[key] = views
        logits_view, hidden_view = views
        if n_out == 1:
            return self._head.logits(logits_view[-1], hidden_view[-1])[None]
        return self._head.logits(logits_view[n_rows - n_out :], hidden_view[n_rows - n_out :])

    # KV cache edits, per sequence. p1 = -1 means "to the end".
    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None:
        ll.llama_memory_seq_rm(self._mem, seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        ll.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Move the cells of `seq` at positions [p0, p1) by `delta` (p1 = -1: to the end);
        llama.cpp rotates their keys to the new positions inside the next decode."""
        ll.llama_memory_seq_add(self._mem, seq, p0, p1, delta)

    def know(self, tokens: Sequence[int]) -> None:
        """Tokens of the text this context is not fed: a narrowed draft scores those outside its
        kept set as it would had it been fed them (NarrowedHead.learn)."""
        if self._head is not None:
            self._head.learn(tokens)

    def seq_keep(self, seq: int) -> None:
        ll.llama_memory_seq_keep(self._mem, seq)

    def seq_pos_max(self, seq: int) -> int:
        """The last position cached for `seq`, or -1 if it holds nothing."""
        return ll.llama_memory_seq_pos_max(self._mem, seq)

    def seq_pos_min(self, seq: int) -> int:
        return ll.llama_memory_seq_pos_min(self._mem, seq)

    def clear(self) -> None:
        ll.llama_memory_clear(self._mem, True)

    def close(self) -> None:
        # Its thread first, which waits for a decode still running there. Left open, it kept
        # itself alive (its worker holds it) and the context's memory: 48 MB an engine here.
        if self.pinned is not None:
            self.pinned.close()
        if self._ctx:
            if self._batch is not None:
                ll.llama_batch_free(self._batch)
            ll.llama_free(self._ctx)
            self._ctx = None
            self.model._context_closed()

    def __del__(self) -> None:
        self.close()


def quantize(
    src: str | Path, dst: str | Path, ftype: int, n_threads: int = 0, output_type: int | None = None
) -> None:
    """Write a requantized copy of a GGUF (e.g. a cheaper draft) with llama.cpp's quantizer.
    `output_type` (a GGML_TYPE_*) sets the type of the output (logits) matrix, which llama.cpp
    otherwise keeps at Q6_K or Q8_0 whatever `ftype` says."""
    _init_backend()
    params = ll.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = n_threads
    params.allow_requantize = True
    if output_type is not None:
        params.output_tensor_type = output_type
    try:  # what llama.cpp would call an "iostream error" too: a read-only or missing folder
        Path(dst).touch()
    except OSError as e:
        raise ModelFileError(f"cannot write in {Path(dst).parent}: {e.strerror or e}") from None
    _native_log.clear()
    with interrupts_held():  # the quantizer cannot be stopped halfway
        status = ll.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if status != 0:
        # It could write there, so "iostream error" means the disk filled up, as a rule.
        why = no_room(Path(dst).parent, Path(src).stat().st_size)
        raise ModelFileError(
            f"llama.cpp could not quantize {src}: {why or _native_log.reason(f'status {status}')}"
        )


def no_room(folder: Path, needed: int) -> str | None:
    """Why writing a file of about `needed` bytes into `folder` failed, if the disk is full:
    the errors a full disk causes name it poorly ("iostream error", "64512 requested and 45728
    written")."""
    free = shutil.disk_usage(folder).free
    if free >= needed:
        return None
    # (`free` counts the half-written file's space as used: the amount needed says more.)
    return f"the disk is full (it needs up to {needed / 2**20:.0f} MB free in {folder})"
