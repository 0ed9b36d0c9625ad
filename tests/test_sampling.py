"""Specification of edgespec.sampling: the sampling filters, and that every verification rule
emits tokens distributed exactly as the target's own samples."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from edgespec.errors import BadSettingError
from edgespec.sampling import (
    RowsOnDemand,
    SamplingParams,
    accept_among_children,
    accept_chain,
    accept_point_mass,
    draw_children,
    probs_from_logits,
    sample,
)

QWEN_VOCAB = 151936


def logits_for(probs: list[float]) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float64))


def kept(probs: np.ndarray) -> list[int]:
    return sorted(np.flatnonzero(probs).tolist())


def llm_like_logits(seed: int, size: int = QWEN_VOCAB) -> np.ndarray:
    """A broad Gaussian floor with a few strong candidates, as float32 like llama.cpp's."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal(size) * rng.uniform(0.5, 3.0)
    logits[rng.choice(size, 20, replace=False)] += rng.uniform(2.0, 12.0, 20)
    return logits.astype(np.float32)


# --- settings --------------------------------------------------------------------------------


def test_temperature_zero_is_greedy():
    assert SamplingParams().greedy
    assert SamplingParams(temperature=0.0, top_k=5).greedy
    assert not SamplingParams(temperature=0.7).greedy


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"temperature": -1}, "--temp must be >= 0 (got -1)"),
        ({"temperature": -0.5}, "--temp must be >= 0 (got -0.5)"),
        ({"temperature": math.nan}, "--temp must be finite (got nan)"),
        ({"temperature": math.inf}, "--temp must be finite (got inf)"),
        ({"top_k": -1}, "--top-k must be >= 0 (0 turns it off) (got -1)"),
        ({"top_k": 2.5}, "--top-k must be a whole number (got 2.5)"),
        ({"top_p": 0}, "--top-p must be in (0, 1] (got 0)"),
        ({"top_p": 1.5}, "--top-p must be in (0, 1] (got 1.5)"),
        ({"min_p": 1}, "--min-p must be in [0, 1) (got 1)"),
        ({"min_p": -0.1}, "--min-p must be in [0, 1) (got -0.1)"),
        ({"seed": -1}, "--seed must be a whole number >= 0 (got -1)"),
    ],
)
def test_invalid_settings_raise_bad_setting_error_naming_the_flag(settings, message):
    with pytest.raises(BadSettingError) as raised:
        SamplingParams(**settings)
    assert str(raised.value) == message


# --- filters ---------------------------------------------------------------------------------


def test_greedy_gives_the_point_mass_on_the_argmax_whatever_the_filters():
    logits = logits_for([0.1, 0.6, 0.3])
    probs = probs_from_logits(logits, SamplingParams(temperature=0, top_k=2, min_p=0.5))
    assert probs.tolist() == [0.0, 1.0, 0.0]


def test_temperature_one_without_filters_is_the_softmax():
    logits = np.random.default_rng(0).standard_normal(50)
    softmax = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(probs_from_logits(logits, SamplingParams(temperature=1)), softmax)


def test_temperature_below_one_sharpens_and_above_one_flattens():
    logits = logits_for([0.5, 0.3, 0.15, 0.05])

    def best(temperature: float) -> float:
        return float(probs_from_logits(logits, SamplingParams(temperature=temperature)).max())

    assert best(1.0) == pytest.approx(0.5)
    assert best(0.5) > best(1.0) > best(2.0) > 0.25


@pytest.mark.parametrize("temperature", [1e-39, 1e-300, 5e-324])
def test_a_temperature_near_zero_is_the_point_mass_on_the_best_token_not_nans(temperature):
    """1/T beyond float32's range made the best token's weight 0 * inf: every probability NaN,
    and `--temp 1e-39` a traceback."""
    logits = np.random.default_rng(3).standard_normal(5000).astype(np.float32)
    probs = probs_from_logits(logits, SamplingParams(temperature=temperature))
    assert probs[np.argmax(logits)] == 1 and probs.sum() == 1


