"""The cost-aware policy of mode "auto", with made-up costs and acceptance (no model, no clock)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from itertools import accumulate
from operator import mul

import pytest

from edgespec.policy import (
    ANSWER_SHARE,
    CARRY_AFTER,
    CEILING_MARGIN,
    FACTOR_HALF_LIFE,
    FIRST_PROBE_EVERY,
    KEEP_MARGIN,
    LOSS_ALLOWANCE,
    MARGIN,
    MAX_SHARE_TRIES,
    MIN_DRAFT_ROUNDS,
    PLAIN_EVERY,
    REPROBE_EVERY,
    SHARE_PRIOR_TRIES,
    START_FACTOR_BOUND,
    SURE_STEPS,
    SURE_TEXT,
    TRY_GIVE_UP,
    TRY_MAX_ROUNDS,
    TRY_ROUNDS,
    Arm,
    AutoPolicy,
    Calibrator,
    CeilingShare,
    Costs,
    Ema,
    LossBudget,
    ModelOrNgram,
    best_pass_size,
    best_proposal_length,
    expected_tokens,
    model_draft_ceiling,
    worth_drafting_on,
    worth_growing,
)

# A CPU like this one: verifying k tokens costs about half a step per extra token.
CPU_CURVE = {1: 1.0, 2: 1.64, 3: 2.2, 4: 2.63, 5: 3.32, 6: 3.94, 8: 4.56, 16: 5.16}


def relative(k: int) -> float:
    from edgespec.profile import relative_cost

    return relative_cost(CPU_CURVE, k)


def chain_rate(accept_probs: list[float], costs: Costs, draft_evals: int) -> float:
    """The definition: expected tokens per second if the drafted chain were verified now."""
    seconds = draft_evals * costs.draft_s.value + costs.verify_s(len(accept_probs) + 1)
    return expected_tokens(accept_probs) / seconds


def costs(step_s: float = 0.03, draft_s: float | None = 0.005) -> Costs:
    c = Costs(relative)
    c.step_s.update(step_s)
    if draft_s is not None:
        c.draft_s.update(draft_s)
    return c


def test_an_ema_starts_at_its_first_sample_and_moves_towards_new_ones():
    ema = Ema(weight=0.5)
    assert ema.update(10) == 10
    assert ema.update(20) == 15


def test_expected_tokens_counts_the_target_token_and_each_accepted_prefix():
    assert expected_tokens([]) == 1
    assert expected_tokens([1.0, 1.0]) == 3
    assert expected_tokens([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)


def test_the_calibrator_starts_at_confidence_and_learns_the_real_acceptance():
    cal = Calibrator()
    assert cal.predict(0.95) == pytest.approx(0.95)
    for _ in range(200):
        cal.record(0.95, accepted=False)  # an overconfident draft
    assert cal.predict(0.95) < 0.1
    assert cal.predict(0.25) == pytest.approx(0.25)  # other bins are untouched


def test_the_calibrator_tells_near_certain_tokens_from_merely_likely_ones():
    """Where a pass of 16 is the sweet spot, chains pay only through tokens right with 0.97 or
    more: a draft's 0.999-sure tokens must not share an estimate with its 0.91-sure ones."""
    cal = Calibrator()
    for i in range(100):
        cal.record(0.91, accepted=i % 10 < 7)  # right 70 % of the time
        cal.record(0.999, accepted=True)
    assert cal.predict(0.91) == pytest.approx(0.7, abs=0.02)
    assert cal.predict(0.999) > 0.99


def test_a_confidence_on_a_bin_edge_shares_the_estimate_of_the_tokens_above_it():
    """0.99 is an edge: a token the draft is 0.99 sure of is as likely accepted as the 0.99 to
    0.995 sure ones were, not the 0.98 to 0.99 ones."""
    below, above = Calibrator(), Calibrator()
    for _ in range(50):
        below.record(0.985, accepted=False)
        above.record(0.992, accepted=False)
    assert below.predict(0.99) == pytest.approx(0.99)
    assert above.predict(0.99) < 0.1


def test_drafting_goes_on_while_a_cheap_draft_is_likely_right():
    c = costs(step_s=0.03, draft_s=0.005)
    assert worth_drafting_on([0.95], 0.95, c)
    assert worth_drafting_on([0.95, 0.95, 0.95], 0.95, c)


def test_drafting_stops_when_the_next_token_is_unlikely_to_be_accepted():
    c = costs(step_s=0.03, draft_s=0.005)
    assert not worth_drafting_on([0.9, 0.9], 0.05, c)


@pytest.mark.parametrize("evaluated", [False, True])
def test_drafting_on_means_some_longer_chain_of_equally_likely_tokens_has_a_higher_rate(evaluated):
    """The definition, by brute force over chain_rate, on random chains and costs. `evaluated`:
    the next token's row is made already (a sampled chain asks before each draw), so stopping
    there is priced with its draft step, spent whichever way the answer goes."""
    rng = random.Random(7)
    for _ in range(300):
        c = costs(step_s=0.03, draft_s=rng.uniform(0.002, 0.03))
        probs = [rng.random() for _ in range(rng.randint(0, 6))]
        guess, k = rng.random(), len(probs)
        longer = [probs + [guess] * extra for extra in range(1, 9)]
        stop = chain_rate(probs, c, k + evaluated)
        expected = any(chain_rate(p, c, len(p)) > stop for p in longer)
        assert worth_drafting_on(probs, guess, c, evaluated=evaluated) == expected


def test_a_dear_drafts_first_token_pays_only_once_its_row_is_made():
    """A draft as dear as the target: its first token, 0.7 likely, is not worth a draft step and
    a pass of two, but is worth the pass once the step is spent."""
    dear = costs(step_s=0.03, draft_s=0.03)
    assert not worth_drafting_on([], 0.7, dear, horizon=1)
    assert worth_drafting_on([], 0.7, dear, horizon=1, evaluated=True)


def test_drafting_on_looks_the_whole_horizon_ahead():
    """A pass that is cheap exactly `horizon` tokens further on (a sweet spot, as 16 is on a
    saw-shaped curve) is seen; one a token further is not."""
    curve = {1: 1.0, 2: 1.5, 10: 2.0}  # every other size costs 10 steps
    c = Costs(lambda k: curve.get(k, 10.0))
    c.step_s.update(0.03)
    c.draft_s.update(0.005)
    # One token drafted (a pass of 2): 8 more make a pass of 10.
    assert worth_drafting_on([0.9], 0.9, c, horizon=8)
    assert not worth_drafting_on([0.9], 0.9, c, horizon=7)


def test_a_tree_grows_on_where_batches_are_cheap_and_stops_where_they_are_dear():
    """Verified now: the target's token, a branch of two likely tokens and one side token
    (1 + 0.9 + 0.81 + 0.3 expected tokens, a pass of 4, 2 draft steps); drafting on extends
    the branch with tokens as likely as its last."""
    tree_now = {"tokens": 1 + 0.9 + 0.81 + 0.3, "verified": 4, "draft_evals": 2}
    flat = Costs(lambda k: 1 + 0.02 * (k - 1))  # a phone's big cores, say
    flat.step_s.update(0.05)
    flat.draft_s.update(0.005)
    from edgespec.profile import relative_cost

    this_vm = {1: 1.0, 2: 1.59, 4: 2.45, 6: 3.67, 8: 5.88, 12: 7.41, 16: 7.69}
    dear = Costs(lambda k: relative_cost(this_vm, k))
    dear.step_s.update(0.05)
    dear.draft_s.update(0.015)
    assert worth_growing(**tree_now, reach=0.81, next_guess=0.9, costs=flat)
    assert not worth_growing(**tree_now, reach=0.81, next_guess=0.9, costs=dear)
    assert not worth_growing(**tree_now, reach=0.81, next_guess=0.05, costs=flat)


def test_a_draft_as_slow_as_the_target_never_beats_plain_decoding():
    c = costs(step_s=0.03, draft_s=0.03)
    plain_rate = 1 / c.verify_s(1)
    for k in range(1, 9):
        assert chain_rate([1.0] * k, c, k) < plain_rate


def test_measured_passes_correct_the_profile_curve_for_batches_not_for_a_step():
    c = costs(step_s=0.03)
    from_profile = c.verify_s(5)
    for _ in range(60):  # the passes of this generation take twice what the profile says
        c.record_pass(5, 2 * from_profile)
    assert c.verify_s(5) == pytest.approx(2 * from_profile, rel=0.01)
    assert c.verify_s(3) == pytest.approx(2 * 0.03 * relative(3), rel=0.01)
    assert c.verify_s(1) == 0.03
    c.record_pass(1, 1.0)  # a single step is measured as step_s, not here
    assert c.verify_s(1) == 0.03
    assert c.verify_s(5) == pytest.approx(2 * from_profile, rel=0.01)  # nor does it correct passes


def test_measured_passes_correct_the_whole_curve_by_one_factor():
    c = costs(step_s=0.03)
    for _ in range(30):  # passes of 4 take 1.2 times what the curve says
        c.record_pass(4, 0.03 * relative(4) * 1.2)
    assert c.batch_factor.value == pytest.approx(1.2)
    for k in (2, 4, 5, 6, 8, 16):
        assert c.steps(k) == pytest.approx(relative(k) * 1.2)
        assert c.verify_s(k) == pytest.approx(0.03 * c.steps(k))


# A Zen 4 here, measured at every size from 8 to 17: cheap at 16, dear on either side.
BANDED = {1: 1.0, 2: 1.84, 4: 3.02, 8: 6.65, 12: 8.97, 15: 10.22, 16: 8.24, 17: 10.15, 32: 14.48}


def banded(sizes: tuple[int, ...]) -> Costs:
    """Costs from the BANDED curve as a profile measured at `sizes` would give them."""
    from edgespec.profile import relative_cost

    curve = {k: BANDED[k] for k in sizes}
    c = Costs(lambda k: relative_cost(curve, k), sizes)
    c.step_s.update(0.03)
    return c


