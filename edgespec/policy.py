"""Cost-aware choice of what to do each round (mode "auto"): plain step, n-gram draft, model draft.

On a CPU a verification pass of k tokens costs about T(k) ≈ 0.5·k single steps (docs/speed.md),
so a proposal pays only if the tokens it is expected to yield outweigh its drafting and
verification time. Everything here is in seconds measured on this device while generating, with
the device profile's curve T(k)/T(1) giving the shape of the verification cost. No llama.cpp,
no clock: the engine feeds measurements in, so the policy is testable with made-up ones.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import mul

MARGIN = 1.03  # a proposal must promise this much more than a plain step: noise must not tempt us
# ... except an n-gram proposal against a plain step: it costs nothing to make, and what passes
# that lose can cost in an answer is bounded by the loss budget (LossBudget). Replayed on a bench
# run's outputs (a curve timed after 600 tokens, auto's learning, 20 % timing noise): edits 1.49
# -> 1.54x plain, quote-dates 1.90 -> 2.05, chat 1.00 -> 0.99, code 1.015 -> 1.008; live (one
# process, 2 repeats alternated, the edits and two chats) no difference beyond noise (2026-11-26).
NGRAM_MARGIN = 1.0
# Model drafts are tried only where their ceiling (a best case: every chain at the length that
# suits the device, every token as sure as the surest) beats plain decoding by this much: where
# it does not, a try only costs (catching the draft up on the prompt, then losing rounds).
CEILING_MARGIN = 1.25
# The ceiling's tokens are each accepted with this chance, as if the draft were this sure of all
# of them (the calibrator's estimate for such tokens once gave it; see AutoPolicy.model_ceiling
# for why no more). Priced with its 0.95-sure tokens, the ceiling was 0.97-1.06 on a Zen 5
# here (2026-11-24) with the Q4_0 draft, 1.18-1.27 with the narrowed one, so auto hardly ever
# drafted with the model, though `chain` made 1.14-1.37x plain on every code prompt. Priced with
# its 0.99-sure tokens (right 99.5-100 % of the time on the bench's outputs) it opens there. That
# lost before probes waited for this answer's own sure text (code 0.98 -> 0.94x with the Q4_0
# draft); with them and the narrowed draft, in one process, 2 repeats, interleaved: code
# 0.99 -> 1.07x (binary-search 1.27), chat 0.99 -> 1.00 (no model round on chat), edits and
# summaries unchanged (no model round either).
SUREST = 0.99
# The ceiling is a best case: real chains reach a share of it, which tries on text the target is
# sure of (where chains are meant to pay) measure on this device, and the gate asks that ceiling
# times that share beat plain decoding by MARGIN. Before any such try the share is
# MARGIN / CEILING_MARGIN, the gate CEILING_MARGIN; it counts as SHARE_PRIOR_TRIES tries, and
# only the last MAX_SHARE_TRIES weigh in full. On a Zen 4 here (a pass of 16 tokens 8.4 steps)
# the ceiling was 1.24-1.39 and `chain` made 0.81-0.93x plain on code; in a chat of seven code
# questions a probe came on nearly every answer and the chat made 0.92x plain over turns 2-7,
# 1.05x once the first lost try (a share of 0.56) had shut the gate. On the Zen 5 chains made
# 1.14-1.37x under a ceiling of ~1.6 (a share of 0.7-0.85).
SHARE_PRIOR_TRIES = 2.0
MAX_SHARE_TRIES = 8.0
# Where the share alone keeps the gate shut (the ceiling itself would pass), a model arm is
# tried again once this many rounds have been decided since the last try (on sure text, where
# catching the draft up fits the answer): only tries move the share, so without them a gate
# shut once stayed shut on that device for good. On a Zen 5 here six short tries on code left a
# share of 0.61 (a gate at 0.94 against 1.03) where `chain` made 1.09x plain and auto 0.98x
# (2026-11-29). A try costs its catch-up (at most ANSWER_SHARE of the answer's time left) and,
# lost, 4-16 rounds at 0.6-0.9x plain: a few plain steps in this many. From a memory whose share
# (0.61) shut the gate, code and chat, 3 repeats, two runs (trying the tree's arm, then the
# chain's): auto 1.00 and 1.01x plain on code (tries came; `chain` 1.14x), 1.01 and 0.98x on
# chat (no try: no sure text), where before it decoded code plainly for good; the share moved
# from 0.61 to 0.63 in each.
REPROBE_EVERY = 512
FIRST_PROBE_EVERY = 8  # rounds between tries of a model arm that has not lost yet
# An arm in use is judged on about its last 1/ARM_WEIGHT rounds: one chain round yields 1 to 16
# tokens on the same code here, and with a memory of 3 rounds (weight 0.3) two short chains
# took an arm that made 1.1x plain out of use. Once out, catching the draft up on the tokens
# decided without it costs ~8 % of a step per token here, so it rarely came back.
ARM_WEIGHT = 0.1
# An arm stays in use while it makes at least this share of plain decoding's rate: leaving costs
# the catch-up of coming back, staying a little below costs at most the difference.
KEEP_MARGIN = 0.97
# While an arm is in use, every PLAIN_EVERY-th round is a plain step: the arm is judged against
# plain decoding as fast as it is now, not as one step timed minutes ago under another load
# (35 against 40 tok/s here). At 1.1x plain this costs 0.1 % of the arm's gain.
PLAIN_EVERY = 16
# While a tree drafts, the chain is still tried when its probe is due, and the faster of the two
# by their recent rates drafts: an arm in use is never probed against, so a tree that won its try
# drafted to the answer's end, and to the next answers' as the arm carried into them, where
# `chain` is the faster on code on every CPU measured here (on an Emerald Rapids showing AMX,
# 2026-12-02, one repeat: chain 1.70x plain on code, tree 1.54x, auto 1.51x with 101 tree rounds
# of 140). Only the chain challenges: trees tried against a chain in use won their four-round
# tries against its ten-round average often enough to take code over (docs/speed.md, "Arms tried
# against the arm in use").
CHAIN_CHALLENGES_TREE = True
# A try of a model arm spans at least this many of its rounds and is judged on their sum: one
# chain round is a gamble (here they yielded 1 to 16 tokens on the same code), so one round alone
# says little.
TRY_ROUNDS = 4
# A try whose rate is still within reach of winning (at least TRY_GIVE_UP of plain decoding's)
# goes on, up to TRY_MAX_ROUNDS rounds: chains gain in runs of 15 sure tokens (1.6x plain) between
# rounds that break even, so of all the windows of four chain rounds on code where chains made
# 1.08-1.21x plain here, only 30-65 % beat plain decoding; a try that goes on while undecided won
# 41-85 % of the time there, and 18 % where chains made 0.91x (replayed on traced rounds).
TRY_MAX_ROUNDS = 16
TRY_GIVE_UP = 0.85
# A try first catches the draft up on the tokens decided without it (the text's first and last
# few dozen: engine.DRAFT_SINK, DRAFT_WINDOW), 50-120 ms on an edit here (2-4 s on a long chat
# or edit before that window). It waits until that is at most this share of the time the answer
# has left: a try that finds the draft worth using can only pay back within the answer it is
# made in. That time is its tokens left at the rate the answer has made so far, not a plain step
# a token: on the edits here answers ran at 1.7-2.2x plain decoding's rate (2026-11-29).
ANSWER_SHARE = 0.05
# The arm in use when an answer ended is tried on the next one after this many rounds, unless an
# n-gram proposal came first. Edits open with a line or two before they copy the text they were
# given (proposals from their third or fifth round here), which a draft that has read only the
# text's ends cannot copy: a chain carried into them from the code answer before made 0.84-0.89x
# what auto made without it (3 repeats, 2026-11-30). Code and chat answers showed no proposal in
# their first ten rounds, but for one code answer's at its third.
CARRY_AFTER = 2
# Probes wait for text the target is sure of (the mean probability of the tokens of its plain
# steps, over about the last ten): 0.92-0.95 over code answers here, 0.72-0.76 over chat ones,
# where drafting lost. They used to wait until catching the draft up cost at most 2 % of the
# time since the last try; at ~8 % of a step per token behind here, that never came once an arm
# had lost, and code after chat went without drafting.
SURE_TEXT = 0.9
# ... or less, where this device's costs let a chain pay at that acceptance: a chain whose tokens
# the draft got right as often as the target is sure of its own must beat plain decoding by
# MARGIN (model_draft_ceiling at that sureness). On the Zen 5 here that needed 0.91; on an
# Emerald Rapids, whose passes of 8 cost 2.2 plain steps and whose draft step 0.17, it needs
# 0.66, and there `chain` made 1.16x plain decoding on chat where auto, waiting for 0.9, took
# plain steps only (1.02x; 2026-11-30).
# ... as this answer's own plain steps show it, this many of them at least: an answer starts
# with the last one's measure otherwise, and a chat answer after a code one (its 0.9-sure
# steps) had chains tried, kept for 47 rounds and made 0.90x plain (the narrowed draft, whose
# cheaper steps opened the gate, 2026-11-24). Five, not ten: code answers copy a name from the
# prompt every few lines, and each copy starts the count again (record_copy); palindrome's
# answer after the summaries' took plain steps in 109 of 131 rounds and 69 of 87 (1.10 and
# 1.20x plain, where five made 1.80-1.85x). In one process, greedy (2026-12-01): code 1.70 ->
# 1.79 and 1.55 -> 1.67 in two A/Bs (priced by the profiles, B/A 1.074 and 1.060, intervals
# above 1), chat 1.12 -> 1.18, edits 2.67 -> 2.61 (priced 0.996), summaries level (priced 0.95
# and 1.00).
SURE_STEPS = 5
# A plain step's sureness is measured only where a try may begin within this many rounds (at
# the share's re-probe, or an arm's next probe): reading the target's whole row of logits for it
# costs 70-110 us right after a decode here (152k logits, two passes), over a quarter of auto's
# Python time in a plain round, and most plain rounds are far from any try (a gate shut by the
# share re-probes once in REPROBE_EVERY). The sureness is an average over about the last ten
# steps: begun thirty steps before a try, it decides as one kept over every step does (the same
# tries on made-up texts where they lose; where they also win, a try a round or so apart, and
# what auto makes within 1 %: test_policy).
SURE_LEAD = 30
# What a draft step costs is remembered for the next answers from a generation that timed at
# least this many draft rounds (or from any, where nothing was known). One chain round timed at
# 12 ms (0.48 of a target step, twice the usual), right after catching the draft up on a prompt,
# was remembered; it put the chain's ceiling at 1.1, below the gate, so the draft was never used
# again and never timed again: every later code answer of that engine decoded plainly
# (2026-11-24, 0.97-1.00x where chains made 1.1).
MIN_DRAFT_ROUNDS = 4
# The pass factor (Costs.batch_factor) is measured only by passes, and it decides whether passes
# are made: here T(4)/T(1) came out 2.0-3.1 over ten minutes (a profile's 2.25), and a slow
# stretch of chains left a factor of 1.36 stored. At that price no n-gram proposal paid and the
# model's ceiling (1.09 x its share 0.83) shut the gate, so no pass came to measure it again:
# palindrome decoded 158 plain steps where its n-gram rounds had gained 1-2 % minutes before,
# and every later run of that engine and device started there. So each plain step draws the
# factor back towards the profile's, which its paired timings measured at once: half-way in
# this many plain steps (4 s here), about half a code answer; passes correct it again.
FACTOR_HALF_LIFE = 64
FACTOR_RELAX = 1.0 - 0.5 ** (1.0 / FACTOR_HALF_LIFE)
# A generation starts from a stored factor within this ratio of the profile's prices: one of 4.3
# was stored by an auto answer timed while other programs ran (2026-11-28), and the next answers
# would have priced every pass out for a hundred plain steps or more. Passes twice as dear as the
# profile's paired timings measured them mean a busy hour or a stale profile (profile again).
START_FACTOR_BOUND = 2.0


@dataclass
class Ema:
    """Exponential moving average; None until the first sample."""

    weight: float = 0.2
    value: float | None = None

    def update(self, x: float) -> float:
        self.value = x if self.value is None else self.value + self.weight * (x - self.value)
        return self.value


class Calibrator:
    """The chance the target accepts a draft token, as a function of the draft's confidence in it.

    EAGLE-2 observed that draft confidence predicts acceptance well; the mapping differs per model
    pair and task, so it is learned online in confidence bins, starting from "acceptance =
    confidence" with the weight of a few observations (so an untrained calibrator changes nothing).
    The bins narrow towards certainty, where a chain's length is decided: where a pass of 16 is
    the sweet spot (T(16)/T(1) 5.3 on a Zen 5 here), 15 drafted tokens pay only if each is right
    with 0.97 or more, so tokens the draft is 0.91 and 0.999 sure of must not share an estimate.
    """

    EDGES: tuple[float, ...] = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998)

    def __init__(self, prior_weight: float = 4.0):
        self.prior_weight = prior_weight
        self.hits = [0.0] * (len(self.EDGES) + 1)
        self.seen = [0.0] * (len(self.EDGES) + 1)

    def _bin(self, confidence: float) -> int:
        return bisect_right(self.EDGES, confidence)

    def predict(self, confidence: float) -> float:
        b = self._bin(confidence)
        return (self.hits[b] + self.prior_weight * confidence) / (self.seen[b] + self.prior_weight)

    def record(self, confidence: float, accepted: bool) -> None:
        b = self._bin(confidence)
        self.hits[b] += accepted
        self.seen[b] += 1


@dataclass
class Costs:
    """Seconds of the things a round is made of, measured while generating."""

    curve: Callable[[int], float]  # T(k)/T(1) of the target on this device (its profile)
    # The pass sizes the curve was measured at, ascending (the profile's ks); empty: the curve
    # holds at every size. A size between them is priced as the next measured one up, not by
    # interpolation: on a Zen 4 here a pass of 16 tokens costs 8.2 steps and one of 15 costs 10.2
    # (llama.cpp's kernels work in bands of rows), so the line from 8 to 16 made 15-token
    # passes look 20 % cheaper than they were, and 16 tokens as cheap always verify more.
    sizes: tuple[int, ...] = ()
    step_s: Ema = field(default_factory=Ema)  # one plain target step
    draft_s: Ema = field(default_factory=Ema)  # one draft model evaluation
    # Measured passes of k > 1 tokens over what the curve says they cost: one factor for every
    # size, so the curve's shape, measured in paired timings at one context length, stays as the
    # profile measured it. Pricing each size by its own passes as well (drawn towards the
    # corrected curve until several agreed) let one dear timing of a size keep it out of use:
    # not chosen, so not timed again. A pass of 27 timed at 14.5 steps where the profile said 9.3
    # (10.1 measured again after 600 tokens) had `auto` verify 22 tokens at a time on the edits;
    # replayed on a bench run's outputs at that curve's prices it made 1.38x plain on
    # add-type-hints against 1.57 with one factor, and live (two processes of 2 repeats,
    # alternated) the edits made 1.31 / 1.53 / 1.35x plain with each size's own prices against
    # 1.43 / 1.87 / 1.25 with one factor (2026-11-26).
    batch_factor: Ema = field(default_factory=lambda: Ema(weight=0.1))
    # Rounds whose draft steps were timed in this generation; before the first, draft_s is an
    # estimate from profiles or an earlier run, if anything.
    draft_rounds: int = 0
    # That estimate in target steps, kept when timed steps replace it (AutoPolicy.model_ceiling).
    draft_estimate: float | None = None
    # Each timed draft step over the plain step as timed then: the draft's cost in target steps.
    # The ratio of the two averages at the end is not: here chains timed in a slow minute (a
    # step 36 ms, a draft step 9.5) over steps timed after it (24 ms) made 0.39, not 0.26; the
    # next answers started from it, their gate shut, and no draft round came to correct it.
    draft_steps: Ema = field(default_factory=Ema)
    # The curve is fixed for a generation and asked for every round: interpolated once per k.
    _relative: dict[int, float] = field(default_factory=dict, repr=False)

    def estimate_draft_step(self, seconds: float) -> None:
        """What a draft step should cost, from profiles, an earlier run or a timing against a
        target step (in the seconds of the plain step timed so far), until one is timed."""
        self.draft_s.update(seconds)
        if self.step_s.value is not None:
            self.draft_estimate = self.draft_s.value / self.step_s.value

    def record_draft_step(self, seconds: float) -> None:
        """A draft step timed while generating. The first replaces the estimate: averaged in at
        the weight of one sample, a wrong estimate (a profile from another hour) would outlive
        the generation's few tries of the draft."""
        if not self.draft_rounds:
            self.draft_s.value = None
        self.draft_s.update(seconds)
        self.draft_rounds += 1
        if self.step_s.value is not None:
            self.draft_steps.update(seconds / self.step_s.value)

    def draft_cost(self, known: float | None) -> float | None:
        """A draft step in target steps to remember after this generation, where `known` is
        what was remembered before it: as timed here if it timed MIN_DRAFT_ROUNDS rounds of draft
        steps, or any where nothing was known; else `known`."""
        timed = self.draft_steps.value
        if not self.draft_rounds or timed is None:
            return known
        if self.draft_rounds < MIN_DRAFT_ROUNDS and known is not None:
            return known
        return timed

    @property
    def measured(self) -> bool:
        """Whether a target step and a draft step have both been timed (or estimated)."""
        return self.step_s.value is not None and self.draft_s.value is not None

    def relative(self, k: int) -> float:
        value = self._relative.get(k)
        if value is None:
            value = self._relative[k] = self.curve(self._measured_size(k))
        return value

    def _measured_size(self, k: int) -> int:
        """The smallest measured pass size of at least k tokens (k past the largest)."""
        i = bisect_left(self.sizes, k)
        return self.sizes[i] if i < len(self.sizes) else k

    def steps(self, k: int) -> float:
        """A pass of k tokens in plain steps: the curve, corrected by how far the measured passes
        were from it. A size the profile did not measure costs what the next measured size up
        costs (relative)."""
        if k <= 1:
            return 1.0
        return self.relative(k) * (self.batch_factor.value or 1.0)

    def verify_s(self, k: int) -> float:
        assert self.step_s.value is not None
        return self.step_s.value * self.steps(k)

    def record_step(self, seconds: float) -> None:
        """A plain step took `seconds`; the pass factor, unmeasured by it, drifts back towards
        the profile (FACTOR_HALF_LIFE)."""
        self.step_s.update(seconds)
        # Until a draft step is timed, the draft is estimated as a share of a target step, and
        # follows the step as plain steps time it: priced in the seconds of the answer's first
        # step, which a passing load had made 62 ms where the next took 14 here, catching the
        # draft up looked four times dearer than it was for the whole answer, and no try came
        # (beside a busy core, 2026-11-30).
        if not self.draft_rounds and self.draft_estimate is not None:
            self.draft_s.value = self.draft_estimate * self.step_s.value
        factor = self.batch_factor.value
        if factor is not None:
            self.batch_factor.value = factor + FACTOR_RELAX * (1.0 - factor)

    def record_pass(self, k: int, seconds: float) -> None:
        """A verification pass of k tokens took `seconds` (inside llama.cpp)."""
        # Only sizes the profile measured: elsewhere the curve prices, it did not measure.
        if k > 1 and self.step_s.value is not None and self._measured_size(k) == k:
            self.batch_factor.update(seconds / self.step_s.value / self.relative(k))

    def record_pass_as_step(self, k: int, seconds: float) -> None:
        """A pass of k tokens, where no plain step is ever timed (chain and tree modes): scaled
        down by what such a pass costs in steps, it stands for one."""
        self.step_s.update(seconds / self.steps(k))

    def start_from(self, batch_factor: float | None) -> None:
        """Begin with the correction earlier generations measured (this generation's passes
        move it)."""
        if batch_factor is not None and batch_factor > 0:
            bound = START_FACTOR_BOUND
            self.batch_factor.value = min(max(batch_factor, 1 / bound), bound)


