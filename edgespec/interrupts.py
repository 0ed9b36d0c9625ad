"""Ctrl+C (and SIGTERM) held while something must not be cut short, then handled."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def interrupts_held(on_signal: Callable[[], object] = lambda: None) -> Iterator[None]:
    """Ctrl+C (and SIGTERM, where the CLI takes it as one) held until a long native call
    returns, then handled; `on_signal` is called as it comes (a load then stops at its next
    tensor). llama.cpp calls back into Python (its log) while it loads or quantizes, and a
    KeyboardInterrupt raised inside a ctypes callback is printed as a traceback and dropped:
    the load went on, and the run with it (exit 0 after a SIGTERM)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only
        return
    pressed: list[int] = []

    def hold(signum: int, _frame: object) -> None:
        pressed.append(signum)
        on_signal()

    # Only signals Python handles: one ignored or left to the system stays so.
    held = {s: h for s in (signal.SIGINT, signal.SIGTERM) if callable(h := signal.getsignal(s))}
    for signum in held:
        signal.signal(signum, hold)
    try:
        yield
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)
    if pressed:
        held[pressed[0]](pressed[0], None)