def test_a_pass_size_the_profile_did_not_measure_costs_what_the_next_measured_size_costs():
    """Interpolating from 8 to 16 says a pass of 15 costs 8.0 steps; it costs 10.2 here."""
    quick = banded((1, 2, 4, 8, 16, 32))
    assert quick.steps(15) == quick.steps(12) == quick.steps(9) == pytest.approx(8.24)
    assert quick.steps(17) == pytest.approx(14.48)
    assert quick.steps(40) == pytest.approx(14.48 * 40 / 32)  # past the last: in proportion
    assert banded((1, 2, 4, 8, 12, 15, 16, 17, 32)).steps(15) == pytest.approx(10.22)


def test_a_copy_is_verified_in_passes_of_measured_sizes():
    """With a proposal of 31 likely tokens, a curve interpolated from the quick sizes picks a
    pass of 17 (priced 8.6 steps, 10.2 here); priced by measured sizes it picks 16."""
    a_copy = [0.97] * 31
    from edgespec.profile import relative_cost

    quick = {k: BANDED[k] for k in (1, 2, 4, 8, 16, 32)}
    interpolated = Costs(lambda k: relative_cost(quick, k))
    interpolated.step_s.update(0.03)
    measured = banded((1, 2, 4, 8, 16, 32))
    assert best_proposal_length(a_copy, interpolated)[0] + 1 == 17
    length = best_proposal_length(a_copy, measured)[0]
    assert length + 1 == 16

    def real_rate(n: int) -> float:
        return expected_tokens(a_copy[:n]) / relative_cost(BANDED, n + 1)

    assert real_rate(length) > 1.15 * real_rate(best_proposal_length(a_copy, interpolated)[0])


def test_passes_of_sizes_the_profile_did_not_measure_do_not_correct_its_curve():
    c = banded((1, 2, 4, 8, 16, 32))
    for _ in range(20):
        c.record_pass(15, 0.03 * 10.22)  # dearer than the price of 16, as measured here
    assert c.batch_factor.value is None
    assert c.steps(15) == c.steps(16) == pytest.approx(8.24)
    c.record_pass(16, 0.03 * 8.24 * 1.1)
    assert c.batch_factor.value == pytest.approx(1.1)


def test_dear_passes_of_a_sweet_spot_do_not_price_it_out_of_use():
    """Priced by its own passes, a size timed dear once or twice was not chosen again, so not
    timed again: a pass of 27 timed at 14.5 steps (9.3 in the profile) had auto verify copies 22
    tokens at a time. One factor moves every size alike, and the sweet spot stays one."""
    c = banded(tuple(sorted(BANDED)))
    for _ in range(30):
        c.record_pass(4, 0.03 * 3.02)
    a_sure_copy = [0.995] * 20
    assert best_proposal_length(a_sure_copy, c)[0] + 1 == 16
    for _ in range(3):  # a busy moment
        c.record_pass(16, 0.03 * 8.24 * 1.6)
    assert c.batch_factor.value > 1.1
    for k in (2, 4, 8, 12, 15, 17, 32):
        assert c.steps(k) / c.steps(16) == pytest.approx(BANDED[k] / BANDED[16])
    assert best_proposal_length(a_sure_copy, c)[0] + 1 == 16


def test_a_size_the_profile_did_not_measure_never_costs_less_than_the_next_measured_size():
    """However the passes move the correction: priced between measured sizes, a pass of 15
    looked cheaper than one of 16, and a 27-token copy was verified 15 at a time (a CI run on
    the real SmolLM)."""
    c = banded((1, 2, 4, 8, 16, 32))
    for _ in range(20):
        c.record_pass(4, 0.03 * 3.02 * 0.8)
    c.record_pass(16, 0.03 * 8.24)
    assert c.batch_factor.value < 0.9
    for k in range(9, 16):
        assert c.steps(k) == pytest.approx(c.steps(16))
    assert best_proposal_length([0.995] * 15, c)[0] + 1 == 16


def test_what_passes_measured_carries_over_to_the_next_generation():
    first = costs(step_s=0.03)
    for _ in range(10):
        first.record_pass(4, 0.03 * relative(4) * 1.3)
    learnt = first.batch_factor.value
    assert learnt == pytest.approx(1.3)
    nxt = Costs(relative)
    nxt.start_from(learnt)
    nxt.step_s.update(0.05)  # another load: the steps, not the seconds, carry over
    assert nxt.verify_s(4) == pytest.approx(0.05 * relative(4) * 1.3)
    assert nxt.steps(8) == pytest.approx(relative(8) * 1.3)
    nxt.record_pass_as_step(4, 0.06 * relative(4) * 1.3)  # chain, tree: a pass stands for a step
    assert nxt.step_s.value == pytest.approx(0.05 + 0.2 * (0.06 - 0.05))
    unknown = Costs(relative)
    unknown.start_from(None)
    assert unknown.steps(8) == relative(8)


def test_a_pass_factor_no_pass_measures_drifts_back_to_the_profile_in_plain_steps():
    """A dear stretch left passes priced 1.36x the profile, and at that price nothing verified a
    pass to correct it: each plain step draws the factor back, half-way in FACTOR_HALF_LIFE."""
    c = costs(step_s=0.03)
    c.start_from(1.36)
    assert c.steps(4) == pytest.approx(relative(4) * 1.36)
    for _ in range(FACTOR_HALF_LIFE):
        c.record_step(0.03)
    assert c.batch_factor.value == pytest.approx(1.18)
    assert c.steps(4) == pytest.approx(relative(4) * 1.18)  # passes are priced at it
    for _ in range(FACTOR_HALF_LIFE):
        c.record_step(0.03)
    assert c.batch_factor.value == pytest.approx(1.09)
    c.record_pass(4, 0.03 * relative(4) * 1.5)  # a pass measures it again
    assert c.batch_factor.value == pytest.approx(1.09 + 0.1 * (1.5 - 1.09))
    cheap = costs(step_s=0.03)
    cheap.start_from(0.8)  # from below as well: a fast stretch does not last either
    for _ in range(FACTOR_HALF_LIFE):
        cheap.record_step(0.03)
    assert cheap.batch_factor.value == pytest.approx(0.9)
    unknown = costs(step_s=0.03)
    unknown.record_step(0.03)  # nothing measured, nothing to relax: the profile's curve
    assert unknown.batch_factor.value is None and unknown.steps(4) == relative(4)


def test_a_stored_pass_factor_is_started_from_within_reason():
    """4.3 stored from a busy minute priced out every pass of the modes that cannot correct it."""
    for stored, started in [(8.0, START_FACTOR_BOUND), (0.1, 1 / START_FACTOR_BOUND), (1.3, 1.3)]:
        c = costs()
        c.start_from(stored)
        assert c.batch_factor.value == pytest.approx(started)
    for nonsense in (0.0, -1.0):
        c = costs()
        c.start_from(nonsense)
        assert c.batch_factor.value is None


def test_a_stale_dear_pass_factor_reopens_the_gate_for_model_drafts():
    """At 1.36x the profile a model chain's ceiling cannot pay (the gate shuts, no chain is
    tried and no pass timed); after some plain steps the factor is back where tries decide."""
    c = costs(step_s=0.03, draft_s=0.012)  # a draft step 0.4 of a target step
    c.start_from(1.36)
    policy = AutoPolicy(c, [Arm("chain")])
    assert not policy.models_can_pay()
    steps = 0
    while not policy.models_can_pay():
        c.record_step(0.03)
        steps += 1
        assert steps < 2 * FACTOR_HALF_LIFE  # inside the loop: a regression fails, not hangs


def half_a_step_a_token() -> Costs:
    """Passes of k tokens cost (k + 1) / 2 plain steps."""
    c = Costs(lambda k: (k + 1) / 2)
    c.step_s.update(1.0)
    return c


def test_a_pass_may_verify_only_what_its_worst_case_leaves_within_the_loss_budget():
    c, budget = half_a_step_a_token(), LossBudget(steps=8.0)
    # n proposed tokens: a pass of n + 1, (n + 2) / 2 steps for the target's own token at worst
    assert budget.longest(c, 32) == 16  # 18/2 - 1 = 8 <= 8; 19/2 - 1 = 8.5 > 8
    assert budget.longest(c, 6) == 6  # never more than was proposed
    budget.record(tokens=1, pass_steps=8.5)  # a pass of 16 that yielded the target's token only
    assert budget.steps == pytest.approx(0.5)
    assert budget.longest(c, 32) == 1  # a pass of 2 can lose at most 0.5 more
    budget.record(tokens=2, pass_steps=1.5)  # it was right: a win widens the budget
    assert budget.longest(c, 32) == 2


def test_the_budget_allows_the_longest_pass_that_fits_past_a_dearer_shorter_one():
    """Whole proposals of 14 tokens were verified, in passes of 15 dearer than those of 16 (as
    on the saw-shaped curve here). Counting up from 2 stopped at the dear 15 and left a pass of
    14, a size no profile measured; the longest pass that fits is 16, and best_proposal_length
    never takes the dear 15 in its place."""
    c = banded((1, 2, 4, 8, 12, 15, 16, 17, 32))
    budget = LossBudget(steps=8.0)  # 16 fits (8.24 - 1), 15 does not (~9.8 - 1)
    assert c.steps(16) - 1 <= budget.steps < c.steps(15) - 1
    allowed = budget.longest(c, 27)
    assert allowed == 15
    length = best_proposal_length([0.97] * allowed, c)[0]
    assert length + 1 == 16 and c.steps(length + 1) - 1 <= budget.steps


@pytest.mark.parametrize("curve", ["linear", "saw", "uneven"])
def test_passes_within_the_budget_never_lose_more_than_the_allowance_whatever_they_yield(curve):
    """Whatever the proposals yield, and whichever length best_proposal_length takes within
    what the budget allows; on the saw-shaped curve, odd sizes were timed dearer than 16; on the
    uneven one, no price is a multiple of half a step, so the budget is not either."""
    c, rng = half_a_step_a_token(), random.Random(5)
    if curve == "uneven":
        c = Costs(lambda k: 1 + 0.43 * (k - 1))
        c.step_s.update(1.0)
    if curve == "saw":
        c = banded((1, 2, 4, 8, 16, 32))
        for k in (5, 7, 13, 15, 17, 31):
            c.record_pass(k, 0.03 * BANDED[16] * 1.3)
    budget, surplus = LossBudget(), 0.0  # surplus: tokens yielded less steps spent, all passes
    for _ in range(2000):
        allowed = budget.longest(c, rng.randint(0, 32))
        estimates = [rng.uniform(0.5, 1.0)] * allowed
        length = best_proposal_length(estimates, c)[0] if allowed else 0
        price = c.steps(length + 1)
        tokens = 1 + rng.choice([0, 0, 0, rng.randint(0, length)])  # mostly wrong proposals
        budget.record(tokens, price)
        surplus += tokens - price
        assert surplus >= -LOSS_ALLOWANCE - 1e-9
    assert budget.steps == pytest.approx(LOSS_ALLOWANCE + surplus)


