"""LLMCad's confidence-scored token tree: grown by the draft, verified by the target in one pass.

The tree is rooted at the last committed token, which neither model has evaluated yet. Every
root-to-leaf path is a branch, and branch i uses llama.cpp sequence id i. A node sits at KV position
n_past + depth. llama.cpp has no custom attention mask, so tree attention comes from sequence ids:
a batch row attends to the cells carrying its FIRST seq id, and tagging each node with the ids of
all branches through it gives every node exactly its ancestors as context.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .sampling import accept_among_children, sample

EogTest = Callable[[int], bool] | Container[int]


@dataclass
class Node:
    token: int
    parent: int  # index into TokenTree.nodes, -1 for the root
    depth: int  # 0 for the root
    # The chance that the target takes this token after its parent's path: the draft's
    # probability (LLMCad), its calibrated form (branch_children) or another drafter's estimate.
    prob: float
    confidence: float  # product of the probs from the root: LLMCad's branch confidence C_i
    branch: int  # the branch this node was drafted on
    children: list[int] = field(default_factory=list)
    evaluated: bool = False  # the draft model has this node in its KV cache


@dataclass
class Branch:
    leaf: int  # node index
    tokens: int = 0  # tokens drafted on this branch itself, not inherited from its parent branch
    closed: bool = False  # its leaf is an end-of-generation token: nothing to extend
    grafted: bool = False  # proposed by another drafter (n-gram): verified, never drafted on


class BranchCopy(NamedTuple):
    """Draft KV the engine must share with a new branch before drafting on it:
    seq_cp(src_seq_id, seq_id, 0, n_past + until_depth)."""

    seq_id: int
    src_seq_id: int
    until_depth: int


class TokenTree:
    def __init__(self, root_token: int) -> None:
        self.nodes = [Node(root_token, parent=-1, depth=0, prob=1.0, confidence=1.0, branch=0)]
        self.branches = [Branch(leaf=0)]

    def leaf(self, branch: int) -> Node:
        return self.nodes[self.branches[branch].leaf]

    def open_branches(self) -> list[int]:
        """The branches the draft may extend."""
        return [i for i, b in enumerate(self.branches) if not (b.closed or b.grafted)]

    def drafted_branches(self) -> list[int]:
        return [i for i, b in enumerate(self.branches) if not b.grafted]

    @property
    def depth(self) -> int:
        return max(self.leaf(b).depth for b in range(len(self.branches)))

    def expected_tokens(self) -> float:
        """What verifying the tree now is expected to yield: the target's own token plus each
        drafted node's chance of being accepted (its confidence, where those are chances)."""
        return 1.0 + sum(node.confidence for node in self.nodes[1:])

    def path(self, node: int) -> list[int]:
        """Node indices from the root to `node`, both included."""
        path = []
        while node != -1:
            path.append(node)
            node = self.nodes[node].parent
        return path[::-1]

    def path_of(self, branch: int) -> list[int]:
        return self.path(self.branches[branch].leaf)

    def branches_through(self, node: int) -> list[int]:
        return [b for b in range(len(self.branches)) if node in self.path_of(b)]

    def surest_nodes(self) -> list[int]:
        """The drafted nodes (the root aside), the likeliest to be accepted first. A node is
        never surer than its parent and comes after it among equals, so any first n of them
        form a tree (best_pass_size)."""
        nodes = self.nodes
        return sorted(range(1, len(nodes)), key=lambda n: (-nodes[n].confidence, nodes[n].depth))

    def prune(self, keep: Collection[int]) -> list[int]:
        """Keep the root and the nodes `keep` (each with its parent) and drop the others; each
        branch then ends at the deepest node of its path that stays. Branch numbers, the seq ids
        of the draft's cache, do not change; node numbers close up, in the same order (parents
        first): returns each old node's new number, -1 where it was dropped."""
        kept = {0, *keep}
        renumbered, count = [], 0
        for old in range(len(self.nodes)):
            renumbered.append(count if old in kept else -1)
            count += old in kept
        for branch in self.branches:
            leaf = branch.leaf
            while renumbered[leaf] < 0:
                leaf = self.nodes[leaf].parent
            if leaf != branch.leaf:
                branch.closed = False  # its end-of-generation leaf, if it had one, is gone
            branch.leaf = renumbered[leaf]
        self.nodes = [node for old, node in enumerate(self.nodes) if renumbered[old] >= 0]
        for node in self.nodes:
            node.parent = renumbered[node.parent] if node.parent >= 0 else -1
            node.children = [renumbered[c] for c in node.children if renumbered[c] >= 0]
        return renumbered

    def graft(
        self,
        tokens: Sequence[int],
        probs: Sequence[float],
        *,
        max_branches: int,
        max_nodes: int,
        is_eog: EogTest = (),
    ) -> int | None:
        """Add another drafter's proposal (SpecInfer's several drafters) as a branch from the root.

        Its nodes carry `probs` (that drafter's estimate of each token given the ones before) and
        share any node the tree already has for the same path. The draft never extends it, but may
        draft through its nodes: a draft token equal to a grafted child reuses that node. Returns
        the new branch, or None when the budgets leave no room.
        """
        ends = is_eog if callable(is_eog) else is_eog.__contains__
        if not tokens or len(self.branches) >= max_branches:
            return None
        branch = len(self.branches)
        grafted = Branch(leaf=0, grafted=True)
        self.branches.append(grafted)
        for token, prob in zip(tokens, probs, strict=True):
            # At the node budget a path the tree already has may still be followed (as expand).
            full = len(self.nodes) >= max_nodes
            if grafted.closed or (full and self._child(grafted.leaf, int(token)) is None):
                break
            self._add_child(grafted.leaf, int(token), float(prob), branch, ends)
        if grafted.tokens == 0:  # no room for its first token
            self.branches.pop()
            return None
        return branch

    def expand(
        self,
        branch: int,
        children: Sequence[tuple[int, float]],
        *,
        max_branches: int,
        max_nodes: int,
        is_eog: EogTest = (),
    ) -> list[BranchCopy]:
        """Add the draft's candidates after `branch`'s leaf, which the draft has just evaluated.

        `children` are (token, draft probability), distinct: the first extends the branch (greedy:
        the argmax; sampling: the first draw), each other starts a new branch under the same
        parent, in order, while fewer than max_branches branches and max_nodes nodes exist.
        Returns the KV copies the new branches need. See `branch_children` for greedy children.
        """
        ends = is_eog if callable(is_eog) else is_eog.__contains__
        if self.branches[branch].closed:
            raise ValueError(f"branch {branch} is closed")
        parent = self.branches[branch].leaf
        self.nodes[parent].evaluated = True
        (top, top_prob), others = children[0], children[1:]
        if len(self.nodes) >= max_nodes and self._child(parent, top) is None:
            return []
        self._add_child(parent, int(top), float(top_prob), branch, ends)
        copies: list[BranchCopy] = []
        for token, prob in others:
            if len(self.branches) >= max_branches or len(self.nodes) >= max_nodes:
                break
            if self._child(parent, int(token)) is not None:
                continue  # a grafted branch already goes this way
            new_branch = len(self.branches)
            self.branches.append(Branch(leaf=-1))
            self._add_child(parent, int(token), float(prob), new_branch, ends)
            copies.append(BranchCopy(new_branch, branch, self.nodes[parent].depth + 1))
        return copies

    def _child(self, parent: int, token: int) -> int | None:
        return next((c for c in self.nodes[parent].children if self.nodes[c].token == token), None)

    def _add_child(
        self, parent: int, token: int, prob: float, branch: int, ends: Callable[[int], bool]
    ) -> None:
        """Extend `branch` by `token` under `parent`, through the existing child if there is one
        (a shared path is one node: evaluated once, verified once)."""
        up = self.nodes[parent]
        child = self._child(parent, token)
        if child is None:
            self.nodes.append(Node(token, parent, up.depth + 1, prob, up.confidence * prob, branch))
            child = len(self.nodes) - 1
            up.children.append(child)
        else:  # two drafters agree: trust the surer one
            node = self.nodes[child]
            node.prob = max(node.prob, prob)
            node.confidence = max(node.confidence, up.confidence * prob)
        b = self.branches[branch]
        b.leaf, b.tokens, b.closed = child, b.tokens + 1, ends(token)


