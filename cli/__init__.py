"""The edgespec command line (installed as edgespec.cli)."""

from __future__ import annotations

import sys

INTERRUPTED = 130  # the exit status of a Ctrl+C (128 + SIGINT), as shells report it


def main() -> int:
    """The console script. The command line imports llama.cpp, numpy, typer and rich first (half
    a second here, more on a Pi), then typer builds its commands: a Ctrl+C meanwhile is an exit
    130 like any other, not a traceback."""
    try:
        from .app import main as run

        return run()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return INTERRUPTED
