"""Sampling and speculative verification maths for one position at a time (numpy only).

Every function here runs once per drafted or generated token on rows of up to 152k entries
(Qwen's vocabulary), so each is a few vectorised passes over the row: no Python loop over the
vocabulary and no full sort of it (np.sort of 152k floats costs ~4 ms, np.argpartition ~1 ms).

Verification follows the papers: speculative sampling
(Leviathan et al. 2022, Chen et al. 2023) for a chain and SpecInfer's multi-step speculative
sampling for the children of a tree node. Both emit tokens distributed exactly as the target's.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.errors import BadSettingError


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. Temperature 0 is greedy: the argmax, filters ignored."""

    temperature: float = 0.0
    top_k: int = 0  # 0 turns top-k off
    top_p: float = 1.0  # 1 turns top-p off
    min_p: float = 0.0  # 0 turns min-p off
    seed: int | None = None

    def __post_init__(self) -> None:
        _require(is_real(self.temperature), "--temp", "a number", self.temperature)
        _require(math.isfinite(self.temperature), "--temp", "finite", self.temperature)
        _require(self.temperature >= 0, "--temp", ">= 0", self.temperature)
        _require(is_whole(self.top_k), "--top-k", "a whole number", self.top_k)
        _require(self.top_k >= 0, "--top-k", ">= 0 (0 turns it off)", self.top_k)
        _require(is_real(self.top_p) and 0 < self.top_p <= 1, "--top-p", "in (0, 1]", self.top_p)
        _require(is_real(self.min_p) and 0 <= self.min_p < 1, "--min-p", "in [0, 1)", self.min_p)
        if self.seed is not None:
            _require(
                is_whole(self.seed) and self.seed >= 0, "--seed", "a whole number >= 0", self.seed
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def make_rng(self) -> np.random.Generator:
        """A generator seeded with `seed`, or from the OS entropy when there is none."""
        return np.random.default_rng(self.seed)


def is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_whole(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _require(ok: bool, flag: str, rule: str, value: object) -> None:
    if not ok:
        shown = f"{value:g}" if isinstance(value, float) else repr(value)
        raise BadSettingError(f"{flag} must be {rule} (got {shown})")


def probs_from_logits(
    logits: np.ndarray, params: SamplingParams, out: np.ndarray | None = None
) -> np.ndarray:
    """The distribution the next token is sampled from, for one row of logits of shape (V,).

    Filters apply in the order of transformers' logits processors: temperature, top-k, top-p
    (on the top-k renormalised mass), min-p (relative to the best token). llama.cpp's default
    chain applies temperature last instead, so the two differ when temperature != 1. Ties at a
    filter's boundary all survive, as in transformers' top-k. Greedy gives the point mass on the
    argmax.

    The result is dense, sums to 1, has exact zeros for filtered tokens and the dtype of the logits
    (float32 from llama.cpp; float64 for integer input), or is written into `out` (a float row of
    the same length, which may be the logits themselves): the decode loop passes a buffer it
    reuses, as a fresh row of Qwen's 152k floats a token costs its allocation's page faults too.
    Draft and target rows must both come from this function with the same params: speculative
    sampling is exact only for the distributions it compares.
    """
    logits = np.asarray(logits)
    if not np.issubdtype(logits.dtype, np.floating):
        logits = logits.astype(np.float64)
    if params.greedy:
        best = np.argmax(logits)
        probs = np.empty_like(logits) if out is None else out
        probs.fill(0)
        probs[best] = 1
        return probs
    # Weights relative to the best token, exp((logit - max) / T): the best weighs 1, so min-p is
    # a plain threshold on them. In place, because every fresh 152k array costs a pass or more.
    weights = np.subtract(logits, logits.max(), out=out)
    if params.temperature != 1:
        # At most 1e30: 1/T beyond float32's range (T < 3e-39) was inf, and the best token's
        # 0 * inf a NaN. A token g below the best still weighs exp(-g * 1e30), 0 for any gap
        # over 1e-28 (logits of a few units are ~1e-7 apart at the least), and no gap overflows.
        weights *= min(1 / params.temperature, 1e30)
    np.exp(weights, out=weights)
    # Each filter keeps the tokens above some weight, so all of them together keep the tokens
    # above the highest of those cutoffs (top-k and top-p keep the best token, so min-p's
    # reference stays the global best).
    cutoff = max(params.min_p, _top_k_top_p_cutoff(weights, params.top_k, params.top_p))
    if cutoff > 0:
        np.multiply(weights, weights >= cutoff, out=weights)  # boolean assignment is 10x slower
    weights /= weights.sum()
    return weights


def _top_k_top_p_cutoff(weights: np.ndarray, top_k: int, top_p: float) -> float:
    """The smallest weight that survives top-k and then top-p; 0 when neither filter is on."""
    cutoff = 0.0
    if 0 < top_k < weights.size:
        cutoff = _cutoff_reaching(weights, top_k, by_mass=False)
    if top_p < 1:
        # Top-p takes top_p of the mass of the top-k survivors, usually a handful of tokens.
        survivors = weights[weights >= cutoff] if cutoff > 0 else weights
        cutoff = _cutoff_reaching(survivors, top_p * survivors.sum(), by_mass=True)
    return cutoff


# Starting thresholds, as gaps below the best token in nats after temperature: the answer lies
# in the first bracket that reaches the target, usually near the top. 0 takes every token.
_BRACKET_FLOORS = (*(math.exp(-gap) for gap in (4, 8, 16, 32, 64)), 0.0)
_MAX_SORTED = 2048  # narrow the bracket until it holds at most this many tokens, then sort them
_MAX_HALVINGS = 24  # ties can keep a bracket crowded however narrow: then sort it anyway


def _cutoff_reaching(weights: np.ndarray, target: float, *, by_mass: bool) -> float:
    """The largest weight t such that the tokens weighing at least t reach `target`, counted in
    tokens (top-k) or in mass (top-p).

    A threshold pass costs ~20-50 µs against ~4 ms for sorting the row, so the answer is
    bracketed between two thresholds, the bracket halved (in log space) until few tokens fall
    inside it, and only those are sorted.
    """

    def tokens_above(threshold: float) -> tuple[np.ndarray, int, float]:
        """(mask of the tokens weighing >= threshold, their number, how far they reach)."""
        selected = weights >= threshold
        count = int(np.count_nonzero(selected))
        if not by_mass:
            return selected, count, count
        # Gathering a few tokens is fastest; for many, einsum sums in chunks without a temporary
        # row (np.sum(where=) and gathering half the row take ~0.8 ms, np.dot casts the mask).
        if count <= weights.size // 16:
            return selected, count, float(weights[selected].sum())
        return selected, count, float(np.einsum("i,i->", weights, selected))

    # Invariant: the tokens above `low` reach the target, those above `high` fall short.
    high, above_high, count_high, reached_high = math.inf, None, 0, 0.0
    for low in _BRACKET_FLOORS:
        above_low, count_low, reached_low = tokens_above(low)
        if reached_low >= target:
            break
        high, above_high, count_high, reached_high = low, above_low, count_low, reached_low
    for _ in range(_MAX_HALVINGS):
        if count_low - count_high <= _MAX_SORTED or low == 0:
            break
        middle = math.sqrt(low * min(high, 1.0))
        above_middle, count_middle, reached_middle = tokens_above(middle)
        if reached_middle >= target:
            low, above_low, count_low = middle, above_middle, count_middle
        else:
            high, above_high, count_high, reached_high = (
                middle,
                above_middle,
                count_middle,
                reached_middle,
            )
    in_bracket = above_low if above_high is None else above_low ^ above_high
    bracket = np.sort(weights[in_bracket])[::-1]
    if bracket.size == 0:  # only through round-off in the sums
        return low
    steps = np.cumsum(bracket, dtype=np.float64) if by_mass else np.arange(1, bracket.size + 1)
    reached = reached_high + steps
    # The first token that reaches the target; round-off can put the target past the last one.
    return float(bracket[min(int(np.searchsorted(reached, target)), bracket.size - 1)])


# np.cumsum runs sequentially (~3 ns per entry, 0.5 ms for 152k), so sample() first picks a block
# by its vectorised sum and then a token inside it: the same inverse CDF in about a tenth the time.
_SAMPLE_BLOCK = 512


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token drawn from `probs` (non-negative weights; their sum need not be exactly 1)."""
    probs = np.asarray(probs)
    if probs.size <= _SAMPLE_BLOCK:
        return _inverse_cdf(probs, rng.random())
    block_mass = np.add.reduceat(probs, np.arange(0, probs.size, _SAMPLE_BLOCK))
    start = _inverse_cdf(block_mass, rng.random()) * _SAMPLE_BLOCK
    return start + _inverse_cdf(probs[start : start + _SAMPLE_BLOCK], rng.random())


def _inverse_cdf(weights: np.ndarray, uniform: float) -> int:
    cdf = np.cumsum(weights, dtype=np.float64)
    if not cdf[-1] > 0:
        raise ValueError("cannot sample: the probabilities sum to zero")
    index = int(np.searchsorted(cdf, uniform * cdf[-1], side="right"))
    # side="right" never lands on a zero weight; uniform * total reaches the total only where
    # the total is subnormal (a uniform just below 1 times 5e-324), rounding up.
    return index if index < weights.size else int(np.flatnonzero(weights)[-1])


def draw_children(q: np.ndarray, n: int, rng: np.random.Generator) -> list[int]:
    """n i.i.d. draws from q, with replacement, in draw order (for accept_among_children)."""
    return [sample(q, rng) for _ in range(n)]


class RowsOnDemand(Sequence[np.ndarray]):
    """`row(i)` for i < n, each computed when first asked for: speculative sampling needs the
    target's distribution only up to the first rejected token, and each is a softmax over the
    whole vocabulary."""

    def __init__(self, n: int, row: Callable[[int], np.ndarray]):
        self._n, self._row = n, row
        self._rows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]  # no slices
        if not 0 <= i < self._n:
            raise IndexError(i)
        if i not in self._rows:
            self._rows[i] = self._row(i)
        return self._rows[i]

    @property
    def computed(self) -> list[int]:
        """The rows asked for so far."""
        return sorted(self._rows)


def accept_chain(
    draft_tokens: Sequence[int],
    q_rows: Sequence[np.ndarray],
    p_rows: Sequence[np.ndarray],
    rng: np.random.Generator,
    *,
    overwrite_p: bool = False,
) -> tuple[int, int]:
    """Speculative sampling of a drafted chain: (draft tokens accepted, token to append after them).

    q_rows[i] is the distribution draft_tokens[i] was drawn from and p_rows[i] the target's at the
    same position; p_rows has one more row, for the bonus token after a fully accepted chain. Each
    draft token is accepted with probability min(1, p/q); the first rejected one is replaced by a
    sample from norm(max(0, p - q)), computed in the rejected p row itself if `overwrite_p`.
    """
    k = len(draft_tokens)
    if len(q_rows) != k or len(p_rows) != k + 1:
        raise ValueError(
            f"{k} draft tokens need {k} q rows and {k + 1} p rows "
            f"(got {len(q_rows)} and {len(p_rows)})"
        )
    for i, (token, q) in enumerate(zip(draft_tokens, q_rows, strict=True)):
        p = p_rows[i]  # p_rows may compute its rows when asked (RowsOnDemand)
        if not _accept_draw(int(token), q, p, rng):
            residual = _residual(p, q, out=p if overwrite_p else None)
            # No residual mass means p == q, where rejection only happens through round-off.
            return i, sample(q if residual is None else residual, rng)
    return k, sample(p_rows[k], rng)


def accept_among_children(
    draws: Sequence[int],
    q: np.ndarray,
    p: np.ndarray,
    rng: np.random.Generator,
    *,
    overwrite_p: bool = False,
) -> tuple[int | None, int]:
    """SpecInfer's multi-step speculative sampling at one tree node.

    `draws` were drawn i.i.d. with replacement from q (draw_children), duplicates included: the
    tree keeps one child per distinct token, but every draw is a trial here. Returns
    (token, token) when a draw is accepted (the caller moves into that child), or (None, token)
    with the token sampled from what is left of p when every draw is rejected (in p itself if
    `overwrite_p`).
    """
    p_current = p
    owns_p_current = overwrite_p  # whether p_current is free to overwrite
    # I.i.d. draws are exchangeable, so shuffling leaves draw_children's output as it is; it
    # protects against callers that reorder draws (say by probability), which would tie the order
    # to the tokens and break the guarantee.
    for token in rng.permutation(np.asarray(draws, dtype=np.int64)):
        if _accept_draw(int(token), q, p_current, rng):
            return int(token), int(token)
        # Every draw is its own trial, duplicates too. The proof that the output follows p takes
        # trial j as a fresh draw from q against p_j, the residual left by the j - 1 rejections
        # before it. A repeat of a rejected token is surely rejected again (p_current is 0 there
        # now), yet its trial still subtracts q once more; skipping it would leave p_current a step
        # short, which the tests show biases the output.
        residual = _residual(p_current, q, out=p_current if owns_p_current else None)
        if residual is None:  # p_current == q (rejected through round-off): keep it
            p_current, owns_p_current = q, False
        else:
            p_current, owns_p_current = residual, True
    return None, sample(p_current, rng)


def accept_point_mass(
    token: int, p: np.ndarray, rng: np.random.Generator, *, overwrite_p: bool = False
) -> tuple[int | None, int]:
    """Speculative sampling of a deterministic proposal (a greedy draft), the point mass on token.

    Accept with probability p(token), else sample from p without token, renormalised: the
    standard rule with q = δ_token, as max(0, p - δ_token) is p with token's entry zeroed.
    Returns (token, token) or (None, replacement), like accept_among_children; a rejection
    zeroes token's entry in p itself if `overwrite_p`.
    """
    token = int(token)
    if rng.random() < p[token]:
        return token, token
    rest = p if overwrite_p else np.array(p, copy=True)
    rest[token] = 0
    if not rest.sum() > 0:  # p was the point mass itself, rejected only through round-off
        return token, token
    return None, sample(rest, rng)


def _accept_draw(token: int, q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> bool:
    """Accept a token drawn from q with probability min(1, p(token) / q(token))."""
    q_token = q[token]
    if not q_token > 0:
        raise ValueError(f"token {token} has draft probability 0, so it was not drawn from q")
    # Strict "<" with a uniform in [0, 1): exactly min(1, p/q), and never a token with p = 0.
    return bool(rng.random() * q_token < p[token])


def _residual(p: np.ndarray, q: np.ndarray, out: np.ndarray | None = None) -> np.ndarray | None:
    """norm(max(0, p - q)), written into `out` if given; None if that is all zeros (p == q)."""
    residual = np.subtract(p, q, out=out)
    np.maximum(residual, 0, out=residual)
    mass = residual.sum()
    if not mass > 0:
        return None
    residual /= mass
    return residual