def expected_tokens(accept_probs: Sequence[float]) -> float:
    """Tokens a verification yields: the target's own one plus each draft token accepted, which
    needs all before it accepted too."""
    total, alive = 1.0, 1.0
    for p in accept_probs:
        alive *= p
        total += alive
    return total


def worth_drafting_on(
    accept_probs: list[float],
    next_guess: float,
    costs: Costs,
    horizon: int = 8,
    evaluated: bool = False,
) -> bool:
    """Whether drafting more raises the expected rate (dynamic draft length): a chain is a tree
    of one branch (worth_growing). `evaluated`: the next token's row is evaluated already (a
    sampled chain asks before it draws there), its draft step spent whichever way this goes."""
    tokens, reach = 1.0, 1.0  # expected_tokens(accept_probs), and the last token's reach
    for p in accept_probs:
        reach *= p
        tokens += reach
    k = len(accept_probs)
    return worth_growing(tokens, k + 1, k, reach, next_guess, costs, horizon, int(evaluated))


def worth_growing(
    tokens: float,
    verified: int,
    draft_evals: int,
    reach: float,
    next_guess: float,
    costs: Costs,
    horizon: int = 8,
    spent: int = 0,
) -> bool:
    """Whether more draft evaluations raise the expected rate of a round that would, verified
    now, yield `tokens` (the target's own plus each drafted token's chance of being accepted)
    for a pass of `verified` tokens after `draft_evals` draft steps. Each further evaluation adds
    one token to the branch being extended, whose leaf is reached with chance `reach`, each as
    likely as `next_guess`. Looks several tokens ahead: the cost curve is not smooth (a batch of
    4 or 16 verifies relatively cheaply here), so one more token can look bad where a few more
    are good. `spent`: evaluations already made for the next tokens (paid for either way).
    """
    assert costs.draft_s.value is not None
    draft_s = costs.draft_s.value
    now = tokens / ((draft_evals + spent) * draft_s + costs.verify_s(verified))
    for extra in range(1, horizon + 1):
        reach *= next_guess
        tokens += reach
        evals = draft_evals + max(extra, spent)
        if tokens / (evals * draft_s + costs.verify_s(verified + extra)) > now:
            return True
    return False