def test_top_k_keeps_exactly_the_k_most_likely_tokens_renormalised():
    logits = np.random.default_rng(1).standard_normal(1000)
    probs = probs_from_logits(logits, SamplingParams(temperature=1, top_k=7))
    best_seven = np.argsort(logits)[-7:]
    assert kept(probs) == sorted(best_seven.tolist())
    softmax_of_best = np.exp(logits[best_seven]) / np.exp(logits[best_seven]).sum()
    np.testing.assert_allclose(probs[best_seven], softmax_of_best)


def test_top_k_at_least_the_vocabulary_keeps_everything():
    logits = logits_for([0.5, 0.3, 0.2])
    probs = probs_from_logits(logits, SamplingParams(temperature=1, top_k=3))
    np.testing.assert_allclose(probs, [0.5, 0.3, 0.2])


def test_top_k_keeps_k_tokens_where_exactly_k_lie_above_a_starting_threshold():
    """The cutoff search starts from thresholds 4, 8, 16, 32 and 64 nats below the best token:
    where exactly k tokens lie above one, that threshold already holds the answer (e.g. the
    best token alone above e^-4 with top-k 1), and not one token more may survive."""
    logits = np.array([10.0, 5.0, 4.0, 0.0])
    assert kept(probs_from_logits(logits, SamplingParams(temperature=1, top_k=1))) == [0]
    # 1, 3, 4, 8, 16 and 32 tokens between the thresholds: 4, 8, 16, 32 and 64 above them.
    gaps = np.concatenate(
        [
            [0.0],
            np.linspace(1, 3, 3),
            np.linspace(5, 7, 4),
            np.linspace(9, 15, 8),
            np.linspace(17, 31, 16),
            np.linspace(33, 63, 32),
            np.linspace(70, 90, 10),  # and a tail below the last one
        ]
    )
    for k in (4, 8, 16, 32, 64):
        probs = probs_from_logits(-gaps, SamplingParams(temperature=1, top_k=k))
        assert kept(probs) == list(range(k)), f"top-k {k}"


def test_top_k_keeps_k_tokens_where_a_halving_of_a_crowded_bracket_holds_exactly_k():
    """A bracket of over 2048 tokens is halved (in log space) before it is sorted: here 1
    token lies above e^-4 and 3010 above e^-8, so the first halving tries e^-6, above which
    exactly the 10 asked for lie."""
    gaps = np.concatenate([[0.0], np.linspace(4.5, 5.5, 9), np.linspace(6.5, 7.5, 3000)])
    probs = probs_from_logits(-gaps, SamplingParams(temperature=1, top_k=10))
    assert kept(probs) == list(range(10))


@pytest.mark.parametrize(
    ("top_p", "survivors"), [(0.4, [0]), (0.75, [0, 1]), (0.85, [0, 1, 2]), (0.99, [0, 1, 2, 3])]
)
def test_top_p_keeps_the_smallest_set_of_best_tokens_reaching_the_mass(top_p, survivors):
    logits = logits_for([0.5, 0.3, 0.15, 0.05])
    probs = probs_from_logits(logits, SamplingParams(temperature=1, top_p=top_p))
    assert kept(probs) == survivors


def test_min_p_keeps_tokens_at_least_min_p_times_as_likely_as_the_best():
    logits = logits_for([0.5, 0.3, 0.15, 0.05])
    probs = probs_from_logits(logits, SamplingParams(temperature=1, min_p=0.2))
    assert kept(probs) == [0, 1, 2]
    np.testing.assert_allclose(probs[:3], np.array([0.5, 0.3, 0.15]) / 0.95)


def test_filters_apply_in_transformers_order_top_p_on_the_top_k_mass():
    # Top-3 renormalised is 0.44, 0.33, 0.22: two tokens reach 0.75. On the full distribution
    # (0.4, 0.7, 0.9) top-p would have kept three.
    logits = logits_for([0.4, 0.3, 0.2, 0.1])
    probs = probs_from_logits(logits, SamplingParams(temperature=1, top_k=3, top_p=0.75))
    assert kept(probs) == [0, 1]