def test_cheaper_batches_than_the_profile_says_make_a_proposal_worth_verifying():
    first_token_right_then_all = [0.45, 1.0, 1.0, 1.0]
    c = costs(step_s=0.03)
    assert best_proposal_length(first_token_right_then_all, c)[0] == 0
    for _ in range(60):
        c.record_pass(5, 0.7 * c.verify_s(5))
    assert best_proposal_length(first_token_right_then_all, c)[0] > 0


def test_ngram_length_zero_when_proposals_are_rarely_right():
    length, rate = best_proposal_length([0.05] + [1.0] * 7, costs())
    assert length == 0 and rate == pytest.approx(1 / 0.03)


def test_ngram_length_grows_with_expected_acceptance_and_uses_the_curve():
    length, rate = best_proposal_length([0.95] + [1.0] * 14, costs())
    assert length >= 7 and rate > 2 / 0.03  # a long, mostly right copy: more than 2x plain


def test_auto_takes_an_ngram_proposal_only_when_it_promises_more_than_a_plain_step():
    """With no margin: the proposal is free, and the loss budget bounds what its passes lose."""
    policy = AutoPolicy(costs())
    plain = policy.plain_rate()
    assert policy.choose(ngram_rate=plain * 1.5) == "ngram"
    assert policy.choose(ngram_rate=plain * 1.01) == "ngram"
    assert policy.choose(ngram_rate=plain * 0.99) == "plain"
    assert policy.choose(ngram_rate=None) == "plain"


def test_a_model_mode_drafts_with_the_model_until_its_rounds_are_measured():
    drafters = ModelOrNgram()
    assert drafters.model_rate is None
    assert drafters.choose(ngram_rate=1000.0) == "model"
    drafters.record_model_round(tokens=3, seconds=0.1)
    assert drafters.model_rate == pytest.approx(30.0)


def test_a_model_mode_verifies_the_ngram_proposal_alone_only_where_it_promises_more():
    drafters = ModelOrNgram()
    drafters.record_model_round(tokens=3, seconds=0.1)  # 30 tokens/s
    assert drafters.choose(ngram_rate=45.0) == "ngram"
    assert drafters.choose(ngram_rate=30.5) == "model"  # within noise: the model
    assert drafters.choose(ngram_rate=None) == "model"


def test_the_model_rate_is_recent_tokens_over_recent_seconds_not_a_mean_of_round_rates():
    drafters = ModelOrNgram()
    for _ in range(30):  # a one-token round in 10 ms, then an eight-token round in 400 ms
        drafters.record_model_round(tokens=1, seconds=0.01)
        drafters.record_model_round(tokens=8, seconds=0.4)
    # 9 tokens per 0.41 s: the mean of the two rates (60 tokens/s) would flatter the model
    assert 15 < drafters.model_rate < 30


def test_the_first_timed_draft_step_replaces_an_estimate_then_steps_are_averaged():
    c = Costs(relative)
    c.estimate_draft_step(0.010)  # from profiles measured in another hour
    c.record_draft_step(0.015)
    assert c.draft_s.value == pytest.approx(0.015)
    c.record_draft_step(0.020)
    assert 0.015 < c.draft_s.value < 0.020


def test_until_a_draft_step_is_timed_its_estimate_follows_the_plain_step():
    """An estimate is a share of a target step: a first step timed under a passing load would
    otherwise price every draft step (and catching the draft up) of the answer at its seconds."""
    c = costs(step_s=0.062, draft_s=None)  # a first step under load
    c.estimate_draft_step(0.2 * 0.062)  # the profiles: a draft step is 0.2 of a target step
    for _ in range(30):  # the load lifts
        c.record_step(0.014)
    assert c.step_s.value == pytest.approx(0.014, rel=0.01)
    assert c.draft_s.value == pytest.approx(0.2 * c.step_s.value)
    c.record_draft_step(0.004)  # timed: from now on what it took, whatever the steps do
    c.record_step(0.03)
    assert c.draft_s.value == pytest.approx(0.004)


def test_a_draft_cost_is_kept_for_later_answers_only_from_enough_timed_draft_rounds():
    """One chain round timed at twice the usual draft step, right after catching the draft up,
    once shut the gate for good: a draft never used is never timed again."""
    c = costs(step_s=0.025, draft_s=None)
    c.estimate_draft_step(0.006)
    assert c.draft_cost(known=0.24) == 0.24  # an estimate teaches nothing new
    c.record_draft_step(0.012)  # one slow round
    assert c.draft_cost(known=0.24) == 0.24
    assert c.draft_cost(known=None) == pytest.approx(0.48)  # better than nothing
    for _ in range(MIN_DRAFT_ROUNDS - 1):
        c.record_draft_step(0.006)
    assert c.draft_cost(known=0.24) == pytest.approx(c.draft_s.value / 0.025)


def test_a_draft_cost_is_its_steps_over_the_target_steps_timed_with_them():
    """Chains timed in a slow minute, then plain steps after it: the draft costs what it cost
    against the target then, not its slow steps over the fast ones that followed."""
    c = costs(step_s=0.036, draft_s=None)  # a slow minute: plain steps of 36 ms
    for _ in range(MIN_DRAFT_ROUNDS):
        c.record_draft_step(0.0095)
    for _ in range(20):  # the load lifts: 24 ms
        c.step_s.update(0.024)
    assert c.draft_cost(known=0.24) == pytest.approx(0.0095 / 0.036)
    assert c.draft_s.value / c.step_s.value > 0.39  # what was remembered before


def test_a_pass_stands_for_a_step_where_no_plain_step_is_timed():
    c = Costs(relative)
    c.record_pass_as_step(4, 0.03 * relative(4))
    assert c.verify_s(1) == pytest.approx(0.03)
    assert c.verify_s(4) == pytest.approx(0.03 * relative(4))


def decode(
    policy: AutoPolicy, rounds: int, arm_round: tuple[int, float], sure: float = 0.95, **choose
) -> list[str]:
    """`rounds` rounds of auto mode where each model arm's round makes `arm_round` (tokens,
    seconds) and the target is `sure` of its plain steps' tokens; what each round chose."""
    chosen = []
    for _ in range(rounds):
        chosen.append(policy.choose(None, **choose))
        if chosen[-1] == "plain":
            policy.record_plain_step(sure)
        else:
            policy.record_arm(chosen[-1], *arm_round)
    return chosen


def try_arm(policy: AutoPolicy, name: str, tokens: int, seconds: float) -> None:
    """A whole try of an arm: TRY_ROUNDS rounds, each making `tokens` in `seconds`."""
    for _ in range(TRY_ROUNDS):
        assert policy.choose(None) == name
        policy.record_arm(name, tokens, seconds)


def show_sure_text(policy: AutoPolicy) -> None:
    """Plain steps of text the target is sure of, as many as an answer is judged by."""
    for _ in range(SURE_STEPS):
        policy.record_plain_step(0.95)


def test_auto_tries_each_model_arm_then_keeps_the_one_that_pays():
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain"), Arm("tree")])
    try_arm(policy, "chain", tokens=3, seconds=0.05)  # 60 tok/s vs 33 plain
    show_sure_text(policy)  # the second arm waits for it (see below)
    try_arm(policy, "tree", tokens=2, seconds=0.08)  # 25 tok/s: loses
    assert [policy.choose(None) for _ in range(5)] == ["chain"] * 5


def test_only_the_first_arm_is_tried_before_the_text_shows_itself():
    """Nothing is known of the draft on a new device, so the first arm goes at once; the tree
    tried at once after the chain's try (dropped at the end of the bench's warm-up) made
    0.67-0.76x plain on a Zen 4 here."""
    arms = [Arm("chain"), Arm("tree")]
    short = AutoPolicy(costs(step_s=0.025), arms)  # an answer of two rounds: the try is dropped
    for _ in range(2):
        assert short.choose(None) == "chain"
        short.record_arm("chain", 1, 0.06)
    following = AutoPolicy(costs(step_s=0.025), arms)
    chosen = decode(following, SURE_STEPS + 1, arm_round=(12, 0.25), sure=0.95)
    assert chosen == ["plain"] * SURE_STEPS + ["tree"]


def test_an_arm_never_tried_is_not_tried_on_the_text_another_arm_just_lost_on():
    """Both arms draft with the same model: on a Zen 4 here the tree tried right after the
    chain lost made 0.67-0.76x plain, where the chain made 0.72-0.89x. The tree then waits as
    if it had lost too, and is remembered so."""
    policy = AutoPolicy(costs(step_s=0.025), [Arm("chain"), Arm("tree")])
    try_arm(policy, "chain", tokens=2, seconds=0.08)  # 25 tok/s against 40: loses
    chosen = decode(policy, 100, arm_round=(2, 0.08), sure=0.95)
    assert chosen[0] == "plain" and "chain" in chosen  # the chain's probe comes, on sure text
    assert "tree" not in chosen[: chosen.index("chain")]
    tree = policy.arms[1]
    assert tree.tried and Arm.remembered("tree", tree.probe_every).tried


