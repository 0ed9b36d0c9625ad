"""Errors a user can cause and fix. The CLI prints their message on one line and exits non-zero.

Anything else that escapes is a bug in edgespec and is allowed to show a traceback.
"""

from __future__ import annotations


class EdgespecError(Exception):
    """A problem with the user's input, files or environment, explained in one line."""

    exit_code = 1


class ModelFileError(EdgespecError):
    """A model file is missing, unreadable, not GGUF, truncated, or not loadable by llama.cpp."""


class IncompatibleModelsError(EdgespecError):
    """Draft and target cannot form a pair (their vocabularies differ)."""


class ContextOverflowError(EdgespecError):
    """The prompt does not fit into the context window."""

    def __init__(self, message: str, needed: int | None = None):
        super().__init__(message)
        # The prompt's tokens, where they were counted; at least as many, where its size alone
        # was more than the target was trained for.
        self.needed = needed


class BadSettingError(EdgespecError):
    """An option has a value outside its range."""

    exit_code = 2


class ModelFetchError(EdgespecError):
    """A catalogue model could not be fetched or failed its checksum."""


class UnknownModelError(EdgespecError):
    """A name that is not in the model catalogue."""