def model_draft_ceiling(
    best_accept: float,
    costs: Costs,
    max_len: int = 32,
    pipelined: bool = False,
    draft_cost: float | None = None,
) -> float:
    """The best speed-up over plain decoding a model chain could reach here if every draft token
    were as likely to be accepted as the draft's most confident ones: the device's curve and the
    draft's cost decide it before a single draft is tried.

    `pipelined` (LLMCad's pipeline, each model on its own CPUs): the next chain is drafted while
    this one is verified, and is of use where the target takes the whole chain and the draft's
    next token too; a round then lasts the longer of the two, else both one after the other.
    `draft_cost`: a draft step in target steps, if not as `costs` time it now."""
    assert costs.step_s.value is not None and costs.draft_s.value is not None
    c_d = draft_cost if draft_cost is not None else costs.draft_s.value / costs.step_s.value
    best, expected, alive = 0.0, 1.0, 1.0
    steps = costs.steps  # auto asks every round: a pass's cost in steps, not seconds / seconds
    for k in range(1, max_len + 1):  # expected tokens of a chain of k, built up as k grows
        alive *= best_accept
        expected += alive
        drafting, verifying = k * c_d, steps(k + 1)
        seconds = drafting + verifying
        if pipelined:
            carried = alive * best_accept
            seconds = carried * max(drafting, verifying) + (1 - carried) * seconds
        best = max(best, expected / seconds)
    return best


