"""Which branch the draft extends next and when the target verifies: LLMCad's pacer and fallback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from edgespec.tree import TokenTree


class Scheduler(Protocol):
    def pick(self, tree: TokenTree) -> int | None:
        """The branch to extend by one token, or None when no branch is open."""
        ...


class GreedyScheduler:
    """Always extend the most confident open branch."""

    def pick(self, tree: TokenTree) -> int | None:
        return max(tree.open_branches(), key=lambda b: tree.leaf(b).confidence, default=None)


@dataclass
class PacerScheduler:
    """LLMCad's pacer: of budget_tokens draft tokens, branch i deserves M·C_i/ΣC over the open
    branches; extend the open branch furthest below its share (max-min fairness)."""

    budget_tokens: int

    def pick(self, tree: TokenTree) -> int | None:
        branches = tree.open_branches()
        # `or 1.0`: confidences can underflow to zero; then the least-drafted branch goes next.
        total = sum(tree.leaf(b).confidence for b in branches) or 1.0

        def below_share(b: int) -> float:
            share = self.budget_tokens * tree.leaf(b).confidence / total
            return share - tree.branches[b].tokens

        return max(branches, key=below_share, default=None)


@dataclass(frozen=True)
class TriggerConfig:
    """The tree's budget; the confidence threshold α is the round's (it moves: verify_cause)."""

    max_nodes: int = 16  # tree size budget, root included: bounds the verification batch
    max_depth: int = 8


def verify_cause(tree: TokenTree, alpha: float, cfg: TriggerConfig) -> str | None:
    """Why the target should verify the tree now: "end", "confidence", "budget", or None."""
    # Grafted (n-gram) branches are verified but never drafted on: they take no part here.
    open_branches = tree.open_branches()
    drafted = tree.drafted_branches()
    most_confident = max(drafted, key=lambda b: tree.leaf(b).confidence)
    if not open_branches or tree.branches[most_confident].closed:
        return "end"
    # Tree confidence T_c: the best chance that the draft is still on the target's path.
    if max(tree.leaf(b).confidence for b in open_branches) < alpha:
        return "confidence"
    depth = max(tree.leaf(b).depth for b in drafted)
    if len(tree.nodes) >= cfg.max_nodes or depth >= cfg.max_depth:
        return "budget"
    return None


def next_alpha(
    alpha: float, drafted: int, accepted: int, floor: float = 1e-4, ceil: float = 1.0
) -> float:
    """LLMCad's self-adaptive fallback, from the most confident branch's drafted/accepted counts.

    All accepted: the draft is doing well, so halve alpha and draft longer before verifying.
    Otherwise alpha becomes the rejected fraction: the more was wrong, the sooner the next check.
    """
    if drafted == 0:
        return alpha
    alpha = alpha * 0.5 if accepted >= drafted else (drafted - accepted) / drafted
    return min(max(alpha, floor), ceil)
