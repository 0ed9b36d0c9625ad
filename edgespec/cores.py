"""Which CPUs are big and which are little, and where the target and the draft should run.

llama.cpp splits every matrix product evenly across its threads and waits for the slowest, so a
thread on a little core holds the big ones back (−30–40 % decode on a Snapdragon 8 Gen 2). The
target therefore gets every core above the lowest tier (prime, big and mid cores together: decode
is memory-bound and wants all fast cores, not just the single prime one) and the draft the lowest
tier, where it can run while the target verifies.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import queue
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from edgespec.errors import BadSettingError, EdgespecError
from edgespec.interrupts import interrupts_held

R = TypeVar("R")

# "CPU part" ids from /proc/cpuinfo, ranked by speed: 0 little, 1 big, 2 prime.
# fmt: off
ARM_PART_RANK = {
    0xD03: 0, 0xD04: 0, 0xD05: 0, 0xD46: 0, 0xD80: 0,  # A53, A35, A55, A510, A520
    0xD07: 1, 0xD08: 1, 0xD09: 1, 0xD0A: 1, 0xD0B: 1, 0xD0D: 1,  # A57, A72, A73, A75, A76, A77
    0xD41: 1, 0xD47: 1, 0xD4D: 1, 0xD81: 1,  # A78, A710, A715, A720
    0xD44: 2, 0xD48: 2, 0xD4E: 2, 0xD82: 2,  # X1, X2, X3, X4
    0x800: 1, 0x801: 0, 0x802: 1, 0x803: 0, 0x804: 1, 0x805: 0,  # Qualcomm Kryo 2xx-4xx Gold/Silver
}
# fmt: on

MAX_FREQ = "cpufreq/cpuinfo_max_freq"


@dataclass
class CoreLayout:
    big: list[int]  # every tier above the lowest; all cores when uniform
    little: list[int]  # the lowest tier; empty when uniform
    uniform: bool
    source: str  # "cpu_capacity", "cpuinfo_max_freq", "cpu part" or "none"


@dataclass
class Placement:
    target_cpus: list[int]
    draft_cpus: list[int]
    note: str


# Linux's largest CONFIG_NR_CPUS is 8192.
MAX_CPU_ID = 8191


def _cpu_range_list(text: str) -> list[int]:
    """The kernel's CPU list notation, "0-3,6" -> [0, 1, 2, 3, 6]; ValueError on bad syntax."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match or (match[2] and int(match[2]) < int(match[1])):
            raise ValueError(f"bad CPU list {text!r}")
        cpus.update(range(int(match[1]), int(match[2] or match[1]) + 1))
    return sorted(cpus)


