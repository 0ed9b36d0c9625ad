"""Prompt-lookup drafting: what it proposes, how its index grows, and how it learns acceptance."""

from __future__ import annotations

import random

import pytest

from edgespec.ngram import (
    MAX_REPLACEMENT,
    MAX_WATCHED,
    POINTER_WINDOW,
    STREAK_AFTER,
    NgramDrafter,
    Proposal,
)
from edgespec.policy import Costs, best_proposal_length, expected_tokens


def reference_proposal(
    tokens: list[int], max_len: int, max_ngram: int, min_ngram: int
) -> tuple[list[int], int]:
    """The definition, by brute force: the longest suffix (max_ngram..min_ngram) that occurred
    earlier with at least one token after it; of its occurrences, the most recent."""
    for n in range(min(max_ngram, len(tokens)), min_ngram - 1, -1):
        suffix = tokens[len(tokens) - n :]
        for start in range(len(tokens) - 1, n - 1, -1):  # start = position after the occurrence
            if tokens[start - n : start] == suffix:
                return tokens[start : start + max_len], n
    return [], 0


def test_copy_heavy_history_proposes_the_copied_continuation():
    source = [10, 11, 12, 13, 14, 15, 16, 17]
    history = [1, *source, 2, 3, 10, 11, 12]  # the model started to quote `source` again
    proposal = NgramDrafter(max_ngram=4).propose(history, max_len=4)
    assert proposal.tokens == [13, 14, 15, 16]
    assert proposal.ngram == 3


def test_the_longest_match_wins_over_shorter_ones():
    # "9" alone last continued with 50, but "8 9" continued with 60 earlier.
    history = [8, 9, 60, 61, 0, 9, 50, 51, 0, 8, 9]
    proposal = NgramDrafter(max_ngram=4).propose(history, max_len=2)
    assert proposal.tokens == [60, 61]
    assert proposal.ngram == 2


def test_the_most_recent_occurrence_wins():
    history = [5, 6, 70, 0, 5, 6, 80, 0, 5, 6]
    proposal = NgramDrafter(max_ngram=3).propose(history, max_len=1)
    assert proposal.tokens == [80]


def test_no_match_proposes_nothing():
    proposal = NgramDrafter().propose([1, 2, 3, 4, 5], max_len=4)
    assert proposal == Proposal([], 0, 0.0)


def test_min_ngram_rules_out_shorter_matches():
    history = [7, 1, 2, 7]  # only a 1-token match exists
    assert NgramDrafter(min_ngram=1).propose(history, max_len=3).tokens == [1, 2, 7]
    assert NgramDrafter(min_ngram=2).propose(history, max_len=3).tokens == []


@pytest.mark.parametrize("max_len", [0, 1, 3, 100])
def test_max_len_is_respected_and_proposals_stay_inside_the_history(max_len):
    history = [1, 2, 3, 4, 5, 6, 1, 2]
    proposal = NgramDrafter().propose(history, max_len=max_len)
    assert len(proposal.tokens) <= max_len
    assert proposal.tokens == [3, 4, 5, 6, 1, 2][:max_len]


def test_a_repeating_history_never_proposes_past_its_end():
    history = [4, 5, 4, 5, 4, 5]
    proposal = NgramDrafter().propose(history, max_len=10)
    assert proposal.tokens == [4, 5]  # what followed "5 4 5" two tokens ago, up to the end


def test_incremental_index_equals_a_from_scratch_scan():
    rng = random.Random(1234)
    history: list[int] = []
    drafter = NgramDrafter(max_ngram=4, min_ngram=1)
    for step in range(1500):
        if step % 300 == 299:
            del history[rng.randrange(len(history)) :]  # the engine truncated its history
        history.extend(rng.randrange(6) for _ in range(rng.randint(1, 3)))
        max_len = rng.randint(1, 8)
        proposal = drafter.propose(history, max_len)
        assert (proposal.tokens, proposal.ngram) == reference_proposal(history, max_len, 4, 1)
    rebuilt = NgramDrafter(max_ngram=4, min_ngram=1)
    rebuilt.update(history)
    assert drafter.index == rebuilt.index


def test_a_history_replaced_by_another_of_equal_length_is_reindexed():
    drafter = NgramDrafter()
    drafter.update([1, 2, 3, 9])
    assert drafter.propose([1, 2, 3, 7, 1, 2], max_len=1).tokens == [3]
    assert drafter.propose([4, 5, 6, 8, 4, 5], max_len=1).tokens == [6]


