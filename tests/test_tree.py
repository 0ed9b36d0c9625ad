"""The token tree: how the draft's probabilities grow it, and how the target's verdict is read."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from edgespec.sampling import draw_children, sample
from edgespec.tree import (
    BranchCopy,
    TokenTree,
    branch_children,
    greedy_accept,
    may_branch,
    sampled_accept,
    sampled_children,
    summarize,
    top_candidates,
    verification_batch,
)

from .test_sampling import N_SAMPLES, follows, joint_cells, target_and_draft
from .test_sampling import VOCAB as TOY_VOCAB

VOCAB = 50
EOG = 49


def probs(spec: dict[int, float]) -> np.ndarray:
    """A draft distribution with the given probabilities, the rest spread thinly over the vocab."""
    p = np.full(VOCAB, (1.0 - sum(spec.values())) / (VOCAB - len(spec)))
    for token, prob in spec.items():
        p[token] = prob
    return p


def grow(
    tree: TokenTree, branch: int, spec: dict[int, float], branch_p: float = 0.3, **budgets
) -> list[BranchCopy]:
    """Expand `branch` as the engine does under greedy drafting, from the draft's logits."""
    settings = {"max_branches": 4, "max_nodes": 32, "is_eog": {EOG}} | budgets
    logits = np.log(np.maximum(probs(spec), 1e-30))  # a spec may leave the rest no mass
    children = branch_children(top_candidates(logits, 4), branch_p)
    return tree.expand(branch, children, **settings)


def forked_tree() -> TokenTree:
    """root(1) ─┬─ 10 ─┬─ 11        branch 0, confidence .6·.5 = .30
                │      └─ 12        branch 2, confidence .6·.4 = .24
                └─ 20 ── 21         branch 1, confidence .35·.9 = .315
    Node indices in creation order: root 0, 10→1, 20→2, 11→3, 12→4, 21→5."""
    tree = TokenTree(1)
    grow(tree, 0, {10: 0.6, 20: 0.35})
    grow(tree, 0, {11: 0.5, 12: 0.4})
    grow(tree, 1, {21: 0.9})
    return tree


def test_a_new_tree_is_one_open_branch_at_the_root() -> None:
    tree = TokenTree(7)
    assert tree.open_branches() == [0]
    root = tree.leaf(0)
    assert (root.token, root.depth, root.prob, root.confidence, root.parent) == (7, 0, 1.0, 1.0, -1)
    assert not root.evaluated


def test_the_most_probable_token_extends_the_branch() -> None:
    tree = TokenTree(1)
    assert grow(tree, 0, {5: 0.9}) == []
    leaf = tree.leaf(0)
    assert (leaf.token, leaf.depth, leaf.parent, leaf.branch) == (5, 1, 0, 0)
    assert tree.branches[0].tokens == 1
    assert tree.nodes[0].evaluated and not leaf.evaluated


def test_the_argmax_extends_the_branch_even_below_branch_p() -> None:
    tree = TokenTree(1)
    grow(tree, 0, {5: 0.1})
    assert tree.leaf(0).token == 5 and len(tree.branches) == 1


def test_a_candidate_above_branch_p_starts_a_new_branch() -> None:
    tree = TokenTree(1)
    copies = grow(tree, 0, {10: 0.5, 20: 0.35})
    assert [tree.leaf(b).token for b in range(2)] == [10, 20]
    assert tree.leaf(1).parent == tree.leaf(0).parent == 0  # siblings under the expanded leaf
    assert tree.branches[1].tokens == 1
    assert copies == [BranchCopy(seq_id=1, src_seq_id=0, until_depth=1)]
    assert [tree.nodes[c].token for c in tree.nodes[0].children] == [10, 20]  # distinct tokens


def test_candidates_below_branch_p_do_not_branch() -> None:
    tree = TokenTree(1)
    assert grow(tree, 0, {10: 0.5, 20: 0.29}) == []
    assert len(tree.branches) == 1 and len(tree.nodes) == 2


