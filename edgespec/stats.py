"""The statistics every generation carries, whatever the mode."""

from __future__ import annotations

import resource
import statistics
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

# Fewer plain steps than this time plain decoding too roughly to compare a run with: the first
# steps after a prompt are slower (27 ms where the next took 23-24 on a Zen 5), and one step
# that met another program's burst moves a handful's mean by a tenth.
MIN_PLAIN_STEPS = 16


@dataclass
class TreeStats:
    """What the token trees looked like and why they were verified (mode "tree")."""

    trees: int = 0
    nodes: int = 0  # drafted nodes over all trees (the root not counted)
    max_branches: int = 0  # most branches in one tree
    depth_sum: int = 0
    max_depth: int = 0
    winner_ranks: list[int] = field(default_factory=list)  # [i]: trees won by the i-th branch
    triggers: dict[str, int] = field(default_factory=dict)  # verification causes
    alphas: list[float] = field(default_factory=list)  # alpha in force at each verification
    grafted_accepted: int = 0  # accepted tokens only an n-gram branch proposed

    def record(self, summary: Any, cause: str, alpha: float) -> None:
        self.trees += 1
        self.nodes += summary.nodes - 1
        self.max_branches = max(self.max_branches, summary.branches)
        self.depth_sum += summary.max_depth
        self.max_depth = max(self.max_depth, summary.max_depth)
        rank = summary.winner_rank
        self.winner_ranks.extend([0] * (rank + 1 - len(self.winner_ranks)))
        self.winner_ranks[rank] += 1
        self.triggers[cause] = self.triggers.get(cause, 0) + 1
        self.alphas.append(alpha)
        self.grafted_accepted += summary.grafted_accepted

    def to_dict(self) -> dict[str, object]:
        alphas = self.alphas or [0.0]
        return {
            "trees": self.trees,
            "tree_nodes_per_verify": round(self.nodes / self.trees, 2) if self.trees else 0.0,
            "max_branches": self.max_branches,
            "mean_depth": round(self.depth_sum / self.trees, 2) if self.trees else 0.0,
            "max_depth": self.max_depth,
            "winner_rank_hist": self.winner_ranks,
            "triggers": self.triggers,
            "alpha_min": min(alphas),
            "alpha_median": statistics.median(alphas),
            "alpha_max": max(alphas),
            "ngram_branch_accepted": self.grafted_accepted,
        }