def best_proposal_length(accept_probs: Sequence[float], costs: Costs) -> tuple[int, float]:
    """How many of the proposed tokens to verify for the best expected tokens per second, and
    that rate; length 0 is a plain step. `accept_probs[i]`: the chance that token i is accepted
    if all before it were. For proposals already paid for: n-gram drafts, which cost nothing to
    make, or model drafts once drafted (verifying a weak tail costs more than it yields)."""
    return best_pass_size(accumulate(accept_probs, mul), costs)


def best_pass_size(reaches: Iterable[float], costs: Costs) -> tuple[int, float]:
    """How many drafted tokens to verify, of a chain or a tree, for the best expected tokens per
    second, and that rate; 0 is a plain step. `reaches`: each token's chance of being accepted
    (its whole path's), surest first; as a token is never surer than the one before it on its
    path, the first n of them form a chain or a tree. Drafting is paid for, so only the pass
    counts: a runner-up sibling, or a weak tail, is verified only if its chance outweighs the
    slot it takes in the pass (on a Zen 4 here a slot costs 0.4-0.9 of a step). Built up as the
    size grows: one pass over `reaches`."""
    best_size, best_rate = 0, 1.0 / costs.verify_s(1)
    tokens = 1.0  # the target's own token, and each drafted one's chance
    for size, reach in enumerate(reaches, start=1):
        tokens += reach
        rate = tokens / costs.verify_s(size + 1)
        if rate > best_rate:
            best_size, best_rate = size, rate
    return best_size, best_rate