def test_max_branches_keeps_the_most_probable_candidates() -> None:
    tree = TokenTree(1)
    copies = grow(tree, 0, {10: 0.31, 20: 0.3, 30: 0.32}, max_branches=2)
    assert [tree.leaf(b).token for b in range(2)] == [30, 10]
    assert [c.seq_id for c in copies] == [1]


def test_max_nodes_caps_the_tree_including_the_continuation() -> None:
    tree = TokenTree(1)
    grow(tree, 0, {10: 0.35, 20: 0.34, 30: 0.31}, max_nodes=3)
    assert len(tree.nodes) == 3 and len(tree.branches) == 2
    assert grow(tree, 0, {11: 0.9}, max_nodes=3) == []
    assert len(tree.nodes) == 3


def test_top_candidates_are_the_softmax_of_the_drafts_logits() -> None:
    rng = np.random.default_rng(7)
    logits = rng.normal(0.0, 3.0, 151_936).astype(np.float32)  # a Qwen-sized vocabulary
    logits[[500, 900, 77]] = [21.0, 20.6, 19.9]
    exact = np.exp(logits.astype(np.float64) - logits.max())
    exact /= exact.sum()
    candidates = top_candidates(logits, 3)
    assert [token for token, _ in candidates] == [500, 900, 77]  # .47, .31, .16
    # This bulk of tokens 16+ nats below the best is heavier than a language model's: the
    # documented bound (the left-out tokens weigh < e^-16 each) is what must hold.
    for token, prob in candidates:
        assert prob == pytest.approx(exact[token], rel=logits.size * np.exp(-16.0))
    assert [t for t, _ in branch_children(candidates, 0.2)] == [500, 900]
    assert branch_children(candidates, 1.0) == candidates[:1]  # the argmax alone


def test_top_candidates_are_the_n_most_probable_argmax_first() -> None:
    logits = np.log(probs({3: 0.5, 40: 0.2, 7: 0.2, 9: 0.05}))
    assert [t for t, _ in top_candidates(logits, 3)] == [3, 7, 40]  # equals: lower id first
    assert [t for t, _ in top_candidates(logits, 2)] == [3, 7]  # a tie at the cut, too
    assert top_candidates(logits, 1) == [(3, pytest.approx(0.5))]
    tied = np.zeros(VOCAB)
    assert top_candidates(tied, 2)[0][0] == 0  # as argmax picks


@pytest.mark.parametrize("scale", [0.5, 3.0, 8.0])  # flat to peaked rows
def test_top_candidates_match_a_full_sort_of_the_softmax(scale: float) -> None:
    rng = np.random.default_rng(int(scale * 10))
    reused_mask = np.empty(5_000, dtype=bool)  # as the engine passes it: one for every row
    for row in range(20):
        logits = rng.normal(0.0, scale, 5_000).astype(np.float32)
        logits[rng.integers(5_000, size=3)] = logits.max()  # equals at the top
        probs = np.exp(logits.astype(np.float64) - logits.max())
        probs /= probs.sum()
        order = np.argsort(-probs, kind="stable")
        for n in (1, 2, 4, 16):
            got = top_candidates(logits, n, reused_mask if row % 2 else None)
            assert got[0][0] == order[0]  # the argmax, as argmax picks among equals
            assert len({t for t, _ in got}) == n  # n distinct tokens...
            expected = probs[order[:n]].tolist()  # ...as probable as the n most probable
            assert [p for _, p in got] == pytest.approx(expected, rel=1e-3)
            assert [p for _, p in got] == pytest.approx([probs[t] for t, _ in got], rel=1e-3)


