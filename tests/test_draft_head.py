"""A draft narrowed to frequent tokens (draft_head.py), on the real SmolLM2 through llama.cpp.

The narrowed copy keeps 8,192 of SmolLM2's 49,152 tokens, so that ordinary text holds tokens
outside it: those must still be proposed (scored from the draft's hidden state), the kept ones
must score exactly as in the full draft, and the output must stay the target's.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import edgespec
from edgespec import draft_head
from edgespec.backend import Context, Model, _native_log, row_dequantizer
from edgespec.draft_head import NarrowedHead, TableRows, narrowed_path
from edgespec.drafts import narrow
from edgespec.engine import DRAFT_SINK, DRAFT_WINDOW
from edgespec.errors import ModelFileError
from edgespec.gguf_info import read_gguf
from edgespec.sampling import SamplingParams

from .conftest import N_CTX
from .test_cli import cli, one_line_error
from .test_generation import PROMPTS
from .test_modes import check_greedy
from .test_sampling_real import (
    FIXED_DRAFTING,
    PROMPT,
    N,
    chi_square_passes,
    exact_joint,
    largest_allocation_at_once,
)

KEEP = 8192
TEXT = "The quartermaster's zeppelin, Xanthippe, floated over Ouagadougou at dawn."


def softmax(logits: np.ndarray) -> np.ndarray:
    weights = np.exp(logits.astype(np.float64) - logits.max())
    return weights / weights.sum()


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    return float(np.abs(p - q).sum() / 2)


@pytest.fixture(scope="module")
def narrowed(smol_q4_0):
    path = narrowed_path(smol_q4_0, KEEP)
    if not path.exists():
        narrow(smol_q4_0, path, KEEP)
    return path


@pytest.fixture(scope="module")
def narrowed_engine(smol_path, narrowed):
    return edgespec.load(smol_path, draft=narrowed, n_ctx=N_CTX)


def test_the_copy_keeps_the_special_and_the_most_frequent_tokens(narrowed, smol_q4_0):
    info, full = read_gguf(narrowed), read_gguf(smol_q4_0)
    assert info.narrowed_from == smol_q4_0.name
    assert info.n_vocab == KEEP and info.full_vocab == full.n_vocab
    ids = info.token_ids
    assert ids is not None and np.all(np.diff(ids) > 0)
    model = Model(smol_q4_0, vocab_only=True)
    kept = set(ids.tolist())
    assert set(model.special_tokens()) <= kept
    for common in ("def", " the", " return", " self"):
        (token,) = model.tokenize(common, add_special=False)
        assert token in kept, common
    rare = model.tokenize(" Ouagadougou", add_special=False)
    assert not set(rare) <= kept


def test_the_copys_vocabulary_fields_all_speak_of_the_kept_tokens(narrowed, smol_q4_0):
    """Per-token fields narrowed alike, special ids renumbered, merges only of kept tokens."""
    from gguf import GGUFReader

    info, full = read_gguf(narrowed), read_gguf(smol_q4_0)
    fields = GGUFReader(narrowed).fields
    assert len(fields["tokenizer.ggml.token_type"].contents()) == KEEP
    assert (info.token_ids[info.bos], info.token_ids[info.eos]) == (full.bos, full.eos)
    texts = set(fields["tokenizer.ggml.tokens"].contents())
    for merge in fields["tokenizer.ggml.merges"].contents():
        assert set(merge.split(" ", 1)) <= texts and merge.replace(" ", "", 1) in texts, merge


def test_special_token_ids_are_renumbered_into_the_narrowed_vocabulary(tmp_path):
    """SmolLM2's special tokens are its first ids, which narrowing leaves in place; Qwen's lie
    past 151,000. One not kept is left out (llama.cpp then uses its default)."""
    from .helpers import write_tiny_gguf

    src = write_tiny_gguf(tmp_path / "tiny.gguf", n_vocab=10)  # BOS 1, EOS 2
    draft_head.write_narrowed(src, tmp_path / "narrow.gguf", np.array([0, 2, 4]))
    info = read_gguf(tmp_path / "narrow.gguf")
    assert (info.bos, info.eos, info.token_ids.tolist()) == (None, 1, [0, 2, 4])


def test_a_corpus_with_few_tokens_is_made_up_with_the_lowest_ids(tmp_path):
    text = tmp_path / "corpus.py"
    text.write_text("x")
    kept = draft_head.frequent_tokens(lambda _: [90, 90, 50], 100, [7], n_keep=5, corpus=[text])
    assert kept.tolist() == [0, 1, 7, 50, 90]


def test_kept_tokens_score_exactly_as_in_the_full_draft_and_others_nearly(narrowed, smol_q4_0):
    full = Context(Model(smol_q4_0), n_ctx=256, n_threads=2)
    small = Context(Model(narrowed), n_ctx=256, n_threads=2)
    head = small.model.head
    assert head is not None
    tokens = full.model.tokenize(TEXT, add_special=False)

    reference = full.decode(tokens, 0, logits="all").copy()
    scored = small.decode(tokens, 0, logits="all").copy()

    outside = [t for t in dict.fromkeys(tokens) if t not in set(head.ids[: head.n_kept])]
    assert outside, "the text should hold tokens outside the kept set"
    assert head.ids[head.n_kept :] == outside  # each scored from the moment it is fed
    assert scored.shape == (len(tokens), KEEP + len(outside))
    np.testing.assert_array_equal(scored[:, :KEEP], reference[:, head.ids[:KEEP]])
    # Ours are float32 dot products; llama.cpp's quantize the hidden state to 8 bits first.
    np.testing.assert_allclose(scored[:, KEEP:], reference[:, outside], atol=0.2)
    # llama.cpp gives every row when asked for hidden states: "last" must still be the last.
    small.clear()
    np.testing.assert_allclose(small.decode(tokens, 0, logits="last")[0], scored[-1], rtol=1e-5)


def test_a_narrowed_drafts_prompt_goes_in_batches_of_64_rows_to_the_same_end(narrowed, monkeypatch):
    """With hidden states on, llama.cpp outputs a row of logits and a hidden state for every row
    of a batch: a chat's catch-up of 1,500 tokens in batches of 512 kept 163 MB more memory, in
    batches of 64 rows 42 MB. The text's last row comes out nearly as from one batch."""
    from edgespec import backend

    small = Context(Model(narrowed), n_ctx=256, n_threads=2)
    tokens = (small.model.tokenize(TEXT, add_special=False) * 4)[:200]
    one_batch = small.decode(tokens, 0, logits="all")[-1].copy()
    small.clear()
    batches = []
    run = small._run
    monkeypatch.setattr(
        small, "_run", lambda batch, n_out: batches.append(batch.n_tokens) or run(batch, n_out)
    )
    last = small.decode(tokens, 0, logits="last")[0]
    assert len(batches) >= 3 and set(batches[:-1]) == {64} and sum(batches) == len(tokens)
    assert backend.PREFILL_ROWS_NARROWED == 64
    # llama.cpp's kernels round differently by batch size (docs: near ties): the same guess and
    # nearly the same distribution (on the Zen 4 the logits moved by 0.13 on average, up to 0.52:
    # a total variation of 0.023; chunks at wrong positions would make another text's).
    assert last.argmax() == one_batch.argmax()
    assert total_variation(softmax(last), softmax(one_batch)) < 0.05


