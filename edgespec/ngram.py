"""Prompt-lookup drafting: propose what followed the longest recent match of the history's suffix.

Free to compute, so it runs every decode round. The index maps each n-gram (n from min_ngram to
max_ngram) to the positions right after its occurrences, and grows with the history
instead of rescanning it. An n-gram is indexed only once a token follows it, so every hit has a
continuation and the history's own suffix never matches itself.

Acceptance is learned online per match length and per position in the proposal (the first three
apart, the rest up to the sixteenth together, the rest together), so the engine can price a
proposal (`acceptances`) against the measured cost of verifying it.

Edits copy their source in order: after the target wrote something of its own (a docstring, a
type hint), the copy resumes where it broke, while the most recent match of a short suffix like
"):\n    " is often in the text just generated. So a match at most POINTER_WINDOW tokens after the
last source token a proposal copied correctly comes first (replayed on a bench run's edits: 1.42,
1.42 and 1.28x plain against 1.34, 1.43 and 1.26 with the most recent match alone).

Edits rename things: where a copy broke because the target wrote other tokens in place of one
source token and then went on copying, the replacement is remembered, and later proposals copy
through that token with the replacement in its place (a rename applied everywhere). A replacement
that is proposed and rejected is forgotten.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

# Prior pseudo-counts: strong enough that one lucky round does not swing the estimate.
PRIOR_STRENGTH = 4.0
# Beyond this many observations the oldest weigh less, so the estimates follow a change of task
# (copy-heavy edits accept most n-gram tokens, open generation few).
MEMORY = 200.0
# Positions from this one on share one estimate, so a proposal judged in full teaches the whole
# tail at once. One estimate per position up to 16 left each at its prior (0.7) until a dozen
# long copies had passed, and fifteen such priors compounded: 15-token proposals looked worth 6.5
# tokens where they yielded 11.8 (bench outputs replayed: rename 1.42 -> 1.67x, quote-dates
# 1.59 -> 1.82x, no prompt lower).
TRACKED_POSITIONS = 4
# Positions from this one on, which only proposals longer than 16 reach, have an estimate of
# their own: a copy that breaks every line or so (type hints added) must not price them as the
# copies of a rename or a quote do.
FAR_POSITION = 16
MAX_WATCHED = 16  # proposals waiting for the tokens that judge them
MAX_REPLACEMENT = 8  # longest replacement of one source token that is learnt
RESUME = 2  # source tokens that must follow a replacement for it to count as one
POINTER_WINDOW = 64  # how far past the copy's last source token a match still continues it
POINTER_MIN_NGRAM = 2  # a single token is too common to say where the copy resumes
# A watched proposal says whether the copy goes on (the next proposal's `streak`) once this many
# of its tokens are judged, not once all of them are: auto verifies 3 or 4 tokens of a 16-token
# proposal, and the streak came from proposals 16 tokens back, so inside a quote it was set
# late and rarely learnt. Replayed on the bench's outputs (scripts/ngram_replay.py, the Zen 5
# curve): edits 1.79 / 2.01 / 1.39 -> 1.90 / 2.12 / 1.46x, summaries 1.09 / 1.21 / 2.48 ->
# 1.11 / 1.26 / 2.52, code 1.00 +- 0.01; on nine other prompts (edits and summaries of this
# repository's own modules and README, two code tasks) edits 2.50-2.71 -> 2.49-2.74, summaries
# 1.04 / 1.51 / 1.01 -> 1.04 / 1.57 / 1.00, code 1.01 / 1.00 -> 0.99 / 0.99 (2026-11-25). Three
# and four tokens gained less on both sets.
STREAK_AFTER = 2


@dataclass
class Proposal:
    tokens: list[int]  # empty when nothing matched
    ngram: int  # length of the suffix match, 0 when nothing matched
    confidence: float  # estimated probability that the first token is accepted
    # Whether the last proposal judged before this one was right (in its first STREAK_AFTER
    # tokens, or in full when verified): inside a copied span, proposals keep being right, so
    # the two cases are estimated apart.
    streak: bool = False
    # For each token: the history position of the source token it copies or stands in for, and
    # whether it is (part of) a learnt replacement rather than a copy.
    origins: list[int] = field(default_factory=list)
    replaced: list[bool] = field(default_factory=list)


def prior_first(ngram: int) -> float:
    """Prior P(first token accepted): near 0.5 for long matches, lower for short ones."""
    return min(0.5, 0.1 + 0.1 * ngram)


def prior_next(ngram: int) -> float:
    """Prior P(token i accepted | all before it were): inside a copied span, copying goes on."""
    return min(0.7, prior_first(ngram) + 0.2)


class NgramDrafter:
    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        # n-gram -> the positions right after each of its occurrences, ascending
        self.index: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0  # history length the index covers
        self._last_token: int | None = None  # tokens[_indexed - 1], to notice a rewritten history
        self._watched: list[_Watched] = []  # see watch()
        self._streak = False  # the last judged proposal was right in full
        # Source token -> the tokens the target wrote in its place (see the module's doc).
        self.replacements: dict[int, tuple[int, ...]] = {}
        self._breaks: list[_Break] = []  # copies that broke, waiting to show what replaced what
        self._pointer: int | None = None  # after the last source token copied and accepted
        # Beta(accepted, rejected) counts per (match length, streak, position in proposal).
        self._stats = {
            (n, streak): [
                [PRIOR_STRENGTH * p, PRIOR_STRENGTH * (1.0 - p)]
                for p in [prior_first(n)] + [prior_next(n)] * TRACKED_POSITIONS
            ]
            for n in range(min_ngram, max_ngram + 1)
            for streak in (False, True)
        }

    def reset(self) -> None:
        """Forget the index and the replacements, which belong to that history (it was cleared or
        rewritten); keep the learned statistics."""
        self.index.clear()
        self._indexed = 0
        self._last_token = None
        self._watched.clear()
        self._breaks.clear()
        self.replacements.clear()
        self._pointer = None

    def watch(self, proposal: Proposal, start: int) -> None:
        """Learn from a whole proposal by comparing it with the tokens decided at positions
        `start`... as they come: under greedy decoding, exactly what verifying it would have
        accepted; under sampling, a draw of it (a proposed token is accepted with the target's
        probability of it, the chance that the token sampled there is it). Verifying only the
        part worth its cost would teach nothing about the rest, and a proposal not verified at
        all nothing: the estimates could never grow."""
        if proposal.tokens and proposal.ngram > 0 and len(self._watched) < MAX_WATCHED:
            self._watched.append(_Watched(proposal, start))

    def _settle_watched(self, tokens: Sequence[int]) -> None:
        """Judge each watched token as soon as the token at its position is decided: a proposal
        inside copied text can run 16 tokens, and waiting for all of them before learning
        anything kept auto mode on plain steps for 35 rounds of a quoting task."""
        pending, n_tokens = [], len(tokens)
        for w in self._watched:
            proposal = w.proposal
            decided = min(n_tokens - w.start, len(proposal.tokens))
            if not w.missed and w.judged < decided:  # a round decides one or a few tokens
                stats = self._position_stats(proposal.ngram, proposal.streak)
                while not w.missed and w.judged < decided:
                    w.missed = int(tokens[w.start + w.judged]) != proposal.tokens[w.judged]
                    _count(stats[_bucket(w.judged)], accepted=not w.missed)
                    if w.missed:
                        self._copy_broke(tokens, proposal, w.judged, w.start + w.judged)
                    elif not proposal.replaced[w.judged]:
                        self._pointer = proposal.origins[w.judged] + 1
                    w.judged += 1
            if w.missed or w.judged >= min(len(proposal.tokens), STREAK_AFTER):
                self._streak = not w.missed
            if not w.missed and w.judged < len(proposal.tokens):
                pending.append(w)
        self._watched = pending
        if self._breaks:
            self._learn_replacements(tokens)

    def _copy_broke(
        self, tokens: Sequence[int], proposal: Proposal, index: int, position: int
    ) -> None:
        """Proposal token `index` was wrong; the target's tokens from `position` on are coming."""
        if index >= len(proposal.origins):
            return
        source = proposal.origins[index]
        if proposal.replaced[index]:  # a learnt replacement that does not hold here
            self.replacements.pop(int(tokens[source]), None)
            return
        after = [int(t) for t in tokens[source + 1 : source + 1 + RESUME]]
        if len(after) == RESUME:
            self._breaks.append(_Break(int(tokens[source]), after, position))

    def _learn_replacements(self, tokens: Sequence[int]) -> None:
        """A broken copy whose source resumes within MAX_REPLACEMENT tokens: what the target
        wrote before it is the source token's replacement. (Also where that ends with the source
        token itself, an insertion before it: excluding those cost 0.04x on the rename replay and
        changed no other prompt; a rule that fails once is forgotten.) Each break tries every
        length once, as the tokens it needs arrive."""
        waiting, n_tokens = [], len(tokens)
        for b in self._breaks:
            for m in range(b.tried + 1, MAX_REPLACEMENT + 1):
                end = b.position + m + RESUME
                if end > n_tokens:
                    waiting.append(b)
                    break
                b.tried = m
                if list(map(int, tokens[b.position + m : end])) == b.after:
                    written = tuple(map(int, tokens[b.position : b.position + m]))
                    self.replacements[b.source] = written
                    break
        self._breaks = waiting[-MAX_WATCHED:]

    def update(self, tokens: Sequence[int]) -> None:
        """Index the positions appended since the last call.

        Between calls the history may grow by appending. A history that shrank, or whose last
        indexed token changed, is re-indexed from scratch; after other in-place rewrites, reset().
        """
        n_tokens = len(tokens)
        if n_tokens < self._indexed or (
            self._indexed and int(tokens[self._indexed - 1]) != self._last_token
        ):
            self.reset()
        # The n-gram ending at position `end - 1` is indexed once tokens[end] exists.
        for end in range(max(self._indexed, 1), n_tokens):
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self.index.setdefault(tuple(map(int, tokens[end - n : end])), []).append(end)
        self._indexed = n_tokens
        self._last_token = int(tokens[-1]) if n_tokens else None

    def propose(self, tokens: Sequence[int], max_len: int) -> Proposal:
        """Up to max_len tokens that followed the match of the suffix nearest after where the
        copy was (see the module's doc), else the longest, then most recent, match."""
        self.update(tokens)
        self._settle_watched(tokens)
        n_tokens = len(tokens)
        if max_len <= 0:
            return Proposal([], 0, 0.0)
        longest = min(self.max_ngram, n_tokens)
        match = self._continuing_match(tokens, longest) or self._latest_match(tokens, longest)
        if match is None:
            return Proposal([], 0, 0.0)
        n, start = match
        proposal = Proposal([], n, self.confidence(n, self._streak), self._streak)
        self._copy(tokens, start, max_len, proposal)
        return proposal

    def _latest_match(self, tokens: Sequence[int], longest: int) -> tuple[int, int] | None:
        """(n, start) of the longest suffix match, at its most recent occurrence."""
        for n in range(longest, self.min_ngram - 1, -1):
            starts = self.index.get(tuple(map(int, tokens[len(tokens) - n :])))
            if starts:
                return n, starts[-1]
        return None

    def _continuing_match(self, tokens: Sequence[int], longest: int) -> tuple[int, int] | None:
        """(n, start) of the suffix match that starts the copy again nearest after its last
        correctly copied source token, at most POINTER_WINDOW after it (the longer match among
        equals): where an edit wrote text of its own, the source goes on right there."""
        if self._pointer is None:
            return None
        n_tokens, best = len(tokens), None
        for n in range(longest, max(self.min_ngram, POINTER_MIN_NGRAM) - 1, -1):
            starts = self.index.get(tuple(map(int, tokens[n_tokens - n :])))
            if not starts:
                continue
            i = bisect_left(starts, self._pointer)
            start = starts[i] if i < len(starts) else None
            if start is not None and start <= self._pointer + POINTER_WINDOW:
                best = (n, start) if best is None or start < best[1] else best
        return best

    def _copy(self, tokens: Sequence[int], start: int, max_len: int, proposal: Proposal) -> None:
        """Fill `proposal` with up to max_len tokens copied from position `start` on, each learnt
        replacement in place of its source token."""
        out, origins, replaced = proposal.tokens, proposal.origins, proposal.replaced
        replacements = self.replacements
        source = tokens[start : start + max_len]
        if replacements.keys().isdisjoint(source):  # most rounds: a plain slice
            out.extend(map(int, source))
            origins.extend(range(start, start + len(out)))
            replaced.extend([False] * len(out))
            return
        for position in range(start, len(tokens)):
            token = int(tokens[position])
            written = replacements.get(token)
            if written is None:
                out.append(token)
                origins.append(position)
                replaced.append(False)
            else:
                out.extend(written)
                origins.extend([position] * len(written))
                replaced.extend([True] * len(written))
            if len(out) >= max_len:
                break
        del out[max_len:], origins[max_len:], replaced[max_len:]

    def _position_stats(self, ngram: int, streak: bool) -> list[list[float]]:
        return self._stats[min(max(ngram, self.min_ngram), self.max_ngram), streak]

    def acceptance(self, ngram: int, position: int, streak: bool = False) -> float:
        """P(token `position` is accepted | all before it were), for a match of length ngram."""
        counts = self._position_stats(ngram, streak)[_bucket(position)]
        return counts[0] / (counts[0] + counts[1])

    def confidence(self, ngram: int, streak: bool = False) -> float:
        """Estimated probability that the first token of a proposal with this match is accepted."""
        return self.acceptance(ngram, 0, streak)

    def acceptances(self, ngram: int, length: int, streak: bool = False) -> list[float]:
        """acceptance() at positions 0..length-1 (what policy.best_proposal_length prices)."""
        probs = [c[0] / (c[0] + c[1]) for c in self._position_stats(ngram, streak)]
        near = probs[: TRACKED_POSITIONS - 1]
        near += probs[TRACKED_POSITIONS - 1 : TRACKED_POSITIONS] * (FAR_POSITION - len(near))
        return (near + probs[-1:] * (length - FAR_POSITION))[:length]

    def record(self, ngram: int, proposed: int, accepted: int, streak: bool = False) -> None:
        """Learn from a verified proposal whose first `accepted` of `proposed` tokens were kept."""
        if ngram <= 0 or proposed <= 0:
            return
        self._streak = accepted == proposed
        stats = self._position_stats(ngram, streak)
        # Positions after the first rejection were never judged on their own: no evidence there.
        for position in range(min(accepted + 1, proposed)):
            _count(stats[_bucket(position)], accepted=position < accepted)


@dataclass
class _Break:
    source: int  # the source token the proposal had where the target wrote something else
    after: list[int]  # the RESUME source tokens after it
    position: int  # where the target's own tokens begin
    tried: int = 0  # replacement lengths checked so far (1..tried did not resume the source)


@dataclass
class _Watched:
    proposal: Proposal
    start: int  # the position of its first token
    judged: int = 0  # its tokens judged so far
    missed: bool = False  # the last judged one was wrong: nothing after it is judged


def _bucket(position: int) -> int:
    """Which estimate a position in a proposal shares (TRACKED_POSITIONS, FAR_POSITION)."""
    if position >= FAR_POSITION:
        return TRACKED_POSITIONS
    return min(position, TRACKED_POSITIONS - 1)


def _count(counts: list[float], accepted: bool) -> None:
    """One more observation in a [accepted, rejected] pair; past MEMORY the old ones fade."""
    counts[0 if accepted else 1] += 1.0
    total = counts[0] + counts[1]
    if total > MEMORY:
        counts[0] *= MEMORY / total
        counts[1] *= MEMORY / total
