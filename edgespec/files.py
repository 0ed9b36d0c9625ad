"""Files written so that whoever reads them sees the old one or the whole new one."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def written_into_place(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` for the block to write, moved onto `path` when the block
    ends without an error and removed otherwise. It is this process's own: two processes making
    the same file on first use (scripts started together) never write into one file, nor remove
    the other's."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        tmp.replace(path)
    finally:
        # Where it cannot be removed (a read-only disk: it was never made), the error that
        # ended the block says more than this one would.
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