def test_reset_forgets_the_history_but_not_what_was_learned():
    drafter = NgramDrafter()
    drafter.update([1, 2, 1])
    for _ in range(20):
        drafter.record(ngram=2, proposed=4, accepted=4)
    learned = drafter.confidence(2)
    drafter.reset()
    assert drafter.propose([1], max_len=2).tokens == []
    assert drafter.confidence(2) == learned


def test_priors_trust_long_matches_more_than_short_ones():
    drafter = NgramDrafter(max_ngram=4, min_ngram=1)
    confidences = [drafter.confidence(n) for n in (1, 2, 3, 4)]
    assert confidences == sorted(confidences)
    assert 0.4 <= confidences[-1] <= 0.6
    assert confidences[0] < 0.4


def expected_accepted(drafter: NgramDrafter, ngram: int, length: int) -> float:
    """Accepted tokens a proposal of this length is expected to yield."""
    return expected_tokens(drafter.acceptances(ngram, length)) - 1


def test_confidence_and_expected_accepted_rise_after_good_rounds_and_fall_after_bad():
    good, bad = NgramDrafter(), NgramDrafter()
    before = (good.confidence(3), expected_accepted(good, 3, 6))
    for _ in range(30):
        good.record(ngram=3, proposed=6, accepted=6)
        bad.record(ngram=3, proposed=6, accepted=0)
    assert good.confidence(3) > before[0] > bad.confidence(3)
    assert expected_accepted(good, 3, 6) > before[1] > expected_accepted(bad, 3, 6)
    assert expected_accepted(good, 3, 6) > 4.0
    assert expected_accepted(bad, 3, 6) < 0.5
    # Other match lengths keep their own statistics.
    assert NgramDrafter().confidence(2) == good.confidence(2) == bad.confidence(2)


def test_a_rejection_teaches_nothing_about_the_positions_after_it():
    drafter = NgramDrafter()
    fresh = NgramDrafter()
    for _ in range(30):
        drafter.record(ngram=4, proposed=8, accepted=2)  # positions 0, 1 accepted, 2 rejected
    assert drafter.acceptance(4, 0) > fresh.acceptance(4, 0)
    assert drafter.acceptance(4, 2) < fresh.acceptance(4, 2)
    assert drafter.acceptance(4, 3) == fresh.acceptance(4, 3)


def test_a_few_long_copies_teach_the_whole_tail_of_a_proposal():
    """Positions from the fourth on share one estimate: a proposal copied in full adds a dozen
    observations to it. With one estimate per position, each prior (0.7 here) gave way one
    proposal at a time and compounded over fifteen positions: on a device whose passes of 16
    are its sweet spot (this VM: T(16)/T(1) = 7.7, T(4)/T(1) = 2.45), auto kept verifying
    3 tokens of copies whose 15-token proposals were right in full two times out of three."""
    drafter = NgramDrafter()
    for _ in range(10):
        drafter.record(ngram=4, proposed=15, accepted=15)
    assert drafter.acceptance(4, 14) == drafter.acceptance(4, 3) > 0.98
    curve = {1: 1.0, 4: 2.45, 16: 7.7}
    costs = Costs(lambda k: curve.get(k, 2.0 * k))  # other sizes: dearer than both
    costs.step_s.update(0.05)
    length, _ = best_proposal_length(drafter.acceptances(4, 15), costs)
    assert length == 15


def test_acceptances_give_each_positions_chance_and_the_tail_shares_one():
    drafter = NgramDrafter()
    drafter.record(ngram=4, proposed=8, accepted=5)
    assert drafter.acceptances(4, 8) == [drafter.acceptance(4, i) for i in range(8)]
    assert drafter.acceptances(4, 2) == [drafter.acceptance(4, 0), drafter.acceptance(4, 1)]
    assert drafter.acceptances(4, 0) == []
    assert len(set(drafter.acceptances(4, 16)[3:])) == 1
    assert drafter.acceptances(4, 32) == [drafter.acceptance(4, i) for i in range(32)]


