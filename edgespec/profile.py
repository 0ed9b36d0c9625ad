"""The device's cost curve: how long one target pass over k tokens takes, T(k), relative to T(1).

On a CPU a verification pass is far from free (docs/speed.md): each extra token costs about half
a decode step, and the curve has sweet spots where the kernels' row blocks fill up. How many tokens
to draft and verify must be chosen from this device's own curve, so it is measured here, stored
under `home()/profiles/`, and found again by model file, thread count and CPU set.
"""

from __future__ import annotations

import json
import math
import random
import re
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from functools import cached_property
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from .backend import Context, Model
from .catalogue import home
from .cores import (
    PinnedThread,
    available_cpus,
    cpu_identity,
    format_cpu_list,
    parse_cpu_list,
)
from .errors import BadSettingError
from .files import exclusive, written_into_place
from .gguf_info import check_generates, read_gguf

# Every size: auto verifies passes only of sizes measured here (policy.Costs.sizes), and the
# curve is not smooth (on a Zen 4 here T(15) 10.2, T(16) 8.2, T(17) 10.2 steps).
FULL_KS = tuple(range(1, 33))
# Up to the longest n-gram proposal (engine.MAX_NGRAM_DRAFT): beyond its last point the curve
# grows in proportion to k, which would never let a proposal longer than 16 look worth it. Every
# size up to 8, where most chains and n-gram passes fall, then the sizes where batches verify
# cheaply on CPUs (powers of two). A size between two measured ones is priced as the next one
# up (policy.Costs.steps), and on a Zen 3 here T(5..7) are 2.8-3.9 steps where T(8) is 5.1-6.3:
# measured at 4 and 8 only, every pass of 5 to 7 tokens looked as dear as one of 8, so no n-gram
# proposal of 4 to 6 tokens was verified (llama-cpp-python's prompt lookup, which verifies 5
# tokens at a time, made 1.26x plain on summarise-incident where auto made 1.03).
QUICK_KS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)
CONTEXT_TOKENS = 256  # a realistic KV length: attention over the prompt is part of every pass
# Quick: a shorter prefix, because prefilling 256 tokens alone takes ~3 s for a 1.5B model on
# 2 cores; the pass times barely depend on it at these lengths.
QUICK_CONTEXT_TOKENS = 64
QUICK_BUDGET_S = 4.0
NOISY = 0.10  # a profile whose timings vary more than this was taken on a busy machine
# A quick profile's three rounds vary more on a quiet machine too (0.14 for SmolLM2's draft in
# the test suite, alone); three processes started together made 0.32-0.57.
NOISY_QUICK = 0.25
# What first use measures once (a device profile; which form of the draft is fastest, drafts.py)
# is measured again on the next first use where other programs kept the cores busy meanwhile,
# until this many such measurements in a row (a device that is always busy keeps what it has).
# Beside a busy core here, seven quick profiles of the 1.5B target (noise 0.35-0.77) put a step
# at 63-178 ms and T(32) at 2.6-17.9 steps, where fourteen quiet ones (noise 0.02-0.12) put them
# at 24-27 ms and 8.7-11.1: kept, such a curve priced every later run's passes.
BUSY_MEASUREMENTS = 3
BUSY_SPREAD = 1.1  # see timed_busy
# How the stored curves are measured. 2: each pass paired with a plain step (curve_from_times).
# Profiles measured otherwise (1: separate medians, T(2) 1.32 and 1.65 in two runs here) are
# measured again rather than trusted.
PROFILE_METHOD = 2
SHUFFLE_SEED = 1234

# Attention by llama.cpp's flash attention kernel, or by matrix products: which is faster depends
# on the CPU. On a Zen 3 here (2 vCPUs, Qwen2.5-Coder-1.5B) without it a plain step after 450-1500
# tokens of context took 8-18 % less time and passes of 2-33 tokens up to 28 % less (one of 4
# after 800 tokens 7 % more), even after 300;
# on Arm Neoverse V cores llama.cpp's issue #27086 found prompts faster without, steps with. So
# `edgespec profile` times both: a plain step and a pass of ATTENTION_K after ATTENTION_CONTEXT.
ATTENTION_CONTEXT = 512
ATTENTION_K = 8
ATTENTION_REPEATS = 6
# llama.cpp's own choice (flash attention, on a CPU) stays unless the other is this much faster.
ATTENTION_MARGIN = 0.05