def test_a_try_is_judged_on_all_its_rounds_not_on_one_unlucky_gamble():
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain")])
    rounds = [(1, 0.06)] + [(8, 0.1)] * (TRY_ROUNDS - 1)  # a wasted draft, then long chains
    for tokens, seconds in rounds:
        assert policy.choose(None) == "chain"  # the first round alone (17 tok/s) would lose
        policy.record_arm("chain", tokens, seconds)
    assert [policy.choose(None) for _ in range(5)] == ["chain"] * 5
    lucky = AutoPolicy(costs(step_s=0.03), [Arm("chain")])
    rounds = 0
    for tokens, seconds in itertools.chain([(8, 0.1)], itertools.repeat((1, 0.09))):
        if lucky.choose(None) != "chain":
            break
        lucky.record_arm("chain", tokens, seconds)
        rounds += 1
    # One lucky round does not make a losing arm: it kept the try going until the rounds after
    # it told (from 30 tok/s, 0.89x plain, down), then the try was lost.
    assert TRY_ROUNDS < rounds <= TRY_MAX_ROUNDS and not lucky.arms[0].in_use


def test_an_undecided_try_goes_on_until_it_wins_or_falls_out_of_reach():
    """Chains gain in runs of sure tokens between rounds that break even: four rounds at 0.95x
    plain decoding are not yet a verdict."""
    step_s = 0.03  # plain: 33.3 tok/s
    winner = AutoPolicy(costs(step_s=step_s), [Arm("chain")])
    for tokens, seconds in [(3, 0.095)] * TRY_ROUNDS + [(16, 0.3)]:  # 31.6 tok/s, then a run
        assert winner.choose(None) == "chain"
        winner.record_arm("chain", tokens, seconds)
    assert winner.arms[0].in_use and not winner.arms[0].trying
    undecided = AutoPolicy(costs(step_s=step_s), [Arm("chain")])
    chosen = decode(undecided, 40, arm_round=(3, 0.095))  # 0.95x plain, round after round
    assert chosen[:TRY_MAX_ROUNDS] == ["chain"] * TRY_MAX_ROUNDS
    assert chosen[TRY_MAX_ROUNDS] == "plain" and not undecided.arms[0].in_use
    hopeless = AutoPolicy(costs(step_s=step_s), [Arm("chain")])
    chosen = decode(hopeless, 40, arm_round=(2, 0.08))  # 0.75x plain: out of reach at once
    assert chosen[: TRY_ROUNDS + 1] == ["chain"] * TRY_ROUNDS + ["plain"]
    assert TRY_GIVE_UP > 0.75


def test_a_try_that_ends_within_the_margin_of_plain_decoding_does_not_win():
    """Noise must not tempt us: a try wins only by beating plain decoding by MARGIN."""
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain")])  # plain: 33.3 tok/s
    chosen = decode(policy, TRY_MAX_ROUNDS + 1, arm_round=(3, 0.088))  # 34.1 tok/s
    assert chosen == ["chain"] * TRY_MAX_ROUNDS + ["plain"] and not policy.arms[0].in_use
    assert MARGIN > 3 / 0.088 * 0.03  # the try's rate over plain decoding's


def test_of_two_arms_in_use_the_faster_one_drafts():
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain"), Arm("tree")])  # plain: 33.3 tok/s
    try_arm(policy, "chain", tokens=3, seconds=0.05)  # 60 tok/s
    show_sure_text(policy)
    try_arm(policy, "tree", tokens=3, seconds=0.075)  # 40 tok/s: it wins too
    assert policy.arms[0].in_use and policy.arms[1].in_use
    assert [policy.choose(None) for _ in range(5)] == ["chain"] * 5


def tree_in_use(chain: Arm) -> AutoPolicy:
    """An answer where the tree's try won (40 tok/s against plain decoding's 33) and `chain`,
    tried before, waits for its probe."""
    policy = AutoPolicy(costs(step_s=0.03), [chain, Arm("tree")])
    show_sure_text(policy)
    try_arm(policy, "tree", tokens=3, seconds=0.075)
    assert policy.arms[1].in_use and not chain.in_use
    return policy


def test_while_a_tree_drafts_the_chain_is_tried_when_due_and_drafts_if_faster():
    """A tree in use drafted to the answer's end, and into the next ones, where chains were
    the faster on code on every CPU measured here."""
    policy = tree_in_use(Arm("chain", probe_every=16, tried=True))  # due: it waited the try
    try_arm(policy, "chain", tokens=3, seconds=0.05)  # 60 tok/s
    assert [policy.choose(None) for _ in range(5)] == ["chain"] * 5


def test_a_chain_that_wins_its_try_but_is_slower_than_the_tree_leaves_the_tree_drafting():
    policy = tree_in_use(Arm("chain", probe_every=16, tried=True))
    try_arm(policy, "chain", tokens=3, seconds=0.085)  # 35 tok/s: above plain, below the tree
    assert policy.arms[0].in_use
    assert [policy.choose(None) for _ in range(5)] == ["tree"] * 5


def test_a_chain_that_loses_against_a_drafting_tree_waits_twice_as_long_for_the_next_try():
    policy = tree_in_use(Arm("chain", probe_every=16, tried=True))
    try_arm(policy, "chain", tokens=1, seconds=0.06)  # 17 tok/s
    assert not policy.arms[0].in_use and policy.arms[1].in_use
    chosen = decode(policy, 32, arm_round=(3, 0.075))
    assert "chain" not in chosen[:31] and chosen[31] == "chain"


def test_a_tree_is_not_tried_against_a_chain_in_use():
    """Trees tried against a chain in use won their four-round tries against its ten-round
    average often enough to take code over, where chains were the faster (docs/speed.md)."""
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain"), Arm("tree", tried=True)])
    show_sure_text(policy)
    try_arm(policy, "chain", tokens=3, seconds=0.05)
    chosen = decode(policy, 5 * PLAIN_EVERY, arm_round=(3, 0.05))
    assert "tree" not in chosen


def test_an_undecided_try_is_judged_on_its_rounds_when_the_answer_ends():
    """So the next answer, or the next run, knows what it found; a try of fewer rounds than
    TRY_ROUNDS says too little, and the next answer drops it."""
    undecided = AutoPolicy(costs(step_s=0.03), [Arm("chain")])
    decode(undecided, TRY_ROUNDS, arm_round=(3, 0.095))  # 0.95x plain, the fewest that count
    assert undecided.arms[0].trying
    undecided.finish()
    arm = undecided.arms[0]
    assert not arm.trying and not arm.in_use and arm.probe_every == 2 * FIRST_PROBE_EVERY
    short = AutoPolicy(costs(step_s=0.03), [Arm("chain")])
    decode(short, TRY_ROUNDS - 1, arm_round=(3, 0.095))
    short.finish()
    arm = short.arms[0]
    assert arm.trying and arm.probe_every == FIRST_PROBE_EVERY
    AutoPolicy(costs(step_s=0.03), short.arms)  # the next answer
    assert not arm.trying and arm.probe_every == FIRST_PROBE_EVERY


def test_an_arm_is_rated_by_its_tokens_over_its_seconds_not_by_a_mean_of_round_rates():
    """Chains on code here: 17 tokens in 318 ms, then 1 in 40 ms, over and over: 50 tok/s
    against plain decoding's 42, though the mean of the two rounds' rates is 39."""
    policy = AutoPolicy(costs(step_s=0.024), [Arm("chain")])
    rounds = itertools.cycle([(17, 0.318), (1, 0.040)])
    chosen = []
    for _ in range(40):
        chosen.append(policy.choose(None))
        if chosen[-1] == "chain":
            policy.record_arm("chain", *next(rounds))
    assert chosen.count("chain") >= 40 - 40 // PLAIN_EVERY  # plain only to time a step


def test_an_arm_in_use_rides_out_a_few_short_chains_and_leaves_once_it_falls_behind():
    """One chain round on code yields 1 to 16 tokens here: an arm is judged on about ten
    rounds, stays while it keeps up with plain decoding, and leaves when it no longer does."""
    policy = AutoPolicy(costs(step_s=0.025), [Arm("chain")])  # plain: 40 tok/s
    try_arm(policy, "chain", tokens=12, seconds=0.25)  # 48 tok/s
    for _ in range(3):  # three wasted drafts in a row (each 1 token in 60 ms)
        assert policy.choose(None) == "chain"
        policy.record_arm("chain", 1, 0.06)
    assert policy.choose(None) == "chain"  # a memory of three rounds would have left by now
    probe_every = policy.arms[0].probe_every
    left_after = 0
    while policy.choose(None) == "chain":  # the text turned unpredictable: 2 tokens in 80 ms
        policy.record_arm("chain", 2, 0.08)
        left_after += 1
        assert left_after <= 20
    assert left_after >= 3
    assert policy.arms[0].rate < KEEP_MARGIN * policy.plain_rate()
    assert policy.arms[0].probe_every == 2 * probe_every  # its probes wait longer now


def test_an_arm_in_use_leaves_room_for_a_plain_step_now_and_then_to_price_it_against():
    policy = AutoPolicy(costs(step_s=0.025), [Arm("chain")])
    try_arm(policy, "chain", tokens=12, seconds=0.25)
    chosen = []
    for _ in range(5 * PLAIN_EVERY):
        chosen.append(policy.choose(None))
        if chosen[-1] == "chain":
            policy.record_arm("chain", 12, 0.25)
    assert chosen.count("plain") == 5 - 1  # one in PLAIN_EVERY rounds, after the try's
    assert "plain" not in chosen[: PLAIN_EVERY - TRY_ROUNDS]
    plain_steps = [i for i, choice in enumerate(chosen) if choice == "plain"]
    assert plain_steps[0] == PLAIN_EVERY - TRY_ROUNDS  # the try's rounds count
    assert {b - a for a, b in itertools.pairwise(plain_steps)} == {PLAIN_EVERY + 1}