def test_the_far_half_of_a_long_proposal_learns_apart_from_the_near_tail():
    """Only proposals longer than 16 reach positions 16-31. Copies broken every line or so (type
    hints added) must not price them as a rename's long copies do: with one estimate for all
    positions from the fourth on, proposals of up to 32 instead of 16 lost 3-5 % on such edits
    here, where they gained 10-19 % on renames and quotes."""
    lines = NgramDrafter()  # copies that break around the sixteenth token
    renames = NgramDrafter()  # copies that run on
    for _ in range(20):
        lines.record(ngram=4, proposed=32, accepted=16)
        renames.record(ngram=4, proposed=32, accepted=32)
    assert lines.acceptance(4, 10) > 0.95 and renames.acceptance(4, 10) > 0.95
    assert lines.acceptance(4, 20) < 0.5 < 0.95 < renames.acceptance(4, 20)
    curve = {1: 1.0, 16: 8.5, 32: 13.0}  # a Zen 4 here: 32 costs less a token than 16
    costs = Costs(lambda k: curve.get(k, 1.0 * k))  # other sizes: dearer than both
    costs.step_s.update(0.03)
    assert best_proposal_length(lines.acceptances(4, 31), costs)[0] == 15
    assert best_proposal_length(renames.acceptances(4, 31), costs)[0] == 31


def test_a_proposal_carries_the_confidence_of_its_match_length():
    drafter = NgramDrafter()
    for _ in range(10):
        drafter.record(ngram=2, proposed=3, accepted=3)
    proposal = drafter.propose([3, 4, 5, 0, 3, 4], max_len=2)
    assert proposal.ngram == 2 and proposal.streak  # the last proposal was right in full
    assert proposal.confidence == drafter.confidence(2, streak=True)


def test_a_watched_proposal_is_judged_by_the_tokens_decided_after_it():
    drafter, fresh = NgramDrafter(), NgramDrafter()
    history = [5, 6, 7, 8, 9, 5, 6]
    proposal = drafter.propose(history, max_len=3)
    assert proposal.tokens == [7, 8, 9] and proposal.ngram == 2
    drafter.watch(proposal, start=len(history))
    drafter.propose([*history, 7], max_len=3)  # one token decided: judged at once
    assert drafter.acceptance(2, 0) > fresh.acceptance(2, 0)
    assert drafter.acceptance(2, 1) == fresh.acceptance(2, 1)
    drafter.propose([*history, 7, 8, 1], max_len=3)  # then 8 right, and 1 instead of 9
    assert drafter.acceptance(2, 1) > fresh.acceptance(2, 1)
    assert drafter.acceptance(2, 2) < fresh.acceptance(2, 2)
    judged = [drafter.acceptance(2, i) for i in range(3)]
    drafter.propose([*history, 7, 8, 1, 9], max_len=3)  # after a miss, nothing more is judged
    assert [drafter.acceptance(2, i) for i in range(3)] == judged


def test_a_copy_going_on_is_noticed_from_the_first_tokens_of_a_watched_proposal():
    """Inside a quote the next proposal is made long before the last one's 16 tokens are all
    decided: whether its first tokens were right is what says the copy goes on."""
    source = list(range(100, 140))
    history = [*source, 7, *source[:4]]  # the text has begun to quote its source
    drafter = NgramDrafter()
    proposal = drafter.propose(history, max_len=16)
    assert proposal.tokens == source[4:20] and not proposal.streak
    drafter.watch(proposal, start=len(history))
    history += source[4 : 4 + STREAK_AFTER]  # the quote goes on, the proposal is far from judged
    assert drafter.propose(history, max_len=16).streak
    history.append(1)  # and breaks: the next proposal starts outside the copy
    assert not drafter.propose(history, max_len=16).streak


def test_watching_sampled_text_learns_what_verifying_its_proposals_would():
    """Under sampling a proposed token is accepted with the target's probability of it (a point
    mass), which is the chance that the token sampled there is that token: watching the sampled
    text estimates the acceptance that verifying every proposal would measure."""
    rng = random.Random(0)
    p_proposed = 0.8  # the target's probability of the proposed token (prior: 0.3)
    watching, verifying = NgramDrafter(), NgramDrafter()
    history = [5, 6, 7]
    for _ in range(400):
        proposal = Proposal([7], ngram=2, confidence=0.3, origins=[2], replaced=[False])
        watching.watch(proposal, start=len(history))
        sampled = 7 if rng.random() < p_proposed else 4
        verifying.record(2, proposed=1, accepted=int(rng.random() < p_proposed))
        history.append(sampled)
        watching.propose(history, max_len=1)  # judges the watched proposal
    assert watching.acceptance(2, 0) == pytest.approx(p_proposed, abs=0.08)
    assert verifying.acceptance(2, 0) == pytest.approx(p_proposed, abs=0.08)


