"""Chats kept between runs. A chat at a terminal is saved after every answer, so that a closed
terminal, a kill or a crash loses at most the answer in progress, and `edgespec chat --continue`
takes up the latest; the lines typed there come back with ↑ in the next chat (readline)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from edgespec.config import state_dir
from edgespec.errors import EdgespecError

if TYPE_CHECKING:  # it imports the engine, and llama.cpp: only when a chat starts
    from edgespec.conversation import Conversation

KEPT_CHATS = 20  # the newest; older ones are deleted as a new chat is kept
TYPED_LINES = 1000  # readline's history across chats


def chats_dir() -> Path:
    return state_dir() / "chats"


def typed_lines_file() -> Path:
    return state_dir() / "typed-lines"


def latest_chat() -> Path | None:
    """The chat kept last, if any."""
    kept = _kept(chats_dir())
    return kept[-1] if kept else None


def _kept(folder: Path) -> list[Path]:
    """The kept chats, oldest first."""
    chats = []
    with contextlib.suppress(OSError):  # none yet, or one deleted while looked at
        for path in folder.glob("*.json"):
            chats.append((path.stat().st_mtime, path.name, path))
    return [path for *_, path in sorted(chats)]


class KeptChat:
    """Saves a conversation into its own file in chats_dir(), after each answer (`save`)."""

    def __init__(self, conversation: Conversation, say: Callable[[str], None], path: Path | None):
        """`path`: the kept chat this one continues, or None for a new one (made at the first
        save: a chat that asked nothing leaves no file)."""
        self.conversation = conversation
        self.say = say
        self.path = path
        self.failed = False  # said once, then not tried again

    def save(self) -> None:
        if self.failed or not self.conversation.messages:
            return
        try:
            if self.path is None:
                self.path = self._new_path()
                self._forget_oldest()
            self.conversation.save(self.path)
        except (EdgespecError, OSError) as e:
            self.failed = True
            with contextlib.suppress(OSError):  # made for a first save that failed: no chat
                if self.path is not None and not self.path.stat().st_size:
                    self.path.unlink()
            why = f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.strerror else e
            self.say(f"this chat is not kept ({why}); /save FILE keeps it")

    def start_new(self) -> None:
        """The conversation was cleared or replaced: what the file holds stays as it is, and
        what follows goes to a new one."""
        self.path = None

    def _new_path(self) -> Path:
        folder = chats_dir()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # what people asked is theirs
        stamp = time.strftime("%Y-%m-%d-%H%M%S")
        path, n = folder / f"{stamp}.json", 1
        while path.exists():  # two chats started in one second
            n += 1
            path = folder / f"{stamp}-{n}.json"
        path.touch(mode=0o600)  # taken, before another chat starting now looks
        return path

    def _forget_oldest(self) -> None:
        for old in _kept(chats_dir())[:-KEPT_CHATS]:
            with contextlib.suppress(OSError):
                old.unlink()


def remember_typed_lines() -> Callable[[], None]:
    """Load the lines typed in earlier chats into readline's history; returns what writes them
    back at the end of this one. Neither fails a chat: a history is a convenience."""
    import readline

    path = typed_lines_file()
    readline.set_history_length(TYPED_LINES)  # what the file keeps (memory keeps all)
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    earlier = readline.get_current_history_length()
    # Only this chat's lines are added to the file (and it is cut to its last TYPED_LINES):
    # two chats at once each keep theirs, where a whole history written back lost the first
    # one's. Not with libedit's readline (macOS), which lacks it.
    append = getattr(readline, "append_history_file", None)

    def write_back() -> None:
        with contextlib.suppress(OSError):
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.touch(mode=0o600)  # as the chats: what a person typed is theirs
            typed = readline.get_current_history_length() - earlier
            if append is None:
                readline.write_history_file(path)
            elif typed > 0:
                append(typed, path)

    return write_back
