"""From accepted tokens to text that is safe to stream: whole UTF-8 characters, stop strings."""

from __future__ import annotations

import codecs
from collections.abc import Sequence


def valid_text(text: str) -> str:
    """`text` as valid Unicode: what was not UTF-8 where it came from (Python keeps such bytes of
    arguments and piped input as lone surrogates, and JSON may hold "\\ud800") becomes U+FFFD,
    so it can be tokenized, printed and saved."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:  # the bytes Python kept, each one U+FFFD
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # other lone surrogates
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


class Detokenizer:
    """Feeds token bytes in, hands out only complete characters.

    A character can be split across tokens (emoji, CJK in byte-level BPE): its leading bytes are
    held back until the rest arrives, so a streamed piece is never broken UTF-8.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        """At the end: a character left incomplete (generation stopped inside it) is dropped."""
        self._decoder.reset()
        return ""


class StopMatcher:
    """Finds stop strings in streamed text, holding back any tail that could begin one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Text that is certainly output. After a stop string is found, `stopped` is True."""
        if not self.stops:
            return text
        buf = self._pending + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return buf[: min(hits)]
        hold = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(buf)), 0, -1):
                if buf.endswith(stop[:k]):
                    hold = max(hold, k)
                    break
        self._pending = buf[len(buf) - hold :]
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out