def test_the_argmax_alone_has_the_probability_it_has_among_more_candidates() -> None:
    # n = 1 takes a shorter way (the engine asks it after every draft step and plain step): it
    # must say what the n > 1 way says of the argmax, bit for bit, and so with the argmax given.
    rng = np.random.default_rng(3)
    for scale in (0.5, 3.0, 8.0):
        logits = rng.normal(0.0, scale, 5_000).astype(np.float32)
        first = int(logits.argmax())
        alone = top_candidates(logits, 1)
        assert alone == top_candidates(logits, 3)[:1]
        assert alone == top_candidates(logits, 1, first=first)
    peaked = np.full(5_000, -30.0, dtype=np.float32)
    peaked[42] = 0.0
    assert top_candidates(peaked, 1) == top_candidates(peaked, 1, first=42) == [(42, 1.0)]


CANDIDATES = [(10, 0.6), (20, 0.35), (30, 0.05)]


def test_without_calibration_children_are_llmcads_rule_on_the_drafts_probabilities() -> None:
    assert branch_children(CANDIDATES, 0.3) == [(10, 0.6), (20, 0.35)]
    assert branch_children(CANDIDATES, 0.5) == [(10, 0.6)]  # the argmax always continues


def test_an_underconfident_draft_whose_argmax_is_usually_right_stays_a_chain() -> None:
    # The target took this draft's 0.6-argmaxes 95 % of the time: the runner-up has 3.5 %.
    children = branch_children(CANDIDATES, 0.3, top_acceptance=0.95)
    assert children == [(10, 0.95)]


def test_an_overconfident_draft_branches_on_candidates_below_the_threshold() -> None:
    # Only 30 % of its 0.7-argmaxes were right: the 0.2 runner-up holds 0.7 · 0.2/0.3 of the rest.
    children = branch_children([(10, 0.7), (20, 0.2), (30, 0.1)], 0.3, top_acceptance=0.3)
    assert [t for t, _ in children] == [10, 20]
    assert children[1][1] == pytest.approx(0.7 * 0.2 / 0.3)


def test_a_certain_draft_leaves_nothing_to_its_runners_up() -> None:
    assert branch_children([(1, 1.0), (2, 0.0)], 0.01, top_acceptance=0.5) == [(1, 0.5)]


def test_a_tree_verified_now_yields_the_targets_token_and_each_nodes_chance() -> None:
    tree = TokenTree(1)
    tree.expand(0, [(10, 0.6), (20, 0.3)], max_branches=4, max_nodes=8)
    tree.expand(0, [(11, 0.5)], max_branches=4, max_nodes=8)  # under 10: 0.6 * 0.5
    assert tree.expected_tokens() == pytest.approx(1.0 + 0.6 + 0.3 + 0.3)


def test_sampled_children_are_the_distinct_draws_in_draw_order_with_their_chances() -> None:
    q = probs({10: 0.6, 20: 0.3})
    # Raw (LLMCad): the draft's probability of each; a repeated draw is one child.
    assert sampled_children([20, 10, 20], q) == [(20, pytest.approx(0.3)), (10, 0.6)]
    # Calibrated: the first draw is taken with the learnt chance, the others share the rest.
    children = sampled_children([20, 10, 20], q, first_acceptance=0.5)
    assert children == [(20, 0.5), (10, pytest.approx(0.6 * 0.5 / 0.7))]


@pytest.mark.parametrize("calibrated", [False, True])
def test_where_no_runner_up_may_branch_none_does(calibrated: bool) -> None:
    # The tree looks at the runner-ups only where may_branch says one could start a branch.
    rng = np.random.default_rng(7)
    for _ in range(2000):
        logits = rng.normal(0.0, rng.uniform(0.1, 6.0), size=64).astype(np.float32)
        candidates = top_candidates(logits, 4)
        p_top = candidates[0][1]
        chance = float(rng.uniform()) if calibrated else None
        branch_p = float(rng.uniform(0.01, 0.6))
        children = branch_children(candidates, branch_p, chance)
        if not may_branch(p_top if chance is None else chance, branch_p):
            assert len(children) == 1
    # At the edge: one runner-up holding all the rest branches at exactly that share.
    assert may_branch(0.7, 0.3) and len(branch_children([(1, 0.7), (2, 0.3)], 0.3)) == 2
    assert not may_branch(0.71, 0.3)