# Plain steps that verified n-gram proposals may lose, as priced, in one generation (LossBudget).
# On a Zen 4 here a pass of 16 tokens costs ~7.7 steps: 8 lets a first one be tried; 4 kept
# rename and quote-dates from their first long copies (1.72 -> 1.64x, 2.00 -> 1.81x replayed).
LOSS_ALLOWANCE = 8.0


@dataclass
class LossBudget:
    """How many plain steps verified n-gram proposals may still lose in this generation.

    Each verification gains or loses the tokens it yielded less the steps its pass cost; a pass
    is allowed only if its worst case (the target's own token alone) fits in what is left, so
    the proposals never lose more than LOSS_ALLOWANCE steps below plain decoding in all (as the
    passes are priced), whatever their estimates say: the "never noticeably slower" of auto
    made a bound. Estimates learnt on one kind of text can mislead on the next: on lru-cache,
    after its docstring quoted the prompt, four proposals of 16 tokens were verified on code
    where the copy broke after 0-2 tokens (0.92x plain, replayed; 0.90 in a bench run). With
    the budget: 0.96-0.97x, and no other prompt of the bench or of the held-out set moved on
    this CPU's curve or the Zen 5's (add-type-hints 1.29 -> 1.28x with every size measured).
    Wins widen it again.
    """

    steps: float = LOSS_ALLOWANCE

    def longest(self, costs: Costs, proposed: int) -> int:
        """The most of `proposed` tokens a pass may verify within the budget: the longest pass
        whose worst case fits. best_proposal_length, given that many, never takes a shorter
        pass that does not fit: it would yield fewer tokens for more steps. (Counting up and
        stopping at the first size that did not fit stopped inside a band of the saw-shaped
        curve, at a size the profile did not measure.)"""
        for n in range(proposed, 0, -1):
            if costs.steps(n + 1) - 1.0 <= self.steps:
                return n
        return 0

    def record(self, tokens: int, pass_steps: float) -> None:
        """A pass priced at `pass_steps` plain steps yielded `tokens` tokens."""
        self.steps += tokens - pass_steps


@dataclass
class ModelOrNgram:
    """Chain and tree modes: each round the draft model drafts, unless the n-gram drafter's
    proposal (free to make) promises more tokens per second than the model's rounds have been
    making. On copied text a model costs a third of a target step per token to propose what the
    lookup proposes for nothing; elsewhere the n-gram rarely promises anything."""

    # Tokens and seconds of the model's rounds, averaged apart: their ratio is the rate of the
    # recent rounds, where an average of each round's rate would overweigh short, lucky rounds.
    tokens: Ema = field(default_factory=lambda: Ema(weight=0.3))
    seconds: Ema = field(default_factory=lambda: Ema(weight=0.3))

    @property
    def model_rate(self) -> float | None:
        if self.seconds.value is None:
            return None
        return self.tokens.value / self.seconds.value

    def choose(self, ngram_rate: float | None) -> str:
        """ "ngram" or "model"; `ngram_rate` is the n-gram proposal's expected rate at its best
        length of one token or more, if there is one. The model goes first, to be measured."""
        model_rate = self.model_rate
        if ngram_rate is None or model_rate is None:
            return "model"
        return "ngram" if ngram_rate > model_rate * MARGIN else "model"

    def record_model_round(self, tokens: int, seconds: float) -> None:
        self.tokens.update(tokens)
        self.seconds.update(seconds)


@dataclass
class CeilingShare:
    """How much of its ceiling (model_draft_ceiling) a model draft really reaches on this device:
    the tokens tries on sure text made, over those their time would have made at the ceiling
    (plain decoding's rate then, times the ceiling then), all tries' together; drawn towards
    MARGIN / CEILING_MARGIN as if that had been seen in SHARE_PRIOR_TRIES tries.

    Together, not each try's share averaged: a try stops after TRY_ROUNDS rounds where they
    lost and goes on while undecided, so a try that began badly was judged at its worst, and
    the mean of tries' shares came out low where chains gain in bursts. Sums over tries are
    not biased by when they stop (Wald's identity). Tries begun at every round of traced `chain`
    answers (scripts/try_replay.py, a Zen 5, 2026-11-29): on code, where the answers' rounds made
    1.13x plain, the tries' mean made 1.10 and their sums 1.12 (12 answers, 456 tries); on chat
    and summaries, 0.84x: 0.82 and 0.86 (12 answers, 1,115 tries)."""

    tokens: float = 0.0  # the tries' tokens (scaled down with `reach` past MAX_SHARE_TRIES)
    reach: float = 0.0  # the tokens their time would have made at the ceiling
    tries: float = 0.0
    rounds_shut: int = 0  # rounds decided while it kept the gate shut, since a try last began

    @property
    def value(self) -> float:
        prior = MARGIN / CEILING_MARGIN
        if self.reach <= 0:
            return prior
        reached = self.tokens / self.reach
        return (SHARE_PRIOR_TRIES * prior + self.tries * reached) / (SHARE_PRIOR_TRIES + self.tries)

    def record(self, tokens: float, reach: float) -> None:
        """A try made `tokens` where at the ceiling it would have made `reach`."""
        self.tokens += tokens
        self.reach += reach
        self.tries += 1
        if self.tries > MAX_SHARE_TRIES:
            scale = MAX_SHARE_TRIES / self.tries
            self.tokens *= scale
            self.reach *= scale
            self.tries = MAX_SHARE_TRIES


def try_goes_on(rounds: int, rate: float) -> bool:
    """Whether a try of a model arm goes on after `rounds` rounds that made `rate` times plain
    decoding's rate together: until TRY_ROUNDS, then while undecided (between TRY_GIVE_UP and
    MARGIN) up to TRY_MAX_ROUNDS; else it is judged."""
    if rounds < TRY_ROUNDS:
        return True
    return TRY_GIVE_UP <= rate <= MARGIN and rounds < TRY_MAX_ROUNDS