@pytest.mark.parametrize("model", ["smol_path", "smol_q4_0", "smol_q2_k"])
def test_rows_are_dequantized_as_gguf_py_does(model, request):
    """llama.cpp's own row functions (a few µs a row) read every type the tables come in."""
    from gguf.quants import dequantize

    info = read_gguf(request.getfixturevalue(model))
    assert info.token_embd is not None and info.n_embd
    table = TableRows(
        info.path, info.token_embd, info.n_embd, row_dequantizer(info.token_embd.ggml_type)
    )
    tokens = [0, 7, 1234, info.n_vocab - 1]
    raw = np.asarray(table._table[tokens])
    expected = dequantize(raw, info.token_embd.ggml_type).reshape(len(tokens), info.n_embd)
    rows = np.empty((len(tokens), info.n_embd), dtype=np.float32)
    table.into(tokens, rows)
    np.testing.assert_array_equal(rows, expected)


@pytest.mark.parametrize(("ggml_type", "dtype"), [(0, np.float32), (1, np.float16)])
def test_float_rows_are_copied_or_widened(ggml_type, dtype):
    values = np.linspace(-2.0, 2.0, 64).astype(dtype)
    out = np.empty(64, dtype=np.float32)
    row_dequantizer(ggml_type)(values.ctypes.data, out.ctypes.data, len(values))
    np.testing.assert_array_equal(out, values.astype(np.float32))


