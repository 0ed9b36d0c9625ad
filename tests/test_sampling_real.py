"""Speculative sampling on the real SmolLM2 keeps the target's distribution.

The first two tokens of many seeded generations, through `generate`, are checked against the
target's exact distribution (computed from its logits) by a chi-square test, for plain sampling and
for chain and tree speculation with a genuinely different draft (the Q2_K requantization), and
for n-gram proposals (point masses); the first three for auto, whose third round speculates.
"""

from __future__ import annotations

import tracemalloc
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

import edgespec
import edgespec.engine
from edgespec.policy import Calibrator, Costs
from edgespec.sampling import SamplingParams, probs_from_logits

from .conftest import N_CTX
from .helpers import fresh_logits, with_extra_tokens
from .test_modes import price_passes_with_a_flat_curve
from .test_sampling import chi_square_critical

PROMPT = "My favourite food is"  # a spread-out first token: 15-24 cells to compare
# An n-gram proposal (" pizza. My favourite") whose first token the target gives 0.3: point masses
# accepted and rejected alike. --draft-max makes every round verify one.
NGRAM_PROMPT = "My favourite food is pizza. My favourite food is"
MODE_SETTINGS = {"ngram": {"draft_max": 4}}
N = 600  # generations per mode and setting
# The draft's confidence at which a sampled chain drafts its next token in the test of that
# rule, at temperature 0.7: the Q2_K draft is 0.38 sure of its favourite after PROMPT, and at
# least this sure after PROMPT and a first token drawn from it about two times in three.
CUT = 0.35
SETTINGS = {
    "temp 1": dict(temperature=1.0),
    "temp 0.8, top-k 20, top-p 0.9": dict(temperature=0.8, top_k=20, top_p=0.9),
}


def exact_joint(engine, prompt: list[int], params: SamplingParams, min_count: float):
    """P(t1, t2) for the first tokens likely enough to matter; the rest is one pooled cell."""
    p1 = probs_from_logits(fresh_logits(engine, prompt), params)
    joint: dict[tuple[int, int], float] = {}
    for t1 in np.flatnonzero(p1 * N >= min_count):
        p2 = probs_from_logits(fresh_logits(engine, [*prompt, int(t1)]), params)
        for t2 in np.flatnonzero(p1[t1] * p2 * N >= min_count):
            joint[(int(t1), int(t2))] = float(p1[t1] * p2[t2])
    return p1, joint


def chi_square_passes(observed: Counter, expected: dict, n: int) -> tuple[bool, float, float]:
    """Pearson's test at level 0.001 over the given cells plus one cell pooling all others."""
    cells = list(expected)
    obs = np.array(
        [observed.get(c, 0) for c in cells] + [n - sum(observed.get(c, 0) for c in cells)]
    )
    exp = np.array([expected[c] * n for c in cells] + [n * (1 - sum(expected.values()))])
    keep = exp > 0
    assert keep.sum() >= 4, "too few cells: the test would say nothing"
    statistic = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    critical = chi_square_critical(int(keep.sum()) - 1)
    return statistic < critical and not obs[~keep].any(), statistic, critical


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("mode", ["target", "chain", "tree", "ngram"])
def test_first_two_tokens_follow_the_target_distribution(q2_draft_engine, mode, setting):
    engine = q2_draft_engine
    params = SamplingParams(**SETTINGS[setting])
    prompt = engine.prompt_tokens(NGRAM_PROMPT if mode == "ngram" else PROMPT, chat_mode=False)
    p1, joint = exact_joint(engine, prompt, params, min_count=5)
    firsts, pairs = Counter(), Counter()
    for seed in range(N):
        tokens = engine.generate(
            prompt,
            max_tokens=2,
            mode=mode,
            seed=seed,
            **SETTINGS[setting],
            **MODE_SETTINGS.get(mode, {}),
        ).tokens
        firsts[tokens[0]] += 1
        pairs[tuple(tokens[:2])] += 1

    first_cells = {int(t): float(p1[t]) for t in np.flatnonzero(p1 * N >= 5)}
    ok, stat, crit = chi_square_passes(firsts, first_cells, N)
    assert ok, f"first token: chi-square {stat:.1f} >= {crit:.1f}"
    ok, stat, crit = chi_square_passes(pairs, joint, N)
    assert ok, f"first two tokens: chi-square {stat:.1f} >= {crit:.1f}"


