"""Would LLMCad's pipeline pay here: the draft drafting on its own cores while the target verifies?

Measured with the real models, for one chain round of k draft tokens:
- serial: k draft steps, then one target pass over k+1 tokens, each on all the cores;
- pipelined: the same work, each model on its own share of the cores, at the same time.

Pipelining wins only if the longer of the two concurrent parts is shorter than the serial sum.
On a phone the draft would take idle little cores; on uniform cores it takes cores away from the
target, and both share one memory bus, so the contention is part of what is measured here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .backend import Context, Model
from .cores import PinnedThread, available_cpus

CONTEXT_TOKENS = 64
# Before each part timed alone, a pause: right after the serial round on all cores, the target's
# pass alone on its share took a median 50-55 ms in 4 of 18 runs here where it took 45-47 in the
# others (what just ran on all cores still in its way, it seems); so paused, pipelined over the
# longer part alone was 0.97-1.07 in 10 runs (0.89-1.07 before). Not before the rounds the
# verdict compares: paused before every measure, the serial round took 62-74 ms instead of
# 50-52, not what back-to-back rounds cost.
SETTLE_S = 0.05


@dataclass
class OverlapReport:
    k: int
    target_cpus: list[int]
    draft_cpus: list[int]
    serial_s: float  # k draft steps then a target pass of k+1, all cores, one after the other
    target_alone_s: float  # the target pass on its share of the cores, nothing else running
    draft_alone_s: float  # the k draft steps on their share, nothing else running
    pipelined_s: float  # both at once, each on its share

    @property
    def speedup(self) -> float:
        """Serial round time over pipelined: above 1 the pipeline pays."""
        return self.serial_s / self.pipelined_s


class _Timed:
    """A context prefilled with CONTEXT_TOKENS tokens, timing passes after them."""

    def __init__(self, model: Model, n_threads: int, pinned: PinnedThread | None):
        self.ctx = Context(model, n_ctx=256, n_threads=n_threads, pinned=pinned)
        rng = np.random.default_rng(0)
        ids = rng.integers(0, model.n_vocab, size=CONTEXT_TOKENS + 33).tolist()
        self.batch = ids[CONTEXT_TOKENS:]
        self.ctx.decode(ids[:CONTEXT_TOKENS], 0, logits="none")

    def target_pass(self, k: int) -> float:
        t0 = time.perf_counter()
        self.ctx.decode(self.batch[: k + 1], CONTEXT_TOKENS, logits="all")
        elapsed = time.perf_counter() - t0
        self.ctx.seq_rm(0, CONTEXT_TOKENS)
        return elapsed

    def draft_steps(self, k: int) -> float:
        t0 = time.perf_counter()
        for i in range(k):
            self.ctx.decode(self.batch[i : i + 1], CONTEXT_TOKENS + i)
        elapsed = time.perf_counter() - t0
        self.ctx.seq_rm(0, CONTEXT_TOKENS)
        return elapsed

    def close(self) -> None:
        self.ctx.close()


def measure_overlap(
    target: str | Path,
    draft: str | Path,
    target_cpus: list[int],
    draft_cpus: list[int],
    k: int = 4,
    repeats: int = 7,
) -> OverlapReport:
    """Time a serial and a pipelined chain round (medians of `repeats`, interleaved)."""
    target_model, draft_model = Model(target), Model(draft)
    all_cpus = sorted(available_cpus())
    pins = [PinnedThread(target_cpus, "target"), PinnedThread(draft_cpus, "draft")]
    target_all = _Timed(target_model, len(all_cpus), None)
    draft_all = _Timed(draft_model, len(all_cpus), None)
    target_own = _Timed(target_model, len(target_cpus), pins[0])
    draft_own = _Timed(draft_model, len(draft_cpus), pins[1])

    def pipelined() -> float:
        t0 = time.perf_counter()
        drafting = pins[1].submit(draft_own.draft_steps, k)  # the draft's loop on its own thread
        target_own.target_pass(k)
        drafting.result()
        return time.perf_counter() - t0

    def settled(part: Callable[[int], float]) -> Callable[[], float]:
        def measure() -> float:
            time.sleep(SETTLE_S)
            return part(k)

        return measure

    measures: dict[str, Callable[[], float]] = {
        "serial": lambda: draft_all.draft_steps(k) + target_all.target_pass(k),
        "target_alone": settled(target_own.target_pass),
        "draft_alone": settled(draft_own.draft_steps),
        "pipelined": pipelined,
    }
    times: dict[str, list[float]] = {name: [] for name in measures}
    try:
        for measure in measures.values():  # warm-up
            measure()
        for _ in range(repeats):
            for name, measure in measures.items():
                times[name].append(measure())
    finally:
        for pin in pins:  # first: a decode still running there (after Ctrl+C) must end
            pin.close()
        for timed in (target_all, draft_all, target_own, draft_own):
            timed.close()
    median = {name: statistics.median(t) for name, t in times.items()}
    return OverlapReport(
        k=k,
        target_cpus=target_cpus,
        draft_cpus=draft_cpus,
        serial_s=median["serial"],
        target_alone_s=median["target_alone"],
        draft_alone_s=median["draft_alone"],
        pipelined_s=median["pipelined"],
    )
