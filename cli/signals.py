"""SIGTERM taken as Ctrl+C, for the commands that write files or answer."""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable


def sigterm_as_ctrl_c(command: Callable[..., None]) -> Callable[..., None]:
    """`command` takes SIGTERM as it takes Ctrl+C: the answer so far is written (with --json,
    in the object) and the exit is 130. Scripts stop a run that way (`timeout 60 edgespec run`,
    `kill`, Android ending a task), and lost all of it."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    @functools.wraps(command)
    def wrapped(*args: object, **kwargs: object) -> None:
        if threading.current_thread() is not threading.main_thread():  # no signals there
            return command(*args, **kwargs)
        before = signal.signal(signal.SIGTERM, interrupt)
        try:
            return command(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, before)

    return wrapped