def test_min_p_applies_after_temperature():
    logits = logits_for([0.5, 0.3, 0.2])  # ratios to the best: 0.6 and 0.4
    assert kept(probs_from_logits(logits, SamplingParams(temperature=1, min_p=0.5))) == [0, 1]
    # At temperature 2 the ratios become sqrt(0.6) = 0.77 and sqrt(0.4) = 0.63.
    assert kept(probs_from_logits(logits, SamplingParams(temperature=2, min_p=0.5))) == [0, 1, 2]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=1),
        SamplingParams(temperature=0.3),
        SamplingParams(temperature=1.7, top_k=40),
        SamplingParams(temperature=0.8, top_p=0.9),
        SamplingParams(temperature=0.8, min_p=0.05),
        SamplingParams(temperature=1.2, top_k=1000, top_p=0.95, min_p=0.01),
    ],
)
def test_result_is_a_distribution_of_the_logits_dtype(params):
    logits = llm_like_logits(seed=2)
    probs = probs_from_logits(logits, params)
    assert probs.shape == logits.shape
    assert probs.dtype == np.float32
    assert probs.min() >= 0
    assert float(probs.sum(dtype=np.float64)) == pytest.approx(1, abs=1e-5)


def test_logits_are_left_untouched():
    logits = llm_like_logits(seed=3)
    before = logits.copy()
    probs_from_logits(logits, SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.02))
    np.testing.assert_array_equal(logits, before)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1),
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.02),
    ],
)
def test_a_row_written_into_a_reused_buffer_is_the_fresh_one(params):
    """The decode loop passes `out` (no vocabulary-sized allocation a token): the same
    distribution, whatever the buffer held before."""
    logits = llm_like_logits(seed=4)
    buffer = np.full_like(logits, 7.0)

    written = probs_from_logits(logits, params, out=buffer)

    assert written is buffer
    np.testing.assert_array_equal(buffer, probs_from_logits(logits, params))


def reference_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """transformers' warpers written plainly over a full sort, in float64."""
    scaled = logits.astype(np.float64) / params.temperature
    order = np.argsort(-scaled, kind="stable")
    keep = np.ones(scaled.size, dtype=bool)
    if params.top_k:
        keep[order[params.top_k :]] = False

    def renormalised() -> np.ndarray:
        weights = np.where(keep, np.exp(scaled - scaled.max()), 0.0)
        return weights / weights.sum()

    if params.top_p < 1:
        probs = renormalised()[order]
        mass_before = np.cumsum(probs) - probs
        keep[order[mass_before >= params.top_p]] = False
    if params.min_p:
        probs = renormalised()
        keep &= probs >= params.min_p * probs.max()
    return renormalised()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1, top_k=40),
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=1.5, top_p=0.95),
        SamplingParams(temperature=1, top_p=0.5),
        SamplingParams(temperature=0.9, top_k=3000, top_p=0.8),
        SamplingParams(temperature=1.1, top_k=100, top_p=0.9, min_p=0.02),
        SamplingParams(temperature=0.6, min_p=0.1),
    ],
)
def test_fast_filters_equal_a_full_sort_reference_on_random_logits(params):
    for seed in range(12):
        size = QWEN_VOCAB if seed < 2 else 5000
        logits = llm_like_logits(seed, size)
        if seed % 3 == 2:  # flat: top-p needs a large share of the vocabulary
            logits = np.random.default_rng(seed).standard_normal(size).astype(np.float32)
        reference = reference_probs(logits, params)
        exact = probs_from_logits(logits.astype(np.float64), params)
        assert kept(exact) == kept(reference), f"seed {seed}"
        np.testing.assert_allclose(exact, reference, rtol=1e-9, atol=1e-15)
        # In float32, round-off of ~1e-7 of the mass can move the top-p boundary by one token
        # when the reference's cumulative mass lands that close to top_p (seed 1 at T=1.5 does).
        fast = probs_from_logits(logits, params)
        assert len(set(kept(fast)) ^ set(kept(reference))) <= 1, f"seed {seed}"
        np.testing.assert_allclose(fast, reference, rtol=2e-4, atol=1e-5)


# --- sample ----------------------------------------------------------------------------------

Z_999 = 3.0902  # the standard normal's 0.999 quantile