# T(k)/T(1) of Qwen2.5-Coder-1.5B Q4_K_M on a 2-vCPU Zen 5 (docs/speed.md): a steep curve, so a
# policy planned on it drafts cautiously until the device's own curve is measured.
DEFAULT_RELATIVE: dict[int, float] = {
    1: 1.00, 2: 1.64, 3: 2.20, 4: 2.63, 5: 3.32, 6: 3.94, 8: 4.56,
    10: 5.38, 12: 5.52, 16: 5.16, 24: 8.01, 32: 9.30,
}  # fmt: skip


def measure_curve(
    ctx: Context,
    ks: Sequence[int] = FULL_KS,
    repeats: int = 5,
    context_tokens: int = CONTEXT_TOKENS,
    *,
    budget_s: float | None = None,
) -> dict[int, float]:
    """Seconds of one decode pass of k tokens (see measure_times and curve_from_times)."""
    return curve_from_times(measure_times(ctx, ks, repeats, context_tokens, budget_s=budget_s))


def curve_from_times(times: Mapping[int, Sequence[tuple[float, float]]]) -> dict[int, float]:
    """{k: seconds} from measure_times' pairs: T(1) is the median step, and T(k) is T(1) times
    the median of each pass's time over that of the step right before it. A machine whose speed
    drifts while it is measured (other work coming and going) slows a pass and its step alike,
    so the ratio holds where separate medians of the two would not."""
    step = statistics.median(s for pairs in times.values() for s, _ in pairs)
    return {k: step if k == 1 else step * in_steps(pairs) for k, pairs in times.items()}


def in_steps(pairs: Sequence[tuple[float, float]]) -> float:
    """A pass in plain steps: the median of its (step, pass) pairs' ratios."""
    return statistics.median(t / s for s, t in pairs)


def noise(times: Mapping[int, Sequence[tuple[float, float]]]) -> float:
    """How much repeated measurements disagreed: the largest median absolute deviation, relative
    to the median, of the plain steps and of each k's pass-to-step ratios; 0 when all agree."""

    def spread(values: list[float]) -> float:
        middle = statistics.median(values)
        return statistics.median(abs(v - middle) for v in values) / middle

    steps = [s for pairs in times.values() for s, _ in pairs]
    ratios = [[t / s for s, t in pairs] for k, pairs in times.items() if k != 1]
    return max(spread(values) for values in [steps, *ratios])


def measure_times(
    ctx: Context,
    ks: Sequence[int] = FULL_KS,
    repeats: int = 5,
    context_tokens: int = CONTEXT_TOKENS,
    *,
    budget_s: float | None = None,
) -> dict[int, list[tuple[float, float]]]:
    """Timed decode passes of k tokens with logits for all k (as a verification), each right
    after a timed plain step (k = 1) at the same position: {k: [(step s, pass s) per round]}.

    The pairs are what makes the curve hold on a busy machine (curve_from_times); the steps are
    also the measurements of T(1), which is always measured. Clears `ctx`, prefills
    `context_tokens` tokens, then times every pass at the positions after that prefix and
    removes its tokens again, so every pass sees the same cache length. Each round times every
    k once in a shuffled order: slow drift spreads over all k instead of biasing the ones
    measured last. With `budget_s`, rounds stop once that much time has passed since the start,
    prefill and warm-up included (after at least one round); then, while some sizes are
    `out_of_order`, those of them with fewer than `repeats` pairs are timed again. Ascending in k.
    """
    ks = sorted(set(ks) | {1})
    if ks[0] < 1 or repeats < 1 or context_tokens < 0:
        raise BadSettingError("ks must be positive, repeats at least 1, context_tokens >= 0")
    if ks[-1] > ctx.n_batch or context_tokens + ks[-1] > ctx.n_ctx:
        raise BadSettingError(
            f"k = {ks[-1]} after {context_tokens} context tokens does not fit the context "
            f"(n_ctx {ctx.n_ctx}, n_batch {ctx.n_batch})"
        )
    # Which tokens does not matter for the time a pass takes; any valid ids do.
    rng = np.random.default_rng(SHUFFLE_SEED)
    ids = rng.integers(0, ctx.model.n_vocab, size=context_tokens + ks[-1]).tolist()
    prefix, batch = ids[:context_tokens], ids[context_tokens:]

    def timed_pass(k: int) -> float:
        _stop_if_asked()
        start = time.perf_counter()
        ctx.decode(batch[:k], context_tokens, logits="all")
        elapsed = time.perf_counter() - start
        ctx.seq_rm(0, context_tokens, -1)
        return elapsed

    # A profile is of the threads the context was made with, whatever its governor chose.
    with ctx.fixed_threads():
        started = time.perf_counter()
        ctx.clear()
        if prefix:
            ctx.decode(prefix, 0, logits="none")
        # Warm-up: the first passes pay for allocating buffers and for cold caches. Once the largest
        # pass has run, the first pass of each smaller size takes what its next ones take (here:
        # 5, 6, 7, 3 tokens 221 / 323 / 363 / 186 ms first, 217-259 / 318-334 / 353-358 / 182-186
        # ms after), so only it and a step are warmed, not every size: that time goes to measuring.
        for k in dict.fromkeys((ks[-1], 1)):  # one step alone where only steps are measured
            timed_pass(k)
        times: dict[int, list[tuple[float, float]]] = {k: [] for k in ks}

        def time_pass_after_step(k: int) -> None:
            step = timed_pass(1)
            times[k].append((step, step if k == 1 else timed_pass(k)))

        order = random.Random(SHUFFLE_SEED)
        for _ in range(repeats):
            for k in order.sample(ks, len(ks)):
                time_pass_after_step(k)
            if budget_s is not None and time.perf_counter() - started > budget_s:
                break
        # Past the budget, sizes that came out of order get the rounds they missed: a size priced
        # too dear is never verified, so never timed again (a quick profile here put T(5) at 3.47
        # steps and T(6) at 2.76, one pass each, and the passes auto timed in the 100 minutes of
        # benches after it include none of 5 tokens).
        while again := [k for k in out_of_order(times) if len(times[k]) < repeats]:
            for k in again:
                time_pass_after_step(k)
        return times


