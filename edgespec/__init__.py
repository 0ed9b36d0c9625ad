"""edgespec: faster LLM generation on CPUs by speculative decoding.

import edgespec
engine = edgespec.load("target.gguf", draft="draft.gguf")
result = engine.generate("Write a haiku about caches", max_tokens=64)
print(result.text, result.stats.acceptance_rate)
"""

from __future__ import annotations

import os

# llama.cpp's CPU threads (OpenMP, in llama-cpp-python's build) wait for each other at every
# node of the graph, spinning for a while before they sleep. Where another program keeps a core
# busy, a thread spinning there holds its core from the one it waits for: decoding the 1.5B
# target on 2 threads with 2 busy processes beside it took 3.1 s a step at times (0.6 tok/s),
# never with a short spin (140-390 ms), which cost nothing measurable on a quiet machine (auto
# mode 11.3 against 11.3 tok/s, 12 answers each). Read by libgomp when llama.cpp loads; a
# setting of the user's wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")

TYPE_CHECKING = False  # not typing's: importing it costs the start time this module saves
if TYPE_CHECKING:
    from .engine import Engine, GenerationConfig, Result, Stream, load
    from .errors import (
        BadSettingError,
        ContextOverflowError,
        EdgespecError,
        IncompatibleModelsError,
        ModelFileError,
    )
    from .stats import Stats

# The errors a caller may want apart (each an EdgespecError): a bad file, a pair that cannot
# work together, a prompt too long for the context, a bad setting.
__all__ = [
    "BadSettingError",
    "ContextOverflowError",
    "EdgespecError",
    "Engine",
    "GenerationConfig",
    "IncompatibleModelsError",
    "ModelFileError",
    "Result",
    "Stats",
    "Stream",
    "load",
]
__version__ = "0.1.0"

# Imported on first use: the engine brings in llama.cpp and numpy (half a second here), and the
# command line must be able to start, and take a Ctrl+C, before that (edgespec.cli.main).
_HOMES = {name: ".errors" for name in __all__ if name.endswith("Error")} | {"Stats": ".stats"}


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_HOMES.get(name, ".engine"), __name__), name)
