"""LLMCad's pipeline with the real models: while the target verifies a chain on its CPU, the draft
drafts on from the chain's end on another; what the verification leaves standing starts the
next chain, the rest is dropped. The output stays the target's own."""

from __future__ import annotations

import os
import time
from collections import Counter

import numpy as np
import pytest

import edgespec
from edgespec.errors import BadSettingError
from edgespec.profile import save_pipeline_speedup
from edgespec.sampling import SamplingParams, probs_from_logits

from .helpers import assert_same_or_near_tie, fresh_logits
from .test_sampling import chi_square_critical

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="a pipeline needs two CPUs"
)
CPUS = sorted(os.sched_getaffinity(0))
TARGET_CPU, DRAFT_CPU = str(CPUS[-1]), str(CPUS[0])
PROMPTS = [
    "List the planets of the solar system in order from the sun.",
    "Write a Python function that returns the squares of a list of numbers.",
]


def split_engine(target, draft, pipeline=True, n_ctx=512) -> edgespec.Engine:
    return edgespec.load(
        target, draft, n_ctx=n_ctx, target_cpus=TARGET_CPU, draft_cpus=DRAFT_CPU, pipeline=pipeline
    )


def slow_target(engine: edgespec.Engine, seconds: float = 0.03) -> None:
    """Verifications take longer (a big target on a phone): the draft drafts its full budget
    ahead, whatever the timing of this machine."""
    verify = engine.target_ctx.verify

    def slow(tokens, start_pos):
        time.sleep(seconds)
        return verify(tokens, start_pos)

    engine.target_ctx.verify = slow


@pytest.fixture(scope="module")
def pipelined(smol_path, smol_q4_0) -> edgespec.Engine:
    engine = split_engine(smol_path, smol_q4_0)
    slow_target(engine)
    return engine


