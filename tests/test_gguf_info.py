"""The GGUF header reader: what `run`, the pairing check and `inspect` learn before llama.cpp
opens a file, checked against gguf-py's reader on a real model, and on broken files."""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest

import edgespec
from edgespec.errors import ModelFileError
from edgespec.gguf_info import check_generates, read_gguf

from .helpers import write_tiny_gguf


def reference_summary(path) -> dict[str, object]:
    """The same facts read with gguf-py's own (slow, thorough) reader."""
    from gguf import GGUFReader, LlamaFileType

    reader = GGUFReader(path, "r")

    def scalar(key: str):
        field = reader.fields.get(key)
        if field is None:
            return None
        value = field.parts[field.data[0]]
        if field.types[0].name == "STRING":
            return bytes(value).decode()
        return value.tolist()[0]

    arch = scalar("general.architecture")
    return {
        "architecture": arch,
        "name": scalar("general.name"),
        "file_type": LlamaFileType(scalar("general.file_type")).name.removeprefix("MOSTLY_"),
        "parameters": sum(int(t.n_elements) for t in reader.tensors),
        "tensors": len(reader.tensors),
        "context_length": scalar(f"{arch}.context_length"),
        "tokenizer": scalar("tokenizer.ggml.model"),
        "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data),
        "bos": scalar("tokenizer.ggml.bos_token_id"),
        "eos": scalar("tokenizer.ggml.eos_token_id"),
        "chat_template": scalar("tokenizer.chat_template") is not None,
        "tensor_bytes_end": max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors),
    }


def test_a_real_model_reads_the_same_as_with_gguf_py(smol_path):
    info = read_gguf(smol_path)
    reference = reference_summary(smol_path)
    # The last tensor ends at the end of the file: tensor offsets and sizes were read right.
    assert reference.pop("tensor_bytes_end") == info.file_size
    ours = info.summary()
    assert {key: ours[key] for key in reference} == reference
    assert info.version == 3 and info.chat_template and "{%" in info.chat_template


def test_vocabularies_compare_equal_exactly_when_their_token_lists_are_equal(
    tmp_path, smol_path, smol_q4_0
):
    assert read_gguf(smol_q4_0).vocab_digest == read_gguf(smol_path).vocab_digest
    one = read_gguf(write_tiny_gguf(tmp_path / "a.gguf", n_vocab=300))
    same = read_gguf(write_tiny_gguf(tmp_path / "b.gguf", n_vocab=300))
    renamed = read_gguf(write_tiny_gguf(tmp_path / "c.gguf", n_vocab=300, token_prefix="t0k"))
    longer = read_gguf(write_tiny_gguf(tmp_path / "d.gguf", n_vocab=301))
    assert one.vocab_digest == same.vocab_digest
    assert len({one.vocab_digest, renamed.vocab_digest, longer.vocab_digest}) == 3
    assert (one.n_vocab, longer.n_vocab) == (300, 301)


@pytest.mark.parametrize("kept", [8, 100, 5_000, 500_000])
def test_a_file_cut_inside_its_header_is_reported_as_truncated(tmp_path, smol_path, kept):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smol_path.read_bytes()[:kept])
    with pytest.raises(ModelFileError, match="truncated") as refused:
        read_gguf(cut)
    if kept > 8:  # in the words of the file, not of Python's struct module
        assert re.search(
            r"header cannot be read \((the file ends inside it|it counts [\d,]+ entries, more "
            r"than the rest of the file holds)\)$",
            str(refused.value),
        )


def test_a_version_too_old_is_said_so_not_called_damaged(tmp_path, smol_path):
    old = tmp_path / "v1.gguf"
    data = bytearray(smol_path.read_bytes()[:100_000])
    struct.pack_into("<I", data, 4, 1)
    old.write_bytes(bytes(data))
    with pytest.raises(ModelFileError) as refused:
        read_gguf(old)
    assert str(refused.value) == (
        f"{old} is GGUF version 1, too old for llama.cpp (2 or later is needed)"
    )