def head_of_three_extras(narrowed, monkeypatch, n_outside: int) -> tuple:
    """A narrowed head with room for 3 extra tokens, `n_outside` tokens it does not keep, and
    a buffer of as many input rows."""
    monkeypatch.setattr(draft_head, "MAX_EXTRA_TOKENS", 3)
    head = NarrowedHead(read_gguf(narrowed), row_dequantizer)
    kept = set(head.ids)
    outside = [t for t in range(1000, 49152) if t not in kept][:n_outside]
    return head, outside, np.empty((n_outside, head.n_embd), dtype=np.float32)


def test_a_long_text_starts_the_extra_tokens_afresh(narrowed, monkeypatch):
    head, outside, buffer = head_of_three_extras(narrowed, monkeypatch, 5)

    head.feed(outside[:2], buffer)
    head.feed(outside[2:4], buffer)  # 4 > 3: the first two make room

    assert head.ids[head.n_kept :] == outside[2:4]
    assert head.id_array.tolist() == head.ids
    head.feed(outside[:1], buffer)  # forgotten, so scored again
    assert head.ids[head.n_kept :] == [*outside[2:4], outside[0]]


def test_tokens_outside_the_kept_set_become_extras_once_however_they_are_fed(narrowed, monkeypatch):
    head, outside, buffer = head_of_three_extras(narrowed, monkeypatch, 6)

    head.feed([outside[0], outside[0]], buffer)  # twice in one batch: one extra
    assert head.ids[head.n_kept :] == outside[:1]
    head.feed_one(outside[1], buffer.ctypes.data)  # a draft step's token
    assert head.ids[head.n_kept :] == outside[:2]
    head.feed(outside[2:6], buffer)  # more than there is room for: the text's latest are kept
    assert head.ids[head.n_kept :] == outside[3:6]


def test_kept_tokens_past_a_smaller_targets_vocabulary_are_never_proposed(narrowed):
    head = NarrowedHead(read_gguf(narrowed), row_dequantizer)
    last = head.ids[head.n_kept - 1]
    head.propose_below(last)  # the target's vocabulary ends just before the last kept token
    logits = head.logits(np.zeros(head.n_kept, dtype=np.float32), np.zeros(head.n_embd))
    assert logits[head.n_kept - 1] == -np.inf and np.isfinite(logits[: head.n_kept - 1]).all()


def other_threads_cpu_s() -> float:
    """CPU seconds this process's threads other than this one have used so far (Linux)."""
    here, ticks = threading.get_native_id(), 0
    for task in Path("/proc/self/task").iterdir():
        if int(task.name) == here:
            continue
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread exited meanwhile
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")
def test_scoring_a_batch_of_rows_leaves_no_thread_spinning(narrowed):
    """A matrix product would wake numpy's BLAS helper thread, which spins for ~0.1 s after it
    on the cores llama.cpp's threads need: a draft's steps after such a batch took twice as long."""
    head = NarrowedHead(read_gguf(narrowed), row_dequantizer)
    kept_ids = set(head.ids)
    outside = [t for t in range(1000, 49152) if t not in kept_ids][:500]
    head.feed(outside, np.empty((len(outside), head.n_embd), dtype=np.float32))
    rng = np.random.default_rng(0)
    kept = rng.standard_normal((32, head.n_kept), dtype=np.float32)
    hidden = rng.standard_normal((32, head.n_embd), dtype=np.float32)
    expected = np.stack([head.logits(k, h).copy() for k, h in zip(kept, hidden, strict=True)])

    before = other_threads_cpu_s()
    for _ in range(10):
        scored = head.logits(kept, hidden)
        time.sleep(0.02)
    assert other_threads_cpu_s() - before < 0.05
    np.testing.assert_allclose(scored, expected, rtol=1e-5, atol=1e-5)


def test_a_narrowed_draft_decodes_without_llama_cpp_warning_about_its_outputs(narrowed_engine):
    """Its hidden states make llama.cpp output every row of a batch, whatever it is told: told so,
    it does not warn at every batch, each warning a call into Python through the log callback."""
    narrowed_engine.forget_caches()  # the prompt and every round's first draft batch: batches
    _native_log.clear()
    narrowed_engine.generate(PROMPTS[0], max_tokens=24, mode="chain")
    assert not [w for w in _native_log.warnings if "output" in w]