# Up to this size a pass of the Qwen 1.5B target (Q4_K_M) over more tokens never cost less than
# one over fewer in the full profiles of the Zen 3, 4 and 5 here; above it the kernels' bands make
# saws (a Zen 4: T(15) 10.2 steps, T(16) 8.2). Where a single timing says otherwise it is usually
# noise (half of six quick profiles on the Zen 3 had a size out of order, none after the timings
# they missed); where it holds, as it seems to for the Q4_0 draft here (T(4) below T(3) in five
# of seven profiles, three timings each), it is timed `repeats` times and kept.
ORDERED_UP_TO = 8


def out_of_order(times: Mapping[int, Sequence[tuple[float, float]]]) -> list[int]:
    """The sizes up to ORDERED_UP_TO whose passes measured dearer than those of the next size
    measured, relative to their steps (as curve_from_times prices them), and that next size."""
    steps = {
        k: in_steps(pairs) for k, pairs in sorted(times.items()) if pairs and k <= ORDERED_UP_TO
    }
    inverted = [(a, b) for a, b in pairwise(steps) if steps[a] > steps[b]]
    return sorted({k for pair in inverted for k in pair})


def relative_cost(curve: Mapping[int, float], k: float) -> float:
    """T(k)/T(1) from a curve of {k: T(k)/T(1)} (or {k: seconds}, then in seconds).

    Linear between the measured points, with T(0) = 0 (no pass). Beyond the largest measured k the
    cost grows in proportion to k: past the kernels' sweet spots a pass is compute-bound, and the
    slope between the last two points of a non-monotone curve can be flat or even negative.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0 (got {k})")
    lo_k, lo_cost = 0, 0.0
    for hi_k, hi_cost in sorted(curve.items()):
        if k <= hi_k:
            return lo_cost + (hi_cost - lo_cost) * (k - lo_k) / (hi_k - lo_k)
        lo_k, lo_cost = hi_k, hi_cost
    return lo_cost * k / lo_k


@dataclass
class DeviceProfile:
    """The measured cost curve of one model file on this device, with these threads and CPUs."""

    model_file: str  # the file's name, not its path: a moved file keeps its profile
    model_size: int
    n_threads: int
    cpus: str  # the CPU set the threads ran on, e.g. "0-3"
    ks: list[int]
    seconds: list[float]  # seconds of one pass of ks[i] tokens (curve_from_times)
    measured_at: str  # ISO 8601, UTC
    noise: float = 0.0  # see noise(): above NOISY the machine was busy while measuring
    method: int = PROFILE_METHOD  # see PROFILE_METHOD; files without it are method 1
    # With llama.cpp's flash attention or without, as found faster here (measure_attention),
    # the curve measured so; None: not measured (the first-use profile), llama.cpp decides.
    flash_attn: bool | None = None
    # Seconds of a plain step and a pass of ATTENTION_K tokens: [with flash attention, without].
    attention_s: list[float] | None = None
    # First-use measurements in a row that found the device busy, this one's included (see
    # kept_profile); 0 for a quiet one.
    busy_measurements: int = 0

    @property
    def quick(self) -> bool:
        """Measured at the quick sizes only (first use, --quick): a full profile knows more."""
        return set(self.ks) <= set(QUICK_KS)

    @property
    def busy(self) -> bool:
        """Measured while other programs kept the cores busy: its timings are the load's as much
        as the device's, so it neither prices passes nor governs threads (engine.Engine)."""
        return self.noise > NOISY_QUICK

    @property
    def measured_again(self) -> bool:
        """Whether the next first use measures it again: a busy first-use profile, until
        BUSY_MEASUREMENTS of them in a row (one an older edgespec stored counts as one)."""
        return self.quick and self.busy and self.busy_measurements < BUSY_MEASUREMENTS

    @property
    def step_s(self) -> float:
        """T(1): one plain decoding step."""
        return self.seconds[self.ks.index(1)]

    @cached_property
    def _curve(self) -> dict[int, float]:
        return dict(zip(self.ks, self.seconds, strict=True))

    def relative(self, k: float) -> float:
        """T(k)/T(1), interpolated between measured ks and proportional beyond the last; at
        least 1 from k = 1 on: a pass does at least one token's work, and a profile timed
        beside a busy core put a batch below a step (scripts/ceiling.py then priced catching the
        draft up below a draft step, 2026-11-30)."""
        value = relative_cost(self._curve, k) / self.step_s
        return max(value, 1.0) if k >= 1 else value

    def cost(self, k: float) -> float:
        """Seconds of one pass over k tokens."""
        return self.relative(k) * self.step_s

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceProfile:
        """Rebuild a profile, or raise ValueError/TypeError/KeyError if it is not a sound one."""
        profile = cls(
            model_file=str(data["model_file"]),
            model_size=int(data["model_size"]),
            n_threads=int(data["n_threads"]),
            cpus=str(data["cpus"]),
            ks=[int(k) for k in data["ks"]],
            seconds=[float(s) for s in data["seconds"]],
            measured_at=str(data["measured_at"]),
            noise=float(data.get("noise", 0.0)),
            method=int(data.get("method", 1)),
            flash_attn=data.get("flash_attn"),
            attention_s=data.get("attention_s"),
            busy_measurements=int(data.get("busy_measurements", 0)),
        )
        if profile.flash_attn not in (None, True, False):
            raise ValueError("flash_attn must be true, false or absent")
        if profile.attention_s is not None:
            profile.attention_s = [float(s) for s in profile.attention_s]
            if len(profile.attention_s) != 2:
                raise ValueError("attention_s must hold two times")
        ks_ok = profile.ks == sorted(set(profile.ks)) and 1 in profile.ks
        if not ks_ok or len(profile.seconds) != len(profile.ks):
            raise ValueError("ks must be ascending, distinct, include 1 and match seconds")
        if not all(s > 0 for s in profile.seconds):
            raise ValueError("every pass must take some time")
        return profile