@dataclass
class Stats:
    mode: str = "target"
    n_prompt_tokens: int = 0
    n_prompt_eval: int = 0  # prompt tokens evaluated: the rest was reused from the cache
    n_generated: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0  # time spent in the draft model during decoding
    native_s: float = 0.0  # time inside llama.cpp's decode (both models) during decoding
    target_passes: int = 0  # target decode calls after prefill (verifications, or plain steps)
    draft_evals: int = 0  # draft model evaluations (one token each) spent on proposals
    # LLMCad's pipeline: draft evaluations made while the target verified, the tokens the
    # next chains started with thanks to them, and the target's time they hid
    pipelined_evals: int = 0
    pipelined_kept: int = 0
    overlap_s: float = 0.0
    draft_tokens: int = 0  # tokens proposed for verification
    accepted_tokens: int = 0  # proposed tokens the target agreed with
    # accepted_hist[i]: verifications that accepted exactly i proposed tokens
    accepted_hist: list[int] = field(default_factory=list)
    finish_reason: str = ""
    peak_rss_mb: float = 0.0
    tree: TreeStats | None = None
    choices: dict[str, int] = field(default_factory=dict)  # rounds by what drafted them
    # The decoding time and the tokens of those rounds, by the same names: the plain steps' time
    # a token is plain decoding's rate in the very minutes the drafted rounds ran (plain_rate).
    choice_s: dict[str, float] = field(default_factory=dict)
    choice_tokens: dict[str, int] = field(default_factory=dict)
    # The round under way's choice, for record_round: bookkeeping, not a statistic.
    _round_choice: str = field(default="", init=False, repr=False, compare=False)
    placement: str = ""  # where the target and the draft were to run
    # Read back from the kernel when generation ended: how many of the process's threads may
    # run on each CPU set ({"0-3": 5, "4-7": 2}), i.e. where llama.cpp's workers really are.
    threads_by_cpus: dict[str, int] = field(default_factory=dict)
    # The threads each model decoded with when generation ended, of the most it may use
    # ({"target": "1/2"}), and how often they changed during it: fewer while other programs
    # kept cores busy (governor.py).
    threads: dict[str, str] = field(default_factory=dict)
    thread_switches: int = 0

    def record_choice(self, choice: str) -> None:
        self.choices[choice] = self.choices.get(choice, 0) + 1
        self._round_choice = choice

    def record_round(self, seconds: float, tokens: int) -> None:
        """The round just made took `seconds` and decided `tokens`: counted under its choice
        (none for modes that record no choices)."""
        choice = self._round_choice
        if choice:
            self.choice_s[choice] = self.choice_s.get(choice, 0.0) + seconds
            self.choice_tokens[choice] = self.choice_tokens.get(choice, 0) + tokens
            self._round_choice = ""

    @property
    def plain_rate(self) -> float | None:
        """Tokens a second of this run's own plain steps (auto's, ngram's), None with fewer than
        MIN_PLAIN_STEPS of them: plain decoding's speed timed in the same minutes as the rounds
        that drafted, where a run of plain decoding before or after this one may have met
        another load on a shared machine (a prompt's repeats were 15 % apart, median, here)."""
        steps = self.choice_tokens.get("plain", 0)
        seconds = self.choice_s.get("plain", 0.0)
        if steps < MIN_PLAIN_STEPS or seconds <= 0:
            return None
        return steps / seconds

    @property
    def in_run_ratio(self) -> float | None:
        """The run's tokens a second over its own plain steps' (plain_rate): what its drafted
        rounds gained or lost against plain steps, within the run. An estimate of the speed-up
        over plain decoding that a shared machine's drift between two runs does not move. Its
        plain steps carry auto's own work per round too (about half a millisecond more than
        plain decoding's, in steps of 60-120 ms here), which leans it a little above a paired
        ratio."""
        rate = self.plain_rate
        return None if rate is None or self.tokens_per_s <= 0 else self.tokens_per_s / rate

    @property
    def tokens_per_s(self) -> float:
        return self.n_generated / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def overhead_ms_per_pass(self) -> float:
        """Our own (Python) time per target pass: decoding time not spent inside llama.cpp."""
        if not self.target_passes:
            return 0.0
        return max(self.decode_s - self.native_s, 0.0) * 1000 / self.target_passes

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over drafted; None when nothing was drafted (no rate, not a rate of 0)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def verifications(self) -> int:
        return sum(self.accepted_hist)

    @property
    def mean_accepted(self) -> float | None:
        """Accepted proposed tokens per verification (the target's own token not counted); None
        without a verification."""
        return self.accepted_tokens / self.verifications if self.verifications else None

    def record_verification(self, proposed: int, accepted: int) -> None:
        self.draft_tokens += proposed
        self.accepted_tokens += accepted
        if len(self.accepted_hist) <= accepted:
            self.accepted_hist.extend([0] * (accepted + 1 - len(self.accepted_hist)))
        self.accepted_hist[accepted] += 1

    def finish(self, reason: str) -> None:
        self.finish_reason = reason
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # ru_maxrss is KiB on Linux, bytes on macOS.
        self.peak_rss_mb = rss / 2**20 if sys.platform == "darwin" else rss / 1024

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        del out["_round_choice"]
        out["tree"] = self.tree.to_dict() if self.tree else None
        out.update(
            tokens_per_s=round(self.tokens_per_s, 2),
            acceptance_rate=_rounded(self.acceptance_rate, 4),
            mean_accepted=_rounded(self.mean_accepted, 3),
            verifications=self.verifications,
            prefill_s=round(self.prefill_s, 4),
            decode_s=round(self.decode_s, 4),
            draft_s=round(self.draft_s, 4),
            native_s=round(self.native_s, 4),
            overlap_s=round(self.overlap_s, 4),
            overhead_ms_per_pass=round(self.overhead_ms_per_pass, 3),
            choice_s={choice: round(s, 4) for choice, s in self.choice_s.items()},
            in_run_ratio=_rounded(self.in_run_ratio, 3),
            peak_rss_mb=round(self.peak_rss_mb, 1),
        )
        return out

    def summary(self) -> str:
        line = (
            f"{self.n_generated} tokens, {self.tokens_per_s:.1f} tok/s, "
            f"prompt {self.n_prompt_tokens} tokens in {self.prefill_s:.2f} s, mode {self.mode}"
        )
        rate, mean = self.acceptance_rate, self.mean_accepted
        if rate is not None and mean is not None:  # something was drafted
            line += (
                f", acceptance {rate:.0%}, mean accepted {mean:.2f}"
                f", {self.target_passes} target passes"
            )
        if self.pipelined_evals:
            line += (
                f", pipeline {self.pipelined_evals} draft steps during verification"
                f" ({self.pipelined_kept} tokens kept)"
            )
        if self.tree and self.tree.trees:
            line += f", {self.tree.nodes / self.tree.trees:.1f} nodes per tree"
        if self.choices:
            line += ", rounds " + " ".join(f"{what} {n}" for what, n in self.choices.items())
            if self.in_run_ratio is not None and set(self.choices) != {"plain"}:
                line += f" ({self.in_run_ratio:.2f}x the rate of its own plain steps)"
        if self.finish_reason == "context":
            line += ", stopped: the context is full (a larger --ctx-size holds more)"
        elif self.finish_reason == "superseded":
            line += ", stopped: another generation began on the same engine, or it was closed"
        if self.thread_switches:
            now = " ".join(f"{role} {n}" for role, n in self.threads.items())
            line += (
                f", threads changed {self.thread_switches}x as other programs took cores"
                f" (now {now})"
            )
        return line


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