def test_an_arm_in_use_when_an_answer_ends_is_tried_early_on_the_next_and_left_if_it_loses():
    """Chains that made 1.3x plain on code made 0.95x on the chat answer after it here; and a
    chat answer that began with the code answer's sureness had them kept for 47 rounds. A try
    says so in TRY_ROUNDS rounds; its loss on the answer's opening spaces nothing out."""
    arms = [Arm("chain")]
    code = AutoPolicy(costs(step_s=0.025), arms)
    try_arm(code, "chain", tokens=12, seconds=0.25)  # 48 tok/s against 40
    code.record_plain_step(0.99)
    chat = AutoPolicy(costs(step_s=0.025), arms)
    chosen = decode(chat, 100, arm_round=(2, 0.06), sure=0.75)  # 33 tok/s: loses
    tried = CARRY_AFTER + TRY_ROUNDS
    assert chosen[:tried] == ["plain"] * CARRY_AFTER + ["chain"] * TRY_ROUNDS
    assert set(chosen[tried:]) == {"plain"}  # text never sure enough for another try
    assert not arms[0].in_use and arms[0].probe_every == FIRST_PROBE_EVERY
    again = AutoPolicy(costs(step_s=0.025), arms)  # where it pays again, it is used again
    chosen = decode(again, SURE_STEPS + TRY_ROUNDS + 1, arm_round=(12, 0.25), sure=0.95)
    assert chosen[:SURE_STEPS] == ["plain"] * SURE_STEPS  # none in use: this text measured first
    assert chosen[-1] == "chain" and again.arms[0].in_use


def test_an_arm_that_pays_answer_after_answer_drafts_from_near_each_ones_start():
    """Each code answer here waited SURE_STEPS plain steps for its first try, where chains
    made 2x plain: a tenth of the answer at half the speed."""
    arms = [Arm("chain"), Arm("tree")]
    first = AutoPolicy(costs(step_s=0.025), arms)
    try_arm(first, "chain", tokens=12, seconds=0.25)
    for _ in range(3):
        answer = AutoPolicy(costs(step_s=0.025), arms)
        chosen = decode(answer, 2 * PLAIN_EVERY, arm_round=(12, 0.25))
        assert chosen[:PLAIN_EVERY] == ["plain"] * CARRY_AFTER + ["chain"] * (
            PLAIN_EVERY - CARRY_AFTER
        )
        assert arms[0].in_use and not arms[1].trying  # the tree still waits for sure text


def test_the_faster_of_two_arms_in_use_is_the_one_carried_into_the_next_answer():
    arms = [Arm("chain"), Arm("tree")]
    first = AutoPolicy(costs(step_s=0.025), arms)
    try_arm(first, "chain", tokens=12, seconds=0.25)  # 48 tok/s
    arms[1].in_use, arms[1].tokens.value, arms[1].seconds.value = True, 14, 0.25  # 56 tok/s
    answer = AutoPolicy(costs(step_s=0.025), arms)
    assert decode(answer, CARRY_AFTER + 1, arm_round=(14, 0.25))[-1] == "tree"
    assert arms[1].trying and not arms[0].trying and not arms[0].in_use


def test_an_answer_that_copies_before_the_carried_try_begins_does_not_make_it():
    """Edits open with a line or two and then copy the text they were given, which a draft
    that has read only its ends cannot do: chains carried into them made 0.84-0.89x what auto
    made without them here. The arm waits for sure text after the copy, as every arm does."""
    arms = [Arm("chain")]
    first = AutoPolicy(costs(step_s=0.025), arms)
    try_arm(first, "chain", tokens=12, seconds=0.25)
    edit = AutoPolicy(costs(step_s=0.025), arms)
    assert decode(edit, CARRY_AFTER, arm_round=(12, 0.25)) == ["plain"] * CARRY_AFTER
    assert edit.choose(ngram_rate=200.0) == "ngram"
    edit.record_copy()
    assert decode(edit, SURE_STEPS, arm_round=(12, 0.25)) == ["plain"] * SURE_STEPS
    assert edit.choose(None) == "chain" and not arms[0].carried  # a try on its own sure text


def test_a_proposal_of_the_ngram_drafter_ends_a_carried_try_without_a_verdict():
    arms = [Arm("chain")]
    first = AutoPolicy(costs(step_s=0.025), arms)
    try_arm(first, "chain", tokens=12, seconds=0.25)
    edit = AutoPolicy(costs(step_s=0.025), arms)
    assert decode(edit, CARRY_AFTER + 1, arm_round=(1, 0.06))[-1] == "chain"  # losing so far
    assert edit.choose(ngram_rate=20.0) == "plain"  # proposed, though not worth verifying
    assert not arms[0].trying and not arms[0].in_use
    assert arms[0].probe_every == FIRST_PROBE_EVERY  # not judged: nothing spaced out


def test_a_failed_try_postpones_every_arms_probe():
    """Both arms draft with the same model: a chain's failed probe leaves the draft caught up,
    which made the tree's probe look cheap right after it; both lost on chat here."""
    policy = AutoPolicy(costs(step_s=0.025), [Arm("chain"), Arm("tree")])
    try_arm(policy, "chain", tokens=12, seconds=0.25)  # in use
    show_sure_text(policy)
    try_arm(policy, "tree", tokens=2, seconds=0.08)  # loses
    tree = policy.arms[1]
    tree.since_try = 10 * tree.probe_every  # long due
    policy.arms[0].in_use = False
    policy.arms[0].start_try()
    for _ in range(TRY_ROUNDS):  # the chain's probe, on text it no longer predicts
        assert policy.choose(None) == "chain"
        policy.record_arm("chain", 2, 0.08)
    waits = tree.probe_every - 1
    assert [policy.choose(None) for _ in range(waits)] == ["plain"] * waits


def test_an_arm_falling_out_of_use_postpones_the_other_arms_probes_too():
    """A tree tried right after the chain fell behind was kept on code, where trees made less
    than chains: the text the draft stopped predicting is the tree's text too."""
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain"), Arm("tree")])
    try_arm(policy, "chain", tokens=12, seconds=0.2)  # 60 tok/s: in use
    tree = policy.arms[1]
    tree.tried, tree.since_try = True, 10 * tree.probe_every  # long due
    for _ in range(SURE_STEPS):  # on text the target is sure of
        policy.record_plain_step(0.95)
    for _ in range(60):  # the text turns: the chain falls behind plain decoding
        choice = policy.choose(None)
        if not policy.arms[0].in_use:
            break
        if choice == "plain":  # now and then, to price plain decoding as it is now
            policy.record_plain_step(0.95)
        else:
            policy.record_arm(choice, 1, 0.06)
    assert not policy.arms[0].in_use and choice == "plain"
    waits = tree.probe_every - 1
    assert [policy.choose(None) for _ in range(waits)] == ["plain"] * waits


def test_auto_takes_an_ngram_proposal_over_a_paying_arm_only_where_it_promises_more():
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain")])
    try_arm(policy, "chain", tokens=3, seconds=0.05)  # 60 tok/s against plain's 33
    assert policy.choose(ngram_rate=45.0) == "chain"  # beats plain decoding, not the chain
    assert policy.choose(ngram_rate=61.0) == "chain"  # not by MARGIN: rounds of either are noisy
    assert policy.choose(ngram_rate=90.0) == "ngram"


def test_auto_falls_back_to_plain_and_probes_ever_less_often_while_drafting_loses():
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain")])
    chosen = decode(policy, 1000, arm_round=(1, 0.06))  # half the plain rate
    tries = [i for i, c in enumerate(chosen) if c == "chain" and (i == 0 or chosen[i - 1] != c)]
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert tries[0] == 0 and len(tries) < 10  # a handful of tries in 1000 rounds
    assert gaps == sorted(gaps)  # spaced out more and more
    # ... until the tries' share of the ceiling shuts the gate: then one in REPROBE_EVERY
    assert not policy.models_can_pay()
    assert max(gaps) <= max(AutoPolicy.MAX_PROBE_EVERY, REPROBE_EVERY) + TRY_ROUNDS


def test_a_probe_waits_for_text_the_target_is_sure_of():
    """The target was 0.92-0.95 sure of its tokens over code answers here, where chains paid,
    and 0.72-0.76 over chat ones, where they lost."""
    chat = AutoPolicy(costs(step_s=0.03), [Arm.remembered("chain", probe_every=32)])
    assert set(decode(chat, 1000, arm_round=(1, 0.06), sure=0.75)) == {"plain"}
    code = AutoPolicy(costs(step_s=0.03), [Arm.remembered("chain", probe_every=32)])
    assert decode(code, 40, arm_round=(1, 0.06), sure=0.95).index("chain") == SURE_STEPS
    # It is the recent tokens that count: a code block in a chat answer gets its probe.
    mixed = AutoPolicy(costs(step_s=0.03), [Arm.remembered("chain", probe_every=32)])
    chosen = decode(mixed, 100, arm_round=(1, 0.06), sure=0.75)
    chosen += decode(mixed, 30, arm_round=(1, 0.06), sure=0.99)
    assert "chain" not in chosen[:100] and "chain" in chosen[100:]
    assert SURE_TEXT < 0.92


# An Emerald Rapids with AMX (2026-11-30): a pass of 8 cost 2.2 plain steps, of 16 2.7.
CHEAP_PASSES = {1: 1.0, 2: 1.64, 3: 1.74, 4: 1.79, 5: 1.91, 6: 1.96, 8: 2.19, 16: 2.68, 32: 4.55}


def test_where_passes_and_draft_steps_are_cheap_a_probe_needs_less_sure_text():
    """There a chain pays at lower acceptance: on that Emerald Rapids, with a draft step at 0.17
    of a target step, `chain` made 1.16x plain decoding on chat, where auto, waiting for text
    0.9 sure, took plain steps only (1.02x)."""
    from edgespec.profile import relative_cost

    def cheap() -> Costs:
        c = Costs(lambda k: relative_cost(CHEAP_PASSES, k))
        c.step_s.update(0.066)
        c.draft_s.update(0.011)
        return c

    chat = AutoPolicy(cheap(), [Arm.remembered("chain", probe_every=32)])
    assert decode(chat, 40, arm_round=(2, 0.1), sure=0.75).index("chain") == SURE_STEPS
    # Text so unsure that a chain could not pay even there: no probe.
    unsure = AutoPolicy(cheap(), [Arm.remembered("chain", probe_every=32)])
    assert set(decode(unsure, 1000, arm_round=(2, 0.1), sure=0.55)) == {"plain"}
    # Where passes cost what they did on the Zen CPUs here, 0.75 is not sure enough.
    zen = AutoPolicy(costs(step_s=0.066, draft_s=0.011), [Arm.remembered("chain", probe_every=32)])
    assert set(decode(zen, 1000, arm_round=(2, 0.1), sure=0.75)) == {"plain"}