# A text that repeats: the n-gram drafter proposes its continuation from the third round on.
AUTO_PROMPT = "a b c d e f g a b c d e f g a b c d e f g a b c"


def test_auto_keeps_the_target_distribution_through_its_speculative_rounds(
    q2_draft_engine, monkeypatch
):
    """Auto picks each round's drafter by timings and by what earlier rounds taught it, never by
    the round's own draws: the first three tokens follow the target's exact distribution. Its
    first two rounds measure a plain step; with verifying nearly free (a flat curve) the third
    verifies a proposal (of one token: a fourth is the last to generate) in most generations."""
    engine = q2_draft_engine
    price_passes_with_a_flat_curve(engine, monkeypatch)
    # and kept flat: the passes auto times would correct it towards this CPU's dear one, on
    # which these proposals do not pay (in one run 85 generations of 600 verified one)
    monkeypatch.setattr(Costs, "record_pass", lambda costs, k, seconds: None)
    setting = SETTINGS["temp 1"]  # 11 cells of three tokens hold 0.7 of the mass
    params = SamplingParams(**setting)
    prompt = engine.prompt_tokens(AUTO_PROMPT, chat_mode=False)
    _, pairs = exact_joint(engine, prompt, params, min_count=5)
    triples = {}
    for (t1, t2), p12 in pairs.items():
        p3 = probs_from_logits(fresh_logits(engine, [*prompt, t1, t2]), params)
        for t3 in np.flatnonzero(p12 * p3 * N >= 5):
            triples[(t1, t2, int(t3))] = p12 * float(p3[t3])
    observed, speculative = Counter(), 0
    for seed in range(N):
        result = engine.generate(prompt, max_tokens=4, mode="auto", seed=seed, **setting)
        observed[tuple(result.tokens[:3])] += 1
        speculative += any(arm != "plain" for arm in result.stats.choices)
    assert speculative > N / 2
    ok, stat, crit = chi_square_passes(observed, triples, N)
    assert ok, f"first three tokens: chi-square {stat:.1f} >= {crit:.1f} ({len(triples)} cells)"


def assert_first_two_tokens_follow_the_target(engine, mode: str) -> None:
    """N generations of PROMPT at temperature 0.7 (17 cells hold a third of the mass), the
    n-gram drafter off: their first two tokens pass the chi-square test against the target's
    exact joint distribution."""
    setting = dict(temperature=0.7)
    prompt = engine.prompt_tokens(PROMPT, chat_mode=False)
    _, joint = exact_joint(engine, prompt, SamplingParams(**setting), min_count=5)
    pairs = Counter()
    for seed in range(N):
        result = engine.generate(prompt, max_tokens=3, mode=mode, seed=seed, ngram=False, **setting)
        pairs[tuple(result.tokens[:2])] += 1
    ok, stat, crit = chi_square_passes(pairs, joint, N)
    assert ok, f"first two tokens: chi-square {stat:.1f} >= {crit:.1f}"