def chi_square_critical(df: int) -> float:
    """The chi-square distribution's 0.999 quantile by the Wilson–Hilferty approximation,
    (df (1 - h + z sqrt(h))^3 with h = 2 / 9df): within 1 % of the exact value for df >= 3."""
    h = 2 / (9 * df)
    return df * (1 - h + Z_999 * math.sqrt(h)) ** 3


def follows(samples: np.ndarray, expected: np.ndarray) -> bool:
    """Whether the samples (indices into `expected`) pass Pearson's chi-square test against
    `expected` at level 0.001, and never hit a zero of `expected`.

    Chi-square rather than a distribution-free total-variation bound: with 100k samples over a
    dozen cells it reliably flags 0.4 % of the mass moved between two cells, where a bound like
    TV <= sqrt(V / n) would let about 1 % through. The seeds are fixed, so a pass or a fail is
    reproducible, not a 1-in-1000 accident.
    """
    counts = np.bincount(np.asarray(samples).ravel(), minlength=expected.size)
    possible = expected > 0
    if counts[~possible].any():
        return False
    expected_counts = counts.sum() * expected[possible]
    assert expected_counts.min() >= 20, "too few samples for the chi-square approximation"
    statistic = float(((counts[possible] - expected_counts) ** 2 / expected_counts).sum())
    return statistic < chi_square_critical(int(possible.sum()) - 1)


def test_checker_accepts_true_samples_and_rejects_a_one_percent_shift():
    rng = np.random.default_rng(4)
    expected = np.array([0.3, 0.3, 0.2, 0.2, 0.0])
    assert follows(rng.choice(5, size=100_000, p=expected), expected)
    shifted = np.array([0.31, 0.29, 0.2, 0.2, 0.0])
    assert not follows(rng.choice(5, size=100_000, p=shifted), expected)


def test_sample_follows_a_distribution_spread_over_the_whole_vocabulary():
    rng = np.random.default_rng(5)
    probs = np.zeros(QWEN_VOCAB)
    support = [0, 511, 512, 70_000, 70_001, QWEN_VOCAB - 2, QWEN_VOCAB - 1]  # block edges, tail
    probs[support] = rng.uniform(0.5, 1.0, len(support))
    probs /= probs.sum()
    tokens = [sample(probs.astype(np.float32), rng) for _ in range(5_000)]
    assert follows(tokens, probs)


def test_sample_accepts_unnormalised_weights_and_never_picks_a_zero():
    rng = np.random.default_rng(6)
    weights = np.array([0.0, 3.0, 0.0, 1.0, 0.0])
    assert follows([sample(weights, rng) for _ in range(20_000)], weights / weights.sum())


def test_sample_refuses_all_zero_probabilities():
    with pytest.raises(ValueError, match="sum to zero"):
        sample(np.zeros(4), np.random.default_rng(0))


def test_draw_children_draws_iid_with_replacement():
    rng = np.random.default_rng(7)
    q = np.array([0.7, 0.2, 0.1])
    draws = draw_children(q, 20_000, rng)
    assert len(draws) == 20_000 and all(isinstance(token, int) for token in draws)
    assert follows(draws, q)


# --- exactness of the verification rules -----------------------------------------------------

N_SAMPLES = 100_000  # ~1 s per simulation: each call is a few µs of numpy over a tiny vocabulary
VOCAB = 12


