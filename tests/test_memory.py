"""Whether the models fit in memory: estimated from the files, checked against llama.cpp's own
accounting and the memory a loaded engine really holds, and said before anything loads."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import edgespec.memory as memory
from edgespec.backend import Context, Model, set_verbose
from edgespec.gguf_info import read_gguf
from edgespec.memory import ENGINE_OVERHEAD, FreeMemory, MemoryNeed, free_memory, memory_need

from .helpers import hear_ctrl_c
from .test_cli import cli

GIB = 2**30


@pytest.fixture(autouse=True)
def no_container(tmp_path, monkeypatch):
    """The machine's own memory control group (a CI container's limit) stays out of these."""
    monkeypatch.setattr(memory, "SELF_CGROUP", tmp_path / "no-cgroup")


def meminfo(tmp_path: Path, available_mib: int, swap_free_mib: int = 0) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(
        "MemTotal:        3993668 kB\n"
        "MemFree:          120000 kB\n"
        f"MemAvailable:   {available_mib * 1024:>9} kB\n"
        "Buffers:           20000 kB\n"
        f"SwapTotal:      {swap_free_mib * 1024:>9} kB\n"
        f"SwapFree:       {swap_free_mib * 1024:>9} kB\n"
    )
    return path


def test_the_kv_cache_estimate_is_what_llama_cpp_allocates(smol_path, capsys):
    set_verbose(True)
    try:
        ctx = Context(Model(smol_path), n_ctx=1024, n_threads=1, n_seq_max=16)
        ctx.close()
    finally:
        set_verbose(False)
    log = capsys.readouterr().err
    said = re.search(r"llama_kv_cache: size = +([\d.]+) MiB \( *1024 cells", log)
    assert said is not None
    need = memory_need(read_gguf(smol_path), None, 1024)
    assert need.kv_cache == pytest.approx(float(said.group(1)) * 2**20, rel=1e-3)


def test_the_estimate_covers_what_a_loaded_engine_holds_with_the_overhead_as_margin(smol_path):
    # In a process of its own: the resident memory it grew by is the engine's alone (the modules
    # `load` imports, numpy's and llama.cpp's, 20 MiB here, were counted in it).
    script = f"""
import edgespec.engine
def anon():
    status = open("/proc/self/status").read().splitlines()
    return next(int(l.split()[1]) * 1024 for l in status if l.startswith("RssAnon"))
before = anon()
engine = edgespec.load({str(smol_path)!r}, {str(smol_path)!r}, n_ctx=2048)
engine.generate("Tell me about the sea.", max_tokens=16, mode="tree")
print(anon() - before)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    grew = int(done.stdout.split()[-1])
    info = read_gguf(smol_path)
    need = memory_need(info, info, 2048)
    assert need.weights + need.kv_cache <= grew <= need.total


def test_a_context_smaller_than_llama_cpps_least_is_counted_at_that_least(smol_path):
    info = read_gguf(smol_path)
    assert memory_need(info, None, 64).kv_cache == memory_need(info, None, 256).kv_cache > 0


def test_free_memory_is_read_from_meminfo_and_none_where_it_cannot_be(tmp_path):
    free = free_memory(meminfo(tmp_path, available_mib=900, swap_free_mib=100))
    assert free == FreeMemory(900 * 2**20, 100 * 2**20, 3993668 * 1024)
    assert free_memory(tmp_path / "missing") is None
    (tmp_path / "old").write_text("MemTotal: 1000 kB\nMemFree: 500 kB\n")  # before Linux 3.14
    assert free_memory(tmp_path / "old") is None


def test_swap_counts_what_is_free_of_it_and_odd_lines_are_skipped(tmp_path):
    path = meminfo(tmp_path, available_mib=900)
    with path.open("a") as f:
        f.write("SwapTotal:       2048000 kB\nSwapFree:         102400 kB\nOdd:   n/a\n")
    assert free_memory(path) == FreeMemory(900 * 2**20, 100 * 2**20, 3993668 * 1024)


