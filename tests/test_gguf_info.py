"""The GGUF header reader: what `run`, the pairing check and `inspect` learn before llama.cpp
opens a file, checked against gguf-py's reader on a real model, and on broken files."""

from __future__ import annotations

import itertools
import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest

import edgespec
from edgespec import catalogue
from edgespec.errors import ModelFileError
from edgespec.gguf_info import check_generates, pairing_problem, read_gguf, token_texts

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
    named = {f"llama.{key.replace('__', '.')}": value for key, value in fields.items()}
    return write_gguf(path, fields=named)


# Each aborted llama.cpp on an assertion (while loading, or at the first pass: the epsilon), or
# made every logit NaN (rope's base), found by setting them in copies of SmolLM2.
DAMAGED_HPARAMS = [
    (dict(block_count=0), "llama.block_count is 0, where llama.cpp needs 1 to 512"),
    (dict(block_count=513), "llama.block_count is 513"),
    (dict(context_length=2**32 - 1), "llama.context_length is 4294967295"),
    (dict(attention__layer_norm_rms_epsilon=-1.0), "layer_norm_rms_epsilon is -1.0"),
    (dict(attention__layer_norm_rms_epsilon=math.nan), "layer_norm_rms_epsilon is nan"),
    (dict(attention__layer_norm_rms_epsilon=math.inf), "layer_norm_rms_epsilon is inf"),
    (dict(attention__layer_norm_rms_epsilon=1.0), "layer_norm_rms_epsilon is 1.0"),
    (dict(attention__layer_norm_epsilon=-1.0), "llama.attention.layer_norm_epsilon is -1.0"),
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
        rope__scaling__factor=0.0, rope__scaling__type="yarn", expert_count=1024,
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


def write_gguf(path, arch="llama", tokens=("a", "b", "c"), fields=None, tensors=None) -> Path:
    """A small GGUF of `arch` with these tokens, metadata fields (full keys: a text, a float32,
    a uint32 or a list of uint32) and tensors (numpy arrays, stored in their own type)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tokenizer_model("gpt2")
    if tokens is not None:
        writer.add_token_list(list(tokens))
    for key, value in (fields or {}).items():
        if isinstance(value, list):
            array, uint32 = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT32
            writer.add_key_value(key, value, array, sub_type=uint32)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    for name, data in (tensors or {}).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_version_2_file_is_read_like_a_version_3_one(tmp_path):
    """llama.cpp still reads version 2 (version 3 only added big-endian files): older
    downloads must not be refused as too old."""
    path = write_tiny_gguf(tmp_path / "v2.gguf", n_vocab=10)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 4, 2)
    path.write_bytes(bytes(data))
    info = read_gguf(path)
    assert (info.version, info.n_vocab) == (2, 10)


def test_tensors_are_found_where_gguf_py_finds_them(tmp_path):
    """Tensor data starts at the first multiple of the alignment after the header, not before:
    the narrowed draft reads its embedding rows at these offsets."""
    from gguf import GGUFReader

    tensors = {
        "token_embd.weight": np.ones((5, 8), dtype=np.float32),
        "output.weight": np.full((5, 8), 2.0, dtype=np.float32),
    }
    for tokens in (("a", "b", "c", "d", "e"), ("alpha", "b", "c", "d", "e")):
        path = write_gguf(tmp_path / "spans.gguf", tokens=tokens, tensors=tensors)
        info = read_gguf(path)
        offsets = {t.name: int(t.data_offset) for t in GGUFReader(path).tensors}
        assert info.token_embd is not None and info.output is not None
        assert (info.token_embd.offset, info.output.offset) == (
            offsets["token_embd.weight"],
            offsets["output.weight"],
        )


def test_an_impossible_count_before_a_zeroed_rest_is_named_at_once(tmp_path):
    """A count past what the file can hold fails before the first entry is read: a header left
    zeroed (a preallocated download) would otherwise be walked entry by empty entry."""
    path = tmp_path / "zeroed.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40) + bytes(200_000))
    with pytest.raises(ModelFileError, match=r"it counts 1,099,511,627,776 entries, more than"):
        read_gguf(path)


def test_a_file_without_tensors_cut_inside_its_last_text_is_refused(tmp_path):
    """A vocabulary-only GGUF has no tensor table after its metadata to trip on: the string's
    own length must be checked against what is left of the file."""
    path = write_gguf(tmp_path / "vocab.gguf", fields={"tokenizer.chat_template": "x" * 100})
    data = path.read_bytes()
    path.write_bytes(data[: data.rindex(b"x" * 100) + 50])
    with pytest.raises(ModelFileError, match="truncated or damaged"):
        read_gguf(path)


def test_a_zero_alignment_is_refused_as_damage_not_a_division_by_zero(tmp_path):
    path = write_gguf(tmp_path / "aligned.gguf", fields={"general.alignment": 32})
    data = bytearray(path.read_bytes())
    at = data.index(b"general.alignment") + len("general.alignment") + 4  # past the type
    struct.pack_into("<I", data, at, 0)
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"damaged: .*\(bad general.alignment 0\)"):
        read_gguf(path)


def test_a_token_list_that_is_not_a_list_of_texts_is_no_tokenizer(tmp_path):
    numbers = {"tokenizer.ggml.tokens": [1, 2]}
    path = write_gguf(tmp_path / "numbers.gguf", tokens=None, fields=numbers)
    with pytest.raises(ModelFileError, match="no tokenizer"):
        read_gguf(path)


def test_vocabularies_differing_only_in_their_last_byte_differ(tmp_path):
    """The digest covers the token list to its very end."""
    one = read_gguf(write_gguf(tmp_path / "a.gguf", tokens=("a", "b", "c")))
    other = read_gguf(write_gguf(tmp_path / "b.gguf", tokens=("a", "b", "d")))
    assert one.vocab_digest != other.vocab_digest


def test_token_texts_are_the_texts_alone(tmp_path):
    info = read_gguf(write_gguf(tmp_path / "t.gguf", tokens=("a", "bc", "")))
    assert token_texts(info) == [b"a", b"bc", b""]


NARROWED = "edgespec.narrowed."


@pytest.mark.parametrize(
    "ids",
    [[0, 2], [0, 2, 2], [0, 1, 3], [2, 1, 0], None],
    ids=["too-few", "repeated", "past-the-full-vocabulary", "unsorted", "missing"],
)
def test_a_narrowed_draft_with_a_damaged_list_of_ids_is_refused(tmp_path, ids):
    """Its ids index the full draft's tables: one repeated, out of order or past the full
    vocabulary would read the wrong rows, or past them."""
    fields = {NARROWED + "source": "full.gguf", NARROWED + "full_vocab": 3}
    if ids is not None:
        fields[NARROWED + "token_ids"] = ids
    with pytest.raises(ModelFileError, match="narrowed draft whose list of token ids is damaged"):
        read_gguf(write_gguf(tmp_path / "narrowed.gguf", fields=fields))
    fields[NARROWED + "token_ids"] = [0, 1, 2]
    assert read_gguf(write_gguf(tmp_path / "sound.gguf", fields=fields)).full_vocab == 3


def test_only_a_narrowed_draft_has_a_full_vocabulary(tmp_path):
    """A stray full_vocab key without a source does not make a file narrowed."""
    info = read_gguf(write_gguf(tmp_path / "plain.gguf", fields={NARROWED + "full_vocab": 9}))
    assert info.narrowed_from is None and info.full_vocab is None


def test_a_t5_encoder_is_an_embedding_model_though_its_header_does_not_say_so(tmp_path):
    assert not read_gguf(write_gguf(tmp_path / "t5.gguf", arch="t5encoder")).causal


def test_the_first_tensor_llama_cpp_cannot_compute_with_is_the_one_named(tmp_path):
    tensors = {
        "blk.0.a.weight": np.zeros((2, 8), dtype=np.float64),
        "blk.0.b.weight": np.zeros((2, 8), dtype=np.int32),
    }
    info = read_gguf(write_gguf(tmp_path / "odd.gguf", tensors=tensors))
    assert info.uncomputable == ("blk.0.a.weight", "F64")


KV_BASE = {"llama.block_count": 3, "llama.attention.head_count": 4, "llama.embedding_length": 64}


@pytest.mark.parametrize(
    ("fields", "per_token"),
    [
        ({}, 3 * 4 * (16 + 16) * 2),  # key and value heads of embedding_length / head_count
        ({"llama.attention.head_count_kv": 2}, 3 * 2 * (16 + 16) * 2),
        ({"llama.attention.key_length": 8, "llama.attention.value_length": 4}, 3 * 4 * 12 * 2),
        ({"llama.attention.head_count_kv": [1, 2, 3]}, 6 * (16 + 16) * 2),  # per layer
        ({"llama.attention.head_count_kv": [1, 2]}, 0),  # not one per layer: not said
    ],
    ids=["heads", "grouped", "own-key-and-value-lengths", "per-layer", "per-layer-miscounted"],
)
def test_the_kv_cache_per_token_follows_the_attention_metadata(tmp_path, fields, per_token):
    info = read_gguf(write_gguf(tmp_path / "kv.gguf", fields={**KV_BASE, **fields}))
    assert info.kv_bytes_per_token == per_token


def tiny_pair(tmp_path, draft_tokens, target_tokens, draft_special=(1, 2), target_special=(1, 2)):
    infos = []
    for name, tokens, (bos, eos) in (
        ("draft", draft_tokens, draft_special),
        ("target", target_tokens, target_special),
    ):
        fields = {"tokenizer.ggml.bos_token_id": bos, "tokenizer.ggml.eos_token_id": eos}
        infos.append(read_gguf(write_gguf(tmp_path / f"{name}.gguf", tokens=tokens, fields=fields)))
    return infos


VOCAB = [f"tok{i}" for i in range(300)]


def test_a_pair_is_refused_on_llama_cpps_rules_for_vocabularies_that_differ(tmp_path):
    assert pairing_problem(*tiny_pair(tmp_path, VOCAB, VOCAB)) is None
    assert pairing_problem(*tiny_pair(tmp_path, VOCAB, [*VOCAB, *["pad"] * 128])) is None
    wider = tiny_pair(tmp_path, VOCAB, [*VOCAB, *["pad"] * 129])
    assert pairing_problem(*wider) == "vocabulary sizes differ (300 vs 429)"
    # the last token both have is compared too
    renamed = tiny_pair(tmp_path, [*VOCAB[:-1], "other"], [*VOCAB, "pad"])
    assert pairing_problem(*renamed) == "token texts differ"


def test_a_pair_whose_special_tokens_differ_is_refused(tmp_path):
    """Even with identical vocabularies for BOS (the prompt starts with it); EOS where they
    differ (identical ones mean the same by every id)."""
    other_bos = tiny_pair(tmp_path, VOCAB, VOCAB, draft_special=(0, 2))
    assert pairing_problem(*other_bos).startswith("special tokens differ (BOS 0 vs 1")
    other_eos = tiny_pair(tmp_path, VOCAB, [*VOCAB, "pad"], draft_special=(1, 0))
    assert pairing_problem(*other_eos) == "special tokens differ (BOS 1 vs 1, EOS 0 vs 2)"


def test_the_catalogues_models_of_one_vocabulary_are_exactly_those_that_pair(smol_path, gemma_path):
    """The setup scripts refuse a --draft by the catalogue's `vocabulary`, before building
    anything: it must say what the files do. Every fetched pair (the Qwen two where fetched)."""
    fetched = {name: path for name in catalogue.specs() if (path := catalogue.local_path(name))}
    assert {smol_path, gemma_path} <= set(fetched.values())
    infos = {name: read_gguf(path) for name, path in fetched.items()}
    for draft, target in itertools.permutations(infos, 2):
        same = catalogue.spec(draft).vocabulary == catalogue.spec(target).vocabulary
        assert (pairing_problem(infos[draft], infos[target]) is None) == same, (draft, target)