def test_a_probe_waits_for_sure_text_after_a_copy_not_just_sure_text():
    """On the edits here tries began right after n-gram copies, on the plain steps around them
    that the target was sure of (it copies its context); the draft, which has read only the
    text's first and last few dozen tokens, made 0.45-0.7x plain decoding there."""
    policy = AutoPolicy(costs(step_s=0.03), [Arm.remembered("chain", probe_every=32)])
    for arm in policy.arms:
        arm.since_try = 10**6  # long due
    show_sure_text(policy)
    policy.record_copy()  # an n-gram proposal accepted
    chosen = decode(policy, SURE_STEPS + 1, arm_round=(12, 0.25), sure=0.95)
    assert chosen == ["plain"] * SURE_STEPS + ["chain"]  # sure text after the copy: probed


def test_a_probe_is_not_made_where_catching_the_draft_up_would_cost_the_answer_too_much():
    step_s = 0.03
    catch_up_s = 0.5  # a draft 100 tokens behind
    short_answer = int(catch_up_s / (ANSWER_SHARE * step_s)) - 1  # 332 rounds left: too few
    for rounds_left, probed in ((short_answer, False), (10 * short_answer, True)):
        policy = AutoPolicy(costs(step_s=step_s), [Arm.remembered("chain", probe_every=32)])
        for arm in policy.arms:
            arm.since_try = 10**6  # long due, as far as the time since its last try goes
        for _ in range(SURE_STEPS):  # and the text is predictable
            policy.record_plain_step(0.99)
        assert (policy.choose(None, catch_up_s, rounds_left) == "chain") is probed
    # Nor a first try: what it would learn could not pay back within this answer either.
    for rounds_left, tried in ((short_answer, False), (10 * short_answer, True)):
        policy = AutoPolicy(costs(step_s=step_s), [Arm("chain")])
        assert (policy.choose(None, catch_up_s, rounds_left) == "chain") is tried


def test_auto_returns_to_drafting_soon_after_a_probe_that_pays():
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain")])
    decode(policy, 100, arm_round=(1, 0.06))  # a long stretch where drafting loses
    rounds = 0
    while policy.choose(None) != "chain":
        policy.record_plain_step(0.95)
        rounds += 1
        assert rounds <= AutoPolicy.MAX_PROBE_EVERY
    for _ in range(TRY_ROUNDS):  # the text became predictable
        policy.record_arm("chain", tokens=5, seconds=0.05)
    chosen = [policy.choose(None) for _ in range(20)]
    chosen_chain = [c for c in chosen if c == "chain"]
    assert chosen_chain  # tried again within the next 20 rounds


def test_a_drafted_chain_is_verified_only_as_far_as_its_tokens_pay_for_their_verification():
    c = costs()  # drafting is paid for: only T(k) counts now
    length, _ = best_proposal_length([0.98, 0.97, 0.95, 0.1, 0.9], c)
    assert length == 3  # the unlikely 4th token and everything after it are not worth verifying
    unsure = [0.3, 0.9]
    length, _ = best_proposal_length(unsure, c)
    assert length == 0  # a plain step instead


def test_a_drafted_trees_runner_up_is_verified_only_where_its_slot_in_the_pass_is_cheap():
    """Chances of acceptance, surest first: the main line (0.95, then 0.9 with it), a runner-up
    sibling (0.3). A slot costing 0.6 of a step leaves the sibling out; one of 0.05 takes it."""
    reaches = [0.95, 0.9, 0.3]

    def device(slot: float) -> Costs:
        c = Costs(lambda k: 1 + slot * (k - 1))
        c.step_s.update(0.03)
        return c

    assert best_pass_size(reaches, device(0.6))[0] == 2
    assert best_pass_size(reaches, device(0.05))[0] == 3
    assert best_pass_size([0.2, 0.1], device(0.6))[0] == 0  # a plain step
    # A chain's tokens are a tree of one branch: its reaches are the running products.
    chain = [0.98, 0.97, 0.95, 0.1, 0.9]
    assert best_pass_size(accumulate(chain, mul), costs()) == best_proposal_length(chain, costs())


def test_the_model_ceiling_rises_with_a_cheaper_draft_and_a_flatter_curve():
    steep, cheap = (
        model_draft_ceiling(0.95, costs(draft_s=0.015)),
        model_draft_ceiling(0.95, costs(draft_s=0.003)),
    )
    assert steep < 1 < cheap
    flat = Costs(lambda k: 1 + 0.1 * (k - 1))  # a phone-like curve: batches nearly free
    flat.step_s.update(0.03)
    flat.draft_s.update(0.015)
    assert model_draft_ceiling(0.95, flat) > 1.25


def test_a_pipelined_draft_is_priced_by_the_longer_of_drafting_and_verifying():
    """Drafting the next chain while this one is verified hides the draft's time where the
    target takes the whole chain: a draft too dear to pay one after the other can pay so."""
    dear = costs(draft_s=0.015)  # half a target step a token
    assert model_draft_ceiling(0.99, dear) < CEILING_MARGIN
    assert model_draft_ceiling(0.99, dear, pipelined=True) > CEILING_MARGIN
    serial = AutoPolicy(costs(draft_s=0.015), [Arm("chain")])
    pipelined = AutoPolicy(costs(draft_s=0.015), [Arm("chain")], pipelined=True)
    serial.calibrator = pipelined.calibrator = Calibrator()  # the same acceptance learnt
    assert not serial.models_can_pay() and pipelined.models_can_pay()
    # Where the target seldom takes a whole chain, the next one is seldom of use: nothing hidden.
    for c in (0.005, 0.015):
        hidden = model_draft_ceiling(0.5, costs(draft_s=c), pipelined=True)
        assert hidden == pytest.approx(model_draft_ceiling(0.5, costs(draft_s=c)), rel=0.15)


def test_a_pipelined_chain_hides_its_drafting_where_the_target_takes_it_and_the_next_token():
    """A chain of one token, worked by hand: a draft step costs c_d = 0.5 steps and a pass of 2
    T(2)/T(1) = 1.64. The next chain, drafted during the pass, is of use where the target takes
    this chain's token and the one the draft went on with (0.5² of the time): such a round lasts
    max(0.5, 1.64) steps, any other 0.5 + 1.64; either yields 1 + 0.5 tokens expected."""
    c = costs(step_s=0.03, draft_s=0.015)
    seconds = 0.25 * 1.64 + 0.75 * (0.5 + 1.64)
    ceiling = model_draft_ceiling(0.5, c, max_len=1, pipelined=True)
    assert ceiling == pytest.approx(1.5 / seconds)


def test_auto_never_tries_a_model_draft_that_cannot_pay_on_this_device():
    # c_d 0.5 on a steep curve
    policy = AutoPolicy(costs(draft_s=0.015), [Arm("chain"), Arm("tree")])
    assert policy.model_ceiling() is not None and policy.model_ceiling() < CEILING_MARGIN
    assert {policy.choose(None) for _ in range(1000)} == {"plain"}
    plain = policy.plain_rate()
    assert policy.choose(ngram_rate=2 * plain) == "ngram"  # n-gram drafts cost nothing to make


def test_auto_tries_the_model_once_to_learn_its_cost_when_no_profile_says_it():
    policy = AutoPolicy(costs(draft_s=None), [Arm("chain"), Arm("tree")])
    assert policy.model_ceiling() is None
    assert policy.choose(None) == "chain"
    policy.costs.draft_s.update(0.015)  # what that chain measured: too slow to pay here
    assert policy.choose(None) == "plain"
    assert not policy.arms[0].trying  # the try ends there: it does not resume when prices move


def test_what_an_arm_learnt_carries_over_to_the_next_generation():
    arms = [Arm("chain")]
    first = AutoPolicy(costs(step_s=0.03), arms)
    try_arm(first, "chain", tokens=1, seconds=0.06)  # loses: half the plain rate
    second = AutoPolicy(costs(step_s=0.03), arms)  # the next prompt, same engine
    # Not tried again at once: it waits for this answer's text to be sure,
    assert [second.choose(None) for _ in range(SURE_STEPS)] == ["plain"] * SURE_STEPS
    chosen = decode(second, 200, arm_round=(1, 0.06), sure=0.95)
    # and losing again, its next try comes later than the last answer's would have.
    tries = [i for i, c in enumerate(chosen) if c == "chain" and (i == 0 or chosen[i - 1] != c)]
    assert tries[1] - tries[0] >= 4 * FIRST_PROBE_EVERY


def test_every_new_answer_probes_the_arms_once_its_text_is_sure_whatever_earlier_ones_did():
    """Chat answers had spaced a chain's tries out to one in 256 rounds (remembered on this
    device): on the code answers after them no try came, where chains made 1.19x plain."""
    arms = [Arm.remembered("chain", probe_every=AutoPolicy.MAX_PROBE_EVERY)]
    for _ in range(3):
        chat = AutoPolicy(costs(step_s=0.025), arms)
        assert set(decode(chat, 300, arm_round=(2, 0.06), sure=0.75)) == {"plain"}
    code = AutoPolicy(costs(step_s=0.025), arms)
    chosen = decode(code, SURE_STEPS + TRY_ROUNDS + 1, arm_round=(12, 0.25), sure=0.95)
    assert chosen[:SURE_STEPS] == ["plain"] * SURE_STEPS
    assert chosen[-1] == "chain" and code.arms[0].in_use


def test_a_try_left_unfinished_by_an_answer_is_not_finished_on_the_next_one():
    arms = [Arm("chain")]
    short = AutoPolicy(costs(step_s=0.025), arms)  # an answer of two rounds
    for _ in range(2):
        assert short.choose(None) == "chain"
        short.record_arm("chain", 1, 0.06)
    following = AutoPolicy(costs(step_s=0.025), arms)
    chosen = decode(following, SURE_STEPS + TRY_ROUNDS, arm_round=(12, 0.25), sure=0.95)
    assert chosen[:SURE_STEPS] == ["plain"] * SURE_STEPS  # not judged on its first round,
    assert following.arms[0].in_use  # but tried afresh on its own sure text