@pytest.mark.parametrize("mode", ["chain", "auto"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_pipelined_greedy_output_is_the_targets_own(pipelined, plain_engine, prompt, mode):
    tokens = pipelined.prompt_tokens(prompt)
    plain = plain_engine.generate(tokens, max_tokens=48, mode="target")
    piped = pipelined.generate(tokens, max_tokens=48, mode=mode)
    assert_same_or_near_tie(plain_engine, tokens, plain.tokens, piped.tokens)
    if mode == "chain":
        stats = piped.stats
        assert stats.pipelined_evals > 0  # the draft drafted while the target verified
        assert stats.pipelined_kept > 0  # and next chains started with some of it
        assert stats.overlap_s > 0
        # the target's hidden time is not counted twice: our own time stays positive
        assert stats.decode_s > stats.native_s > 0


def test_the_pipeline_moves_drafting_into_the_verifications(
    pipelined, plain_engine, smol_path, smol_q4_0
):
    serial = split_engine(smol_path, smol_q4_0, pipeline=False)
    tokens = pipelined.prompt_tokens(PROMPTS[0])
    # the same chains: --draft-max fixes their length, --no-ngram keeps the n-gram rounds out
    options = dict(max_tokens=40, mode="chain", draft_max=3, ngram=False)
    alone = serial.generate(tokens, **options)
    piped = pipelined.generate(tokens, **options)
    assert serial.pipelines("chain") is False and alone.stats.pipelined_evals == 0
    assert_same_or_near_tie(plain_engine, tokens, alone.tokens, piped.tokens)
    # drafting that the serial chains did between verifications, the pipeline did during them
    assert piped.stats.pipelined_kept > 0
    assert piped.stats.draft_evals - piped.stats.pipelined_evals < alone.stats.draft_evals
    # Kept: what the chains started with (a token at most here), not all that was drafted
    # ahead (twice as many, counted before).
    ones = pipelined.generate(tokens, **{**options, "draft_max": 1}).stats
    assert 0 < ones.pipelined_kept <= ones.verifications


def carried_starts(
    engine, generations
) -> list[tuple[list[int], list[int], np.ndarray, np.ndarray]]:
    """The committed tokens, the carried tokens, their q rows and the draft's own logits at their
    positions, of every chain that started with what the pipeline drafted ahead, in the
    generations `generations()` runs."""
    starts = []
    draft_chain = engine._draft_chain

    def recording(run, k, *rules):
        ahead = run.ahead
        if ahead is not None and ahead.at == len(run.tokens):
            q_rows = engine._q_rows[: len(ahead.tokens)].copy()  # none when greedy
            logits = draft_logits_in_its_cache(engine, run.tokens, ahead.tokens)
            starts.append((list(run.tokens), list(ahead.tokens), q_rows, logits))
        return draft_chain(run, k, *rules)

    engine._draft_chain = recording
    try:
        generations()
    finally:
        del engine._draft_chain
    return starts


def draft_logits_in_its_cache(engine, committed: list[int], carried: list[int]) -> np.ndarray:
    """The draft's logits before each carried token, computed again in the engine's own draft
    cache: a second sequence shares the cells of the committed text before the root, and the root
    and carried tokens are evaluated one at a time, as the pipeline drafted them.

    A fresh context is no reference here: it evaluates the text in other batches, and this
    Q4_0's logits then differ by up to 1.7, enough to move a flat distribution's total variation
    by 0.16 (seen); computed over the same cells they agree to summation order."""
    ctx = engine.draft_ctx
    root = len(committed) - 1
    ctx.seq_cp(0, 1, 0, root)
    try:
        fed = [committed[-1], *carried[:-1]]
        return np.array(
            [ctx.decode([t], root + j, seq_ids=[[1]])[-1].copy() for j, t in enumerate(fed)]
        )
    finally:
        ctx.seq_rm(1, 0)


def test_a_chain_starts_with_what_the_draft_drafts_after_the_committed_text(pipelined):
    """What the next chain is given is the draft's own greedy continuation of the text the target
    committed, not of a guess the verification turned down."""
    engine = pipelined
    starts = carried_starts(
        engine, lambda: [engine.generate(p, max_tokens=48, mode="chain") for p in PROMPTS]
    )
    assert sum(len(carried) for _, carried, _, _ in starts) >= 8
    for _, carried, _, logits in starts:
        for token, row in zip(carried, logits, strict=True):
            assert row[token] > row.max() - 1e-3  # the argmax, up to summation order


def test_a_sampled_chain_starts_with_the_draft_distributions_of_its_carried_tokens(pipelined):
    """Carried tokens are verified against q rows moved to the start of the next chain: those
    rows must be the draft's distributions at the carried tokens' positions."""
    engine = pipelined
    params = SamplingParams(temperature=0.8)
    tokens = engine.prompt_tokens(PROMPTS[0])
    options = dict(max_tokens=40, mode="chain", draft_max=2, temperature=0.8)
    starts = carried_starts(
        engine, lambda: [engine.generate(tokens, seed=seed, **options) for seed in range(4)]
    )
    assert sum(len(carried) for _, carried, _, _ in starts) >= 4
    for _, _, q_rows, logits in starts:
        for q, row in zip(q_rows, logits, strict=True):
            # another position's row would be another distribution altogether (TV near 1)
            assert 0.5 * np.abs(q - probs_from_logits(row, params)).sum() < 0.01


def test_pipelined_sampling_keeps_the_targets_distribution_after_a_carried_start(
    smol_path, smol_q2_k
):
    """The third token of four, after the two most likely first tokens: a chain of one is
    verified with the draft's two tokens ahead; where the target takes it and samples the
    first of them itself, the second is the next chain, verified against its carried q row."""
    engine = split_engine(smol_path, smol_q2_k)
    slow_target(engine, 0.01)
    params = SamplingParams(temperature=1.0)
    prompt = engine.prompt_tokens(
        "Q: What is your favourite food?\nA: My favourite", chat_mode=False
    )
    n = 500
    runs = [
        engine.generate(
            prompt, max_tokens=4, mode="chain", draft_max=1, ngram=False, seed=s, temperature=1.0
        )
        for s in range(n)
    ]
    kept = sum(r.stats.pipelined_kept for r in runs)
    assert kept >= n // 4, "too few carried starts: the test would say little"
    prefixes = Counter(tuple(r.tokens[:2]) for r in runs)
    ((prefix, count),) = prefixes.most_common(1)
    assert count >= n // 2
    p3 = probs_from_logits(fresh_logits(engine, [*prompt, *prefix]), params)
    thirds = Counter(r.tokens[2] for r in runs if tuple(r.tokens[:2]) == prefix)
    cells = [int(t) for t in np.flatnonzero(p3 * count >= 5)]
    observed = np.array(
        [thirds.get(t, 0) for t in cells] + [count - sum(thirds.get(t, 0) for t in cells)]
    )
    expected = np.array([p3[t] * count for t in cells] + [count * (1 - p3[cells].sum())])
    assert len(cells) >= 3
    statistic = float(((observed - expected) ** 2 / expected).sum())
    assert statistic < chi_square_critical(len(cells)), (statistic, thirds.most_common(5))


def test_ctrl_c_during_a_pipelined_verification_leaves_the_engine_usable(pipelined, plain_engine):
    engine = pipelined
    tokens = engine.prompt_tokens(PROMPTS[1])
    decode = engine.draft_ctx.decode
    calls = 0

    def interrupted(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 12:
            raise KeyboardInterrupt
        return decode(*args, **kwargs)

    engine.draft_ctx.decode = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.generate(tokens, max_tokens=48, mode="chain")
    finally:
        del engine.draft_ctx.decode
    again = engine.generate(tokens, max_tokens=32, mode="chain")
    plain = plain_engine.generate(tokens, max_tokens=32, mode="target")
    assert_same_or_near_tie(plain_engine, tokens, plain.tokens, again.tokens)


def test_pipelining_needs_each_model_on_cpus_of_its_own(smol_path, smol_q4_0, monkeypatch):
    """Said before the models load (it took 19 s with the default pair)."""

    def no_load(*args):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("edgespec.engine._load_models", no_load)
    with pytest.raises(BadSettingError, match="CPUs of their own"):
        edgespec.load(smol_path, smol_q4_0, n_ctx=256, pipeline=True)
    with pytest.raises(BadSettingError, match="needs a draft"):
        edgespec.load(smol_path, n_ctx=256, target_cpus=TARGET_CPU, pipeline=True)


def test_pipelining_is_for_chains(pipelined):
    for mode in ("chain", "auto"):
        assert pipelined.pipelines(mode)
    for mode in ("target", "ngram", "tree"):
        assert not pipelined.pipelines(mode)
    # Other modes run as they do unpipelined (a chat's `/set mode tree`, the Python API's).
    tree = pipelined.generate(PROMPTS[0], max_tokens=4, mode="tree")
    assert tree.tokens and tree.stats.pipelined_evals == 0


def test_by_default_chains_pipeline_only_where_profile_measured_it_paying(smol_path, smol_q4_0):
    def stored(speedup: float) -> None:
        save_pipeline_speedup((smol_path, 1, TARGET_CPU), (smol_q4_0, 1, DRAFT_CPU), speedup)

    stored(0.7)
    assert not split_engine(smol_path, smol_q4_0, pipeline=None).pipelines("chain")
    stored(1.2)
    engine = split_engine(smol_path, smol_q4_0, pipeline=None)
    assert engine.pipelines("chain") and engine.pipelines("auto")
    assert not split_engine(smol_path, smol_q4_0, pipeline=False).pipelines("chain")
    # on shared CPUs there is nothing to pipeline, measured or not
    assert not edgespec.load(smol_path, smol_q4_0, n_ctx=256).pipelines("chain")