@pytest.mark.parametrize("prompt", PROMPTS[:2])
@pytest.mark.parametrize("mode", ["chain", "tree", "auto"])
def test_greedy_output_equals_plain_decoding_with_a_narrowed_draft(
    plain_engine, narrowed_engine, mode, prompt
):
    check_greedy(plain_engine, narrowed_engine, prompt, mode)


def test_the_narrowed_draft_guesses_the_rare_words_of_its_text(narrowed, smol_q4_0):
    """The point of the extra tokens: a name met earlier in the text, outside the kept set, is
    still the draft's guess where the text repeats it."""
    tokens = Model(smol_q4_0, vocab_only=True).tokenize(f"{TEXT}\n{TEXT}", add_special=False)
    draft = Context(Model(narrowed), n_ctx=256, n_threads=2)
    head = draft.model.head
    assert head is not None

    rows = draft.decode(tokens, 0, logits="all")
    guesses = [head.ids[j] for j in rows.argmax(axis=1)]

    kept = set(head.ids[: head.n_kept])
    second = range(len(tokens) // 2 + 1, len(tokens))  # the repeat, after its first token
    rare = [i for i in second if tokens[i] not in kept]
    assert len(rare) >= 3
    hits = sum(guesses[i - 1] == tokens[i] for i in rare)
    assert hits >= len(rare) * 2 // 3, f"{hits} of {len(rare)} rare tokens guessed"


def test_a_narrowed_draft_caught_up_on_the_ends_of_a_text_still_knows_the_rare_words_between(
    smol_path, narrowed
):
    """A draft far behind is fed only the start and end of the text (engine._draft_catch_up);
    the names in between are still scored, as if it had been fed them, for where the answer
    repeats them."""
    engine = edgespec.load(smol_path, draft=narrowed, n_ctx=N_CTX)
    head = engine.draft.head
    filler = "The weather was mild and nothing happened. " * 3
    prompt = engine.prompt_tokens(f"{filler}\n{TEXT}\n{filler}\nWhich city is named above?")
    skipped = range(DRAFT_SINK, len(prompt) - 1 - DRAFT_WINDOW)
    fed = {prompt[i] for i in range(len(prompt)) if i not in skipped}
    rare = {prompt[i] for i in skipped if not head._known[prompt[i]]} - fed
    assert len(rare) >= 3

    engine.generate(prompt, max_tokens=4, mode="chain", draft_max=2)

    assert engine.draft_ctx.seq_pos_min(0) == len(skipped)  # the middle was not evaluated
    assert rare <= set(head.ids[head.n_kept :])


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_sampling_with_a_narrowed_draft_keeps_the_target_distribution(narrowed_engine, mode):
    """The draft's tokens are drawn among its own 8,192 rows, then named by their ids."""
    engine = narrowed_engine
    setting = dict(temperature=1.0)
    prompt = engine.prompt_tokens(PROMPT, chat_mode=False)
    _, joint = exact_joint(engine, prompt, SamplingParams(**setting), min_count=5)
    pairs = Counter(
        tuple(engine.generate(prompt, max_tokens=2, mode=mode, seed=seed, **setting).tokens)
        for seed in range(N)
    )
    ok, stat, crit = chi_square_passes(pairs, joint, N)
    assert ok, f"first two tokens: chi-square {stat:.1f} >= {crit:.1f}"


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_sampling_with_a_narrowed_draft_allocates_no_row_of_its_own_while_decoding(
    narrowed_engine, mode
):
    """As with a full draft (test_sampling_real): no row of the target's vocabulary, where the
    draft's distribution is spread over the target's ids. (Its distribution over its own 8,192
    rows is kept too, but is too small to tell from the run's other allocations here.)"""
    engine = narrowed_engine
    prompt = engine.prompt_tokens(TEXT, chat_mode=False)

    def generate() -> None:
        result = engine.generate(
            prompt, max_tokens=24, mode=mode, seed=3, temperature=0.9, **FIXED_DRAFTING[mode]
        )
        assert result.stats.n_generated == 24 and result.stats.draft_evals

    generate()
    row = engine.target.n_vocab * np.dtype(np.float32).itemsize
    assert largest_allocation_at_once(generate) < row / 2


def test_a_narrowed_draft_without_its_original_is_one_clear_line(
    capsys, tmp_path, narrowed, smol_path
):
    alone = tmp_path / narrowed.name
    shutil.copy(narrowed, alone)
    with pytest.raises(ModelFileError, match="missing"):
        Model(alone)
    code, _, err = cli(capsys, "run", "--draft", str(alone), "--target", str(smol_path), "Hi")
    one_line_error(code, err, narrowed.name, "missing")


def test_a_narrowed_draft_cannot_be_a_target(capsys, narrowed, smol_q4_0):
    """Its logits cover 8,192 tokens: as a target it wrote nonsense, or nothing, with exit 0."""
    code, _, err = cli(capsys, "run", "-m", str(narrowed), "--mode", "target", "Hi")
    one_line_error(code, err, narrowed.name, "narrowed draft", smol_q4_0.name)
    # inspect says so too, not that the vocabularies' sizes differ
    code, out, _ = cli(capsys, "inspect", str(smol_q4_0), str(narrowed))
    assert f"{narrowed.name} is a narrowed draft: it can only draft" in out


def test_the_narrow_command_writes_a_copy_next_to_the_draft(capsys, tmp_path, smol_q4_0):
    draft = tmp_path / smol_q4_0.name
    shutil.copy(smol_q4_0, draft)
    code, out, _ = cli(capsys, "narrow", str(draft), "--tokens", "4096")
    assert code == 0
    made = narrowed_path(draft, 4096)
    assert out.strip() == str(made)
    assert read_gguf(made).n_vocab == 4096
    one_line_error(*cli(capsys, "narrow", str(made))[::2], "already narrowed")
    one_line_error(*cli(capsys, "narrow", str(draft), "--tokens", "10")[::2], "--tokens")
    one_line_error(*cli(capsys, "narrow", str(draft), str(draft))[::2], "is the input file")


def test_a_draft_that_is_a_link_is_narrowed_next_to_the_link(
    capsys, tmp_path, smol_q4_0, smol_path
):
    (tmp_path / "models").mkdir()
    draft = tmp_path / "models" / "draft.gguf"
    draft.symlink_to(smol_q4_0)  # a draft kept elsewhere, linked into a folder of models
    code, out, err = cli(capsys, "narrow", str(draft), "--tokens", "4096")
    assert code == 0, err
    made = narrowed_path(draft, 4096)
    assert out.strip() == str(made) and made.parent == draft.parent
    code, _, err = cli(capsys, "run", "-m", str(smol_path), "--draft", str(made), "-n", "4", "Hi")
    assert code == 0, err


def test_a_narrowed_copy_is_named_by_its_size_in_full():
    """--tokens 9000 was named .head8k, over the copy of 8,192, without a word."""
    draft = Path("models/draft.gguf")
    assert narrowed_path(draft).name == "draft.head32k.gguf"
    assert narrowed_path(draft, 8192).name == "draft.head8k.gguf"
    assert narrowed_path(draft, 9000).name == "draft.head9000.gguf"


def test_a_narrowed_draft_naming_no_file_as_its_source_is_one_clear_error(
    capsys, narrowed, smol_q4_0, smol_path, tmp_path
):
    """A name with a slash in it (a crafted file's: 6 bytes changed) was a ValueError from
    pathlib, a traceback."""
    data = narrowed.read_bytes()
    name = smol_q4_0.name.encode()
    assert data.count(name) == 1
    copy = tmp_path / narrowed.name
    copy.write_bytes(data.replace(name, b"../" + name[3:]))  # the same length: nothing moves
    (tmp_path / smol_q4_0.name).symlink_to(smol_q4_0)
    code, out, _ = cli(capsys, "inspect", str(copy), str(smol_path), "--json")
    verdict = json.loads(out)
    assert code == 0 and verdict["pairable"] is False
    assert "which is no file name" in verdict["reason"]
    code, _, err = cli(capsys, "run", "-m", str(smol_path), "--draft", str(copy), "-n", "2", "Hi")
    assert code == 1 and err.startswith("error: ") and "which is no file name" in err
    assert "Traceback" not in err


def test_inspect_of_a_narrowed_draft_without_its_full_one_answers_in_json(
    capsys, narrowed, smol_path, tmp_path
):
    """It printed an error and no JSON: a script reading the object broke."""
    moved = tmp_path / narrowed.name
    shutil.copy(narrowed, moved)  # without the full draft beside it
    code, out, _ = cli(capsys, "inspect", str(moved), str(smol_path), "--json")
    verdict = json.loads(out)
    assert code == 0 and verdict["pairable"] is False and "is missing from" in verdict["reason"]