def cgroup(tmp_path: Path, line: str, folder: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake /proc/self/cgroup holding `line`, and a cgroup tree with `files` in `folder`."""
    (tmp_path / "self_cgroup").write_text(f"{line}\n")
    (tmp_path / folder).mkdir(parents=True)
    for name, text in files.items():
        (tmp_path / folder / name).write_text(text)
    return tmp_path, tmp_path / "self_cgroup"


MIB = 2**20


def test_a_containers_memory_limit_counts_what_it_leaves_with_its_droppable_cache_free(tmp_path):
    root, self_cgroup = cgroup(tmp_path, "0::/docker/abc", "docker/abc", {
        "memory.max": f"{2048 * MIB}\n", "memory.current": f"{1500 * MIB}\n",
        "memory.stat": f"anon {1000 * MIB}\ninactive_file {300 * MIB}\n",
    })  # fmt: skip
    limited = memory.container_memory(root, self_cgroup)
    assert limited == FreeMemory(848 * MIB, 0, 2048 * MIB, "this container's")


def test_a_container_over_its_limit_has_nothing_available_not_less_than_nothing(tmp_path):
    """memory.current passes memory.max for a while after the limit is lowered."""
    root, self_cgroup = cgroup(tmp_path, "0::/c", "c", {
        "memory.max": f"{512 * MIB}", "memory.current": f"{600 * MIB}", "memory.stat": "",
    })  # fmt: skip
    assert memory.container_memory(root, self_cgroup) == FreeMemory(
        0, 0, 512 * MIB, "this container's"
    )


def test_a_group_that_cannot_be_read_gives_way_to_the_next_line(tmp_path):
    root, self_cgroup = cgroup(tmp_path, "0::/c", "c", {
        "memory.max": f"{512 * MIB}", "memory.current": f"{12 * MIB}", "memory.stat": "",
    })  # fmt: skip
    self_cgroup.write_text("5:memory:/not-mounted-here\n0::/c\n")
    assert memory.container_memory(root, self_cgroup).available == 500 * MIB


def test_a_v1_memory_controller_is_read_too_and_no_limit_is_none(tmp_path):
    line = "4:memory:/process_api/x"
    root, self_cgroup = cgroup(tmp_path, line, "memory/process_api/x", {
        "memory.limit_in_bytes": f"{1024 * MIB}", "memory.usage_in_bytes": f"{1000 * MIB}",
        "memory.stat": f"cache 9\ntotal_inactive_file {100 * MIB}\n",
    })  # fmt: skip
    assert memory.container_memory(root, self_cgroup) == FreeMemory(
        124 * MIB, 0, 1024 * MIB, "this container's"
    )
    (root / "memory/process_api/x/memory.limit_in_bytes").write_text(str(2**63 - 4096))
    assert memory.container_memory(root, self_cgroup) is None  # v1's "no limit"


def test_a_line_of_proc_self_cgroup_that_is_no_group_is_passed_over(tmp_path):
    root, self_cgroup = cgroup(tmp_path, "garbage\n0::/c", "c", {
        "memory.max": f"{512 * MIB}", "memory.current": f"{12 * MIB}", "memory.stat": "",
    })  # fmt: skip
    assert memory.container_memory(root, self_cgroup).available == 500 * MIB


def test_a_cgroup_without_a_memory_limit_or_files_leaves_the_devices_figures(tmp_path):
    root, self_cgroup = cgroup(tmp_path, "0::/user.slice", "user.slice", {
        "memory.max": "max\n", "memory.current": "123\n", "memory.stat": "anon 1\n",
    })  # fmt: skip
    assert memory.container_memory(root, self_cgroup) is None
    assert memory.container_memory(root, tmp_path / "missing") is None


def test_the_smaller_of_the_devices_and_the_containers_room_is_what_is_available(
    tmp_path, monkeypatch
):
    root, self_cgroup = cgroup(tmp_path, "0::/c", "c", {
        "memory.max": f"{512 * MIB}", "memory.current": f"{12 * MIB}", "memory.stat": "",
    })  # fmt: skip
    monkeypatch.setattr(memory, "SELF_CGROUP", self_cgroup)
    device = meminfo(tmp_path, available_mib=900)
    assert free_memory(device, root) == FreeMemory(500 * MIB, 0, 512 * MIB, "this container's")
    (tmp_path / "roomy").mkdir()
    roomy = meminfo(tmp_path / "roomy", available_mib=400)
    assert free_memory(roomy, root).where == "this device's"
    need = MemoryNeed(weights=GIB, kv_cache=0, n_ctx=2048)
    said = memory.shortage(need, free_memory(device, root))
    assert said is not None and "0.5 GiB of this container's 0.5 is available" in said


def test_models_that_fit_what_is_available_are_not_mentioned():
    need = MemoryNeed(weights=GIB, kv_cache=0, n_ctx=2048)
    assert memory.shortage(need, FreeMemory(need.total, 0, 4 * GIB)) is None
    assert memory.shortage(need, None) is None  # not Linux: nothing to say
    assert memory.shortage(need, FreeMemory(need.total - 1, 0, 4 * GIB)) is not None


def test_a_shortage_says_swap_where_swap_holds_the_rest_and_out_of_memory_where_nothing_does():
    need = MemoryNeed(weights=GIB, kv_cache=GIB // 4, n_ctx=8192)
    short_of = need.total - GIB // 2
    swapping = memory.shortage(need, FreeMemory(short_of, GIB, 4 * GIB))
    assert swapping is not None and "the system will swap" in swapping
    killed = memory.shortage(need, FreeMemory(short_of, GIB // 4, 4 * GIB))
    assert killed is not None and "stop edgespec while they load (out of memory)" in killed
    assert "weights 1.0, a 8,192-token context 0.2" in killed
    assert f"the rest {ENGINE_OVERHEAD / GIB:.1f}" in killed


def test_run_says_before_loading_that_the_models_do_not_fit_and_still_runs(
    capsys, smol_path, tmp_path, monkeypatch
):
    monkeypatch.setattr(memory, "MEMINFO", meminfo(tmp_path, available_mib=100))
    args = ["-m", str(smol_path), "--draft", str(smol_path), "-n", "4", "hi"]
    code, out, err = cli(capsys, "run", *args)
    assert code == 0 and out
    lines = err.splitlines()
    said = next(i for i, line in enumerate(lines) if "the models need about" in line)
    assert "0.1 GiB of this device's 3.8 is available" in lines[said]
    assert "out of memory" in lines[said] and "smaller --ctx-size" in lines[said]
    monkeypatch.setattr(memory, "MEMINFO", meminfo(tmp_path, available_mib=4000))
    code, _, err = cli(capsys, "run", *args)
    assert code == 0 and "the models need" not in err


def test_bench_says_before_loading_that_the_models_do_not_fit_in_its_own_flags(
    smol_path, tmp_path, monkeypatch
):
    from edgespec.bench import BenchPrompt, run_bench
    from edgespec.errors import BadSettingError

    monkeypatch.setattr(memory, "MEMINFO", meminfo(tmp_path, available_mib=100))
    said: list[str] = []
    long = BenchPrompt("long-one", "code", "word " * 400, 8)  # stops the bench once loaded
    with pytest.raises(BadSettingError, match="long-one"):
        run_bench(smol_path, smol_path, ["chain"], [long], n_ctx=256, say=said.append)
    assert len(said) == 1 and "the models need about" in said[0]
    assert said[0].endswith(
        "bench a smaller --target (named alone it has no draft) or a smaller --ctx-size"
    )
    monkeypatch.setattr(memory, "MEMINFO", meminfo(tmp_path, available_mib=4000))
    said.clear()
    with pytest.raises(BadSettingError, match="long-one"):
        run_bench(smol_path, smol_path, ["chain"], [long], n_ctx=256, say=said.append)
    assert said == []


def test_a_load_shows_its_progress_on_a_terminal_once_it_takes_a_while_and_erases_it(
    capsys, smol_path, monkeypatch
):
    import io

    from rich.console import Console

    from edgespec.cli import app as cli_app

    terminal = io.StringIO()
    monkeypatch.setattr(cli_app, "err", Console(file=terminal, force_terminal=True))
    monkeypatch.setattr(cli_app, "SHOW_LOAD_AFTER_S", 0.0)  # a load here is too quick to show
    code, out, _ = cli(capsys, "run", "-m", str(smol_path), "--draft", str(smol_path), "-n", "2",
                       "hi")  # fmt: skip
    assert code == 0 and out
    shown = terminal.getvalue()
    loading, _, after = shown.partition("\r\x1b[K")  # erased when done, before anything else
    percents = [int(p) for p in re.findall(r"\rloading the models (\d+)%", loading)]
    assert percents == sorted(percents) and percents[-1] == 100 and len(percents) > 10
    assert "loading" not in after and "tok/s" in after


def test_ctrl_c_while_the_models_load_stops_both_loads_at_their_next_tensor(smol_path):
    """llama.cpp loads a file in one call, and Ctrl+C waited for its end: ~30 s for the default
    pair from a Pi's SD card. Here each tensor's progress is slowed to make a long load, and
    a Ctrl+C comes a fifth of the way in: the load ends there, the draft's (on a thread of its
    own, signals reach only the main one) too."""
    script = f"""
import os, signal, time
import edgespec
seen = []
def slowly(fraction):
    seen.append(fraction)
    time.sleep(0.005)
    if len(seen) == 40:
        os.kill(os.getpid(), signal.SIGINT)
        seen.append(time.monotonic())
try:
    edgespec.load({str(smol_path)!r}, {str(smol_path)!r}, n_ctx=512, progress=slowly)
    print("loaded")
except KeyboardInterrupt:
    pressed = seen.pop(40)
    print("interrupted", max(seen), len(seen), time.monotonic() - pressed)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, preexec_fn=hear_ctrl_c
    )
    assert done.returncode == 0, done.stderr
    said, fraction, calls, seconds = done.stdout.split()
    assert said == "interrupted"
    # Both files are the same size: the draft's load alone, had it gone on, is half the bytes.
    assert float(fraction) < 0.5 and int(calls) < 60 and float(seconds) < 1.0