def tiny_llama_with(path, **fields) -> Path:
    """write_tiny_gguf's file with some `llama.` hyperparameters set (a number or a string)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "c"])
    for key, value in fields.items():
        key = f"llama.{key.replace('__', '.')}"
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Each aborted llama.cpp on an assertion (while loading, or at the first pass: the epsilon), or
# made every logit NaN (rope's base), found by setting them in copies of SmolLM2.
DAMAGED_HPARAMS = [
    (dict(block_count=0), "llama.block_count is 0, where llama.cpp needs 1 to 512"),
    (dict(block_count=513), "llama.block_count is 513"),
    (dict(context_length=2**32 - 1), "llama.context_length is 4294967295"),
    (dict(attention__layer_norm_rms_epsilon=-1.0), "layer_norm_rms_epsilon is -1.0"),
    (dict(attention__layer_norm_rms_epsilon=math.nan), "layer_norm_rms_epsilon is nan"),
    (dict(attention__layer_norm_rms_epsilon=math.inf), "layer_norm_rms_epsilon is inf"),
    (dict(rope__freq_base=0.0), "llama.rope.freq_base is 0.0"),
    (dict(rope__freq_base=math.nan), "llama.rope.freq_base is nan"),
    (dict(rope__scaling__factor=-1.0), "llama.rope.scaling.factor is -1.0"),
    (dict(rope__scaling__type="bogus"), "llama.rope.scaling.type is bogus"),
    (dict(expert_count=1025, expert_used_count=2), "llama.expert_count is 1025"),
    (dict(expert_count=8), "expert_used_count is 0 of llama.expert_count 8 experts"),
    (dict(expert_used_count=2), "expert_used_count is 2 of llama.expert_count 0 experts"),
    (dict(expert_count=8, expert_used_count=9), "expert_used_count is 9 of"),
]


@pytest.mark.parametrize("fields, message", DAMAGED_HPARAMS)
def test_hyperparameters_that_would_abort_llama_cpp_are_refused_by_key(tmp_path, fields, message):
    with pytest.raises(ModelFileError, match=re.escape(message)):
        read_gguf(tiny_llama_with(tmp_path / "odd.gguf", **fields))


def test_the_hyperparameters_of_working_models_pass(tmp_path):
    fine = dict(
        block_count=512, attention__layer_norm_rms_epsilon=0.0, rope__freq_base=1e6,
        rope__scaling__factor=0.0, rope__scaling__type="yarn", expert_count=8,
        expert_used_count=2, context_length=2**31 - 1,
    )  # fmt: skip
    read_gguf(tiny_llama_with(tmp_path / "fine.gguf", **fine))


def test_a_file_cut_inside_its_tensor_data_names_the_first_missing_tensor(tmp_path, smol_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smol_path.read_bytes()[: smol_path.stat().st_size - 1])
    with pytest.raises(ModelFileError, match=r"truncated: tensor \S+ needs"):
        read_gguf(cut)


def test_an_impossible_count_in_the_header_fails_at_once_with_a_clear_error(tmp_path, smol_path):
    damaged = tmp_path / "bad-count.gguf"
    data = bytearray(smol_path.read_bytes()[:1_000_000])
    struct.pack_into("<Q", data, 16, 2**60)  # the number of metadata entries
    damaged.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"truncated or damaged: .*more than the rest"):
        read_gguf(damaged)


def test_a_file_without_a_vocabulary_is_refused(tmp_path):
    import gguf

    path = tmp_path / "no-vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFileError, match="no tokenizer"):
        read_gguf(path)


def test_an_embedding_model_is_refused_by_name_before_it_loads(tmp_path):
    """A BERT loaded, "generated" nothing and exited 0 (and aborted llama.cpp's profile)."""
    import gguf

    path = tmp_path / "tiny-bert.gguf"
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_causal_attention(False)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(["[PAD]", "[CLS]", "hello"])
    writer.add_tensor("token_embd.weight", np.zeros((3, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    info = read_gguf(path)
    assert not info.causal
    with pytest.raises(
        ModelFileError, match=r"tiny-bert\.gguf is an embedding model .* cannot gen"
    ):
        check_generates(info)
    with pytest.raises(ModelFileError, match="embedding model"):  # as target, before loading
        edgespec.load(path)
    check_generates(read_gguf(write_tiny_gguf(tmp_path / "causal.gguf", 4)))  # a causal one passes