def test_an_arm_that_lost_in_an_earlier_run_waits_for_sure_text_instead_of_going_first():
    lost = AutoPolicy(costs(step_s=0.03), [Arm.remembered("chain", probe_every=32)])
    choices = decode(lost, 40, arm_round=(1, 0.06))
    assert choices.index("chain") == SURE_STEPS  # probed once the answer shows sure text
    assert lost.arms[0].probe_every == 64  # and, losing again, later and later
    fresh = AutoPolicy(costs(step_s=0.03), [Arm.remembered("chain", probe_every=8)])
    assert fresh.choose(None) == "chain"  # it did not lose: tried first, as a new arm
    assert Arm.remembered("tree", 10**6).probe_every == AutoPolicy.MAX_PROBE_EVERY


LOSING_ROUND = (4, 4 / (0.88 / 0.03))  # 0.88x plain, where a step takes 30 ms


def test_where_tries_on_sure_text_reach_too_little_of_the_ceiling_the_draft_is_left_alone():
    """A Zen 4 here: the ceiling 1.24-1.39, chains 0.83-0.93x plain on code, and every code
    answer's probe cost 5-15 % of it. The same losing tries under a Zen 5's higher ceiling do
    not shut the gate: there chains made 1.14-1.37x, and tries are noisy."""
    for draft_s, probed_again in ((0.012, False), (0.008, True)):  # ceilings 1.33 and 1.62
        arms, share = [Arm("chain")], CeilingShare()
        first = AutoPolicy(costs(step_s=0.03, draft_s=draft_s), arms, share=share)
        assert first.models_can_pay()
        decode(first, 100, arm_round=LOSING_ROUND, sure=0.95)
        first.finish()
        assert share.tries >= 1
        assert share.tokens / share.reach == pytest.approx(0.88 / first.model_ceiling(), rel=0.05)
        later = AutoPolicy(costs(step_s=0.03, draft_s=draft_s), arms, share=share)
        chosen = decode(later, REPROBE_EVERY - 100, arm_round=LOSING_ROUND, sure=0.95)
        assert ("chain" in chosen) == probed_again, draft_s


def shut_by_the_share(policy: AutoPolicy, share: float) -> None:
    """Tries that reached `share` of the ceiling, enough of them to shut the gate by it."""
    for _ in range(int(MAX_SHARE_TRIES)):
        policy.share.record(20 * share, 20.0)
    assert policy.model_ceiling() > MARGIN and not policy.models_can_pay()


def test_where_the_share_alone_shut_the_gate_a_try_comes_every_reprobe_every_rounds():
    """Only tries move the share: without them a gate shut once stayed shut on that device for
    good (a Zen 5 here: a share of 0.61 after six short tries on code, where `chain` made 1.09x
    plain and auto decoded plainly, 0.98x)."""
    policy = AutoPolicy(costs(step_s=0.03, draft_s=0.008), [Arm("chain")])
    shut_by_the_share(policy, 0.5)
    chosen = decode(policy, 2 * REPROBE_EVERY + 40, arm_round=LOSING_ROUND, sure=0.95)
    tries = [i for i, c in enumerate(chosen) if c == "chain" and chosen[i - 1] != c]
    assert tries[0] == REPROBE_EVERY - 1  # this round is the REPROBE_EVERY-th while shut
    assert tries[1] - tries[0] == REPROBE_EVERY  # counted from where the last one began
    assert policy.share.tries == MAX_SHARE_TRIES  # each try told the share what it reached


def test_rounds_the_share_kept_the_gate_shut_count_across_answers():
    """Answers of a few hundred tokens each (a chat, `run` after `run` with the share
    remembered) must come to a try too."""
    share = CeilingShare()
    for answer in range(3):
        policy = AutoPolicy(costs(step_s=0.03, draft_s=0.008), [Arm("chain")], share=share)
        if answer == 0:
            shut_by_the_share(policy, 0.5)
        chosen = decode(policy, 200, arm_round=LOSING_ROUND, sure=0.95)
        assert ("chain" in chosen) == (answer == 2), answer


def test_where_the_share_shut_the_gate_a_try_waits_for_sure_text():
    policy = AutoPolicy(costs(step_s=0.03, draft_s=0.008), [Arm("chain")])
    shut_by_the_share(policy, 0.5)
    assert "chain" not in decode(policy, 2 * REPROBE_EVERY, arm_round=LOSING_ROUND, sure=0.7)
    # Once the sureness (an average over about its last ten plain steps) has climbed: a try.
    assert "chain" in decode(policy, SURE_STEPS + 20, arm_round=LOSING_ROUND, sure=0.99)


def test_a_try_that_wins_while_the_share_keeps_the_gate_shut_puts_its_arm_in_use():
    """What the arm made is measured; the share is an estimate from other tries."""
    policy = AutoPolicy(costs(step_s=0.03, draft_s=0.008), [Arm("chain")])
    shut_by_the_share(policy, 0.4)
    decode(policy, REPROBE_EVERY - 1, arm_round=LOSING_ROUND, sure=0.95)
    try_arm(policy, "chain", tokens=3, seconds=0.06)  # 50 tok/s against plain's 33
    assert not policy.models_can_pay()  # one try does not reopen it
    assert decode(policy, 5, arm_round=(3, 0.06)) == ["chain"] * 5


def test_a_try_the_share_shut_the_gate_on_goes_on_to_its_verdict():
    """The gate moves with the price of passes (one dear pass raises it) and plain steps draw it
    back: a try paused while it was shut went on whenever it reopened, and caught the draft up
    again each time (cli-parser here: four rounds spread over ninety, 1.3 s of a 14.5 s answer).
    Its rounds say what the draft makes here; the price said only what it might."""
    policy = AutoPolicy(costs(step_s=0.03, draft_s=0.008), [Arm("chain")])
    assert policy.choose(None) == "chain"
    policy.record_arm("chain", 3, 0.06)
    shut_by_the_share(policy, 0.5)
    for _ in range(TRY_ROUNDS - 1):
        assert policy.choose(None) == "chain"
        policy.record_arm("chain", 3, 0.06)  # 50 tok/s against plain's 33
    arm = policy.arms[0]
    assert not arm.trying and arm.in_use  # judged on its four rounds: it won


def test_a_try_priced_out_of_paying_even_at_its_best_ends_without_a_verdict():
    """Where passes turn so dear that no chain could pay, the try stops, and does not resume
    when the price comes back: its probe waits its turn like any other."""
    policy = AutoPolicy(costs(step_s=0.03, draft_s=0.008), [Arm("chain")])
    assert policy.choose(None) == "chain"
    policy.record_arm("chain", 3, 0.06)
    usual = policy.costs.batch_factor.value
    policy.costs.batch_factor.value = 5.0
    assert policy.model_ceiling() <= MARGIN
    assert policy.choose(None) == "plain"
    arm = policy.arms[0]
    assert not arm.trying and not arm.in_use and policy.share.tries == 0
    policy.costs.batch_factor.value = usual
    assert policy.models_can_pay()
    chosen = decode(policy, arm.probe_every + SURE_STEPS, arm_round=(3, 0.06), sure=0.95)
    assert chosen[: arm.probe_every - 1] == ["plain"] * (arm.probe_every - 1)
    assert "chain" in chosen


def test_where_the_ceiling_itself_cannot_pay_no_try_comes_however_long_it_waits():
    policy = AutoPolicy(costs(step_s=0.03, draft_s=0.03), [Arm("chain")])  # a draft step = a step
    assert policy.model_ceiling() <= MARGIN
    assert "chain" not in decode(policy, 3 * REPROBE_EVERY, arm_round=(3, 0.06), sure=0.99)


def test_before_any_try_the_share_makes_the_gate_the_ceiling_margin():
    assert CeilingShare().value * CEILING_MARGIN == pytest.approx(MARGIN)


def test_a_try_begun_before_the_text_showed_itself_teaches_nothing_of_the_ceiling():
    """An untried arm is tried at an answer's first round, a chat's as well as code's: where
    chains are not meant to pay, what they reach says nothing of where they are."""
    share = CeilingShare()
    policy = AutoPolicy(costs(step_s=0.03, draft_s=0.008), [Arm("chain")], share=share)
    try_arm(policy, "chain", tokens=1, seconds=0.06)
    assert not policy.arms[0].in_use and share.tries == 0


def test_the_share_follows_the_recent_tries():
    share = CeilingShare()
    for _ in range(20):
        share.record(10.0, 20.0)  # a busy hour, say
    for _ in range(int(MAX_SHARE_TRIES)):
        share.record(18.0, 20.0)
    assert share.tries == MAX_SHARE_TRIES
    assert 0.7 < share.value < 0.9  # where all 28 together made 0.61; never past the tries'


def test_the_share_is_what_the_tries_made_together_not_the_mean_of_their_shares():
    """A try stops after a few rounds where they lost and goes on while undecided: on code
    here (scripts/try_replay.py) chains made 1.13x plain, the tries' mean 1.10, their sums 1.12."""
    share = CeilingShare()
    share.record(2.0, 10.0)  # four rounds that lost: stopped there
    share.record(36.0, 40.0)  # an undecided start that went on, and paid
    assert share.tokens / share.reach == pytest.approx(0.76)  # the mean of 0.2 and 0.9: 0.55
    prior = MARGIN / CEILING_MARGIN
    assert share.value == pytest.approx(
        (SHARE_PRIOR_TRIES * prior + 2 * 0.76) / (SHARE_PRIOR_TRIES + 2)
    )


def test_costs_are_measured_once_a_step_and_a_draft_step_are_both_known():
    c = Costs(relative)
    assert not c.measured
    c.step_s.update(0.03)
    assert not c.measured
    c.estimate_draft_step(0.005)
    assert c.measured


def test_a_token_whose_chance_only_pays_for_its_slot_in_the_pass_is_not_verified():
    """Verifying it would yield no more tokens a second than a plain step: its chance must
    outweigh the slot, not match it."""
    c = Costs(lambda k: 1 + 0.5 * (k - 1))
    c.step_s.update(1.0)
    assert best_pass_size([0.5], c) == (0, 1.0)  # 1.5 tokens for 1.5 steps


