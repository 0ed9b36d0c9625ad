"""Core detection from fake sysfs and /proc/cpuinfo trees, placement, CPU lists and real pinning."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from edgespec.cores import (
    CoreLayout,
    PinnedThread,
    cpu_model,
    default_placement,
    detect_cores,
    format_cpu_list,
    needs_pinning,
    parse_cpu_list,
    pin_current_thread,
    plan_placement,
    thread_cpus,
    threads_by_cpus,
)
from edgespec.errors import BadSettingError, EdgespecError


def fake_sysfs(
    root: Path,
    n_cpus: int,
    capacity: list[int] | None = None,
    max_freq: list[int] | None = None,
    offline: tuple[int, ...] = (),
) -> Path:
    sysfs = root / "sys/devices/system/cpu"
    for cpu in range(n_cpus):
        cpu_dir = sysfs / f"cpu{cpu}"
        cpu_dir.mkdir(parents=True)
        if cpu:  # like the kernel: cpu0 has no "online" switch
            (cpu_dir / "online").write_text("0\n" if cpu in offline else "1\n")
        if capacity:
            (cpu_dir / "cpu_capacity").write_text(f"{capacity[cpu]}\n")
        if max_freq:
            (cpu_dir / "cpufreq").mkdir()
            (cpu_dir / "cpufreq/cpuinfo_max_freq").write_text(f"{max_freq[cpu]}\n")
    online = [c for c in range(n_cpus) if c not in offline]
    (sysfs / "online").write_text(format_cpu_list(online) + "\n")
    return sysfs


def fake_cpuinfo(root: Path, parts: list[str]) -> Path:
    blocks = [
        f"processor\t: {cpu}\nBogoMIPS\t: 48.00\nCPU implementer\t: 0x41\nCPU part\t: {part}\n"
        for cpu, part in enumerate(parts)
    ]
    path = root / "cpuinfo"
    path.write_text("\n".join(blocks) + "\nHardware\t: fake board\n")
    return path


EIGHT = set(range(8))
NO_CPUINFO = Path("/nonexistent/cpuinfo")


def test_phone_with_prime_big_and_little_tiers(tmp_path):
    # Snapdragon-like: cpu0-3 little (A55), cpu4-6 big (A78), cpu7 prime (X1).
    capacity = [380] * 4 + [870] * 3 + [1024]
    layout = detect_cores(fake_sysfs(tmp_path, 8, capacity), NO_CPUINFO, allowed=EIGHT)
    # The prime core joins the big ones: the target wants every fast core.
    assert layout == CoreLayout([4, 5, 6, 7], [0, 1, 2, 3], uniform=False, source="cpu_capacity")
    placement = default_placement(layout)
    assert (placement.target_cpus, placement.draft_cpus) == ([4, 5, 6, 7], [0, 1, 2, 3])
    assert "4-7" in placement.note and "0-3" in placement.note


def test_cpu_capacity_wins_over_max_freq(tmp_path):
    sysfs = fake_sysfs(tmp_path, 4, capacity=[512, 512, 1024, 1024], max_freq=[1800000] * 4)
    layout = detect_cores(sysfs, NO_CPUINFO, allowed={0, 1, 2, 3})
    assert (layout.big, layout.little, layout.source) == ([2, 3], [0, 1], "cpu_capacity")


def test_raspberry_pi_with_four_equal_cores_is_uniform(tmp_path):
    sysfs = fake_sysfs(tmp_path, 4, max_freq=[2400000] * 4)
    layout = detect_cores(sysfs, NO_CPUINFO, allowed={0, 1, 2, 3})
    assert layout == CoreLayout([0, 1, 2, 3], [], uniform=True, source="cpuinfo_max_freq")
    placement = default_placement(layout)
    assert placement.target_cpus == placement.draft_cpus == [0, 1, 2, 3]
    assert "uniform" in placement.note


def test_x86_vm_that_exposes_nothing_is_uniform(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nprocessor\t: 1\n")
    layout = detect_cores(fake_sysfs(tmp_path, 2), cpuinfo, allowed={0, 1})
    assert layout == CoreLayout([0, 1], [], uniform=True, source="none")


def test_board_known_only_by_cpu_part(tmp_path):
    # RK3588-like: four A55 then four A76, no capacity or frequency files.
    cpuinfo = fake_cpuinfo(tmp_path, ["0xd05"] * 4 + ["0xd0b"] * 4)
    layout = detect_cores(fake_sysfs(tmp_path, 8), cpuinfo, allowed=EIGHT)
    assert layout == CoreLayout([4, 5, 6, 7], [0, 1, 2, 3], uniform=False, source="cpu part")


def test_a_prime_core_is_told_from_big_ones_by_cpu_part(tmp_path):
    # A process allowed onto an A78 trio and an X1 only: the X1 is the faster tier.
    cpuinfo = fake_cpuinfo(tmp_path, ["0xd41"] * 3 + ["0xd44"])
    layout = detect_cores(fake_sysfs(tmp_path, 4), cpuinfo, allowed={0, 1, 2, 3})
    assert (layout.big, layout.little, layout.source) == ([3], [0, 1, 2], "cpu part")


def test_odd_lines_in_cpuinfo_are_skipped_not_fatal(tmp_path):
    """A kernel's or emulator's cpuinfo need not follow the usual form: a line that is not a
    processor number or a hexadecimal part is passed over, and the other cores still count."""
    cpuinfo = tmp_path / "cpuinfo"
    parts = ["0xd05", "0xd05", "0xd0b", "0xd0b", "n/a"]
    blocks = [f"processor\t: {cpu}\nCPU part\t: {part}\n" for cpu, part in enumerate(parts)]
    cpuinfo.write_text("".join(blocks) + "processor\t: unknown\n")
    layout = detect_cores(fake_sysfs(tmp_path, 4), cpuinfo, allowed={0, 1, 2, 3})
    assert (layout.big, layout.little) == ([2, 3], [0, 1])


def test_the_online_list_counts_where_per_cpu_switches_cannot_be_read(tmp_path):
    """Android may forbid reading cpuN/online: the kernel's own list of online CPUs still
    keeps the offline ones out."""
    sysfs = fake_sysfs(tmp_path, 8, [380] * 4 + [1024] * 4, offline=(3, 7))
    for cpu in range(1, 8):
        (sysfs / f"cpu{cpu}" / "online").unlink()
    layout = detect_cores(sysfs, NO_CPUINFO, allowed=EIGHT)
    assert (layout.big, layout.little) == ([4, 5, 6], [0, 1, 2])


def test_unknown_cpu_parts_are_not_guessed(tmp_path):
    cpuinfo = fake_cpuinfo(tmp_path, ["0xd05", "0xd05", "0xabc", "0xabc"])
    layout = detect_cores(fake_sysfs(tmp_path, 4), cpuinfo, allowed={0, 1, 2, 3})
    assert (layout.uniform, layout.source) == (True, "none")


def test_offline_cpus_are_ignored(tmp_path):
    capacity = [380] * 4 + [1024] * 4
    sysfs = fake_sysfs(tmp_path, 8, capacity, offline=(2, 6))
    layout = detect_cores(sysfs, NO_CPUINFO, allowed=EIGHT)
    assert (layout.big, layout.little) == ([4, 5, 7], [0, 1, 3])


def test_only_allowed_cpus_are_used(tmp_path):
    sysfs = fake_sysfs(tmp_path, 8, [380] * 4 + [1024] * 4)
    assert detect_cores(sysfs, NO_CPUINFO, allowed={0, 1, 6, 7}).little == [0, 1]
    # Allowed onto the big cores only: nothing slower to avoid.
    only_big = detect_cores(sysfs, NO_CPUINFO, allowed={5, 6, 7})
    assert only_big == CoreLayout([5, 6, 7], [], uniform=True, source="cpu_capacity")


def test_without_any_sysfs_tree_every_allowed_cpu_counts(tmp_path):
    layout = detect_cores(tmp_path / "missing", NO_CPUINFO, allowed={0, 1, 2})
    assert layout == CoreLayout([0, 1, 2], [], uniform=True, source="none")


def test_this_machine_is_detected_within_its_affinity():
    layout = detect_cores()
    assert set(layout.big + layout.little) <= os.sched_getaffinity(0)
    assert layout.big


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,6", [0, 1, 2, 3, 6]), ("5", [5]), ("6,0-1", [0, 1, 6]), (" 2 - 3 ", [2, 3])],
)
def test_parse_cpu_list(text, cpus):
    assert parse_cpu_list(text, available=set(range(8))) == cpus


@pytest.mark.parametrize("text", ["", "a", "0-", "3-1", "0,,1", "1.5", "-2"])
def test_parse_cpu_list_rejects_bad_syntax(text):
    with pytest.raises(BadSettingError, match="bad CPU list"):
        parse_cpu_list(text, available=set(range(8)))


def test_parse_cpu_list_rejects_cpus_that_are_not_available():
    with pytest.raises(BadSettingError, match=r"CPUs 4-5 are not available here \(usable: 0-3\)"):
        parse_cpu_list("2-5", available={0, 1, 2, 3})


@pytest.mark.parametrize("text", ["0-99999999999", "0-2000000000,1", "8192", "1" * 40])
def test_a_cpu_list_past_any_kernels_cpus_is_refused_before_it_is_expanded(text):
    """The list "0-99999999999" became a set of every CPU in it: the OOM killer ended edgespec."""
    refused = r"CPUs past 8191 are not available here \(usable: 0-3\)"
    with pytest.raises(BadSettingError, match=refused):
        parse_cpu_list(text, available={0, 1, 2, 3})


def test_a_cpu_number_too_long_for_python_to_read_is_refused_all_the_same():
    """int() refuses strings of more than 4,300 digits: the length is checked first."""
    with pytest.raises(BadSettingError, match="CPUs past 8191 are not available here"):
        parse_cpu_list("1" * 5000, available={0, 1, 2, 3})


def test_parse_cpu_list_defaults_to_this_process_affinity():
    usable = sorted(os.sched_getaffinity(0))
    assert parse_cpu_list(format_cpu_list(usable)) == usable
    with pytest.raises(BadSettingError):
        parse_cpu_list(str(max(usable) + 1000))


def test_format_cpu_list_uses_kernel_notation():
    assert format_cpu_list([6, 0, 1, 2, 3, 9, 10]) == "0-3,6,9-10"
    assert format_cpu_list([]) == ""


def test_a_pinned_thread_is_reported_on_its_cpus():
    cpu = max(os.sched_getaffinity(0))
    seen: dict[str, object] = {}
    pinned, release = threading.Event(), threading.Event()

    def worker() -> None:
        seen["note"] = pin_current_thread([cpu])
        seen["tid"] = threading.get_native_id()
        pinned.set()
        release.wait(5)  # stay alive while the test reads /proc

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert pinned.wait(5)
        cpus = thread_cpus()
        assert cpus[seen["tid"]] == str(cpu)
        assert cpus[threading.get_native_id()] == format_cpu_list(sorted(os.sched_getaffinity(0)))
        assert f"pinned to CPUs {cpu}" in str(seen["note"])
    finally:
        release.set()
        thread.join()


PHONE = CoreLayout(big=[4, 5, 6, 7], little=[0, 1, 2, 3], uniform=False, source="cpu_capacity")
UNIFORM = CoreLayout(big=[0, 1, 2, 3], little=[], uniform=True, source="none")


def test_placement_defaults_to_detected_tiers_and_takes_the_flags_where_given():
    default = plan_placement(layout=PHONE, available=EIGHT)
    assert (default.target_cpus, default.draft_cpus) == ([4, 5, 6, 7], [0, 1, 2, 3])
    only_target = plan_placement("6-7", layout=PHONE, available=EIGHT)
    assert (only_target.target_cpus, only_target.draft_cpus) == ([6, 7], [0, 1, 2, 3])
    both = plan_placement("0-5", "6,7", layout=PHONE, available=EIGHT)
    assert (both.target_cpus, both.draft_cpus) == ([0, 1, 2, 3, 4, 5], [6, 7])
    assert "as asked" in both.note


def test_placement_on_uniform_cores_shares_all_of_them_and_says_so():
    placement = plan_placement(layout=UNIFORM, available={0, 1, 2, 3})
    assert placement.target_cpus == placement.draft_cpus == [0, 1, 2, 3]
    assert "uniform" in placement.note


def test_an_empty_cpu_flag_leaves_that_models_detected_cpus():
    placement = plan_placement("", "", layout=PHONE, available=EIGHT)
    assert (placement.target_cpus, placement.draft_cpus) == ([4, 5, 6, 7], [0, 1, 2, 3])


def test_placement_rejects_cpus_that_are_not_usable():
    # The error names the flag whose value is wrong.
    with pytest.raises(BadSettingError, match=r"^--draft-cpus: CPUs 8 are not available"):
        plan_placement("0-3", "8", layout=PHONE, available=EIGHT)
    with pytest.raises(BadSettingError, match=r"^--target-cpus: CPUs 8 are not available"):
        plan_placement("8", "0-3", layout=PHONE, available=EIGHT)
    with pytest.raises(BadSettingError, match="bad CPU list"):
        plan_placement(draft_cpus="3-1", layout=PHONE, available=EIGHT)


def test_a_model_on_every_usable_cpu_runs_unpinned():
    """Pinning to what the process may use anyway would only add a hand-off to every decode."""
    usable = sorted(os.sched_getaffinity(0))
    assert not needs_pinning(usable)
    assert needs_pinning(usable[:1]) == (len(usable) > 1)


def test_the_cpu_name_skips_empty_fields(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: \nHardware\t: Qualcomm Technologies\n")
    assert cpu_model(cpuinfo) == "Qualcomm Technologies"


def test_a_pinned_thread_runs_calls_on_its_cpus_and_passes_errors_back():
    cpu = max(os.sched_getaffinity(0))
    runner = PinnedThread([cpu], "test")
    try:
        assert runner.call(os.sched_getaffinity, 0) == {cpu}
        assert runner.call(threading.get_native_id) == runner.native_id
        assert runner.native_id != threading.get_native_id()
        with pytest.raises(ZeroDivisionError):
            runner.call(divmod, 1, 0)
        assert threads_by_cpus().get(str(cpu), 0) >= 1
    finally:
        runner.close()


def test_a_call_made_from_the_pinned_thread_itself_runs_there_without_waiting_on_itself():
    runner = PinnedThread(sorted(os.sched_getaffinity(0)), "test")
    try:
        inner = runner.submit(runner.call, threading.get_native_id).result(timeout=5)
        assert inner == runner.native_id
    finally:
        runner.close()


def slow_call_that_records_when_it_ends(ended: threading.Event):
    def decode() -> None:
        time.sleep(0.3)
        ended.set()

    return decode


def test_ctrl_c_while_a_pinned_call_runs_returns_only_once_the_call_has_ended():
    runner, ended = PinnedThread(sorted(os.sched_getaffinity(0)), "test"), threading.Event()
    ctrl_c = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    # Python's own handler, even in a test run started where SIGINT is ignored (a background job)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        ctrl_c.start()
        with pytest.raises(KeyboardInterrupt):
            runner.call(slow_call_that_records_when_it_ends(ended))
        assert ended.is_set()
    finally:
        ctrl_c.join()
        signal.signal(signal.SIGINT, previous)
        runner.close()


class QueueThatSeesCtrlCAsItTakesACall:
    """The pinned thread's call queue, with a real Ctrl+C sent as the first call is handed in."""

    def __init__(self, calls):
        self.calls, self.handed_over = calls, []

    def put(self, call) -> None:
        if not self.handed_over:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):  # Python runs a handler between these, unless it is held
                pass
        self.handed_over.append(call)
        self.calls.put(call)

    def get(self):
        return self.calls.get()