def test_a_sampled_chain_stopped_before_a_draw_keeps_the_target_distribution(
    q2_draft_engine, monkeypatch
):
    """A sampled chain may stop before its next token is drawn, where the draft is unsure there
    (Engine._auto_chain): whether the second token is drafted depends on the first, never on
    itself. Here the draft's confidence decides alone (the device's costs and the calibration
    set aside): the first token is always drafted, the second only where the draft is at least
    CUT sure of its favourite after the first, two times in three; the first two tokens keep
    the target's distribution. (This checks the engine's path; that the check catches a chain
    cut by the draw itself is shown on a toy model in test_sampling, with 100k samples: on this
    prompt, 1,500 generations did not tell such a cut apart.)"""
    engine = q2_draft_engine
    first_chains: list[int] = []  # tokens drafted by each generation's first chain
    draft_chain = edgespec.engine.Engine._draft_chain

    def recording(self, run, k, *rules):
        drafted = draft_chain(self, run, k, *rules)
        if not run.generated:
            first_chains.append(len(drafted[0]))
        return drafted

    def sure_enough(accept_probs, next_guess, costs, **_) -> bool:
        return next_guess >= CUT

    monkeypatch.setattr(edgespec.engine.Engine, "_draft_chain", recording)
    monkeypatch.setattr(Costs, "measured", property(lambda costs: True))
    monkeypatch.setattr(Calibrator, "predict", lambda calibrator, confidence: confidence)
    monkeypatch.setattr(edgespec.engine, "worth_drafting_on", sure_enough)
    assert_first_two_tokens_follow_the_target(engine, "chain")
    assert len(first_chains) == N and min(first_chains) == 1
    assert N / 5 < first_chains.count(2) < N * 4 / 5, f"{first_chains.count(2)} of {N} took two"


def test_a_sampled_tree_that_draws_children_by_the_drafts_confidence_keeps_the_distribution(
    q2_draft_engine, monkeypatch
):
    """A sampled tree draws children at a node only where they are worth their places in the
    pass, decided from the draft's distribution there before they are drawn
    (Engine._children_worth_drawing): whether a first token gets children depends on that
    token, never on them. Here the draft's confidence decides alone (costs and calibration set
    aside): the root always draws, a node after it only where the draft is at least CUT sure
    there, two times in three; the first two tokens keep the target's distribution."""
    engine = q2_draft_engine
    drawn_after_first: list[bool] = []

    def sure_enough(run, tree, node, draft_evals, chance) -> bool:
        if node == 0:
            return True
        drawn_after_first.append(chance >= CUT)
        return drawn_after_first[-1]

    Engine = edgespec.engine.Engine
    monkeypatch.setattr(Engine, "_children_worth_drawing", staticmethod(sure_enough))
    monkeypatch.setattr(Engine, "_tree_worth_growing", staticmethod(lambda *_: True))
    monkeypatch.setattr(Calibrator, "predict", lambda calibrator, confidence: confidence)
    assert_first_two_tokens_follow_the_target(engine, "tree")
    n = len(drawn_after_first)
    assert n >= N and n / 5 < sum(drawn_after_first) < n * 4 / 5, f"{sum(drawn_after_first)} of {n}"


@pytest.fixture(scope="module")
def wider_q2_draft(tmp_path_factory, smol_q2_k):
    """The Q2_K draft with 64 tokens more than the target (Qwen2.5's 0.5B and 7B differ so)."""
    return with_extra_tokens(smol_q2_k, tmp_path_factory.mktemp("wide") / "q2-wide.gguf", 64)


def test_a_draft_with_more_tokens_than_the_target_keeps_its_distribution(smol_path, wider_q2_draft):
    """Its rows were 64 longer than the target's, and every sampled chain failed at its first
    rejected token; tokens only the draft has must never be proposed."""
    engine = edgespec.load(smol_path, draft=wider_q2_draft, n_ctx=N_CTX)
    assert engine.draft.n_vocab == engine.target.n_vocab + 64
    params = SamplingParams(**SETTINGS["temp 1"])
    prompt = engine.prompt_tokens(PROMPT, chat_mode=False)
    _, joint = exact_joint(engine, prompt, params, min_count=5)
    pairs, drafted = Counter(), 0
    for seed in range(N):
        result = engine.generate(
            prompt, max_tokens=2, mode="chain", seed=seed, **SETTINGS["temp 1"]
        )
        pairs[tuple(result.tokens[:2])] += 1
        drafted += result.stats.draft_tokens
    assert drafted > N / 2
    ok, stat, crit = chi_square_passes(pairs, joint, N)
    assert ok, f"first two tokens: chi-square {stat:.1f} >= {crit:.1f}"
    for mode in ("tree", "auto"):  # the tree's rows and auto's chains: no error
        assert engine.generate(prompt, max_tokens=24, mode=mode, seed=1, temperature=0.9).tokens