def test_proposals_inside_a_copied_span_learn_apart_from_the_others():
    drafter, fresh = NgramDrafter(), NgramDrafter()
    for _ in range(20):
        drafter.record(ngram=3, proposed=4, accepted=0, streak=False)
        drafter.record(ngram=3, proposed=4, accepted=4, streak=True)
    assert drafter.confidence(3, streak=True) > fresh.confidence(3) > drafter.confidence(3)
    drafter.record(ngram=3, proposed=4, accepted=4)
    assert drafter.propose([1, 2, 3, 4, 1, 2, 3], max_len=1).streak
    drafter.record(ngram=3, proposed=4, accepted=1)
    assert not drafter.propose([1, 2, 3, 4, 1, 2, 3], max_len=1).streak
    drafter.record(ngram=3, proposed=4, accepted=4)
    drafter.record(ngram=3, proposed=4, accepted=3)  # all but the last: the copy broke
    assert not drafter.propose([1, 2, 3, 4, 1, 2, 3], max_len=1).streak


# A module in which token 50 (say `proc`) is to be renamed to 60 61 (`parse_line`).
SOURCE = [1, 50, 2, 3, 4, 50, 5, 6, 7, 8]


def renaming_drafter() -> tuple[NgramDrafter, list[int]]:
    """A drafter that watched its copy of SOURCE break where the target wrote 60 61 for 50."""
    drafter = NgramDrafter()
    history = [*SOURCE, 0, 1]
    proposal = drafter.propose(history, max_len=4)
    assert proposal.tokens == [50, 2, 3, 4]
    drafter.watch(proposal, start=len(history))
    return drafter, [*history, 60, 61, 2, 3]


def test_a_token_the_target_replaced_before_copying_on_is_replaced_in_later_copies():
    drafter, history = renaming_drafter()
    proposal = drafter.propose(history, max_len=4)  # the copy goes on after "2 3"
    assert drafter.replacements == {50: (60, 61)}
    assert proposal.tokens == [4, 60, 61, 5]
    assert proposal.replaced == [False, True, True, False]


@pytest.mark.parametrize("max_len", [1, 2, 3])
def test_a_proposal_with_a_replacement_still_respects_max_len(max_len):
    drafter, history = renaming_drafter()
    proposal = drafter.propose(history, max_len=max_len)
    assert proposal.tokens == [4, 60, 61][:max_len]  # a replacement may be cut short
    assert len(proposal.origins) == len(proposal.replaced) == len(proposal.tokens)


def test_a_replacement_the_target_rejects_is_forgotten():
    drafter, history = renaming_drafter()
    proposal = drafter.propose(history, max_len=4)
    drafter.watch(proposal, start=len(history))
    history += [4, 50]  # here the target kept the old token
    assert drafter.propose(history, max_len=2).tokens == [5, 6]
    assert drafter.replacements == {}
    assert drafter.propose([*history, 5, 6, 99, 4], max_len=2).tokens == [50, 5]
    assert drafter.replacements == {}  # nor learnt again from what the target kept there


def test_a_break_after_which_the_source_does_not_resume_teaches_no_replacement():
    drafter = NgramDrafter()
    history = [*SOURCE, 0, 1]
    drafter.watch(drafter.propose(history, max_len=4), start=len(history))
    history += [70, 71, 72, 73, 74, 75, 76, 77, 78, 2, 3]  # 9 new tokens, then the copy again
    drafter.propose(history, max_len=4)
    assert drafter.replacements == {}


def test_a_replacement_is_learnt_as_well_from_tokens_decided_one_round_at_a_time():
    """As in decoding: the break is judged first, the replacement and the resumed source come a
    token per round; each replacement length is tried once, as its tokens arrive."""
    drafter, decided = renaming_drafter()
    history = decided[: len(SOURCE) + 2]
    for token in decided[len(history) :]:
        history.append(token)
        drafter.watch(drafter.propose(history, max_len=4), start=len(history))
    assert drafter.replacements == {50: (60, 61)}
    assert drafter.propose([*history, 4], max_len=3).tokens == [60, 61, 5]


