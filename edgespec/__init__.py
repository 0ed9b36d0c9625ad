"""edgespec: faster LLM generation on CPUs by speculative decoding.

import edgespec
engine = edgespec.load("target.gguf", draft="draft.gguf")
result = engine.generate("Write a haiku about caches", max_tokens=64)
print(result.text, result.stats.acceptance_rate)
"""

from .engine import Engine, GenerationConfig, Result, Stream, load
from .errors import EdgespecError
from .stats import Stats

__all__ = ["EdgespecError", "Engine", "GenerationConfig", "Result", "Stats", "Stream", "load"]
__version__ = "0.1.0"