# A token this many nats below the draft's best weighs < e^-16 ≈ 1.1e-7 of it in the softmax.
NEGLIGIBLE_NATS = 16.0


def top_candidates(
    logits: np.ndarray, n: int, near_mask: np.ndarray | None = None, first: int | None = None
) -> list[tuple[int, float]]:
    """The draft's n most probable tokens (fewer if fewer lie within NEGLIGIBLE_NATS of the
    best), most probable first, with their probabilities; the lower token id first among
    equals, so the first is the argmax as argmax picks it.

    The softmax's normaliser sums only the tokens within NEGLIGIBLE_NATS of the best: an exp over
    a 150,000-token vocabulary at every tree node would cost more than the rest of the node's
    Python work. The tokens left out change the probabilities by less than 1.1e-7 × vocabulary
    size relative (1.7 % for Qwen's vocabulary if every token sat just below the cut; in practice
    nothing). These probabilities only steer drafting; verification never uses them.
    `near_mask`, a bool array of the vocabulary's size, is reused for the cut: a fresh one would
    be a 150 KB allocation at every draft step. `first`: the argmax, where the caller has it
    (a plain step's token): a second scan of the row would cost as much as the first.
    """
    if first is None:
        first = int(logits.argmax())
    best = logits[first]
    if near_mask is None:
        near_mask = np.empty(logits.shape, dtype=bool)
    np.greater(logits, best - NEGLIGIBLE_NATS, out=near_mask)
    # The argmax alone (n = 1: after every draft step and plain step) needs its rivals' logits,
    # not their indices: gathered by the mask, one pass over it fewer. Each numpy call right
    # after a decode costs microseconds, so the sum is the ufunc's own (`.sum()` is one more
    # Python call) and the exp works in place on the gathered copy (94 -> 73 µs per draft step,
    # median, with the two temporaries this saves).
    near = near_mask.nonzero()[0] if n > 1 else None
    weights = logits[near_mask] if near is None else logits[near]
    if weights.size == 1:
        return [(first, 1.0)]
    weights -= best
    np.exp(weights, out=weights)  # the argmax's weight is exactly 1
    total = float(np.add.reduce(weights))
    if near is None:
        return [(first, 1.0 / total)]
    # The tokens at least as probable as the n-th (ties at the cut included, so that the lower
    # ids win), then plain Python: right after a decode every numpy call costs microseconds
    # (measured in a tree run: ~10 µs each), more than sorting a handful of pairs.
    if near.size > n:
        top = np.flatnonzero(weights >= np.partition(weights, -n)[-n]).tolist()
    else:
        top = range(near.size)
    ranked = sorted((-float(weights[i]), int(near[i])) for i in top)
    rest = [(token, -weight / total) for weight, token in ranked if token != first]
    return [(first, 1.0 / total), *rest[: n - 1]]