def test_after_text_of_its_own_the_copy_resumes_where_it_broke_not_at_the_latest_match():
    """An edit that adds a docstring after each def line: after the second docstring the latest
    match of the text's end is in the first function just written ("... ret a"), while the copy
    of the source goes on in its second function ("... ret b")."""
    d, f, g, a, b, lp, rp, colon, nl, ret = 10, 11, 18, 13, 19, 12, 14, 15, 16, 17
    source = [d, f, lp, a, rp, colon, nl, ret, a, nl, d, g, lp, b, rp, colon, nl, ret, b, nl]
    first = [d, f, lp, a, rp, colon, nl, 30, 31, nl, ret, a, nl]  # 30 31: a docstring
    second = [d, g, lp, b, rp, colon, nl, 40, 41, nl, ret]  # another one
    drafter, history = NgramDrafter(), [0, *source]
    for token in first + second:  # as auto mode does: every proposal is watched
        drafter.watch(drafter.propose(history, max_len=4), start=len(history))
        history.append(token)
    assert drafter.propose(history, max_len=2).tokens == [b, nl]
    assert NgramDrafter().propose(history, max_len=2).tokens == [a, nl]  # no copy followed


def test_a_copy_resumed_after_text_of_its_own_is_priced_by_its_longest_match():
    """Where the copy resumes, the text's last 3 and last 2 tokens both match at the same place
    in the source: the proposal carries the longer match, whose estimates price it."""
    source = list(range(100, 130))
    history = [*source, 7, *source[:4]]  # the text has begun to quote its source
    drafter = NgramDrafter()
    drafter.watch(drafter.propose(history, max_len=4), start=len(history))
    history += [*source[4:6], 8, *source[6:9]]  # two tokens copied, one of its own, copying on
    proposal = drafter.propose(history, max_len=3)
    assert (proposal.tokens, proposal.ngram) == (source[9:12], 3)


def test_the_memory_of_old_rounds_fades_so_the_estimates_follow_a_change_of_task():
    drafter = NgramDrafter()
    for _ in range(1000):  # copy-heavy edits
        drafter.record(ngram=4, proposed=1, accepted=1)
    for _ in range(200):  # then open generation: with every round counted alike, still 0.83
        drafter.record(ngram=4, proposed=1, accepted=0)
    assert drafter.confidence(4) < 0.5


def test_a_watched_proposal_of_one_token_says_the_copy_goes_on_once_that_token_is_right():
    source = list(range(100, 140))
    history = [*source, 7, *source[:4]]
    drafter = NgramDrafter()
    drafter.watch(drafter.propose(history, max_len=1), start=len(history))
    history.append(source[4])
    assert drafter.propose(history, max_len=16).streak


def test_a_watched_proposal_wrong_from_its_first_token_ends_the_streak():
    source = list(range(100, 140))
    history = [*source, 7, *source[:4]]
    drafter = NgramDrafter()
    drafter.watch(drafter.propose(history, max_len=2), start=len(history))
    history += source[4:6]  # right in full
    proposal = drafter.propose(history, max_len=16)
    assert proposal.streak
    drafter.watch(proposal, start=len(history))
    history.append(source[20])  # the text leaves the copy at once, for a token found further on
    proposal = drafter.propose(history, max_len=16)
    assert proposal.tokens and not proposal.streak


def test_at_most_max_watched_proposals_wait_to_be_judged():
    history = [5, 6, 7, 8, 5, 6]
    learnt = []
    for watched in (MAX_WATCHED, MAX_WATCHED + 4):
        drafter = NgramDrafter()
        proposal = drafter.propose(history, max_len=2)
        for _ in range(watched):
            drafter.watch(proposal, start=len(history))
        drafter.propose([*history, 7], max_len=2)
        learnt.append(drafter.acceptance(2, 0))
    assert learnt[0] == learnt[1] > NgramDrafter().acceptance(2, 0)


@pytest.mark.parametrize("length", [1, MAX_REPLACEMENT])
def test_a_replacement_of_one_up_to_max_replacement_tokens_is_learnt(length):
    drafter = NgramDrafter()
    history = [*SOURCE, 0, 1]
    drafter.watch(drafter.propose(history, max_len=4), start=len(history))
    written = list(range(60, 60 + length))
    drafter.propose([*history, *written, 2, 3], max_len=4)
    assert drafter.replacements == {50: tuple(written)}


def test_the_shortest_text_after_which_the_source_resumes_is_the_replacement():
    drafter = NgramDrafter()
    history = [*SOURCE, 0, 1]
    drafter.watch(drafter.propose(history, max_len=4), start=len(history))
    drafter.propose([*history, 60, 2, 3, 2, 3], max_len=4)  # "2 3" follows 60, and 60 2 3
    assert drafter.replacements == {50: (60,)}