def test_a_new_branch_copies_its_parent_branch_up_to_the_shared_parent() -> None:
    tree = TokenTree(1)
    grow(tree, 0, {10: 0.6, 20: 0.35})
    grow(tree, 1, {21: 0.9})
    copies = grow(tree, 1, {22: 0.5, 23: 0.45})  # the expanded leaf 21 sits at depth 2
    assert copies == [BranchCopy(seq_id=2, src_seq_id=1, until_depth=3)]
    assert tree.path(tree.branches[2].leaf)[:-1] == tree.path(tree.branches[1].leaf)[:-1]


def test_confidence_is_the_product_of_probs_along_the_path() -> None:
    tree = forked_tree()
    assert tree.leaf(0).confidence == pytest.approx(0.6 * 0.5)
    assert tree.leaf(1).confidence == pytest.approx(0.35 * 0.9)
    assert tree.leaf(2).confidence == pytest.approx(0.6 * 0.4)
    assert tree.leaf(2).prob == pytest.approx(0.4)


def test_an_end_of_generation_leaf_closes_its_branch() -> None:
    tree = TokenTree(1)
    grow(tree, 0, {10: 0.6, EOG: 0.35})
    assert tree.open_branches() == [0]
    with pytest.raises(ValueError):
        grow(tree, 1, {11: 0.9})


def test_is_eog_may_be_a_predicate() -> None:
    tree = TokenTree(1)
    grow(tree, 0, {EOG: 0.9}, is_eog=lambda token: token == EOG)
    assert tree.open_branches() == []


def test_the_verification_batch_holds_every_node_once_parents_first() -> None:
    tree = forked_tree()
    tokens, depths, _ = verification_batch(tree)
    assert tokens == [1, 10, 20, 11, 12, 21]
    assert depths == [0, 1, 1, 2, 2, 2]
    assert all(tree.nodes[i].parent < i for i in range(len(tree.nodes)))


def test_a_node_carries_the_seq_ids_of_every_branch_through_it() -> None:
    _, _, seq_ids = verification_batch(forked_tree())
    assert seq_ids == [[0, 1, 2], [0, 2], [1], [0], [2], [1]]


def test_the_surest_nodes_come_after_their_parents_so_any_first_ones_form_a_tree() -> None:
    tree = forked_tree()
    surest = tree.surest_nodes()
    assert surest == [1, 2, 5, 3, 4]  # confidences .6, .35, .315, .30, .24
    for n in range(len(surest)):
        assert all(tree.nodes[node].parent in (0, *surest[:n]) for node in surest[: n + 1])


def test_a_child_as_sure_as_its_parent_still_comes_after_it_among_the_surest_nodes() -> None:
    """A token the draft is certain of leaves its node's confidence equal to its parent's: the
    tie must not put the child first, or the first node alone would not form a tree."""
    tree = TokenTree(1)
    grow(tree, 0, {10: 0.6, 20: 0.35})
    tree.expand(0, [(11, 1.0)], max_branches=4, max_nodes=32)  # node 3, under 10 (node 1)
    assert tree.leaf(0).confidence == tree.nodes[1].confidence
    surest = tree.surest_nodes()
    assert surest == [1, 3, 2]
    for n in range(len(surest)):
        assert all(tree.nodes[node].parent in (0, *surest[:n]) for node in surest[: n + 1])


def test_a_pruned_tree_keeps_the_surest_nodes_and_ends_each_branch_at_its_deepest_kept_one():
    tree = forked_tree()
    renumbered = tree.prune([1, 2, 5])  # 11 and 12, the tips of branches 0 and 2, go
    assert renumbered == [0, 1, 2, -1, -1, 3]
    tokens, depths, seq_ids = verification_batch(tree)
    assert (tokens, depths) == ([1, 10, 20, 21], [0, 1, 1, 2])
    assert seq_ids == [[0, 1, 2], [0, 2], [1], [1]]  # branch numbers (seq ids) unchanged
    assert [tree.leaf(b).token for b in range(3)] == [10, 21, 10]
    assert tree.nodes[1].children == [] and tree.nodes[2].children == [3]
    # The target wanted 11 after 10: it is the bonus token, as if 11 had never been drafted.
    result = greedy_accept(tree, np.array([10, 11, 21, 0]))
    assert (result.path, result.tokens, result.bonus) == ([0, 1], [10], 11)