@dataclass
class Arm:
    """A way of drafting with the model ("chain", "tree"), judged by the rate it really reached.

    An engine keeps its arms from one generation to the next: what a try measured on this device
    still holds for the next prompt, and a first try costs catching the draft up on the prompt
    (50-120 ms on an edit here) and its rounds, so an arm that lost is tried again only once
    the text shows it may pay (AutoPolicy: sure text), and ever less often while it loses.
    """

    name: str
    # Tokens and seconds of its rounds, averaged apart (as ModelOrNgram's): a mean of round
    # rates would make a chain of 17 tokens in 318 ms and one of 1 in 40 ms look like 39 tok/s
    # where they made 50 (seen here on code, where plain decoding made 41).
    tokens: Ema = field(default_factory=lambda: Ema(weight=ARM_WEIGHT))
    seconds: Ema = field(default_factory=lambda: Ema(weight=ARM_WEIGHT))
    # Drafting with it whenever no n-gram proposal promises more: a try found it beats plain
    # decoding by MARGIN, and it has not since fallen below KEEP_MARGIN of it.
    in_use: bool = False
    probe_every: int = FIRST_PROBE_EVERY  # rounds between tries; doubles per failed try
    since_try: int = 0
    tried: bool = False  # by this engine, or (see `remembered`) on this device before
    trying: bool = False  # a try is under way
    try_on_sure_text: bool = False  # it began where the target was sure of its text
    reprobe: bool = False  # it began while the share kept the gate shut (REPROBE_EVERY)
    carried: bool = False  # it began the answer, as the arm in use when the last one ended
    unpriced: bool = False  # it began before the draft's cost was known: its first round timed it
    try_rounds: int = 0  # the current try's rounds so far, and what they made
    try_tokens: int = 0
    try_seconds: float = 0.0

    @property
    def rate(self) -> float:
        """Tokens per second of its recent rounds; 0 before any."""
        if self.seconds.value is None:
            return 0.0
        return self.tokens.value / self.seconds.value

    @property
    def try_rate(self) -> float:
        """Tokens per second of the current try's rounds together."""
        return self.try_tokens / max(self.try_seconds, 1e-9)

    def start_try(
        self,
        on_sure_text: bool = False,
        reprobe: bool = False,
        carried: bool = False,
        unpriced: bool = False,
    ) -> str:
        self.trying, self.try_rounds, self.try_tokens, self.try_seconds = True, 0, 0, 0.0
        self.try_on_sure_text, self.reprobe, self.carried = on_sure_text, reprobe, carried
        self.unpriced = unpriced
        return self.name

    def drop_try(self) -> None:
        """The try under way ends without a verdict; the next waits its turn (probe_every)."""
        self.trying, self.since_try = False, 0

    @classmethod
    def remembered(cls, name: str, probe_every: int) -> Arm:
        """An arm as an earlier run on this device left it: one that lost there waits for sure
        text to be probed instead of being tried first (a new process knows nothing else)."""
        if probe_every <= FIRST_PROBE_EVERY:
            return cls(name)
        return cls(name, probe_every=min(probe_every, AutoPolicy.MAX_PROBE_EVERY), tried=True)


