"""Checks shared by the generation tests."""

from __future__ import annotations

import contextlib
import importlib.util
import mmap
import os
import shutil
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import numpy as np

from edgespec.backend import Context
from edgespec.bench import NEAR_TIE  # why a near tie may differ: see there


def fresh_logits(engine, tokens: list[int], model=None) -> np.ndarray:
    """The target's (or `model`'s) next-token logits after `tokens`, from a fresh context (one
    prefill); the target's attending as the engine's does."""
    attention = engine.target_ctx.flash_attn if model is None else None
    ctx = Context(model or engine.target, n_ctx=engine.n_ctx, n_threads=2, flash_attn=attention)
    try:
        return ctx.decode(tokens, 0)[-1].copy()
    finally:
        ctx.close()


def plain_path_logits(engine, prompt: list[int], generated: list[int]) -> np.ndarray:
    """The logits plain decoding chose its next token from: the prompt prefilled (all but its
    last token), then one token at a time, exactly as the engine's plain mode computes them."""
    ctx = Context(engine.target, n_ctx=engine.n_ctx, n_threads=2)
    try:
        ctx.decode(prompt[:-1], 0, logits="none")
        tokens = [*prompt, *generated]
        for pos in range(len(prompt) - 1, len(tokens)):
            row = ctx.decode([tokens[pos]], pos)[-1]
        return row.copy()
    finally:
        ctx.close()


def assert_same_or_near_tie(engine, prompt: list[int], plain: list[int], spec: list[int]) -> None:
    """Speculative greedy output equals plain greedy output, except at a near tie for the top.

    At the first position where they differ, both tokens must score within NEAR_TIE of the best
    candidate of the logits plain decoding chose from (recomputed here). Not "the top two": where
    three candidates are that close, the recomputed order of them may differ from the one either
    run saw (its cache built in other batches).
    """
    n = min(len(plain), len(spec))
    first = next((i for i in range(n) if plain[i] != spec[i]), n)
    if first == len(plain) == len(spec):
        return
    logits = plain_path_logits(engine, prompt, plain[:first])
    # An output that ended here stopped on the end-of-generation token, not listed in its tokens.
    a = plain[first] if first < len(plain) else int(logits.argmax())
    b = spec[first] if first < len(spec) else int(logits.argmax())
    best = float(logits.max())
    behind = {token: best - float(logits[token]) for token in (a, b)}
    assert a != b and max(behind.values()) < NEAR_TIE, (
        f"outputs differ at token {first}: plain {a} vs speculative {b}, "
        f"behind the best candidate by {behind[a]:.3f} and {behind[b]:.3f}"
    )