def test_a_fully_accepted_branch_earns_the_bonus_token_after_its_leaf() -> None:
    tree = forked_tree()
    target = np.array([20, 0, 21, 0, 0, 40])  # target's argmax at each node
    result = greedy_accept(tree, target)
    assert (result.path, result.tokens, result.bonus, result.branch) == ([0, 2, 5], [20, 21], 40, 1)


def test_a_mismatch_at_the_root_accepts_nothing_and_takes_the_targets_token() -> None:
    result = greedy_accept(forked_tree(), np.array([42, 0, 0, 0, 0, 0]))
    assert (result.path, result.tokens, result.bonus) == ([0], [], 42)


def test_acceptance_follows_the_sibling_the_target_chose() -> None:
    tree = forked_tree()
    result = greedy_accept(tree, np.array([10, 12, 0, 0, 33, 0]))
    assert (result.path, result.tokens, result.bonus, result.branch) == ([0, 1, 4], [10, 12], 33, 2)


def test_a_partial_acceptance_keeps_the_most_confident_branch_through_its_end() -> None:
    result = greedy_accept(forked_tree(), np.array([10, 44, 0, 0, 0, 0]))  # 10 ok, then neither
    assert (result.tokens, result.bonus, result.branch) == ([10], 44, 0)  # .30 beats .24


def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def test_sampled_verification_walks_into_accepted_children_and_samples_after_the_last() -> None:
    """The target certain of 20, then 21, then 40 (point masses): both draws are accepted, and
    at the leaf, which the draft never evaluated, the target's own sample is the bonus."""
    tree = forked_tree()
    draft = {0: probs({10: 0.6, 20: 0.35}), 2: probs({21: 0.9})}
    target = {0: probs({20: 1.0}), 2: probs({21: 1.0}), 5: probs({40: 1.0})}
    draws = {0: [20, 10], 2: [21]}
    result = sampled_accept(tree, target.__getitem__, draft.__getitem__, draws, rng())
    assert (result.path, result.tokens, result.bonus, result.branch) == ([0, 2, 5], [20, 21], 40, 1)


def test_a_sampled_rejection_at_the_root_keeps_the_most_confident_branch() -> None:
    tree = forked_tree()
    draft = {0: probs({10: 0.6, 20: 0.35})}
    target = {0: probs({42: 1.0})}  # neither 10 nor 20: both draws rejected, 42 the residual
    result = sampled_accept(tree, target.__getitem__, draft.__getitem__, {0: [10, 20]}, rng())
    assert (result.path, result.tokens, result.bonus) == ([0], [], 42)
    assert result.branch == 1  # confidences: branch 1 .315, branch 0 .30, branch 2 .24


def test_an_accepted_draw_the_budget_left_without_a_node_is_emitted_and_ends_the_walk() -> None:
    tree = TokenTree(1)
    tree.expand(0, [(10, 0.5), (20, 0.3)], max_branches=4, max_nodes=2)  # no room for 20
    q = probs({10: 0.5, 20: 0.3})
    result = sampled_accept(tree, lambda node: q, lambda node: q, {0: [20]}, rng())  # p = q
    assert (result.path, result.tokens, result.bonus, result.branch) == ([0], [], 20, 0)