def format_cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 6] -> "0-3,6", the kernel's own notation."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def available_cpus() -> set[int]:
    """The CPUs the calling thread may use (a pinned thread sees only its own pins)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _cpu_parts(cpuinfo: Path) -> dict[int, int]:
    """processor number -> CPU part, from /proc/cpuinfo (ARM only; x86 has no such line)."""
    parts, processor = {}, None
    for key, value in _cpuinfo_pairs(cpuinfo):
        if key == "processor" and value.isdigit():
            processor = int(value)
        elif key == "CPU part" and processor is not None and re.fullmatch(r"0x[0-9a-fA-F]+", value):
            parts[processor] = int(value, 16)
    return parts


def detect_cores(
    sysfs: Path = Path("/sys/devices/system/cpu"),
    cpuinfo: Path = Path("/proc/cpuinfo"),
    allowed: set[int] | None = None,
) -> CoreLayout:
    """Rank the online CPUs in `allowed` (default: this process's affinity) from the best source."""
    allowed = available_cpus() if allowed is None else allowed
    # Without a sysfs tree (macOS, Windows) every allowed CPU counts, all equal.
    present = {int(p.name[3:]) for p in sysfs.glob("cpu[0-9]*") if p.name[3:].isdigit()} or allowed
    with contextlib.suppress(OSError, ValueError):  # no or unreadable list: trust per-CPU files
        present = present & set(_cpu_range_list((sysfs / "online").read_text()))
    # cpu0 often has no "online" file: it cannot be taken offline.
    cpus = sorted(c for c in present & allowed if _read_int(sysfs / f"cpu{c}" / "online") != 0)

    parts = _cpu_parts(cpuinfo)
    sources = {
        "cpu_capacity": {c: _read_int(sysfs / f"cpu{c}" / "cpu_capacity") for c in cpus},
        "cpuinfo_max_freq": {c: _read_int(sysfs / f"cpu{c}" / MAX_FREQ) for c in cpus},
        "cpu part": {c: ARM_PART_RANK.get(parts.get(c, -1)) for c in cpus},
    }
    for source, rank in sources.items():
        if cpus and all(r is not None for r in rank.values()):
            lowest = min(r for r in rank.values() if r is not None)
            little = [c for c in cpus if rank[c] == lowest]
            if len(little) < len(cpus):
                return CoreLayout([c for c in cpus if rank[c] != lowest], little, False, source)
            return CoreLayout(cpus, [], True, source)
    return CoreLayout(cpus, [], True, "none")


def default_placement(layout: CoreLayout) -> Placement:
    if layout.uniform or not layout.little:
        cpus = format_cpu_list(layout.big)
        note = f"uniform cores ({layout.source}): target and draft take turns on CPUs {cpus}"
        return Placement(layout.big, layout.big, note)
    big, little = format_cpu_list(layout.big), format_cpu_list(layout.little)
    note = f"target on big CPUs {big}, draft on little CPUs {little} (from {layout.source})"
    return Placement(layout.big, layout.little, note)


def plan_placement(
    target_cpus: str | None = None,
    draft_cpus: str | None = None,
    layout: CoreLayout | None = None,
    available: set[int] | None = None,
) -> Placement:
    """Where each model runs: the --target-cpus/--draft-cpus values where given (checked), the
    detected default for the rest."""
    available = available_cpus() if available is None else available
    layout = detect_cores(allowed=available) if layout is None else layout
    placement = default_placement(layout)
    if target_cpus is None and draft_cpus is None:
        return placement
    target, draft = placement.target_cpus, placement.draft_cpus
    if target_cpus:
        target = parse_cpu_list(target_cpus, available, "--target-cpus")
    if draft_cpus:
        draft = parse_cpu_list(draft_cpus, available, "--draft-cpus")
    note = f"target on CPUs {format_cpu_list(target)}, draft on CPUs {format_cpu_list(draft)}"
    return Placement(target, draft, note + " (as asked)")


def parse_cpu_list(text: str, available: set[int] | None = None, flag: str = "") -> list[int]:
    """A --target-cpus/--draft-cpus value like "0-3,6", checked against the usable CPUs. An
    error begins with `flag`, so that the CLI can say where a value it was not typed came from."""
    said = f"{flag}: " if flag else ""
    available = available_cpus() if available is None else available
    # A range becomes a set of every CPU in it: "0-99999999999" filled the memory before any
    # of it was checked. No kernel numbers its CPUs past MAX_CPU_ID.
    if any(len(n.lstrip("0")) > 4 or int(n) > MAX_CPU_ID for n in re.findall(r"\d+", text)):
        raise BadSettingError(
            f"{said}CPUs past {MAX_CPU_ID} are not available here "
            f"(usable: {format_cpu_list(sorted(available))})"
        )
    try:
        cpus = _cpu_range_list(text)
    except ValueError:
        raise BadSettingError(f"{said}bad CPU list {text!r}: expected a form like 0-3,6") from None
    if missing := [c for c in cpus if c not in available]:
        raise BadSettingError(
            f"{said}CPUs {format_cpu_list(missing)} are not available here "
            f"(usable: {format_cpu_list(sorted(available))})"
        )
    return cpus


def pin_current_thread(cpus: list[int]) -> str:
    """Restrict the calling thread to `cpus`, and the threads it creates afterwards: llama.cpp's
    OpenMP workers are created by the thread that first decodes and keep the affinity they were
    born with, so pin before that thread's first decode. Returns a note saying what happened."""
    if not hasattr(os, "sched_setaffinity"):
        return "this platform cannot pin threads (no sched_setaffinity): running unpinned"
    os.sched_setaffinity(threading.get_native_id(), cpus)
    return f"thread {threading.get_native_id()} pinned to CPUs {format_cpu_list(cpus)}"


def thread_cpus(pid: int | None = None, proc: Path = Path("/proc")) -> dict[int, str]:
    """Thread id -> the CPUs it may run on ("0-3"), for every thread of a process; {} off Linux."""
    allowed = {}
    for status in (proc / str(pid or os.getpid()) / "task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:  # the thread exited meanwhile
            continue
        if match := re.search(r"^Cpus_allowed_list:\s*(\S+)", text, re.MULTILINE):
            allowed[int(status.parent.name)] = match[1]
    return allowed


class PinnedCall:
    """A call handed to a PinnedThread; its result (or error) once it has run there.

    It is waited for on a C-level queue, not on a Python lock: a KeyboardInterrupt raised while
    the main thread waits leaves no lock taken (Python's `with lock` is not safe against one: a
    CI run's Ctrl+C test hung for good on an executor's lock so) and the result stays to be had.
    """

    __slots__ = ("_finished", "_outcome", "args", "fn")

    def __init__(self, fn: Callable[..., object], args: tuple[object, ...]):
        self.fn, self.args = fn, args
        self._finished: queue.SimpleQueue[tuple[bool, object]] = queue.SimpleQueue()
        self._outcome: tuple[bool, object] | None = None

    def run(self) -> None:
        try:
            outcome = (True, self.fn(*self.args))
        except BaseException as e:  # passed back to whoever waits, as the call's own
            outcome = (False, e)
        self._finished.put(outcome)

    def done(self) -> bool:
        return self._outcome is not None or not self._finished.empty()

    def result(self, timeout: float | None = None) -> Any:
        """The call's return value, or its error raised here; waits until it has run."""
        if self._outcome is None:
            try:
                self._outcome = self._finished.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"{self.fn!r} still running after {timeout} s") from None
        ok, value = self._outcome
        if not ok:
            raise value  # type: ignore[misc]  # a BaseException, by run()
        return value


class PinnedThread:
    """A long-lived thread, pinned to some CPUs, that runs the calls handed to it, in order.

    llama.cpp's OpenMP workers belong to the thread that starts a parallel region and are born
    with its affinity, so a model whose every decode runs on one pinned thread keeps all of its
    threads on those CPUs, while another model decodes on other CPUs from its own thread.
    """

    def __init__(self, cpus: list[int], name: str):
        self.cpus = cpus
        self.name = name
        self._pin_error: OSError | None = None
        self._closed = False
        # Calls are handed over on C-level queues (no Python lock a Ctrl+C could leave taken).
        # A daemon: one never closed (a library user's engine left open) must not hold up the
        # interpreter's exit; calls are always waited for, so none is cut short by it.
        self._calls: queue.SimpleQueue[PinnedCall | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=f"edgespec-{name}", daemon=True)
        self._thread.start()
        self.native_id: int | None = self._thread.native_id

    def _serve(self) -> None:
        try:
            pin_current_thread(self.cpus)
        except OSError as e:  # each call is then an error (a phone may take cores offline)
            self._pin_error = e
        while (call := self._calls.get()) is not None:
            if self._pin_error is not None:
                call.fn, call.args = self._refuse, ()
            call.run()

    def _refuse(self) -> NoReturn:
        assert self._pin_error is not None
        raise EdgespecError(
            f"cannot run the {self.name} on CPUs {format_cpu_list(self.cpus)}: "
            f"{self._pin_error.strerror or self._pin_error} (taken offline or out of this "
            "process's reach since the start?)"
        )

    def call(self, fn: Callable[..., R], *args: object) -> R:
        if threading.get_native_id() == self.native_id:  # already here (inside a submitted call)
            return fn(*args)
        # Ctrl+C is held until the call is done, then raised: the call runs on whatever is
        # pressed, and nothing (such as clearing a cache) may touch llama.cpp's state while it
        # decodes.
        with interrupts_held():
            return self.submit(fn, *args).result()

    def wait_idle(self) -> None:
        """Return once every call handed over so far has finished (calls run in order); a
        Ctrl+C meanwhile is raised after that."""
        with interrupts_held():
            self.submit(int).result()

    def submit(self, fn: Callable[..., R], *args: object) -> PinnedCall:
        """Start a call and return at once (the caller waits on its `result()`)."""
        if self._closed:  # else it would wait for good
            raise RuntimeError(f"the {self.name}'s thread is closed")
        call = PinnedCall(fn, args)
        self._calls.put(call)  # one C call: a Ctrl+C comes before it or after it
        return call

    def close(self) -> None:
        """Stop the thread once the calls handed to it are done (from inside one of them, such
        as a collected context's `__del__` there, without waiting for itself)."""
        self._closed = True
        self._calls.put(None)
        if threading.get_native_id() != self.native_id:
            self._thread.join()


def needs_pinning(cpus: list[int]) -> bool:
    """Whether a model on `cpus` runs pinned: not where those are all the CPUs this process may
    use anyway (no hand-off per decode for nothing)."""
    return set(cpus) != available_cpus()


def pinned_thread(cpus: list[int], name: str) -> PinnedThread | None:
    """A pinned thread for a model on `cpus`, where it needs one (needs_pinning)."""
    return PinnedThread(cpus, name) if needs_pinning(cpus) else None


def threads_by_cpus(pid: int | None = None, proc: Path = Path("/proc")) -> dict[str, int]:
    """How many of a process's threads may run on each CPU set: {"0-3": 5, "4-7": 2}.

    This is read back from the kernel, so it shows where llama.cpp's workers really are.
    """
    counts: dict[str, int] = {}
    for cpus in thread_cpus(pid, proc).values():
        counts[cpus] = counts.get(cpus, 0) + 1
    return dict(sorted(counts.items()))


def _cpuinfo_pairs(cpuinfo: Path) -> list[tuple[str, str]]:
    """/proc/cpuinfo's "key : value" lines, stripped, in order; none where it cannot be read."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return []
    return [(key.strip(), value.strip()) for key, _, value in (s.partition(":") for s in lines)]


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's marketing name from /proc/cpuinfo (x86 "model name", ARM "Hardware"/"Model")."""
    pairs = _cpuinfo_pairs(cpuinfo)
    for wanted in ("model name", "Hardware", "Model"):
        for key, value in pairs:
            if key == wanted and value:
                return value
    return platform.processor() or platform.machine() or "unknown"


# The vector extensions llama.cpp's CPU kernels use, best first, by their /proc/cpuinfo flag
# names (x86 "flags", ARM "Features"). "AMD EPYC" alone names several generations whose batch
# costs differ (AVX-512 or not): a bench result must say which one it ran on.
SIMD_FLAGS = {
    "avx512f": "AVX-512",
    "avx2": "AVX2",
    "sve": "SVE",
    "i8mm": "I8MM",
    "asimddp": "DOTPROD",
    "asimd": "NEON",
}


def cpu_simd(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's vector extensions that matter to llama.cpp, e.g. "AVX2" or "I8MM DOTPROD NEON";
    "unknown" when /proc/cpuinfo does not say."""
    flags: set[str] = set()
    for key, value in _cpuinfo_pairs(cpuinfo):
        if key in ("flags", "Features"):
            flags.update(value.split())
    found = [label for flag, label in SIMD_FLAGS.items() if flag in flags]
    if "AVX-512" in found or "AVX2" in found:
        found = found[:1]  # x86: the widest says it
        if "amx_int8" in flags:
            # llama.cpp multiplies batches on AMX's tiles: a pass of 8 tokens cost 2.2 plain steps
            # on an Emerald Rapids with them and 3.2 without.
            found.append("AMX")
    return " ".join(found) or "unknown"


# x86 CPUs by /proc/cpuinfo's "cpu family" and "model" (AMD's ranges as Linux's amd.c sorts them;
# Intel's server parts): one cloud "AMD EPYC" was a Zen 5 on one day and a Zen 4 the next, where
# a pass of 16 tokens cost 8.4 plain steps instead of 5.3, and speculation's worth with it.
AMD_FAMILIES: dict[int, tuple[tuple[range, str], ...]] = {
    0x17: ((range(0x00, 0x30), "Zen/Zen+"), (range(0x30, 0x100), "Zen 2")),
    0x19: (
        (range(0x00, 0x10), "Zen 3"),
        (range(0x10, 0x20), "Zen 4"),
        (range(0x20, 0x60), "Zen 3"),
        (range(0x60, 0x80), "Zen 4"),
        (range(0xA0, 0xB0), "Zen 4"),
    ),
    0x1A: ((range(0x00, 0x100), "Zen 5"),),
}
INTEL_FAMILY_6 = {
    0x55: "Skylake-SP/Cascade Lake",
    0x6A: "Ice Lake-SP",
    0x8F: "Sapphire Rapids",
    0xCF: "Emerald Rapids",
    0xAD: "Granite Rapids",
    0xAF: "Sierra Forest",
}


def cpu_generation(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """An x86 CPU's microarchitecture ("Zen 4"), else its family and model numbers; "" where
    /proc/cpuinfo has neither (ARM names its cores by "CPU part": detect_cores)."""
    fields: dict[str, str] = {}
    for key, value in _cpuinfo_pairs(cpuinfo):
        fields.setdefault(key, value)  # the first processor's
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return ""
    vendor = fields.get("vendor_id", "")
    if vendor == "AuthenticAMD":
        for models, name in AMD_FAMILIES.get(family, ()):
            if model in models:
                return name
    if vendor == "GenuineIntel" and family == 6 and model in INTEL_FAMILY_6:
        return INTEL_FAMILY_6[model]
    return f"family {family} model {model}"


@functools.cache  # asked at every save and load of what was measured; the CPU stays
def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """What this CPU is, as far as batch costs go: "AMD EPYC, Zen 4, AVX-512". Measured costs are
    kept per identity: the same file on another CPU has another curve."""
    traits = [cpu_model(cpuinfo), cpu_generation(cpuinfo), cpu_simd(cpuinfo)]
    return ", ".join(t for t in traits if t)