# --- Where profiles live ------------------------------------------------------------------------


def current_cpus() -> str:
    """The CPUs this thread may run on, as a list of ranges ("0-3,6")."""
    return format_cpu_list(sorted(available_cpus()))


def profiles_dir() -> Path:
    """Where what was measured on this kind of CPU is kept: `home()/profiles/<cpu_identity>`.
    The same model file costs otherwise on another CPU (a VM moved to another host here went
    from a Zen 5 to a Zen 4, where a pass of 16 tokens cost 8.4 plain steps instead of 5.3):
    there nothing is found and everything is measured afresh."""
    return home() / "profiles" / re.sub(r"[^A-Za-z0-9.+-]+", "_", cpu_identity()).strip("_")


def measuring_alone(say: Callable[[str], None]) -> AbstractContextManager[None]:
    """Held while this process measures the device or makes a model's first-use files: processes
    started together measured each other's load into their profiles, and each made the same
    copies. The next one waits, then finds what the first measured or made."""
    return exclusive(
        home() / "measuring.lock",
        lambda: say("another edgespec is measuring this device or preparing a model: waiting"),
    )


def profile_key(model_file: str, model_size: int, n_threads: int, cpus: str) -> str:
    """A file-name-safe key; a changed file (new size), thread count or CPU set misses."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", model_file)
    return f"{stem}-{model_size}-t{n_threads}-cpus{cpus.replace(',', '_')}"


def profile_path(profile: DeviceProfile) -> Path:
    key = profile_key(profile.model_file, profile.model_size, profile.n_threads, profile.cpus)
    return profiles_dir() / f"{key}.json"


def save_profile(profile: DeviceProfile) -> Path:
    """Write the profile (atomically, replacing any older or corrupt one); return its path."""
    path = profile_path(profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_into_place(path) as tmp:
        tmp.write_text(json.dumps(profile.to_dict(), indent=1) + "\n", "utf-8")
    return path


def load_profile(
    model_path: str | Path, n_threads: int, cpus: str | None = None, n_ctx: int | None = None
) -> DeviceProfile | None:
    """The saved profile of this model file, thread count and CPU set (default: this thread's
    CPUs), or None if there is none, or it is unreadable, does not match or was measured the old
    way (PROFILE_METHOD) or at fewer sizes than a context of `n_ctx` tokens (any) has passes
    of: never an error."""
    model_path = Path(model_path)
    try:
        size = model_path.stat().st_size
    except OSError:
        return None
    cpus = cpus if cpus is not None else current_cpus()
    key = profile_key(model_path.name, size, n_threads, cpus)
    try:
        data = json.loads((profiles_dir() / f"{key}.json").read_text("utf-8"))
        profile = DeviceProfile.from_dict(data)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # missing or corrupt: measure again, and the next save replaces it
    expected = (model_path.name, size, n_threads, cpus)
    if (profile.model_file, profile.model_size, profile.n_threads, profile.cpus) != expected:
        return None
    if profile.method < PROFILE_METHOD:
        return None  # measured the old way: measure again, and the next save replaces it
    # Measured at fewer sizes than edgespec verifies at now: as above. A profile measured in a
    # small context (`-c 16`: no pass of 32 fits) serves a context as small, or each run
    # measured it again.
    if not {k for k in QUICK_KS if n_ctx is None or k <= n_ctx} <= set(profile.ks):
        return None
    return profile


def _passes_path(target: Path, n_threads: int, cpus: str) -> Path | None:
    try:
        key = profile_key(target.name, target.stat().st_size, n_threads, cpus)
    except OSError:
        return None
    return profiles_dir() / f"passes-{key}.json"


def load_batch_factor(
    target: str | Path, n_threads: int, cpus: str, profile: DeviceProfile | None
) -> float | None:
    """How far auto mode's passes of this target here were from its profile's curve
    (policy.Costs.batch_factor); None if unknown, unreadable, or older than the profile (a new
    `edgespec profile` supersedes it): never an error."""
    path = _passes_path(Path(target), n_threads, cpus)
    try:
        data = json.loads(path.read_text("utf-8")) if path else {}
        saved_at = datetime.fromisoformat(data["saved_at"])
        if profile is not None and saved_at < datetime.fromisoformat(profile.measured_at):
            return None
        factor = float(data["batch_factor"])
        return factor if factor > 0 else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def save_batch_factor(target: str | Path, n_threads: int, cpus: str, factor: float) -> None:
    """Keep for the next run (errors are ignored)."""
    path = _passes_path(Path(target), n_threads, cpus)
    if path is None:
        return
    saved_at = datetime.now(timezone.utc).isoformat()
    _write_json_quietly(path, {"batch_factor": factor, "saved_at": saved_at})


def _write_json_quietly(path: Path, data: Mapping[str, Any]) -> None:
    """Write atomically (a reader sees the old file or the new one); a home that cannot be
    written is no reason to fail a generation, so errors are ignored."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with written_into_place(path) as tmp:
            tmp.write_text(json.dumps(data) + "\n", "utf-8")
    except OSError:
        pass