@pytest.mark.parametrize("overwrite", [False, True])  # the engine's: rows of its own buffer
@pytest.mark.parametrize("max_nodes", [3, 2])  # 2: a second distinct draw gets no node
def test_sampled_verification_emits_the_target_distribution_at_each_position(
    max_nodes, overwrite
) -> None:
    """Trees of one level (two children drawn from the draft at the root) for a toy target whose
    distribution depends only on the position: p0 at the root, p1 after it. A round that
    accepts a child emits the target's sample at that leaf as well; after one that does not,
    the next round's first token is a sample of p1. Free to overwrite the target's rows, the
    walk leaves a rejection's residual in them, so each row given is a fresh copy."""
    p0, q0 = target_and_draft(seed=11)
    p1, _ = target_and_draft(seed=12)
    generator = np.random.default_rng(2)
    tokens = np.empty((20_000, 2), dtype=np.int64)
    for row in tokens:
        tree = TokenTree(0)
        draws = {0: draw_children(q0, 2, generator)}
        children = [(token, float(q0[token])) for token in dict.fromkeys(draws[0])]
        tree.expand(0, children, max_branches=4, max_nodes=max_nodes)
        # Every node but the root (node 0) sits at depth 1.
        result = sampled_accept(
            tree,
            lambda n: (p1 if n else p0).copy(),
            lambda n: q0,
            draws,
            generator,
            overwrite_target_rows=overwrite,
        )
        emitted = [*result.tokens, result.bonus]
        row[:] = [*emitted, sample(p1, generator)][:2]
    assert follows(tokens[:, 0], p0)
    assert follows(tokens[:, 1], p1)
    assert follows(tokens[:, 0] * p0.size + tokens[:, 1], np.outer(p0, p1).ravel())


def rows_of(
    tree: TokenTree, after_token: list[np.ndarray], first: np.ndarray
) -> Callable[[int], np.ndarray]:
    """A toy model's distribution after each node of a two-level tree: `first` at the root,
    after_token[x] after a node of token x."""
    return lambda node: after_token[tree.nodes[node].token] if node else first


