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
    """/proc/meminfo's MemAvailable (what can be had without swapping), its swap, its total."""

    available: int
    swap_free: int
    total: int


def memory_need(target: GGUFInfo, draft: GGUFInfo | None, n_ctx: int) -> MemoryNeed:
    """The engine's memory for this pair: both weights, and a KV cache of `n_ctx` cells each."""
    models = [target] if draft is None else [target, draft]
    cells = max(n_ctx, MIN_CTX)
    return MemoryNeed(
        weights=sum(m.file_size for m in models),
        kv_cache=sum(m.kv_bytes_per_token for m in models) * cells,
        n_ctx=n_ctx,
    )


def free_memory(meminfo: Path | None = None) -> FreeMemory | None:
    """This device's free memory, or None where /proc/meminfo cannot be read (not Linux)."""
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
    return FreeMemory(values["MemAvailable"], values.get("SwapFree", 0), values["MemTotal"])


def shortage(need: MemoryNeed, free: FreeMemory | None) -> str | None:
    """What a user should know where the models take more memory than is available; None where
    they fit or the device does not say."""
    if free is None or need.total <= free.available:
        return None
    needs = (
        f"the models need about {need.total / GIB:.1f} GiB of memory (weights "
        f"{need.weights / GIB:.1f}, a {need.n_ctx:,}-token context {need.kv_cache / GIB:.1f}, "
        f"the rest {ENGINE_OVERHEAD / GIB:.1f}) and {free.available / GIB:.1f} GiB of this "
        f"device's {free.total / GIB:.1f} is available"
    )
    if need.total > free.available + free.swap_free:
        outcome = "the system will likely stop edgespec while they load (out of memory)"
    else:
        outcome = "the system will swap, and generation may crawl"
    return (
        f"{needs}: {outcome}; close other programs, or use a smaller --target, "
        "no draft (--mode target or ngram) or a smaller --ctx-size"
    )