def test_a_draft_that_prefers_a_token_the_target_lacks_never_proposes_it(smol_path, wider_q2_draft):
    """Greedy drafts took the argmax of the draft's whole row: an id past the target's
    vocabulary went into its batch, and llama.cpp refused the batch (a RuntimeError)."""
    import llama_cpp

    engine = edgespec.load(smol_path, draft=wider_q2_draft, n_ctx=N_CTX)
    draft_ctx, n_vocab = engine.draft_ctx, engine.draft.n_vocab
    decode = draft_ctx.decode

    def decode_preferring_the_last_extra_token(*args, **kwargs):
        rows = decode(*args, **kwargs)
        if len(rows):  # in llama.cpp's own buffer, whatever view edgespec takes of it
            pointer = llama_cpp.llama_get_logits(draft_ctx._ctx)
            logits = np.ctypeslib.as_array(pointer, shape=(len(rows), n_vocab))
            logits[:, -1] = logits.max() + 50.0
        return rows

    draft_ctx.decode = decode_preferring_the_last_extra_token
    assert_drafting_goes_on_as_plain_decoding(engine)


def test_a_narrowed_draft_that_prefers_a_token_the_target_lacks_never_proposes_it(
    smol_path, tmp_path
):
    """A narrowed draft keeps user-defined tokens, a padded vocabulary's among them: its kept
    columns past the target's vocabulary went into the target's batch as well."""
    from edgespec.drafts import narrow

    wider = with_extra_tokens(smol_path, tmp_path / "wide.gguf", 8)
    narrow(wider, tmp_path / "wide.head2k.gguf", 2048)
    engine = edgespec.load(smol_path, draft=tmp_path / "wide.head2k.gguf", n_ctx=N_CTX)
    head = engine.draft.head
    beyond = np.flatnonzero(np.asarray(head.ids[: head.n_kept]) >= engine.target.n_vocab)
    assert len(beyond) == 8
    logits = head.logits

    def logits_preferring_the_last_of_them(kept, hidden):
        kept[..., beyond[-1]] = kept.max() + 50.0  # as llama.cpp would have computed it
        return logits(kept, hidden)

    head.logits = logits_preferring_the_last_of_them
    assert_drafting_goes_on_as_plain_decoding(engine)


def assert_drafting_goes_on_as_plain_decoding(engine) -> None:
    """Greedy chain, tree and auto give plain decoding's tokens; a sampled chain runs."""
    prompt = engine.prompt_tokens(PROMPT, chat_mode=False)
    plain = engine.generate(prompt, max_tokens=24, mode="target").tokens
    for mode in ("chain", "tree", "auto"):
        assert engine.generate(prompt, max_tokens=24, mode=mode).tokens == plain, mode
    assert engine.generate(prompt, max_tokens=24, mode="chain", seed=1, temperature=0.9).tokens


def test_a_target_with_more_tokens_than_the_draft_samples_in_every_mode(
    tmp_path_factory, smol_path, smol_q2_k
):
    wider = with_extra_tokens(smol_path, tmp_path_factory.mktemp("wide") / "target-wide.gguf", 64)
    engine = edgespec.load(wider, draft=smol_q2_k, n_ctx=N_CTX)
    prompt = engine.prompt_tokens(PROMPT, chat_mode=False)
    for mode in ("chain", "tree", "auto"):
        for seed in range(3):
            result = engine.generate(prompt, max_tokens=24, mode=mode, seed=seed, temperature=0.9)
            assert result.tokens and result.stats.finish_reason in ("length", "stop")


