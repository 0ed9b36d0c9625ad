"""How many threads a model decodes with while other programs compete for the cores.

llama.cpp splits every matrix product evenly across its threads, and at each of the graph's
hundreds of barriers all of them wait for the slowest. When another program keeps a core busy,
the thread sharing that core runs only part of the time and holds the others back. Measured here
(Qwen2.5-Coder 1.5B Q4_K_M, 2 threads on 2 cores, one busy process beside it): 135-330 ms a
step, against 115-140 ms with one thread and 70-90 ms with two on a quiet machine. On a phone,
where other apps run, this is the usual case, not the exception.

ThreadGovernor watches how long each decode takes against what the device's profile says it
should, tries one thread fewer when decodes are much slower than that, and keeps it if it is
faster; on fewer threads it tries one more now and then, as the other programs may be gone. A
pure policy: it sees times, not the model, and is tested with made-up ones.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median


@dataclass
class ThreadGovernor:
    """Chooses the thread count for the next decode from the times of the last ones.

    Times are given in plain steps' seconds (a pass's seconds over its cost relative to one
    step), so passes of any size compare. Trials are short (`trial_decodes` decodes) and end at
    the first decode that is far slower than the current count's, so a wrong trial costs about
    one decode; failed trials wait twice as long each time before the next (up to
    `max_retry_s` of decoding), so a machine that is merely slower than its profile, or a count
    that stays best, costs almost nothing.
    """

    max_threads: int
    # A plain step at max_threads on this device when it was quiet (its profile); None: the
    # fastest seen so far stands for it.
    reference_s: float | None = None
    slow: float = 1.5  # decodes this much slower than expected start a trial of one thread fewer
    window: int = 5  # decodes whose median is the current count's speed
    trial_decodes: int = 3
    better: float = 0.9  # a trial count is kept if its median is at most this times the current
    abort: float = 1.5  # a trial decode this much slower than the current median ends the trial
    first_retry_s: float = 2.0  # seconds of decoding before trying again after a failed trial
    max_retry_s: float = 32.0

    threads: int = field(init=False)
    switches: int = field(init=False, default=0)  # counts kept after a trial, so far
    _recent: deque[float] = field(init=False)
    _best: dict[int, float] = field(init=False, default_factory=dict)  # fastest window median
    _trial: int | None = field(init=False, default=None)
    _trial_times: list[float] = field(init=False, default_factory=list)
    _clock: float = field(init=False, default=0.0)  # seconds of decoding observed
    _next_try: dict[int, float] = field(init=False)  # per direction (-1, +1): clock of next trial
    _retry: dict[int, float] = field(init=False)

    def __post_init__(self) -> None:
        if self.max_threads < 1:
            raise ValueError(f"max_threads must be at least 1 (got {self.max_threads})")
        self.threads = self.max_threads
        self._recent = deque(maxlen=self.window)
        self._next_try = {-1: 0.0, +1: 0.0}
        self._retry = {-1: self.first_retry_s, +1: self.first_retry_s}

    def observe(self, seconds: float, relative_cost: float = 1.0) -> int:
        """A decode took `seconds`, a pass costing `relative_cost` plain steps: the thread count
        for the next one."""
        self._clock += seconds
        step_s = seconds / relative_cost
        if self._trial is not None:
            return self._judge_trial(step_s)
        self._recent.append(step_s)
        if len(self._recent) < self.window:
            return self.threads
        current = median(self._recent)
        if current < self._best.get(self.threads, float("inf")):
            self._best[self.threads] = current
        if self.threads > 1 and self._clock >= self._next_try[-1]:
            expected = self._best[self.threads]
            if self.threads == self.max_threads and self.reference_s is not None:
                expected = min(expected, self.reference_s)
            if current > self.slow * expected:
                return self._start_trial(-1)
        if self.threads < self.max_threads and self._clock >= self._next_try[+1]:
            return self._start_trial(+1)
        return self.threads

    def _start_trial(self, direction: int) -> int:
        self._trial = self.threads + direction
        self._trial_times.clear()
        return self._trial

    def _judge_trial(self, step_s: float) -> int:
        assert self._trial is not None
        current = median(self._recent)
        self._trial_times.append(step_s)
        direction = self._trial - self.threads
        if step_s > self.abort * current:
            return self._end_trial(direction, kept=False)
        if len(self._trial_times) < self.trial_decodes:
            return self._trial
        return self._end_trial(direction, kept=median(self._trial_times) <= self.better * current)

    def _end_trial(self, direction: int, kept: bool) -> int:
        assert self._trial is not None
        if kept:
            self.threads = self._trial
            self.switches += 1
            self._recent.clear()
            self._recent.extend(self._trial_times)
            # Back the other way soon: the other programs may stop at any time.
            self._retry = {-1: self.first_retry_s, +1: self.first_retry_s}
            self._next_try[-direction] = self._clock + self.first_retry_s
        else:
            self._next_try[direction] = self._clock + self._retry[direction]
            self._retry[direction] = min(2 * self._retry[direction], self.max_retry_s)
        self._trial = None
        return self.threads
