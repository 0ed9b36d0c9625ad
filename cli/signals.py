"""SIGTERM taken as Ctrl+C, for the commands that write files or answer; SIGHUP and SIGTERM
as the end of a kept chat."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Iterator

# The commands SIGTERM ends as it ends any program (exit 143): chat goes on after a Ctrl+C, and
# inspect is over at once. The others take it as Ctrl+C (sigterm_as_ctrl_c).
SIGTERM_ENDS = ("chat", "inspect")


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def sigterm_as_ctrl_c(command: Callable[..., None]) -> Callable[..., None]:
    """`command` takes SIGTERM as it takes Ctrl+C: the answer so far is written (with --json,
    in the object) and the exit is 130. Scripts stop a run that way (`timeout 60 edgespec run`,
    `kill`, Android ending a task), and lost all of it. Once one has come, those after it are
    ignored: a second Ctrl+C 2-5 ms after the first came while the answer so far was being
    written, and `run --json` wrote nothing (2 tries in 9)."""

    @functools.wraps(command)
    def wrapped(*args: object, **kwargs: object) -> None:
        if threading.current_thread() is not threading.main_thread():  # no signals there
            return command(*args, **kwargs)
        interrupted = False

        def interrupt_once(signum: int, frame: object) -> None:
            nonlocal interrupted
            if not interrupted:
                interrupted = True
                raise KeyboardInterrupt

        # One ignored stays so: a job a script starts with `&` has SIGINT ignored.
        signals = [
            s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN
        ]
        before = {s: signal.signal(s, interrupt_once) for s in signals}
        try:
            return command(*args, **kwargs)
        finally:
            for signum, handler in before.items():
                signal.signal(signum, handler)

    return wrapped


class Ended(BaseException):
    """The terminal closed (SIGHUP) or the chat was told to end (SIGTERM): not a Ctrl+C, which
    a chat takes as "stop this answer" and goes on."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum


@contextlib.contextmanager
def ended_by_signals() -> Iterator[None]:
    """SIGHUP and SIGTERM raise Ended inside: the chat keeps what it has before it exits."""

    ending = False

    def end(signum: int, frame: object) -> None:
        nonlocal ending
        if not ending:  # once: the terminal's SIGHUP after a SIGTERM must not cut the save short
            ending = True
            raise Ended(signum)

    if threading.current_thread() is not threading.main_thread():  # no signals there
        yield
        return
    before = {
        signum: signal.signal(signum, end)
        for signum in (signal.SIGHUP, signal.SIGTERM)
        if signal.getsignal(signum) is not signal.SIG_IGN  # `nohup edgespec chat` stays up
    }
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