def branch_children(
    candidates: Sequence[tuple[int, float]], branch_p: float, top_acceptance: float | None = None
) -> list[tuple[int, float]]:
    """LLMCad's branching rule on `candidates` (top_candidates): the draft's argmax continues
    the branch, and every other candidate whose chance of being the target's token is at least
    branch_p starts one; each comes with that chance, which the tree's confidences multiply.

    LLMCad takes the draft's probability for that chance. A draft may be under- or
    overconfident for its target and task, so `top_acceptance` may give the learnt chance that
    the target agrees with the argmax here; the other candidates then share the rest in the
    draft's proportions. The tree then branches where the draft really is unsure and stays a
    chain where it is not, and its confidences say how likely a branch is to be accepted.
    """
    (top, p_top), others = candidates[0], candidates[1:]
    chance_top = p_top if top_acceptance is None else top_acceptance
    scale = (1.0 - chance_top) / (1.0 - p_top) if p_top < 1.0 else 0.0
    chances = ((token, p * scale) for token, p in others)
    return [(top, chance_top), *((t, c) for t, c in chances if c >= branch_p)]


def sampled_children(
    draws: Sequence[int], probs: np.ndarray, first_acceptance: float | None = None
) -> list[tuple[int, float]]:
    """The distinct tokens of a sampled node's draws (draw_children), in draw order, each with
    its chance of being the target's token: the draft's probability `probs[token]` (LLMCad), or,
    given `first_acceptance` (the learnt chance that the target takes the first draw), that for
    the first, and for each other what the first leaves, in the draft's proportions (as
    branch_children shares it among runner-ups)."""
    tokens = list(dict.fromkeys(draws))
    if first_acceptance is None:
        return [(token, float(probs[token])) for token in tokens]
    first, q_first = tokens[0], float(probs[tokens[0]])
    scale = (1.0 - first_acceptance) / (1.0 - q_first) if q_first < 1.0 else 0.0
    return [(first, first_acceptance), *((t, float(probs[t]) * scale) for t in tokens[1:])]


def may_branch(top_chance: float, branch_p: float) -> bool:
    """Whether any runner-up could start a branch (branch_children) where the argmax's chance of
    being the target's token is `top_chance`: the runner-ups share what the argmax leaves, so
    none reaches branch_p when that is less (by more than rounding)."""
    return 1.0 - top_chance >= branch_p - 1e-9