def target_and_draft(seed: int, overconfident_draft: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A random target p and draft q over VOCAB tokens where each has zeros the other has not:
    tokens 0 and 1 the target never emits, tokens 2 and 3 the draft never proposes (only a
    residual can emit them). An overconfident draft puts over half its mass on token 5, so
    draws repeat often."""
    rng = np.random.default_rng(seed)
    p, q = rng.uniform(0.2, 1.0, VOCAB), rng.uniform(0.2, 1.0, VOCAB)
    p[[0, 1]] = 0
    q[[2, 3]] = 0
    if overconfident_draft:
        q[5] += q.sum()
    return p / p.sum(), q / q.sum()


AcceptChain = Callable[..., tuple[int, int]]


def generate_with_chains(
    accept: AcceptChain, k: int, length: int, seed: int, n_samples: int = N_SAMPLES
) -> tuple[np.ndarray, np.ndarray, float]:
    """Emit `length` tokens n_samples times by rounds of k-token speculative sampling, for a toy
    model whose next-token distribution depends only on the position: position j's exact
    distribution is p_rows[j] whatever precedes it. Returns (tokens, p_rows, share of the
    rounds that accepted all k drafts)."""
    pairs = [target_and_draft(seed * 100 + position) for position in range(length + k)]
    p_rows, q_rows = [p for p, _ in pairs], [q for _, q in pairs]
    rng = np.random.default_rng(seed)
    # One draft token per (sample, position), drawn at once: a round drafting from position s
    # looks at drafts[:, s : s + k] and the next round starts after its first rejection, so no
    # draft token is looked at twice.
    drafts = np.stack([rng.choice(VOCAB, size=n_samples, p=q) for q in q_rows], axis=1)
    tokens = np.empty((n_samples, length), dtype=np.int64)
    rounds = full_rounds = 0
    for emitted_row, drafted in zip(tokens, drafts, strict=True):
        position = 0
        while position < length:
            window = slice(position, position + k)
            n_accepted, next_token = accept(
                drafted[window], q_rows[window], p_rows[position : position + k + 1], rng
            )
            emitted = [*drafted[position : position + n_accepted], next_token]
            emitted = emitted[: length - position]
            emitted_row[position : position + len(emitted)] = emitted
            position += n_accepted + 1
            rounds += 1
            full_rounds += n_accepted == k
    return tokens, np.array(p_rows), full_rounds / rounds


def joint_cells(tokens: np.ndarray) -> np.ndarray:
    """The pair (first token, second token) as one cell index."""
    return tokens[:, 0] * VOCAB + tokens[:, 1]


def test_chain_of_one_emits_the_target_distribution_and_a_correct_bonus():
    tokens, p_rows, _ = generate_with_chains(accept_chain, k=1, length=2, seed=1)
    assert follows(tokens[:, 0], p_rows[0])
    assert follows(tokens[:, 1], p_rows[1])  # a bonus token when the draft was accepted
    assert follows(joint_cells(tokens), np.outer(p_rows[0], p_rows[1]).ravel())


def test_chain_of_three_emits_the_target_distribution_at_every_position():
    # Fewer samples, as each takes about two rounds: still >= 60 expected per joint cell.
    tokens, p_rows, fully_accepted = generate_with_chains(
        accept_chain, k=3, length=4, seed=2, n_samples=60_000
    )
    assert fully_accepted > 0.1  # so position 3 is often the bonus token
    for position in range(4):
        assert follows(tokens[:, position], p_rows[position]), f"position {position}"
    assert follows(joint_cells(tokens), np.outer(p_rows[0], p_rows[1]).ravel())


def chain_resampling_from_target(draft_tokens, q_rows, p_rows, rng) -> tuple[int, int]:
    """A wrong rule: on rejection it samples from p instead of norm(max(0, p - q))."""
    for i, (token, q, p) in enumerate(zip(draft_tokens, q_rows, p_rows, strict=False)):
        if rng.random() * q[token] >= p[token]:
            return i, sample(p, rng)
    return len(draft_tokens), sample(p_rows[-1], rng)


def test_the_check_catches_a_chain_that_resamples_from_the_target():
    tokens, p_rows, _ = generate_with_chains(chain_resampling_from_target, k=1, length=1, seed=1)
    assert not follows(tokens[:, 0], p_rows[0])


def chain_verifying_only_sure_draws(draft_tokens, q_rows, p_rows, rng) -> tuple[int, int]:
    """A wrong rule: the chain is cut before its first draw the draft gave less than 1/VOCAB,
    as if a weak tail were not worth its verification (right for greedy chains only): which
    draws are verified then depends on the draws themselves."""
    sure = 0
    while sure < len(draft_tokens) and q_rows[sure][draft_tokens[sure]] >= 1 / VOCAB:
        sure += 1
    return accept_chain(draft_tokens[:sure], q_rows[:sure], p_rows[: sure + 1], rng)


def test_the_check_catches_a_chain_that_verifies_only_the_draws_the_draft_was_sure_of():
    tokens, p_rows, _ = generate_with_chains(chain_verifying_only_sure_draws, k=1, length=1, seed=1)
    assert not follows(tokens[:, 0], p_rows[0])


def first_two_tokens_by_chains(
    cut_on_the_draw: bool, seed: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """The first two tokens of a toy model whose second position depends on the first (rows
    p2[x1], q2[x1]), N_SAMPLES times, by one chain round: x1 drafted, then x2 only where the
    draft is at least 0.3 sure there (engine: _auto_chain's `take`). The draft is, after an even
    x1 (its row overconfident), else not. `cut_on_the_draw`: the wrong rule, x2 drafted where the
    draft gave x2 itself 0.3 or more. Tokens the round leaves undecided are the target's own
    draws. Returns the tokens and their exact joint distribution."""
    rng = np.random.default_rng(seed)
    p1, q1 = target_and_draft(seed * 100)
    rows = [
        target_and_draft(seed * 100 + 1 + t, overconfident_draft=t % 2 == 0) for t in range(VOCAB)
    ]
    p2, q2 = [p for p, _ in rows], [q for _, q in rows]
    tokens = np.empty((N_SAMPLES, 2), dtype=np.int64)
    for pair in tokens:
        x1 = sample(q1, rng)
        chain, q_rows = [x1], [q1]
        if cut_on_the_draw:
            x2 = sample(q2[x1], rng)
            if q2[x1][x2] >= 0.3:
                chain.append(x2)
                q_rows.append(q2[x1])
        elif q2[x1].max() >= 0.3:
            chain.append(sample(q2[x1], rng))
            q_rows.append(q2[x1])
        n_ok, next_token = accept_chain(chain, q_rows, [p1, p2[x1], p1][: len(chain) + 1], rng)
        decided = [*chain[:n_ok], next_token]
        if len(decided) == 1:
            decided.append(sample(p2[decided[0]], rng))
        pair[:] = decided[:2]
    return tokens, (p1[:, None] * np.array(p2)).ravel()


def test_a_chain_stopped_before_a_draw_by_the_drafts_confidence_there_is_exact():
    tokens, joint = first_two_tokens_by_chains(cut_on_the_draw=False)
    assert follows(joint_cells(tokens), joint)


def test_the_check_catches_a_chain_stopped_by_the_draw_itself():
    tokens, joint = first_two_tokens_by_chains(cut_on_the_draw=True)
    assert not follows(joint_cells(tokens), joint)


def test_chain_validates_its_rows_and_draft_tokens():
    p, q = target_and_draft(0)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="2 draft tokens need 2 q rows and 3 p rows"):
        accept_chain([4, 5], [q, q], [p, p], rng)
    with pytest.raises(ValueError, match="1 draft tokens need 1 q rows and 2 p rows"):
        accept_chain([4], [q], [p, p, p], rng)  # one p row too many is no bonus row either
    with pytest.raises(ValueError, match="draft probability 0"):
        accept_chain([2], [q], [p, p], rng)  # q(2) = 0: token 2 cannot come from this draft


def test_chain_computes_the_targets_distributions_only_up_to_the_first_rejection():
    p, q = target_and_draft(0)
    rng = np.random.default_rng(0)
    impossible = int(np.flatnonzero((p == 0) & (q > 0))[0])  # drafted, never the target's
    p_rows = RowsOnDemand(4, lambda i: p)

    n_accepted, _ = accept_chain([impossible, 4, 5], [q, q, q], p_rows, rng)

    assert n_accepted == 0 and p_rows.computed == [0]


def test_chain_accepts_everything_when_draft_and_target_agree():
    p, _ = target_and_draft(0)
    rng = np.random.default_rng(0)
    for _ in range(100):
        n_accepted, bonus = accept_chain([4, 5, 6], [p, p, p], [p, p, p, p], rng)
        assert n_accepted == 3 and p[bonus] > 0


AcceptChildren = Callable[..., tuple[int | None, int]]


def emitted_at_node(
    accept: AcceptChildren, n_draws: int, seed: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """The token emitted at one tree node with n_draws children drawn from an overconfident
    draft, N_SAMPLES times. Returns (tokens, p, share of nodes with a repeated draw)."""
    p, q = target_and_draft(seed, overconfident_draft=True)
    rng = np.random.default_rng(seed)
    draws = rng.choice(VOCAB, size=(N_SAMPLES, n_draws), p=q)
    tokens = np.array([accept(row.tolist(), q, p, rng)[1] for row in draws])
    with_duplicates = np.mean([len(set(row)) < n_draws for row in draws.tolist()])
    return tokens, p, with_duplicates


@pytest.mark.parametrize("n_draws", [1, 2, 4])
def test_children_emit_the_target_distribution(n_draws):
    tokens, p, with_duplicates = emitted_at_node(accept_among_children, n_draws, seed=3)
    if n_draws > 1:
        assert with_duplicates > 0.3  # repeated draws are common, and each is its own trial
    assert follows(tokens, p)


def children_without_residual_update(draws, q, p, rng) -> tuple[int | None, int]:
    """A wrong rule: tries every draw against p itself and only then takes the residual."""
    for token in rng.permutation(draws):
        if rng.random() * q[token] < p[token]:
            return int(token), int(token)
    residual = np.maximum(p - q, 0)
    return None, sample(residual, rng)


def children_skipping_duplicates(draws, q, p, rng) -> tuple[int | None, int]:
    """A wrong rule: tries each distinct token once, one trial per child of the tree."""
    return accept_among_children(list(dict.fromkeys(draws)), q, p, rng)


@pytest.mark.parametrize(
    "wrong_rule", [children_without_residual_update, children_skipping_duplicates]
)
def test_the_check_catches_wrong_rules_among_children(wrong_rule):
    tokens, p, _ = emitted_at_node(wrong_rule, n_draws=4, seed=3)
    assert not follows(tokens, p)


def test_an_accepted_child_is_one_of_the_draws():
    p, q = target_and_draft(0, overconfident_draft=True)
    rng = np.random.default_rng(0)
    for _ in range(200):
        draws = draw_children(q, 3, rng)
        accepted, token = accept_among_children(draws, q, p, rng)
        assert accepted is None or (accepted == token and accepted in draws)
        assert p[token] > 0


def test_zero_residual_falls_back_to_sampling_the_remaining_target():
    # p below q everywhere, as round-off can leave it when p == q: a rejection leaves
    # max(0, p - q) all zeros, and the rules must sample from p instead of failing.
    _, q = target_and_draft(0)
    p = q * 0.5
    rng = np.random.default_rng(0)
    for _ in range(100):
        _, token = accept_among_children([5, 5], q, p, rng)
        assert p[token] > 0
        _, token = accept_chain([5], [q], [p, p], rng)
        assert p[token] > 0
        # Free to overwrite p, the rules have zeroed it by then: they sample from q (== p).
        _, token = accept_among_children([5, 5], q, p.copy(), rng, overwrite_p=True)
        assert p[token] > 0
        _, token = accept_chain([5], [q], [p.copy(), p], rng, overwrite_p=True)
        assert p[token] > 0


def decide_each_way(rule: Callable, args: tuple, p: np.ndarray, seed: int) -> tuple:
    """`rule(*args, p_rows, rng)` seeded alike, left p (three rows of it), then free to
    overwrite them: (both decisions, whether the first left p untouched)."""
    rows = [p.copy() for _ in range(3)]
    left = rule(*args, rows if rule is accept_chain else rows[0], np.random.default_rng(seed))
    untouched = all(np.array_equal(row, p) for row in rows)
    rows = [p.copy() for _ in range(3)]
    target = rows if rule is accept_chain else rows[0]
    overwritten = rule(*args, target, np.random.default_rng(seed), overwrite_p=True)
    return left, overwritten, untouched


def test_rules_free_to_overwrite_p_decide_as_the_ones_that_leave_it():
    """The engine lets the rules write a rejection's residual into the target's row (a buffer of
    its own); the decisions, seeded alike, are the same, and without the flag p is untouched."""
    for seed in range(200):
        p, q = target_and_draft(seed, overconfident_draft=seed % 2 == 0)
        draws = draw_children(q, 3, np.random.default_rng(seed))
        for rule, args in (
            (accept_chain, (draws[:2], [q, q])),
            (accept_among_children, (draws, q)),
            (accept_point_mass, (draws[0],)),
        ):
            left, overwritten, untouched = decide_each_way(rule, args, p, seed)
            assert untouched, rule.__name__
            assert overwritten == left, (rule.__name__, seed)


@pytest.mark.parametrize("proposed", [7, 0])  # p(0) = 0: always rejected
def test_point_mass_proposal_emits_the_target_distribution(proposed):
    p, _ = target_and_draft(4)
    rng = np.random.default_rng(4)
    tokens = np.array([accept_point_mass(proposed, p, rng)[1] for _ in range(N_SAMPLES)])
    assert follows(tokens, p)


def test_the_check_catches_a_point_mass_rule_that_resamples_from_the_target():
    p, _ = target_and_draft(4)
    rng = np.random.default_rng(4)

    def accept_point_mass_resampling_from_target(token: int) -> int:
        return token if rng.random() < p[token] else sample(p, rng)

    tokens = np.array([accept_point_mass_resampling_from_target(7) for _ in range(N_SAMPLES)])
    assert not follows(tokens, p)


def test_point_mass_accepts_with_the_target_probability_of_the_token():
    p, _ = target_and_draft(4)
    rng = np.random.default_rng(5)
    results = [accept_point_mass(7, p, rng) for _ in range(20_000)]
    assert all(accepted in (None, 7) for accepted, _ in results)
    accepted_share = np.mean([accepted == 7 for accepted, _ in results])
    assert accepted_share == pytest.approx(p[7], abs=4 * math.sqrt(p[7] / 20_000))
    assert all(token != 7 for accepted, token in results if accepted is None)
    assert accept_point_mass(0, p, rng)[0] is None  # p(0) = 0: never accepted
    assert accept_point_mass(3, np.eye(VOCAB)[3], rng) == (3, 3)  # certain


class Uniform:
    """A generator whose every uniform is `value`: edges a real one reaches once in 2^53 draws."""

    def __init__(self, value: float):
        self.value = value

    def random(self) -> float:
        return self.value

    def permutation(self, values: np.ndarray) -> np.ndarray:
        return values


def test_sample_never_picks_a_zero_even_at_the_edges_of_the_uniform():
    assert sample(np.array([0.0, 0.0, 1.0, 1.0, 0.0]), Uniform(0.0)) == 2
    # A subnormal total: uniform * total rounds up to the total itself.
    assert sample(np.array([5e-324, 0.0]), Uniform(1 - 2**-53)) == 0


def test_a_token_the_target_never_emits_is_rejected_even_by_a_uniform_of_zero():
    p, q = target_and_draft(0)
    impossible = int(np.flatnonzero((p == 0) & (q > 0))[0])
    assert accept_chain([impossible], [q], [p, p], Uniform(0.0))[0] == 0
    assert accept_among_children([impossible], q, p, Uniform(0.0))[0] is None
    assert accept_point_mass(impossible, p, Uniform(0.0))[0] is None


def children_sorted_by_the_drafts_probability(draws, q, p, rng) -> tuple[int | None, int]:
    """A caller that tries the likeliest draws first: the rule must not let that order bias it."""
    return accept_among_children(sorted(draws, key=lambda token: -q[token]), q, p, rng)


def test_children_emit_the_target_distribution_whatever_order_the_caller_gives_the_draws():
    tokens, p, _ = emitted_at_node(children_sorted_by_the_drafts_probability, n_draws=4, seed=3)
    assert follows(tokens, p)


def test_min_p_keeps_a_token_exactly_min_p_times_as_likely_as_the_best():
    logits = np.array([0.0, -0.7, -3.0])
    # The ratio as probs_from_logits computes it (same ufunc, same row), so the tie is exact.
    min_p = float(np.exp(np.subtract(logits, logits.max()))[1])
    assert kept(probs_from_logits(logits, SamplingParams(temperature=1, min_p=min_p))) == [0, 1]