def first_two_tokens_by_trees(
    cut_on_the_draw: bool, seed: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """The first two tokens of a toy model whose second position depends on the first (rows
    p2[x1], q2[x1]), N_SAMPLES times, by one tree round: two draws at the root, then under each
    distinct child x1 a draw of its own only where the draft is at least 0.3 sure after x1
    (engine: _children_worth_drawing, asked before the draw), which it is after an even x1 (its
    row overconfident). `cut_on_the_draw`: the wrong rule, the child drawn and kept only where
    the draft gave it 0.3 or more. Tokens the round leaves undecided are the target's own draws.
    Returns the tokens and their exact joint distribution."""
    rng = np.random.default_rng(seed)
    p1, q1 = target_and_draft(seed * 100)
    rows = [target_and_draft(seed * 100 + 1 + t, t % 2 == 0) for t in range(TOY_VOCAB)]
    p2, q2 = [p for p, _ in rows], [q for _, q in rows]
    budgets = {"max_branches": 4, "max_nodes": 8}
    tokens = np.empty((N_SAMPLES, 2), dtype=np.int64)
    for pair in tokens:
        tree = TokenTree(0)
        draws = {0: draw_children(q1, 2, rng)}
        tree.expand(0, [(t, float(q1[t])) for t in dict.fromkeys(draws[0])], **budgets)
        for branch in range(len(tree.branches)):
            leaf = tree.branches[branch].leaf
            x1 = tree.nodes[leaf].token
            if cut_on_the_draw:
                drawn = draw_children(q2[x1], 1, rng)
                if q2[x1][drawn[0]] < 0.3:
                    continue
            elif q2[x1].max() >= 0.3:
                drawn = draw_children(q2[x1], 1, rng)
            else:
                continue
            draws[leaf] = drawn
            tree.expand(branch, [(drawn[0], float(q2[x1][drawn[0]]))], **budgets)
        result = sampled_accept(tree, rows_of(tree, p2, p1), rows_of(tree, q2, q1), draws, rng)
        decided = [*result.tokens, result.bonus]
        if len(decided) == 1:
            decided.append(sample(p2[decided[0]], rng))
        pair[:] = decided[:2]
    return tokens, (p1[:, None] * np.array(p2)).ravel()


def test_a_sampled_tree_that_draws_children_by_the_drafts_confidence_there_is_exact() -> None:
    tokens, joint = first_two_tokens_by_trees(cut_on_the_draw=False)
    assert follows(joint_cells(tokens), joint)


def test_the_check_catches_a_sampled_tree_that_keeps_a_child_by_its_own_draw() -> None:
    tokens, joint = first_two_tokens_by_trees(cut_on_the_draw=True)
    assert not follows(joint_cells(tokens), joint)


def test_the_summary_ranks_the_winner_and_scores_the_most_confident_branch() -> None:
    tree = forked_tree()
    summary = summarize(tree, greedy_accept(tree, np.array([10, 12, 0, 0, 33, 0])))
    assert (summary.nodes, summary.branches, summary.max_depth) == (6, 3, 2)
    assert summary.winner_rank == 2  # confidences: branch 1 .315, branch 0 .30, branch 2 .24
    assert (summary.best_drafted, summary.best_accepted) == (2, 0)  # branch 1 diverged at once

    summary = summarize(tree, greedy_accept(tree, np.array([20, 0, 21, 0, 0, 40])))
    assert (summary.winner_rank, summary.best_drafted, summary.best_accepted) == (0, 2, 2)


# ----- another drafter's proposal grafted onto the tree (SpecInfer's several drafters) -----


def grafted_tree() -> TokenTree:
    """root(1) ── 10 ── 11 ── 12   branch 1, grafted (n-gram), probs .9 each
    then the draft extends branch 0 (the root): it agrees on 10, disagrees after it."""
    tree = TokenTree(1)
    assert tree.graft([10, 11, 12], [0.9, 0.9, 0.9], max_branches=4, max_nodes=32) == 1
    return tree


def test_a_grafted_proposal_is_a_branch_the_draft_never_extends() -> None:
    tree = grafted_tree()
    assert [n.token for n in tree.nodes] == [1, 10, 11, 12]
    assert tree.leaf(1).confidence == pytest.approx(0.9**3)
    assert tree.open_branches() == tree.drafted_branches() == [0]


def test_a_draft_token_equal_to_a_grafted_child_shares_its_node() -> None:
    tree = grafted_tree()
    grow(tree, 0, {10: 0.95})
    assert len(tree.nodes) == 4  # no second node for 10
    assert tree.branches[0].leaf == 1 and tree.leaf(0).confidence == pytest.approx(0.95)
    assert tree.leaf(0).prob == pytest.approx(0.95)  # the surer of the graft's .9 and the draft's
    grow(tree, 0, {13: 0.6, 11: 0.35})  # 11 already has its node: no duplicate branch for it
    assert [n.token for n in tree.nodes] == [1, 10, 11, 12, 13]
    assert len(tree.branches) == 2
    _, _, seq_ids = verification_batch(tree)
    assert seq_ids == [[0, 1], [0, 1], [1], [1], [0]]


def test_runners_up_after_one_a_grafted_branch_already_has_still_start_branches() -> None:
    tree = grafted_tree()
    grow(tree, 0, {10: 0.95})
    grow(tree, 0, {13: 0.5, 11: 0.25, 14: 0.2}, branch_p=0.15)  # 11 has its node: 14 branches
    assert [n.token for n in tree.nodes] == [1, 10, 11, 12, 13, 14]
    assert [tree.leaf(b).token for b in range(3)] == [13, 12, 14]


def test_tokens_only_the_grafted_branch_proposed_are_counted_when_accepted() -> None:
    tree = grafted_tree()
    grow(tree, 0, {10: 0.95})
    grow(tree, 0, {13: 0.6})
    target = np.array([10, 11, 12, 0, 0])  # the n-gram was right throughout
    accepted = greedy_accept(tree, target)
    assert (accepted.tokens, accepted.branch) == ([10, 11, 12], 1)
    summary = summarize(tree, accepted)
    assert summary.grafted_accepted == 2  # 11 and 12; 10 the draft proposed too
    assert (summary.best_drafted, summary.best_accepted) == (2, 1)  # the draft's own branch


def test_a_graft_respects_the_node_and_branch_budgets() -> None:
    tree = TokenTree(1)
    assert tree.graft([10, 11, 12, 13], [0.9] * 4, max_branches=4, max_nodes=3) == 1
    assert len(tree.nodes) == 3
    full = TokenTree(1)
    assert full.graft([10], [0.9], max_branches=1, max_nodes=32) is None


def test_a_branch_whose_end_of_generation_leaf_is_pruned_is_open_again() -> None:
    tree = TokenTree(1)
    grow(tree, 0, {10: 0.6, 20: 0.35})
    grow(tree, 0, {EOG: 0.9})  # node 3, ends branch 0
    grow(tree, 1, {EOG: 0.9})  # node 4, ends branch 1
    assert tree.open_branches() == []
    tree.prune([1, 2, 3])
    assert tree.open_branches() == [1]  # branch 0 still ends at its end-of-generation token


def test_at_the_node_budget_the_draft_still_moves_into_a_node_a_graft_already_has() -> None:
    tree = grafted_tree()
    assert tree.expand(0, [(10, 0.95)], max_branches=4, max_nodes=4) == []
    assert len(tree.nodes) == 4 and tree.branches[0].leaf == 1


def test_a_shared_node_keeps_the_grafts_estimate_where_the_draft_is_less_sure() -> None:
    tree = grafted_tree()
    grow(tree, 0, {10: 0.5})
    assert tree.leaf(0).prob == pytest.approx(0.9)
    assert tree.leaf(0).confidence == pytest.approx(0.9)


def test_a_graft_ends_at_its_first_end_of_generation_token() -> None:
    tree = TokenTree(1)
    tree.graft([10, EOG, 11], [0.9] * 3, max_branches=4, max_nodes=32, is_eog={EOG})
    assert [n.token for n in tree.nodes] == [1, 10, EOG]
    assert tree.branches[1].closed


def test_an_empty_proposal_grafts_no_branch() -> None:
    tree = TokenTree(1)
    assert tree.graft([], [], max_branches=4, max_nodes=32) is None
    assert len(tree.branches) == 1


def test_a_proposal_with_no_room_for_its_first_node_grafts_no_branch() -> None:
    tree = TokenTree(1)
    assert tree.graft([10], [0.9], max_branches=4, max_nodes=1) is None
    assert len(tree.branches) == 1 and len(tree.nodes) == 1


def test_at_the_node_budget_a_graft_still_follows_a_path_the_draft_made() -> None:
    tree = TokenTree(1)
    tree.expand(0, [(10, 0.5)], max_branches=4, max_nodes=2)
    branch = tree.graft([10, 11], [0.9, 0.9], max_branches=4, max_nodes=2)
    assert branch == 1 and tree.leaf(branch).token == 10  # then no room for 11
    assert len(tree.nodes) == 2 and tree.nodes[1].prob == 0.9  # the surer drafter's estimate


def test_a_candidate_exactly_at_branch_p_starts_a_branch() -> None:
    assert branch_children([(10, 0.6), (20, 0.3)], 0.3) == [(10, 0.6), (20, 0.3)]


def test_the_summary_of_an_acceptance_cut_short_on_the_most_confident_branch() -> None:
    tree = forked_tree()
    summary = summarize(tree, greedy_accept(tree, np.array([20, 0, 99, 0, 0, 0])))
    assert (summary.best_drafted, summary.best_accepted) == (2, 1)  # 20 yes, 21 no


def test_the_summary_of_a_graft_accepted_beyond_the_drafts_best_branch() -> None:
    tree = grafted_tree()
    grow(tree, 0, {10: 0.95})  # the draft's only branch ends at 10, the graft goes to depth 3
    summary = summarize(tree, greedy_accept(tree, np.array([10, 11, 12, 0])))
    assert (summary.best_drafted, summary.best_accepted, summary.grafted_accepted) == (1, 1, 2)
    assert summary.max_depth == 3  # the graft's nodes are verified: the tree is that deep