def verification_batch(tree: TokenTree) -> tuple[list[int], list[int], list[list[int]]]:
    """Tokens, depths and sorted seq ids of every node once, parents before children.

    A node's seq ids are all branches whose root-to-leaf path passes through it. llama.cpp attends
    with a row's first seq id only; that is safe because every branch through a node also holds all
    of the node's ancestors. Nodes are stored in creation order, which already puts parents first.
    """
    seq_ids: list[list[int]] = [[] for _ in tree.nodes]
    for b, branch in enumerate(tree.branches):  # increasing b keeps every list sorted
        for node in tree.path(branch.leaf):
            seq_ids[node].append(b)
    return [n.token for n in tree.nodes], [n.depth for n in tree.nodes], seq_ids


@dataclass(frozen=True)
class Acceptance:
    path: list[int]  # accepted node indices from the root; the root is always accepted
    tokens: list[int]  # the accepted draft tokens: the tokens of path[1:]
    bonus: int  # the target's token after the last accepted node: the next round's root
    branch: int  # a branch (= seq id) holding the whole path: the KV cache to keep


def greedy_accept(tree: TokenTree, target_argmax: np.ndarray) -> Acceptance:
    """SpecInfer's greedy tree verification; target_argmax[i] is the target's argmax at node i."""
    path = [0]
    while True:
        wanted = int(target_argmax[path[-1]])
        children = tree.nodes[path[-1]].children
        match = next((c for c in children if tree.nodes[c].token == wanted), None)
        if match is None:
            break
        path.append(match)
    # Several branches may pass through the last accepted node; credit the most confident one.
    branch = max(tree.branches_through(path[-1]), key=lambda b: tree.leaf(b).confidence)
    tokens = [tree.nodes[n].token for n in path[1:]]
    return Acceptance(path, tokens, int(target_argmax[path[-1]]), branch)


def sampled_accept(
    tree: TokenTree,
    target_probs: Callable[[int], np.ndarray],
    draft_probs: Callable[[int], np.ndarray],
    draws: Mapping[int, Sequence[int]],
    rng: np.random.Generator,
    *,
    overwrite_target_rows: bool = False,
) -> Acceptance:
    """SpecInfer's multi-step speculative sampling down the tree: the emitted tokens follow the
    target's distribution exactly.

    At each node, the draws made from the draft's distribution there (`draws[node]`, duplicates
    included; the tree holds one child per distinct token) are tried against the target's
    distribution; an accepted draw moves into its child, else the residual's sample ends the walk.
    At a node the draft never evaluated (a leaf), the target's own sample ends it. A draw accepted
    for which the tree has no child (a budget cut it) is emitted and ends the walk too.
    With `overwrite_target_rows` a rejection leaves its residual in the row target_probs gave.
    """
    path = [0]
    while True:
        node = path[-1]
        p = target_probs(node)
        node_draws = draws.get(node)
        if not node_draws:
            token = sample(p, rng)
            break
        accepted, token = accept_among_children(
            node_draws, draft_probs(node), p, rng, overwrite_p=overwrite_target_rows
        )
        child = next(
            (c for c in tree.nodes[node].children if tree.nodes[c].token == accepted), None
        )
        if accepted is None or child is None:
            break
        path.append(child)
    branch = max(tree.branches_through(path[-1]), key=lambda b: tree.leaf(b).confidence)
    return Acceptance(path, [tree.nodes[n].token for n in path[1:]], int(token), branch)


@dataclass(frozen=True)
class TreeSummary:
    nodes: int
    branches: int
    max_depth: int
    winner_rank: int  # rank by leaf confidence (0 = most confident) of the accepted branch
    best_drafted: int  # draft tokens on the most confident drafted branch (LLMCad's N_all)
    best_accepted: int  # how many of them the target accepted (N_correct)
    grafted_accepted: int = 0  # accepted tokens that only a grafted (n-gram) branch proposed


def summarize(tree: TokenTree, acceptance: Acceptance) -> TreeSummary:
    by_confidence = sorted(range(len(tree.branches)), key=lambda b: -tree.leaf(b).confidence)
    best = max(tree.drafted_branches(), key=lambda b: tree.leaf(b).confidence)
    best_path = tree.path_of(best)
    drafted = {n for b in tree.drafted_branches() for n in tree.path_of(b)}
    shared = 0
    while shared < min(len(best_path), len(acceptance.path)) and (
        best_path[shared] == acceptance.path[shared]
    ):
        shared += 1
    return TreeSummary(
        nodes=len(tree.nodes),
        branches=len(tree.branches),
        max_depth=tree.depth,
        winner_rank=by_confidence.index(acceptance.branch),
        best_drafted=len(best_path) - 1,
        best_accepted=shared - 1,  # the shared root is no drafted token
        grafted_accepted=sum(node not in drafted for node in acceptance.path),
    )
