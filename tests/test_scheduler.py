"""Which branch the draft extends next, when the target verifies, and how alpha adapts."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.scheduler import (
    GreedyScheduler,
    PacerScheduler,
    TriggerConfig,
    next_alpha,
    verify_cause,
)
from edgespec.tree import TokenTree, branch_children, top_candidates

VOCAB = 50
EOG = 49


def grow(tree: TokenTree, branch: int, spec: dict[int, float], max_nodes: int = 32) -> None:
    p = np.full(VOCAB, (1.0 - sum(spec.values())) / (VOCAB - len(spec)))
    for token, prob in spec.items():
        p[token] = prob
    children = branch_children(top_candidates(np.log(p), 4), branch_p=0.3)
    tree.expand(branch, children, max_branches=4, max_nodes=max_nodes, is_eog={EOG})


def test_the_pacer_extends_the_branch_furthest_below_its_share() -> None:
    """Worked by hand with M = 8; share_i = M·C_i/ΣC − tokens_i over the open branches."""
    pacer, tree = PacerScheduler(budget_tokens=8), TokenTree(1)
    assert pacer.pick(tree) == 0  # the only branch
    grow(tree, 0, {10: 0.5, 20: 0.4})
    # C = .5, .4; tokens 1, 1: 8·.5/.9 − 1 = 3.44 vs 8·.4/.9 − 1 = 2.56
    assert pacer.pick(tree) == 0
    grow(tree, 0, {11: 0.9})
    # C = .45, .4; tokens 2, 1: 8·.45/.85 − 2 = 2.24 vs 8·.4/.85 − 1 = 2.76
    assert pacer.pick(tree) == 1
    assert GreedyScheduler().pick(tree) == 0  # where greedy and the pacer part ways
    grow(tree, 1, {21: 0.9})
    # C = .45, .36; tokens 2, 2: 8·.45/.81 − 2 = 2.44 vs 8·.36/.81 − 2 = 1.56
    assert pacer.pick(tree) == 0


def test_the_greedy_scheduler_extends_the_most_confident_open_branch() -> None:
    tree = TokenTree(1)
    grow(tree, 0, {10: 0.35, 20: 0.6})
    assert GreedyScheduler().pick(tree) == 0  # the argmax 20 continued branch 0
    grow(tree, 0, {21: 0.5})  # branch 0 falls to .30, below branch 1's .35
    assert GreedyScheduler().pick(tree) == 1


@pytest.mark.parametrize("scheduler", [GreedyScheduler(), PacerScheduler(budget_tokens=8)])
def test_schedulers_skip_closed_branches_and_give_up_when_none_is_open(scheduler) -> None:
    tree = TokenTree(1)
    grow(tree, 0, {EOG: 0.6, 20: 0.35})
    assert scheduler.pick(tree) == 1
    grow(tree, 1, {EOG: 0.9})
    assert scheduler.pick(tree) is None


CFG = TriggerConfig(max_nodes=8, max_depth=3)


def test_no_trigger_while_the_tree_is_confident_and_within_budget() -> None:
    tree = TokenTree(1)
    grow(tree, 0, {10: 0.9})
    assert verify_cause(tree, 0.5, CFG) is None


def test_low_tree_confidence_triggers_verification() -> None:
    tree = TokenTree(1)
    grow(tree, 0, {10: 0.6, 20: 0.35})
    assert verify_cause(tree, 0.61, CFG) == "confidence"  # T_c = max(.6, .35)
    assert verify_cause(tree, 0.59, CFG) is None


def test_the_node_budget_triggers_verification() -> None:
    tree = TokenTree(1)
    for branch in (0, 0, 0):
        grow(tree, branch, {10: 0.6, 20: 0.31}, max_nodes=CFG.max_nodes)  # 1 + 2 + 2 + 2 nodes
    assert len(tree.nodes) == 7 and tree.depth == 3
    assert verify_cause(tree, 0.0, TriggerConfig(max_nodes=8, max_depth=9)) is None
    grow(tree, 1, {11: 0.9})
    assert verify_cause(tree, 0.0, TriggerConfig(max_nodes=8, max_depth=9)) == "budget"


def test_the_depth_budget_triggers_verification() -> None:
    tree = TokenTree(1)
    for _ in range(3):
        grow(tree, 0, {10: 0.99})
    assert verify_cause(tree, 0.0, CFG) == "budget"


def test_an_ended_most_confident_branch_triggers_verification() -> None:
    tree = TokenTree(1)
    grow(tree, 0, {EOG: 0.6, 20: 0.35})
    assert verify_cause(tree, 0.0, CFG) == "end"


def test_a_less_confident_ended_branch_does_not_trigger() -> None:
    tree = TokenTree(1)
    grow(tree, 0, {10: 0.6, EOG: 0.35})
    assert verify_cause(tree, 0.0, CFG) is None


def test_no_open_branch_left_triggers_verification() -> None:
    tree = TokenTree(1)
    grow(tree, 0, {EOG: 0.9})
    assert verify_cause(tree, 0.0, CFG) == "end"


def test_alpha_halves_when_every_drafted_token_was_accepted() -> None:
    assert next_alpha(0.01, drafted=5, accepted=5) == pytest.approx(0.005)


def test_alpha_becomes_the_rejected_fraction_otherwise() -> None:
    assert next_alpha(0.01, drafted=4, accepted=1) == pytest.approx(0.75)
    assert next_alpha(0.01, drafted=4, accepted=0) == pytest.approx(1.0)


def test_alpha_is_clamped() -> None:
    assert next_alpha(1.5e-4, drafted=3, accepted=3) == 1e-4
    assert next_alpha(0.01, drafted=4, accepted=2, ceil=0.3) == 0.3
    assert next_alpha(0.01, drafted=2, accepted=2, floor=0.02) == 0.02


def test_alpha_is_unchanged_when_nothing_was_drafted() -> None:
    assert next_alpha(0.37, drafted=0, accepted=0) == 0.37


def test_a_grafted_branch_neither_keeps_the_draft_going_nor_ends_it() -> None:
    cfg = TriggerConfig(max_nodes=32, max_depth=3)
    tree = TokenTree(1)
    tree.graft([10, 11, 12, 13], [0.99] * 4, max_branches=4, max_nodes=32)  # deeper than 3
    assert verify_cause(tree, alpha=0.5, cfg=cfg) is None  # the draft has not started
    grow(tree, 0, {20: 0.4})
    assert verify_cause(tree, alpha=0.5, cfg=cfg) == "confidence"  # the graft's .96 counts not
    ended = TokenTree(1)  # the n-gram proposes the end of the text, surer than the draft
    ended.graft([10, EOG], [0.99, 0.99], max_branches=4, max_nodes=32, is_eog={EOG})
    assert ended.branches[1].closed
    grow(ended, 0, {20: 0.9})
    assert verify_cause(ended, alpha=0.5, cfg=cfg) is None  # the graft's closed .98 counts not


def test_the_pacer_holds_back_a_confident_branch_that_has_drafted_beyond_its_share() -> None:
    tree, budgets = TokenTree(1), {"max_branches": 4, "max_nodes": 32}
    tree.expand(0, [(10, 0.6), (20, 0.4)], **budgets)
    tree.expand(0, [(11, 1.0)], **budgets)
    tree.expand(0, [(12, 1.0)], **budgets)
    # C = .6, .4; tokens 3, 1: 8·.6 − 3 = 1.8 vs 8·.4 − 1 = 2.2
    assert PacerScheduler(budget_tokens=8).pick(tree) == 1
    assert GreedyScheduler().pick(tree) == 0


def test_the_pacer_shares_the_budget_among_the_open_branches_only() -> None:
    tree, budgets = TokenTree(1), {"max_branches": 4, "max_nodes": 32, "is_eog": {EOG}}
    tree.expand(0, [(10, 0.5), (EOG, 0.3), (20, 0.2)], **budgets)
    for token in (11, 12, 13):
        tree.expand(0, [(token, 1.0)], **budgets)
    # Open C = .5, .2 (ΣC = .7); tokens 4, 1: 8·.5/.7 − 4 = 1.71 vs 8·.2/.7 − 1 = 1.29.
    # Counting the ended branch's .3 in ΣC would give 0 vs 0.6.
    assert PacerScheduler(budget_tokens=8).pick(tree) == 0


def test_when_every_confidence_underflows_the_pacer_extends_the_least_drafted_branch() -> None:
    tree, budgets = TokenTree(1), {"max_branches": 4, "max_nodes": 32}
    tree.expand(0, [(10, 1e-200), (20, 1e-200)], **budgets)
    tree.expand(0, [(11, 1e-200)], **budgets)
    tree.expand(1, [(21, 1e-200)], **budgets)
    tree.expand(0, [(12, 0.5)], **budgets)
    assert [tree.leaf(b).confidence for b in (0, 1)] == [0.0, 0.0]
    assert PacerScheduler(budget_tokens=8).pick(tree) == 1  # 2 tokens against 3


def test_a_tree_as_confident_as_alpha_keeps_drafting() -> None:
    # After a round that rejected everything alpha is 1: the root alone is that confident,
    # and the draft must still propose a token before the target verifies.
    assert next_alpha(0.01, drafted=3, accepted=0) == 1.0
    assert verify_cause(TokenTree(1), 1.0, CFG) is None
