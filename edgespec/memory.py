"""Whether the models fit in this device's memory, said before they load.

edgespec reads the weights into memory rather than mapping the file (backend.Model), so a pair
that does not fit is not paged from storage: the system swaps it out, or its out-of-memory
killer (Android's low-memory killer first) ends the process while it loads, with no word why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .gguf_info import GGUFInfo

MEMINFO = Path("/proc/meminfo")
SELF_CGROUP = Path("/proc/self/cgroup")  # which control groups this process is in
CGROUP_ROOT = Path("/sys/fs/cgroup")
GIB = 2**30
# What an engine takes besides the weights and KV caches: Python and numpy, llama.cpp's compute
# buffers and logits, the sampling rows. Measured as resident memory after a generation (the
# Qwen 1.5B alone, the default pair, the pair at 8,192 tokens): 117, 133 and 160 MiB.
ENGINE_OVERHEAD = 160 * 2**20
MIN_CTX = 256  # llama.cpp's smallest KV cache (backend.Context)


@dataclass(frozen=True)
class MemoryNeed:
    """What loading the models takes, in bytes: weights (each file's size) and KV caches."""

    weights: int
    kv_cache: int
    n_ctx: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + ENGINE_OVERHEAD


@dataclass(frozen=True)
class FreeMemory:
    """What can be had without swapping (/proc/meminfo's MemAvailable, or what a container's
    memory limit leaves, if less), the swap free, and the memory in all (device or container)."""

    available: int
    swap_free: int
    total: int
    where: str = "this device's"


def memory_need(target: GGUFInfo, draft: GGUFInfo | None, n_ctx: int) -> MemoryNeed:
    """The engine's memory for this pair: both weights, and a KV cache of `n_ctx` cells each."""
    models = [target] if draft is None else [target, draft]
    cells = max(n_ctx, MIN_CTX)
    return MemoryNeed(
        weights=sum(m.file_size for m in models),
        kv_cache=sum(m.kv_bytes_per_token for m in models) * cells,
        n_ctx=n_ctx,
    )


def free_memory(meminfo: Path | None = None, cgroup_root: Path | None = None) -> FreeMemory | None:
    """This device's free memory, or its container's where a memory limit leaves less; None
    where /proc/meminfo cannot be read (not Linux)."""
    values: dict[str, int] = {}
    try:
        with (meminfo or MEMINFO).open() as f:
            for line in f:
                key, _, rest = line.partition(":")
                number = rest.split()
                if number and number[0].isdigit():
                    values[key] = int(number[0]) * 1024  # kB
    except OSError:
        return None
    if "MemAvailable" not in values or "MemTotal" not in values:  # kernels before 3.14
        return None
    device = FreeMemory(values["MemAvailable"], values.get("SwapFree", 0), values["MemTotal"])
    limited = container_memory(cgroup_root or CGROUP_ROOT)
    if limited is None or limited.available >= device.available:
        return device
    return limited


def container_memory(root: Path, self_cgroup: Path | None = None) -> FreeMemory | None:
    """What this process's memory control group (a container's, a systemd slice's) still
    allows, where it has a limit: /proc/meminfo shows the whole machine, and past the limit the
    kernel ends a process inside the group whatever the machine has free. Its file cache that
    can be dropped counts as free, as MemAvailable counts it (cAdvisor's working set)."""
    try:
        lines = (self_cgroup or SELF_CGROUP).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(":", 2)  # "id:controllers:path"
        if len(fields) != 3:
            continue
        _, controllers, group = fields
        if controllers == "":  # cgroup v2: one hierarchy
            folder, names = root / group.lstrip("/"), ("memory.max", "memory.current")
            cache_key = "inactive_file"
        elif "memory" in controllers.split(","):  # v1
            folder = root / "memory" / group.lstrip("/")
            names, cache_key = (
                ("memory.limit_in_bytes", "memory.usage_in_bytes"),
                "total_inactive_file",
            )
        else:
            continue
        try:
            limit_text, usage_text = ((folder / name).read_text().strip() for name in names)
            stat = dict(row.split() for row in (folder / "memory.stat").read_text().splitlines())
            limit, usage, cache = int(limit_text), int(usage_text), int(stat.get(cache_key, 0))
        except (OSError, ValueError):  # "max" (no limit), or not mounted here
            continue
        if limit >= 2**60:  # v1's "no limit": the largest page-aligned number
            continue
        return FreeMemory(max(limit - usage + cache, 0), 0, limit, "this container's")
    return None


RUN_REMEDY = "use a smaller --target, no draft (--mode target or ngram) or a smaller --ctx-size"


def shortage(need: MemoryNeed, free: FreeMemory | None, remedy: str = RUN_REMEDY) -> str | None:
    """What a user should know where the models take more memory than is available; None where
    they fit or the device does not say. `remedy`: what else the command could be asked to do."""
    if free is None or need.total <= free.available:
        return None
    needs = (
        f"the models need about {need.total / GIB:.1f} GiB of memory (weights "
        f"{need.weights / GIB:.1f}, a {need.n_ctx:,}-token context {need.kv_cache / GIB:.1f}, "
        f"the rest {ENGINE_OVERHEAD / GIB:.1f}) and {free.available / GIB:.1f} GiB of "
        f"{free.where} {free.total / GIB:.1f} is available"
    )
    if need.total > free.available + free.swap_free:
        outcome = "the system will likely stop edgespec while they load (out of memory)"
    else:
        outcome = "the system will swap, and generation may crawl"
    return f"{needs}: {outcome}; close other programs, or {remedy}"