def _arms_path(target: Path, draft: Path, n_threads: int, cpus: str) -> Path | None:
    try:
        keys = [profile_key(m.name, m.stat().st_size, n_threads, cpus) for m in (target, draft)]
    except OSError:
        return None
    return profiles_dir() / f"arms-{keys[0]}--{keys[1]}.json"


@dataclass
class AutoMemory:
    """What auto mode learnt about drafting with one model pair on this device, for the next
    run: how often it was probing each way of drafting (see policy.Arm.remembered), what a
    draft step cost in target steps (without a stored draft profile, only a try tells), and
    what share of their ceiling its tries reached, and how many rounds since the last try that
    share kept drafts out (policy.CeilingShare)."""

    probe_every: dict[str, int]
    draft_cost: float | None = None
    share_tokens: float = 0.0  # CeilingShare's tokens, reach and tries
    share_reach: float = 0.0
    share_tries: float = 0.0
    rounds_shut: int = 0

    # A draft cost within this fraction of the stored one is the same cost (it is an average of
    # noisy timings): the file is rewritten only when something worth remembering changed.
    COST_TOLERANCE = 0.05
    # An earlier edgespec kept the mean of tries' shares ("share_total" over "share_tries"):
    # each of those tries counts as reaching this many tokens at the ceiling, about what a try
    # on code reached here (20-25 tokens of plain decoding's time, a ceiling of ~1.5).
    OLD_TRY_REACH = 32.0

    @property
    def share(self) -> float | None:
        """The share of the ceiling the tries reached, together; None before any."""
        return self.share_tokens / self.share_reach if self.share_reach > 0 else None

    def same_as(self, other: AutoMemory) -> bool:
        if self.probe_every != other.probe_every or self.share_tries != other.share_tries:
            return False
        if self.rounds_shut != other.rounds_shut:
            return False
        # with as many tries, the share within COST_TOLERANCE of it: the same
        mine, theirs = self.share, other.share
        if mine is None or theirs is None:
            if mine is not theirs:
                return False
        elif abs(mine - theirs) > self.COST_TOLERANCE:
            return False
        if self.draft_cost is None or other.draft_cost is None:
            return self.draft_cost is other.draft_cost
        return abs(self.draft_cost - other.draft_cost) <= self.COST_TOLERANCE * other.draft_cost


