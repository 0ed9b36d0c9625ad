"""The edgespec command line (installed as edgespec.cli)."""

from __future__ import annotations

import os
import signal
import sys

from .signals import SIGTERM_ENDS, interrupt

INTERRUPTED = 130  # the exit status of a Ctrl+C (128 + SIGINT), as shells report it


def main() -> int:
    """The console script. The command line imports llama.cpp, numpy, typer and rich first (half
    a second here, more on a Pi), then typer builds its commands: a Ctrl+C meanwhile is an exit
    130 like any other, not a traceback."""
    if sys.stderr is None:  # started with stderr closed (`2>&-`): print(file=None) wrote the
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115  errors to stdout, in the answer's place
    before = signal.getsignal(signal.SIGTERM)
    if sys.argv[1:2] and sys.argv[1] not in SIGTERM_ENDS and before is not signal.SIG_IGN:
        # As the command will (signals.sigterm_as_ctrl_c), from before its imports: a SIGTERM
        # in their half second here (seconds on a Pi) ended `run` with 143, not 130.
        signal.signal(signal.SIGTERM, interrupt)
    try:
        from .app import main as run

        return run()
    except KeyboardInterrupt:
        say_interrupted()
        return INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, before)


def say_interrupted() -> None:
    """The line of an exit 130. At a terminal, on a line of its own: the terminal has echoed ^C
    where the cursor was. Elsewhere (a script's log, `-q`) without the empty line before it."""
    print(("\n" if sys.stderr.isatty() else "") + "interrupted", file=sys.stderr)