def test_the_check_catches_a_wrong_distribution(q2_draft_engine):
    """Samples at temperature 0.8 tested against the temperature-1 distribution must fail."""
    engine = q2_draft_engine
    prompt = engine.prompt_tokens(PROMPT, chat_mode=False)
    p1 = probs_from_logits(fresh_logits(engine, prompt), SamplingParams(temperature=1.0))
    firsts = Counter(
        engine.generate(prompt, max_tokens=1, mode="target", seed=s, temperature=0.6).tokens[0]
        for s in range(N)
    )
    cells = {int(t): float(p1[t]) for t in np.flatnonzero(p1 * N >= 5)}
    assert not chi_square_passes(firsts, cells, N)[0]


# Where drafting adapts to measured speed (a chain's length, n-gram or model, a calibrated tree's
# size), the draws fall differently from run to run: reproducible are the modes that draft the
# same way every time. (A calibrated tree parted after 120 characters in CI, under load.)
FIXED_DRAFTING = {
    "target": {},
    "ngram": {"draft_max": 4},
    "chain": {"draft_max": 4, "ngram": False},
    "tree": {"ngram": False, "calibrated": False},
}


@pytest.mark.parametrize("mode", list(FIXED_DRAFTING))
def test_a_seed_makes_sampling_reproducible_and_another_seed_differs(q2_draft_engine, mode):
    def text(seed: int) -> str:
        return q2_draft_engine.generate(
            "Tell me a story.",
            max_tokens=30,
            mode=mode,
            temperature=0.9,
            seed=seed,
            **FIXED_DRAFTING[mode],
        ).text

    assert text(1) == text(1)
    assert text(1) != text(2)


def largest_allocation_at_once(run: Callable[[], object]) -> int:
    """The most memory `run` held at any moment beyond what it began with, in bytes, as
    tracemalloc counts it (numpy reports its arrays to it; llama.cpp's own memory is not seen)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        held, _ = tracemalloc.get_traced_memory()
        run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - held


# The calibrated tree too: its buffers are sized by the budget, not by what it drafted.
@pytest.mark.parametrize(
    "mode, drafting", [*FIXED_DRAFTING.items(), ("tree", {"ngram": False, "calibrated": True})]
)
def test_sampling_allocates_no_row_of_the_vocabulary_while_decoding(
    q2_draft_engine, mode, drafting
):
    """Each sampled token is a distribution over the whole vocabulary (Qwen's: 0.6 MB of
    float32): the decode loop writes them into buffers it keeps, never into a fresh array, not
    even for a moment. The first run sizes the buffers; every run after it is measured."""
    engine = q2_draft_engine
    prompt = engine.prompt_tokens(NGRAM_PROMPT, chat_mode=False)

    def drafts_24_tokens(seed: int) -> bool:
        result = engine.generate(
            prompt, max_tokens=24, mode=mode, seed=seed, temperature=0.9, **drafting
        )
        return result.stats.n_generated == 24 and (
            mode == "target" or result.stats.draft_tokens > 0
        )

    # A seed whose answer runs the whole 24 tokens and drafts: which one depends on the CPU's
    # numerics (seed 3's answer ended after 2 tokens on an Emerald Rapids, where llama.cpp
    # multiplies on AMX tiles).
    seed = next((s for s in range(3, 23) if drafts_24_tokens(s)), None)
    assert seed is not None

    def measured(seed: int) -> tuple[bool, int]:
        drafted: list[bool] = []
        size = largest_allocation_at_once(lambda: drafted.append(drafts_24_tokens(seed)))
        return drafted[0], size

    # The same seed mostly drafts the same again, but the calibrated tree learns from every
    # run, so its next one may draft another tree and draw otherwise (on a Zen 3 here the
    # seed's second run ended early or drafted nothing): then the next seeds, each measured
    # too, until one drafts 24 tokens.
    runs = []
    for next_seed in range(seed, seed + 20):
        runs.append(measured(next_seed))
        if runs[-1][0]:
            break
    row = engine.target.n_vocab * np.dtype(np.float32).itemsize
    assert runs[-1][0]
    assert max(size for _, size in runs) < row / 2