def write_tiny_gguf(path, n_vocab: int, token_prefix: str = "tok"):
    """A small well-formed GGUF with a vocabulary of its own (not loadable as a model)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-other-vocab")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"{token_prefix}{i}" for i in range(n_vocab)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_tensor("token_embd.weight", np.zeros((n_vocab, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_vocab_copy(source: Path, path: Path, tokens: dict[int, str]) -> Path:
    """A copy of `source`'s metadata (no tensors: loadable with vocab_only) with some tokens'
    texts replaced."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(source)
    writer = GGUFWriter(str(path), reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer writes these itself
        value = field.contents()
        if name == "tokenizer.ggml.tokens":
            value = [tokens.get(i, text) for i, text in enumerate(value)]
        kind = field.types[0]
        writer.add_key_value(
            name, value, kind, sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@contextlib.contextmanager
def held_in_a_round(engine, generate: Callable[[], object], at_step: int) -> Iterator[list]:
    """`generate()` on a thread of its own, held inside the engine's `at_step`-th plain step
    (the engine busy there) until the block ends; yields the list its result goes into once the
    thread is done."""
    inside, release = threading.Event(), threading.Event()
    plain_step, steps = engine._plain_step, 0

    def held_plain_step(run):
        nonlocal steps
        steps += 1
        if steps == at_step:
            inside.set()
            release.wait(30)
        return plain_step(run)

    engine._plain_step = held_plain_step
    results: list = []
    thread = threading.Thread(target=lambda: results.append(generate()))
    thread.start()
    try:
        assert inside.wait(30)
        yield results
    finally:
        release.set()
        thread.join(30)
        del engine._plain_step


def ctrl_c_while_trimming(engine, monkeypatch) -> list[bool]:
    """Have a Ctrl+C reach this process as the engine begins to settle its caches after a
    generation (its trimming); returns a list that gets True once the trimming is done."""
    trim, trimmed = engine._trim_caches, []

    def pressed_while_trimming(run):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs here, between bytecodes
        trim(run)
        trimmed.append(True)

    monkeypatch.setattr(engine, "_trim_caches", pressed_while_trimming)
    return trimmed


def first_use_measured_quiet(monkeypatch) -> None:
    """First-use profiles labelled as a quiet device measures them (their noise at most
    NOISY_QUICK), for tests of what a measured profile does: on a busy test machine the real
    label would have them measured again and price nothing (DeviceProfile.busy), which the
    busy-profile tests specify."""
    from dataclasses import replace

    import edgespec.engine
    from edgespec.profile import NOISY_QUICK

    quick = edgespec.engine.quick_profile

    def quiet(*args):
        measured = quick(*args)
        return replace(measured, noise=min(measured.noise, NOISY_QUICK))

    monkeypatch.setattr(edgespec.engine, "quick_profile", quiet)


def hear_ctrl_c() -> None:
    """In a child about to exec: let SIGINT through again. A test run started in the background
    by a non-interactive shell ignores SIGINT, and exec keeps that for every child; a user's
    terminal does not."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def tensor_types(path: Path) -> dict[str, str]:
    """The quantization type of each tensor of a GGUF, by name (gguf-py's reader: slow on large
    vocabularies, fine for SmolLM2)."""
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def with_extra_tokens(src: Path, dst: Path, extra: int) -> Path:
    """A copy of the GGUF `src` whose vocabulary has `extra` more tokens at its end (their rows
    of the embedding and output tables copy the last token's), as a model of the same family
    with a padded vocabulary has: llama.cpp pairs vocabularies up to 128 tokens apart."""
    from edgespec.draft_head import rewrite_gguf
    from edgespec.gguf_info import read_gguf

    n_vocab = read_gguf(src).n_vocab
    added = {
        "tokenizer.ggml.tokens": [f"<extra_{i}>" for i in range(extra)],
        "tokenizer.ggml.token_type": [4] * extra,  # user defined
        "tokenizer.ggml.scores": [0.0] * extra,
    }

    def edit(name: str, value):
        return [*value, *added[name]] if name in added else value

    rewrite_gguf(src, dst, edit, [*range(n_vocab), *[n_vocab - 1] * extra])
    return dst


def with_extra_tokens_and_one_renamed(src: Path, dst: Path, token: int) -> Path:
    """`with_extra_tokens(src, dst, 8)`, and token `token` given another text: sizes llama.cpp
    would pair, a vocabulary that means something else by one id."""
    from edgespec.draft_head import rewrite_gguf

    wider = with_extra_tokens(src, dst.with_name(f"wider-{dst.name}"), 8)

    def edit(name: str, value):
        if name == "tokenizer.ggml.tokens":
            value = list(value)
            value[token] = "<renamed>"
        return value

    rewrite_gguf(wider, dst, edit, range(len(read_tokens(wider))))
    return dst


def write_spm_vocab(source: Path, path: Path, controls: list[str], words: list[str]) -> Path:
    """A GGUF of `source`'s model metadata (no tensors: loadable with vocab_only) with a
    SentencePiece vocabulary of its own, as Llama 2's: a space before the text a tokenization
    starts with, bytes for characters it lacks, `controls` as control tokens after <unk>, <s>
    and </s>, and `words` ("▁" for a space) with every prefix of them they are merged from."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    control, unknown, normal, byte = 3, 2, 1, 6  # GGUF's token types
    texts = ["<unk>", "<s>", "</s>", *controls, *(f"<0x{b:02X}>" for b in range(256))]
    types = [unknown, control, control, *[control] * len(controls), *[byte] * 256]
    pieces = {w[:n] for w in words for n in range(1, len(w) + 1)}
    pieces |= {chr(c) for c in range(32, 127)} | {"▁"}
    for piece in sorted(pieces, key=lambda p: (len(p), p)):
        texts.append(piece)
        types.append(normal)
    # Longer pieces score higher: merged first, as a trained vocabulary's frequent words are.
    scores = [float(len(t)) if k == normal else 0.0 for t, k in zip(texts, types, strict=True)]
    tokenizer = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": texts,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": True,
    }
    reader = GGUFReader(source)
    writer = GGUFWriter(str(path), reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith(("GGUF.", "tokenizer.")) or name == "general.architecture":
            continue  # the writer writes GGUF's own; the tokenizer's are the new ones
        kind = field.types[0]
        sub_type = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub_type)
    for name, value in tokenizer.items():
        if isinstance(value, list):
            sub_type = {str: GGUFValueType.STRING, float: GGUFValueType.FLOAT32}.get(
                type(value[0]), GGUFValueType.INT32
            )
            writer.add_key_value(name, value, GGUFValueType.ARRAY, sub_type=sub_type)
        elif isinstance(value, bool):
            writer.add_key_value(name, value, GGUFValueType.BOOL)
        elif isinstance(value, int):
            writer.add_key_value(name, value, GGUFValueType.UINT32)
        else:
            writer.add_key_value(name, value, GGUFValueType.STRING)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def with_bool_metadata(src: Path, dst: Path, key: str, value: bool) -> Path:
    """A copy of the GGUF `src` whose boolean metadata field `key` says `value`: its byte
    patched (gguf-py's tools take 20 s to read Gemma's 262k-token vocabulary)."""
    shutil.copyfile(src, dst)
    name = key.encode()
    field = struct.pack("<Q", len(name)) + name + struct.pack("<I", 7)  # 7: GGUF's bool
    with open(dst, "r+b") as f, mmap.mmap(f.fileno(), 0) as data:
        at = data.find(field)
        assert at >= 0, f"{src} has no boolean {key}"
        data[at + len(field)] = int(value)
    return dst


def read_tokens(path: Path) -> list[bytes]:
    from edgespec.gguf_info import read_gguf, token_texts

    return token_texts(read_gguf(path))


def with_tensor_stored_as(src: Path, dst: Path, name: str, dtype: str) -> Path:
    """A copy of the GGUF `src` whose tensor `name` holds the same values stored as numpy's
    `dtype` ("float64", "int32": types a GGUF may hold)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    reader = GGUFReader(src)
    writer = GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer writes these itself
        kind = field.types[0]
        sub_type = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub_type)
    for tensor in reader.tensors:
        if tensor.name == name:
            shape = [int(n) for n in reversed(tensor.shape)]
            values = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
            writer.add_tensor(name, values.astype(dtype))
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape,
                              raw_dtype=tensor.tensor_type)  # fmt: skip
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load_script(name: str) -> ModuleType:
    """scripts/`name`.py as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass needs its module registered
    spec.loader.exec_module(module)
    return module