def test_a_try_that_wins_brings_the_arms_next_probes_close_again():
    policy = AutoPolicy(costs(step_s=0.03), [Arm.remembered("chain", probe_every=64)])
    show_sure_text(policy)
    try_arm(policy, "chain", tokens=3, seconds=0.05)  # 60 tok/s against 33
    assert policy.arms[0].in_use and policy.arms[0].probe_every == FIRST_PROBE_EVERY


def test_after_a_lost_try_the_next_probe_comes_probe_every_rounds_later():
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain")])
    show_sure_text(policy)
    try_arm(policy, "chain", tokens=1, seconds=0.06)
    wait = policy.arms[0].probe_every
    assert decode(policy, wait, arm_round=(1, 0.06)) == ["plain"] * (wait - 1) + ["chain"]


def test_a_probe_is_made_where_catching_the_draft_up_costs_exactly_the_answers_share():
    """ANSWER_SHARE is the most a catch-up may cost of the time the answer has left."""
    rounds_left = 400
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain")])
    catch_up_s = ANSWER_SHARE * rounds_left * policy.costs.verify_s(1)
    assert policy.choose(None, catch_up_s, rounds_left) == "chain"


def test_text_exactly_as_sure_as_sure_text_is_sure_enough_for_a_probe():
    policy = AutoPolicy(costs(step_s=0.03), [Arm.remembered("chain", probe_every=32)])
    assert decode(policy, 40, arm_round=(1, 0.06), sure=SURE_TEXT).index("chain") == SURE_STEPS


def test_a_try_judged_before_the_drafts_cost_is_known_teaches_nothing_of_the_ceiling():
    share = CeilingShare()
    policy = AutoPolicy(costs(step_s=0.03, draft_s=None), [Arm("chain")], share=share)
    show_sure_text(policy)
    try_arm(policy, "chain", tokens=1, seconds=0.06)
    assert share.tries == 0 and not policy.arms[0].in_use


def test_where_models_cannot_pay_an_ngram_proposal_is_weighed_against_plain_steps_alone():
    """An arm in use when the gate shuts (its draft priced dearer) drafts no more, so it is
    not the rival an n-gram proposal must beat."""
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain")])
    try_arm(policy, "chain", tokens=3, seconds=0.05)  # 60 tok/s against 33: in use
    policy.costs.draft_s.update(0.1)
    assert not policy.models_can_pay()
    assert policy.choose(ngram_rate=1.2 * policy.plain_rate()) == "ngram"


def test_a_try_pays_for_catching_the_draft_up_after_its_first_round():
    """On an edit the n-gram rounds between a try's rounds leave the draft behind again: a try
    there made 11 tokens in four rounds, 36 tok/s against plain decoding's 33 without the 51 ms
    its second round caught up, and won; in use its next rounds made 20 tok/s."""
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain")])
    rounds = [(2, 0.055, 0.119), (3, 0.092, 0.051), (3, 0.083, 0.0), (3, 0.076, 0.0)]
    for tokens, seconds, catch_up_s in rounds:
        assert policy.choose(None) == "chain"
        policy.record_arm("chain", tokens, seconds + catch_up_s, catch_up_s)
    arm = policy.arms[0]
    assert arm.try_seconds == pytest.approx(0.055 + 0.092 + 0.051 + 0.083 + 0.076)
    assert not arm.in_use  # 31 tok/s: on trial still, where without the 51 ms it won
    without_it = 11 / (0.055 + 0.092 + 0.083 + 0.076)
    assert without_it > policy.plain_rate() * MARGIN


def test_a_try_is_judged_without_catching_the_draft_up_but_an_arm_in_use_pays_for_it():
    """The first round of a try catches the draft up on the whole prompt: that is the probe's
    price, and with it a first chain round lost here on a 100-token prompt. An arm in use
    catches up on what the n-gram rounds between its rounds decided: that is what using it
    costs, and left out, chains in use beside the n-gram drafter on the edits looked faster
    than they were (auto 1.76x plain where `ngram` made 1.93x; 1.93x with it)."""
    policy = AutoPolicy(costs(step_s=0.03), [Arm("chain")])
    assert policy.choose(None) == "chain"
    policy.record_arm("chain", 3, 0.05 + 0.5, catch_up_s=0.5)  # a whole prompt caught up
    for _ in range(TRY_ROUNDS - 1):
        assert policy.choose(None) == "chain"
        policy.record_arm("chain", 3, 0.05)
    arm = policy.arms[0]
    assert arm.in_use and arm.rate == pytest.approx(60.0)  # 3 tokens in 50 ms
    ngram_rate = 50.0  # n-gram proposals that beat plain decoding, not the chain
    assert policy.choose(ngram_rate) == "chain"
    for _ in range(20):  # each chain round after an n-gram round's 16 tokens: 0.03 s behind
        policy.record_arm("chain", 3, 0.05 + 0.03, catch_up_s=0.03)
    assert arm.rate < 40.0
    assert policy.choose(ngram_rate) == "ngram"


def decode_text(
    policy: AutoPolicy,
    sureness: list[float],
    arm_round: Callable[[float], tuple[int, float]],
    when_wanted: bool,
) -> tuple[list[str], int, float]:
    """Auto on a text whose plain steps the target is `sureness[i]` sure of, each model arm's
    round making `arm_round(sureness[i])` (tokens, seconds), a plain step 30 ms; a step's
    sureness measured at every plain step, or as the engine does, only where the policy wants
    it. What each round chose, how many steps were measured, and the tokens per second made."""
    chosen, measured, tokens, seconds = [], 0, 0, 0.0
    for sure in sureness:
        chosen.append(policy.choose(None))
        if chosen[-1] != "plain":
            made = arm_round(sure)
            policy.record_arm(chosen[-1], *made)
            tokens, seconds = tokens + made[0], seconds + made[1]
            continue
        tokens, seconds = tokens + 1, seconds + 0.03
        if not when_wanted or policy.wants_sureness():
            policy.record_plain_step(sure)
            measured += 1
        else:
            policy.record_plain_step(None)
    return chosen, measured, tokens / seconds


def text_of_changing_sureness(rounds: int, seed: int) -> list[float]:
    """Stretches of chat (the target 0.6-0.9 sure of its tokens) and of code (0.9-1.0)."""
    rng, sureness = random.Random(seed), []
    while len(sureness) < rounds:
        low, high = rng.choice([(0.6, 0.9), (0.9, 1.0)])
        sureness += [rng.uniform(low, high) for _ in range(rng.randint(5, 200))]
    return sureness[:rounds]


@pytest.mark.parametrize("shut", [False, True], ids=["gate open", "gate shut by the share"])
def test_tries_begin_where_they_would_had_every_plain_step_been_measured(shut):
    """Measuring a step's sureness reads the target's whole row of logits (70-110 us a plain
    step here, over a quarter of auto's Python work in one); only tries read it, and most plain
    steps are far from any."""
    sureness = text_of_changing_sureness(3 * REPROBE_EVERY, seed=7)
    runs = []
    for when_wanted in (False, True):
        policy = AutoPolicy(costs(step_s=0.03, draft_s=0.008), [Arm("chain")])
        if shut:
            shut_by_the_share(policy, 0.5)
        runs.append(decode_text(policy, sureness, lambda _: LOSING_ROUND, when_wanted))
    (every_step, all_measured, _), (when_wanted, measured, _) = runs
    assert when_wanted == every_step
    assert "chain" in every_step
    assert measured < all_measured / 2


def test_plain_steps_not_measured_start_the_sureness_afresh():
    """A try must not begin on sureness measured long before (the stretch since was not)."""
    policy = AutoPolicy(costs(step_s=0.03, draft_s=0.008), [Arm.remembered("chain", 64)])
    show_sure_text(policy)
    policy.record_plain_step(None)
    assert decode(policy, SURE_STEPS + 1, arm_round=LOSING_ROUND)[-2:] == ["plain", "chain"]


def test_measuring_sureness_only_where_wanted_makes_as_much_where_chains_pay_on_sure_text():
    """Where arms win too, tries can begin a round or so apart: a measure started afresh weighs
    its first steps more than one that ran on. What auto makes is the same within 1 %."""

    def arm_round(sure: float) -> tuple[int, float]:  # 2x plain on sure text, 0.88x elsewhere
        return (4, 0.06) if sure > 0.9 else LOSING_ROUND

    for seed in range(6):
        sureness = text_of_changing_sureness(3 * REPROBE_EVERY, seed=seed)
        rates = []
        for when_wanted in (False, True):
            policy = AutoPolicy(costs(step_s=0.03, draft_s=0.008), [Arm("chain"), Arm("tree")])
            rates.append(decode_text(policy, sureness, arm_round, when_wanted)[2])
        assert rates[1] >= 0.99 * rates[0], seed


def test_a_try_is_judged_against_the_ceiling_the_next_answers_gate_applies_its_share_to():
    """Each answer learns its draft's cost and how often its surest tokens are right; judged
    against the ceiling that knowledge made (1.7-2.0 on code on a Zen 5 here), tries left a
    share that the next answer, starting from the profiles' cost and no such knowledge (1.55),
    turned into a gate of 1.01-1.04 where tries made 1.1-1.3x plain: code answers began shut."""
    share, made = CeilingShare(), 1.10  # each try makes 1.1x plain decoding
    for answer in range(int(MAX_SHARE_TRIES) + 4):
        c = costs(step_s=0.03, draft_s=None)
        c.estimate_draft_step(0.03 * 0.29)  # as the profiles say
        policy = AutoPolicy(c, [Arm("chain")], share=share)
        assert policy.models_can_pay(), answer
        show_sure_text(policy)
        for _ in range(MIN_DRAFT_ROUNDS):  # the answer times its draft steps: cheaper
            c.record_draft_step(0.03 * 0.22)
        for _ in range(200):  # and finds its 0.99-sure tokens right every time
            policy.calibrator.record(0.992, accepted=True)
        try_arm(policy, "chain", tokens=4, seconds=4 * 0.03 / made)
    assert share.tries == MAX_SHARE_TRIES
    # what the tries reached, at the ceiling the gate uses, is what they made
    assert share.tokens / share.reach * policy.model_ceiling() == pytest.approx(made, rel=0.01)