class AutoPolicy:
    """Each round: n-gram proposal if one promises more than a plain step, else the model arm
    in use (one whose try beat plain decoding and which has kept up since), else a plain step —
    with an occasional probe of a losing arm, so a change of text (or of machine load) is
    noticed. Model arms are not tried at all where the device's costs say they cannot pay even
    at their best."""

    MAX_PROBE_EVERY = 256  # a failed probe costs about one plain step: at most ~0.5 % here

    def __init__(
        self,
        costs: Costs,
        arms: Sequence[Arm] = (),
        pipelined: bool = False,
        share: CeilingShare | None = None,
    ):
        self.costs = costs
        self.arms = list(arms)
        # What the ceiling is worth here, kept by the engine across answers (and runs).
        self.share = share if share is not None else CeilingShare()
        self.pipelined = pipelined  # chains draft the next one while the target verifies
        self.calibrator = Calibrator()
        self.since_plain = 0  # rounds since the last plain step
        # What the last choice found: model drafts could pay here at their best (_gates), so
        # they may be used or tried.
        self.may_draft = False
        self.can_pay = False  # ... and at the share of it tries reached
        self.target_sure = Ema(weight=0.1)  # the target's probability of its plain steps' tokens
        self.sure_steps = 0  # plain steps measured so far, one after another (wants_sureness)
        # Every arm is probed afresh on a new answer, once its text is sure. One in use when the
        # last answer ended: chains that made 1.3x plain on code made 0.95x on the chat answer
        # after it (two lines of the same run here), and the old rate took 20 rounds to fade.
        # One that lost there: its tries, spaced out by chat answers to one in 256 rounds (and
        # remembered on this device), never came on the code answers after them, where chains
        # made 1.19x plain and auto 0.97x (2026-11-24). A try the last answer left unfinished is
        # dropped: one begun in the bench's short warm-up was judged on the next prompt's first
        # round, before its text had shown anything.
        # But the arm in use at the last answer's end (the faster, if two were) is tried early
        # on this one (CARRY_AFTER): a try's few rounds, not 20, say whether the text still
        # pays, and waiting for sure text cost every code answer its first SURE_STEPS plain
        # steps, where chains make 2x (traced, 2026-11-30). One that loses there has its probes
        # neither spaced out nor postponed: the answer's opening is not its text yet (_judge).
        in_use = [arm for arm in self.arms if arm.in_use]
        self.carried_arm = max(in_use, key=lambda arm: arm.rate, default=None)
        self.rounds_chosen = 0
        for arm in self.arms:
            arm.in_use = False
            arm.since_try = arm.probe_every
            arm.trying = False

    def plain_rate(self) -> float:
        return 1.0 / self.costs.verify_s(1)

    def model_ceiling(self) -> float | None:
        """`model_draft_ceiling` with every token accepted at SUREST, a draft step priced as
        estimated before this generation timed one (else as timed); None while the draft's cost
        is unknown.

        The same at every round of every answer, whatever a generation learns: tries are judged
        as a share of the ceiling at their end, and the gate applies that share to the ceiling at
        the next answer's start. Priced with what the answer had learnt (0.996-0.997 for its
        0.99-sure tokens, draft steps of 0.20-0.26 where the profiles said 0.29), tries on code
        were judged against ceilings of 1.7-2.0 and the next answers began at 1.55-1.60: a
        share of 0.65 that meant 1.1-1.3x plain at the tries opened a gate of 1.01-1.04 there
        (its margin 1.03). Code answers began shut, and some drafted no chain at all: in the
        bench's prompts run twice from an emptied memory (2026-11-29), every code answer of the
        second pass, where `chain` makes 1.1x."""
        if self.costs.draft_s.value is None:
            return None
        return model_draft_ceiling(
            SUREST, self.costs, pipelined=self.pipelined, draft_cost=self.costs.draft_estimate
        )

    def models_can_pay(self) -> bool:
        """Whether the ceiling, at the share of it drafts reach here, beats plain decoding."""
        return self._gates()[1]

    def _gates(self) -> tuple[bool, bool]:
        """Whether model drafts could pay here at their best (the ceiling alone beats plain
        decoding), and whether they can at the share of it tries reached (models_can_pay)."""
        if not self.arms:
            return False, False
        ceiling = self.model_ceiling()
        if ceiling is None:
            return True, True
        return ceiling > MARGIN, ceiling * self.share.value > MARGIN

    def wants_sureness(self) -> bool:
        """Whether the next plain step's sureness (`record_plain_step`) may be read by a try
        beginning within SURE_LEAD rounds: one not yet tried, one due soon, or the share's
        re-probe."""
        if not self.may_draft:
            return False
        if not self.can_pay:
            return self.share.rounds_shut >= REPROBE_EVERY - SURE_LEAD
        return any(
            not a.tried or a.since_try >= a.probe_every - SURE_LEAD
            for a in self.arms
            if not (a.in_use or a.trying)
        )

    def record_plain_step(self, confidence: float | None) -> None:
        """A plain step: the target's probability of the token it chose; None where it was not
        measured (wants_sureness): the steps measured after it start the measure afresh, as an
        answer's first ones do, not from steps long past."""
        if confidence is None:
            if self.sure_steps:
                self.target_sure, self.sure_steps = Ema(weight=0.1), 0
            return
        self.target_sure.update(confidence)
        self.sure_steps += 1

    def record_copy(self) -> None:
        """An n-gram proposal was accepted: the text copies what came before it. The target is
        sure of what it copies; a draft that has read only the text's first and last few dozen
        tokens (engine.DRAFT_WINDOW) cannot copy it, so the sureness measured so far says
        nothing of the draft, and a try waits for SURE_STEPS sure plain steps after the copy.
        Begun right after copies, tries on the edits here made 0.45-0.7x plain decoding, their
        catching up included: 13 % of add-type-hints' time for 34 of its 256 tokens (traced,
        2026-11-29)."""
        self.record_plain_step(None)

    def choose(
        self, ngram_rate: float | None, catch_up_s: float = 0.0, rounds_left: float | None = None
    ) -> str:
        """ "plain", "ngram" or a model arm's name. Call once per round, after a plain step has
        been measured; `ngram_rate` is the best n-gram proposal's expected rate, if any,
        `catch_up_s` what bringing the draft up to date would cost before it drafts, and
        `rounds_left` how many plain steps' time the answer may still take (None: no end in
        sight)."""
        choice = self._choose(ngram_rate, catch_up_s, rounds_left)
        self.rounds_chosen += 1
        self.since_plain = 0 if choice == "plain" else self.since_plain + 1
        return choice

    def _choose(
        self, ngram_rate: float | None, catch_up_s: float, rounds_left: float | None
    ) -> str:
        plain = self.plain_rate()
        for arm in self.arms:
            arm.since_try += 1
        # Not even at its best: drafting only costs. At the share tries reached: tries are
        # made, else only re-probes (REPROBE_EVERY); an arm a try put in use is used either way,
        # judged by what it makes.
        could_pay, can_pay = self._gates()
        self.may_draft, self.can_pay = could_pay, can_pay
        if could_pay and not can_pay:
            self.share.rounds_shut += 1
        elif can_pay:
            self.share.rounds_shut = 0
        if ngram_rate is not None:  # the text may copy: no arm carried into it (CARRY_AFTER)
            self._drop_carried()
        using = [a for a in self.arms if a.in_use] if could_pay else []
        best = max(using, key=lambda a: a.rate, default=None)
        if best is not None and best.rate < plain * KEEP_MARGIN:
            best.in_use = False  # fell behind plain decoding: its tries space out
            best.probe_every = min(best.probe_every * 2, self.MAX_PROBE_EVERY)
            # As after a lost try (see _judge): the other arms draft from the same draft. A tree
            # tried right after the chain fell behind was kept on code here, where `tree` makes
            # 0.95-1.00x and `chain` 1.14-1.18x (in one process, 3 repeats, code: 1.078 ->
            # 1.085x, no tree round left).
            self._postpone_probes()
            best = None
        # The n-gram's free proposal against what the round would otherwise make.
        rival, margin = (best.rate, MARGIN) if best is not None else (plain, NGRAM_MARGIN)
        if ngram_rate is not None and ngram_rate > rival * margin:
            return "ngram"
        trying = next((a for a in self.arms if a.trying), None)
        if not could_pay:
            if trying is not None:  # priced too dear to pay at its best: it ends, unjudged
                trying.drop_try()
            return "plain"
        # A try goes on though the share shut the gate after it began: it has paid for catching
        # the draft up, and its rounds say what the draft makes better than a price one pass
        # moved. Paused there, it went on whenever plain steps had drawn the price back, and
        # each time caught the draft up again: a try of four rounds spread over ninety, each
        # 0.4-0.8 s (catching up 0.3-0.7 s), cost cli-parser 1.3 s of 14.5 (2026-12-03). Only
        # a try whose first round gave the draft its first price, too dear, stops there.
        if trying is not None:
            if can_pay or trying.reprobe or not trying.unpriced:
                return trying.name
            trying.drop_try()
            return "plain"
        step_s = self.costs.verify_s(1)
        if rounds_left is not None and catch_up_s > ANSWER_SHARE * rounds_left * step_s:
            return "plain"
        if self.carried_arm is not None and self.rounds_chosen >= CARRY_AFTER:
            carried, self.carried_arm = self.carried_arm, None
            if can_pay:
                return carried.start_try(carried=True)
        # The first arm is tried at once: nothing is known of the draft on a new device. The
        # others wait for sure text once one has been tried: in a bench on a Zen 4 here the
        # chain's try was dropped at the end of the warm-up and the tree's went at once on the
        # first prompt, before its text had shown anything (`tree` made 0.67-0.76x plain there,
        # less than `chain` on every class on both CPUs measured).
        untried = [a for a in self.arms if not a.tried]
        if can_pay and untried:
            sure = self.sure_text()
            if sure or len(untried) == len(self.arms):
                return untried[0].start_try(sure, unpriced=self.costs.draft_s.value is None)
        if best is not None:
            challenger = self._challenger(best) if can_pay else None
            if challenger is not None:
                return challenger.start_try()
            return "plain" if self.since_plain >= PLAIN_EVERY else best.name
        if not can_pay:  # the share keeps the gate shut: now and then a try, to move it
            if self.share.rounds_shut < REPROBE_EVERY or not self.sure_text():
                return "plain"
            self.share.rounds_shut = 0
            # The first arm (the chain's): on every CPU measured here the better on code.
            return self.arms[0].start_try(True, reprobe=True)
        due = [a for a in self.arms if a.since_try >= a.probe_every]
        return due[0].start_try(True) if due and self.sure_text() else "plain"

    def _challenger(self, best: Arm) -> Arm | None:
        """The chain, where a tree drafts and the chain's probe is due (CHAIN_CHALLENGES_TREE).
        Its try is judged as any (against plain decoding); won, both arms are in use and the
        faster by its recent rate drafts. No sure text is asked for: the tree in use shows the
        text is worth drafting, and while it drafts, plain steps (which measure sureness) come
        only every PLAIN_EVERY rounds."""
        if not CHAIN_CHALLENGES_TREE or best.name != "tree":
            return None
        chain = next((a for a in self.arms if a.name == "chain"), None)
        if chain is None or chain.in_use or chain.since_try < chain.probe_every:
            return None
        return chain

    def sure_text(self) -> bool:
        """Whether the target's plain steps show text it is sure enough of for a try of the
        draft: SURE_STEPS of them at least, at SURE_TEXT, or at less where a chain accepted as
        often as they are sure would pay on this device. Asked only where a try could begin:
        pricing the chain takes about 11 us here."""
        sureness = self.target_sure.value
        if self.sure_steps < SURE_STEPS or sureness is None:
            return False
        if sureness >= SURE_TEXT:
            return True
        if self.costs.draft_s.value is None:
            return False
        ceiling = model_draft_ceiling(
            sureness, self.costs, pipelined=self.pipelined, draft_cost=self.costs.draft_estimate
        )
        return ceiling > MARGIN

    def record_arm(self, name: str, tokens: int, seconds: float, catch_up_s: float = 0.0) -> None:
        """A round of arm `name` made `tokens` in `seconds`, `catch_up_s` of them catching the
        draft up on tokens other rounds decided. A try's first round is judged without them:
        the probes' schedule pays for that (on a 100-token prompt it alone made a first chain
        round lose here). Every later round pays them: they are what using the arm beside the
        n-gram drafter costs. Left out, on edits here, where the two alternate, chains in use
        looked faster than they were, and n-gram proposals that did not beat that lost to them:
        from the same memory, edits, 3 repeats, auto made 1.76x plain without them and 1.93x
        with them, `ngram` 1.93x in both runs (2026-11-29; 1.73x against 1.93x in the full run
        before). So did tries: one on an edit made 11 tokens in four rounds, 36 tok/s against
        plain decoding's 33 without the 51 ms its second round caught up, and won; in use, its
        next rounds made 20 tok/s."""
        arm = next(a for a in self.arms if a.name == name)
        arm.since_try, arm.tried = 0, True
        if not arm.trying:  # in use: choose() takes it out if it falls behind
            arm.tokens.update(tokens)
            arm.seconds.update(seconds)
            return
        if not arm.try_rounds:
            seconds -= catch_up_s
        arm.try_rounds += 1  # a try is judged on the sum of its rounds
        arm.try_tokens += tokens
        arm.try_seconds += seconds
        if try_goes_on(arm.try_rounds, arm.try_rate / self.plain_rate()):
            return  # the next rounds say more
        self._judge(arm)

    def finish(self) -> None:
        """The answer ended: a try with enough rounds is judged on them, so the next answer (or
        run) knows what it found; one with fewer is dropped (see __init__)."""
        for arm in self.arms:
            if arm.trying and arm.try_rounds >= TRY_ROUNDS:
                self._judge(arm)

    def _judge(self, arm: Arm) -> None:
        """A try's verdict, on the sum of its rounds: in use if it beat plain decoding."""
        won = arm.try_rate > self.plain_rate() * MARGIN
        ceiling = self.model_ceiling()
        if arm.try_on_sure_text and ceiling:  # elsewhere chains are not meant to pay
            self.share.record(arm.try_tokens, arm.try_seconds * self.plain_rate() * ceiling)
        # The verdict replaces what the arm measured before: that was another text, or load.
        arm.trying = False
        arm.tokens.value = arm.try_tokens / arm.try_rounds
        arm.seconds.value = arm.try_seconds / arm.try_rounds
        arm.in_use = won
        # One good try brings the next close, so a text that turns predictable is noticed
        # within a few rounds; failures space the tries out.
        if arm.in_use:
            arm.probe_every = FIRST_PROBE_EVERY
        elif not arm.carried:
            arm.probe_every = min(arm.probe_every * 2, self.MAX_PROBE_EVERY)
            # What the draft failed to predict, the other arms draft from too: their probes
            # wait their turn again (a chain's probe leaves the draft caught up, which made a
            # tree's probe look cheap right after it; both lost on chat here).
            self._postpone_probes()

    def _drop_carried(self) -> None:
        """No try of the arm carried into this answer, or no verdict on one under way: its
        probes wait for sure text as every other arm's."""
        self.carried_arm = None
        for arm in self.arms:
            if arm.trying and arm.carried:
                arm.drop_try()

    def _postpone_probes(self) -> None:
        """A model arm lost: every arm's probe waits its turn again, and one never tried waits
        like one that lost: the text the draft just failed on is its text too. Tried at once,
        it lost as well: on a fresh device (a Zen 4 here) the bench's third code prompt had a
        chain try, then a tree try (34 and 28 rounds), and made 0.76x plain."""
        for arm in self.arms:
            arm.since_try = 0
            if not arm.tried:
                arm.tried = True
                arm.probe_every = min(arm.probe_every * 2, self.MAX_PROBE_EVERY)