def load_auto_memory(
    target: str | Path, draft: str | Path, n_threads: int, cpus: str
) -> AutoMemory:
    """The memory of this pair, threads and CPUs; empty if unknown or unreadable: never an error."""
    path = _arms_path(Path(target), Path(draft), n_threads, cpus)
    try:
        data = json.loads(path.read_text("utf-8")) if path else {}
        cost = data.get("draft_cost")
        tries = float(data.get("share_tries", 0))
        if "share_reach" in data:
            tokens, reach = float(data["share_tokens"]), float(data["share_reach"])
        else:  # an earlier edgespec's mean of shares, if any
            tokens = float(data.get("share_total", 0)) * AutoMemory.OLD_TRY_REACH
            reach = tries * AutoMemory.OLD_TRY_REACH
        measured = all(0 <= x < math.inf for x in (tokens, reach, tries))  # not NaN either
        if not (measured and (reach > 0) == (tries > 0)):  # as if never measured
            tokens = reach = tries = 0.0
        return AutoMemory(
            {str(name): int(every) for name, every in data["probe_every"].items()},
            float(cost) if cost is not None and float(cost) > 0 else None,
            tokens,
            reach,
            tries,
            max(int(data.get("rounds_shut", 0)), 0),
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return AutoMemory({})


def save_auto_memory(
    target: str | Path, draft: str | Path, n_threads: int, cpus: str, memory: AutoMemory
) -> None:
    """Remember for the next run; a home that cannot be written is no reason to fail a
    generation, so errors are ignored."""
    path = _arms_path(Path(target), Path(draft), n_threads, cpus)
    if path is None:
        return
    saved_at = datetime.now(timezone.utc).isoformat()
    _write_json_quietly(path, {**asdict(memory), "saved_at": saved_at})


# A model as placed: its file, its threads and its CPUs ("0-3").
Placed = tuple[str | Path, int, str]


def _pipeline_path(target: Placed, draft: Placed) -> Path | None:
    try:
        keys = [
            profile_key(Path(path).name, Path(path).stat().st_size, n_threads, cpus)
            for path, n_threads, cpus in (target, draft)
        ]
    except OSError:
        return None
    return profiles_dir() / f"pipeline-{keys[0]}--{keys[1]}.json"


def save_pipeline_speedup(target: Placed, draft: Placed, speedup: float) -> None:
    """Remember what `edgespec profile --overlap` measured: a chain round pipelined on these
    CPUs over the same round done serially on all of them. Errors are ignored."""
    path = _pipeline_path(target, draft)
    if path is not None:
        measured_at = datetime.now(timezone.utc).isoformat()
        _write_json_quietly(path, {"speedup": speedup, "measured_at": measured_at})


def load_pipeline_speedup(target: Placed, draft: Placed) -> float | None:
    """The stored pipelined-over-serial speed-up of this pair so placed; None if never measured
    (or unreadable)."""
    path = _pipeline_path(target, draft)
    try:
        speedup = float(json.loads(path.read_text("utf-8"))["speedup"]) if path else None
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return speedup if speedup is not None and speedup > 0 else None


# --- Measuring ----------------------------------------------------------------------------------


def measure_profile(
    ctx: Context,
    n_threads: int,
    cpus: str | None = None,
    ks: Sequence[int] = FULL_KS,
    repeats: int = 5,
    context_tokens: int = CONTEXT_TOKENS,
    budget_s: float | None = None,
) -> DeviceProfile:
    """Measure the curve on `ctx` (which it clears) and label it; `n_threads` and `cpus` say how
    `ctx` runs (a Context does not know its CPUs; default: this thread's)."""
    times = measure_times(ctx, ks, repeats, context_tokens, budget_s=budget_s)
    curve = curve_from_times(times)
    path = ctx.model.path
    return DeviceProfile(
        model_file=path.name,
        model_size=path.stat().st_size,
        n_threads=n_threads,
        cpus=cpus if cpus is not None else current_cpus(),
        ks=list(curve),
        seconds=list(curve.values()),
        # To the microsecond, as the passes learnt are stamped: a quick profile on a fast CPU
        # ends within the second in which the passes it supersedes were saved.
        measured_at=datetime.now(timezone.utc).isoformat(),
        noise=round(noise(times), 4),
    )


def measure_attention(
    model: Model, n_threads: int, repeats: int = ATTENTION_REPEATS
) -> tuple[float, float]:
    """Median seconds of a plain step plus a pass of ATTENTION_K tokens after ATTENTION_CONTEXT
    tokens of context, (with llama.cpp's flash attention, without), in one context each, timed
    in turns so that a change of load hits both alike."""
    n_ctx = ATTENTION_CONTEXT + ATTENTION_K
    rng = np.random.default_rng(SHUFFLE_SEED)
    ids = rng.integers(0, model.n_vocab, size=n_ctx).tolist()
    prefix, batch = ids[:ATTENTION_CONTEXT], ids[ATTENTION_CONTEXT:]
    contexts = [
        Context(model, n_ctx=n_ctx, n_threads=n_threads, flash_attn=with_flash)
        for with_flash in (True, False)
    ]
    try:

        def step_and_pass(ctx: Context) -> float:
            _stop_if_asked()
            start = time.perf_counter()
            for k in (1, ATTENTION_K):
                ctx.decode(batch[:k], ATTENTION_CONTEXT, logits="all")
                ctx.seq_rm(0, ATTENTION_CONTEXT, -1)
            return time.perf_counter() - start

        for ctx in contexts:
            ctx.decode(prefix, 0, logits="none")
            step_and_pass(ctx)  # warm-up: the first passes allocate buffers
        times: list[list[float]] = [[], []]
        for r in range(repeats):
            for i in (0, 1) if r % 2 == 0 else (1, 0):
                times[i].append(step_and_pass(contexts[i]))
        return statistics.median(times[0]), statistics.median(times[1])
    finally:
        for ctx in contexts:
            ctx.close()


def faster_attention(with_flash_s: float, without_s: float) -> bool:
    """Whether to attend with flash attention, given measure_attention's times: llama.cpp's
    choice for the CPU unless the other measured ATTENTION_MARGIN faster."""
    return without_s >= with_flash_s * (1.0 - ATTENTION_MARGIN)


def steps_in_turns(steps: Sequence[Callable[[], object]], turns: int) -> list[list[float]]:
    """Seconds each of `steps` took, called in turn `turns` times round: [per step: times]."""
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(turns):
        for step, samples in zip(steps, times, strict=True):
            _stop_if_asked()
            start = time.perf_counter()
            step()
            samples.append(time.perf_counter() - start)
    return times


def fastest_steps(contexts: Sequence[Context], turns: int = 24) -> list[float]:
    """Seconds of one plain decode step of each context: the fastest of `timed_steps`.

    Another program's load only adds time, so the fastest step is each context's own when it
    had the cores; the medians of rounds of eight steps, as they were timed before, were not.
    Beside a busy core (a shell loop on one of the two CPUs here), the Qwen 0.5B draft narrowed
    against its whole Q4_0 copy (0.82-0.83 on a quiet machine): 0.72-1.11 in eight timings, the
    medians of the same minutes 0.22-4.8; 0.52-0.88 in six more. Where no step of two threads
    had both cores (the 1.5B target against the draft, 0.26 quiet) the fastest came out low
    too, 0.07-0.23 (medians 0.13-0.64): a draft priced too cheap is tried and its rounds time
    it, one priced too dear may never be (2026-11-30). In turn, each step pays for what the
    other evicted from the caches, as a draft step after a verification does (quiet: 0.26,
    where rounds of eight gave 0.22)."""
    return [min(samples) for samples in timed_steps(contexts, turns)]


def timed_steps(contexts: Sequence[Context], turns: int = 24) -> list[list[float]]:
    """Seconds of `turns` plain decode steps of each context, one step of each context in turn,
    each at the same position after a short prefix (and removed again): [per context: times]."""
    prefix = np.random.default_rng(SHUFFLE_SEED).integers(0, 256, size=33).tolist()

    def step(ctx: Context) -> Callable[[], None]:
        def one() -> None:
            ctx.decode(prefix[-1:], len(prefix) - 1)
            ctx.seq_rm(0, len(prefix) - 1)

        return one

    with ExitStack() as fixed:
        for ctx in contexts:  # the threads each context was made with, whatever its governor
            fixed.enter_context(ctx.fixed_threads())
            ctx.clear()
            ctx.decode(prefix[:-1], 0, logits="none")
        # The first step of each pays for cold buffers: a warm-up, not counted.
        times = steps_in_turns([step(ctx) for ctx in contexts], turns + 1)
    return [samples[1:] for samples in times]


def timed_busy(times: Sequence[Sequence[float]]) -> bool:
    """Whether another program had the cores while `timed_steps` timed these steps: some
    context's median step is more than BUSY_SPREAD times its fastest. Here 1.01-1.04 on a quiet
    machine (the Qwen 0.5B draft's forms; SmolLM2 and a Q4_0 copy, one thread or two),
    1.18-2.2 beside a busy core (the draft's forms, 2026-11-30)."""
    return any(statistics.median(samples) > BUSY_SPREAD * min(samples) for samples in times)


def quick_profile(ctx: Context, n_threads: int, cpus: str | None = None) -> DeviceProfile:
    """A first-use profile: QUICK_KS only, 3 rounds at most, about QUICK_BUDGET_S (and up to
    3 timings of sizes whose single one came out of order: see measure_times). In a
    context smaller than its prefix and largest pass (`-c 64`), after a shorter prefix, and
    without the passes that do not fit at all (such a profile is measured again in a larger
    context: it lacks quick sizes)."""
    prefix = max(0, min(QUICK_CONTEXT_TOKENS, ctx.n_ctx - QUICK_KS[-1]))
    return measure_profile(
        ctx,
        n_threads,
        cpus,
        ks=[k for k in QUICK_KS if prefix + k <= ctx.n_ctx],
        repeats=3,
        context_tokens=prefix,
        budget_s=QUICK_BUDGET_S,
    )


def kept_profile(before: DeviceProfile | None, measured: DeviceProfile) -> DeviceProfile:
    """What a first use keeps of `measured`, taken where `before` was measured busy (else None):
    a quiet measurement as it is; a busy one counted as one more busy measurement in a row, and
    of the two busy ones the less noisy."""
    if not measured.busy:
        return replace(measured, busy_measurements=0)
    if before is None or not before.busy:
        return replace(measured, busy_measurements=1)
    quieter = measured if measured.noise <= before.noise else before
    return replace(quieter, busy_measurements=max(before.busy_measurements, 1) + 1)


def profile_model(
    model_path: str | Path,
    n_threads: int,
    cpus: str | None = None,
    quick: bool = False,
    n_ctx: int = 512,
) -> DeviceProfile:
    """Load a GGUF, choose its attention (measure_attention) and measure its curve attending so
    (`edgespec profile`; the first-use profile, quick_profile, leaves attention to llama.cpp:
    prefilling its context twice would take longer than the rest). With `cpus` ("0-1"), the
    measurement runs on a thread pinned to those CPUs (llama.cpp's worker threads inherit its
    affinity); the caller's own affinity is left alone."""
    if n_threads < 1:
        raise BadSettingError("--threads must be at least 1")
    pinned = parse_cpu_list(cpus) if cpus is not None else None
    if pinned is not None:
        cpus = format_cpu_list(pinned)  # the canonical spelling, so that the key finds it again

    def measure() -> DeviceProfile:
        info = read_gguf(model_path)
        check_generates(info)  # an embedding model aborted llama.cpp halfway
        model = Model(model_path, info)
        attention_s = measure_attention(model, n_threads)
        flash_attn = faster_attention(*attention_s)
        ctx = Context(model, n_ctx=n_ctx, n_threads=n_threads, flash_attn=flash_attn)
        try:
            if quick:
                measured = quick_profile(ctx, n_threads, cpus)
            else:
                measured = measure_profile(ctx, n_threads, cpus)
        finally:
            ctx.close()
        return replace(measured, flash_attn=flash_attn, attention_s=list(attention_s))

    if pinned is None:
        return measure()
    runner = PinnedThread(pinned, "profile")
    try:
        measuring = runner.submit(measure)
        try:
            return measuring.result()
        except KeyboardInterrupt:
            # Ctrl+C reaches the main thread only: the measuring, on its own thread, is asked
            # to stop at its next pass (it ran on for minutes), and waited for.
            _stop_measuring.set()
            runner.wait_idle()
            raise
    finally:
        _stop_measuring.clear()
        runner.close()


_stop_measuring = threading.Event()  # set by profile_model on Ctrl+C


def _stop_if_asked() -> None:
    if _stop_measuring.is_set():
        raise KeyboardInterrupt