def test_ctrl_c_while_the_call_is_still_being_handed_over_is_raised_once_it_has_run(monkeypatch):
    """Raised inside a hand-off through Python locks (it was an executor's), a KeyboardInterrupt
    can leave a lock taken, and every later call waits for good: a CI run's Ctrl+C test hung so,
    both threads blocked on the executor's idle semaphore. Ctrl+C is held until the call is
    done."""
    runner, ended = PinnedThread(sorted(os.sched_getaffinity(0)), "test"), threading.Event()
    calls = QueueThatSeesCtrlCAsItTakesACall(runner._calls)
    monkeypatch.setattr(runner, "_calls", calls)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.call(slow_call_that_records_when_it_ends(ended))
        assert ended.is_set() and len(calls.handed_over) == 1  # handed over whole, once, and run
        assert runner.call(int) == 0  # and the thread takes calls still
    finally:
        signal.signal(signal.SIGINT, previous)
        runner.close()


def test_ctrl_c_while_waiting_on_a_started_call_leaves_its_result_and_the_thread_usable():
    """The pipeline starts the target's pass and waits on it later: a Ctrl+C during that wait
    must leave nothing half-taken (the wait is on a C-level queue, not a Python lock)."""
    runner = PinnedThread(sorted(os.sched_getaffinity(0)), "test")
    ctrl_c = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        verifying = runner.submit(lambda: time.sleep(0.3) or "logits")
        ctrl_c.start()
        with pytest.raises(KeyboardInterrupt):
            verifying.result()
        assert not verifying.done()  # interrupted while it ran on
        runner.wait_idle()
        assert verifying.done() and verifying.result() == "logits"
        assert runner.call(int) == 0
    finally:
        ctrl_c.join()
        signal.signal(signal.SIGINT, previous)
        runner.close()


def test_a_started_call_passes_its_error_back_to_whoever_waits_on_it():
    runner = PinnedThread(sorted(os.sched_getaffinity(0)), "test")
    try:
        failing = runner.submit(divmod, 1, 0)
        for _ in range(2):  # each time it is asked
            with pytest.raises(ZeroDivisionError):
                failing.result(timeout=5)
    finally:
        runner.close()


def test_a_closed_pinned_thread_refuses_calls_rather_than_leaving_them_waiting():
    runner = PinnedThread(sorted(os.sched_getaffinity(0)), "test")
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.call(int)


def test_cpus_that_cannot_be_had_when_a_pinned_thread_starts_are_a_clear_error():
    """A CPU taken offline after the start broke the thread's pool: a BrokenThreadPool
    traceback at every later decode."""
    runner = PinnedThread([4095], "target")  # no such CPU here: sched_setaffinity refuses it
    try:
        for _ in range(2):  # and it stays an error, not a broken pool
            with pytest.raises(EdgespecError, match="cannot run the target on CPUs 4095: "):
                runner.call(int)
    finally:
        runner.close()