def test_proposing_again_on_an_unchanged_history_keeps_what_was_learnt_of_it():
    drafter, history = renaming_drafter()
    first = drafter.propose(history, max_len=4)
    again = drafter.propose(history, max_len=4)
    assert again.tokens == first.tokens == [4, 60, 61, 5]


def test_reset_forgets_the_replacements_and_the_breaks_and_proposals_waiting_to_teach_them():
    """They belong to the history that was cleared or rewritten."""
    drafter, decided = renaming_drafter()
    drafter.propose(decided, max_len=4)
    assert drafter.replacements == {50: (60, 61)}
    drafter.reset()
    assert drafter.replacements == {}
    for seen in (0, 1):  # the proposal waiting to be judged, then the break it showed
        drafter, decided = renaming_drafter()
        drafter.propose(decided[: len(decided) - 4 + seen], max_len=4)
        learnt = drafter.acceptances(2, 4)
        drafter.reset()
        drafter.propose(decided, max_len=4)  # the same tokens again, from a new history
        assert drafter.replacements == {}
        assert drafter.acceptances(2, 4) == learnt


def test_reset_forgets_where_the_copy_was():
    drafter = NgramDrafter()
    history = [5, 9, 5]
    drafter.watch(drafter.propose(history, max_len=2), start=len(history))  # 9 5
    drafter.propose([*history, 9], max_len=2)  # right: the copy is at 9
    drafter.reset()
    new = [1, 2, 9, 1, 2, 8, 1, 2]  # "1 2" was last followed by 8
    assert drafter.propose(new, max_len=1).tokens == [8]


def test_an_index_grown_a_token_at_a_time_holds_each_position_once():
    rng = random.Random(99)
    history: list[int] = []
    drafter = NgramDrafter()
    for _ in range(300):
        history.append(rng.randrange(4))
        drafter.update(history)
    rebuilt = NgramDrafter()
    rebuilt.update(history)
    assert drafter.index == rebuilt.index


def quoting_drafter(source: list[int], between: list[int]) -> tuple[NgramDrafter, list[int]]:
    """A drafter whose text, after `between`, quotes `source` and was right for two tokens of
    its watched proposal: the copy's place is 6 in the source."""
    history = [*source, *between, *source[:4]]
    drafter = NgramDrafter()
    drafter.watch(drafter.propose(history, max_len=4), start=len(history))
    return drafter, history + source[4:6]


@pytest.mark.parametrize("offset, continues", [(POINTER_WINDOW, True), (POINTER_WINDOW + 1, False)])
def test_a_match_continues_the_copy_only_within_pointer_window_of_its_place(offset, continues):
    source = list(range(100, 200))
    source[6 + offset - 2 : 6 + offset] = [1, 2]  # "1 2" `offset` tokens past the copy's place,
    drafter, history = quoting_drafter(source, between=[1, 2, 3, 7])  # and later, followed by 3
    history += [1, 2]  # where the text writes "1 2"
    expected = source[6 + offset] if continues else 3
    assert drafter.propose(history, max_len=1).tokens == [expected]


def test_a_single_token_does_not_say_where_the_copy_resumes():
    source = list(range(100, 140))
    source[10] = 0  # a common token, a newline say, ahead in the source
    drafter, history = quoting_drafter(source, between=[0, 99, 7])  # and later, followed by 99
    history.append(0)  # a newline of its own
    assert drafter.propose(history, max_len=1).tokens == [99]  # its latest match


def test_a_copy_through_a_run_of_one_token_resumes_after_the_last_token_copied():
    source = list(range(100, 140))
    source[8:13] = [0] * 5  # padding, say: copied three zeros, two are left
    history = [*source, 7, *source[:7]]
    drafter = NgramDrafter()
    drafter.watch(drafter.propose(history, max_len=6), start=len(history))
    history += source[7:11]  # right so far
    assert drafter.propose(history, max_len=3).tokens == [0, 0, source[13]]


def test_a_resumed_copy_carries_its_longest_match_up_to_max_ngram():
    source = list(range(100, 130))
    history = [*source, 7, *source[:4]]
    drafter = NgramDrafter()
    drafter.watch(drafter.propose(history, max_len=4), start=len(history))
    history += [*source[4:6], 8, *source[6:10]]  # copying on for four tokens after its own
    proposal = drafter.propose(history, max_len=3)
    assert (proposal.tokens, proposal.ngram) == (source[10:13], 4)
