"""Where a prompt's text comes from: an argument, stdin ("-"), files given with it, and the
chat template it is put in."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

from edgespec.errors import BadSettingError, EdgespecError
from edgespec.files import user_path
from edgespec.text import valid_text

MAX_PROMPT_BYTES = 64 << 20
STDIN = Path("-")
SNIFFED_BYTES = 8192


def read_prompt(prompt: str) -> str:
    """The prompt as given, or read from stdin for "-"; bytes that are not UTF-8 become U+FFFD.
    From stdin without the newline that ends its last line (`echo`, a file): with it, the same
    question was a prompt one token longer than as an argument, and answered otherwise."""
    if prompt == "-":
        text = read_stdin(read_at_most(MAX_PROMPT_BYTES, "the prompt on stdin"))
        return text[:-1] if text.endswith("\n") else text
    return valid_text(prompt)


def prompt_lines(prompt: str) -> Iterator[str]:
    """The lines of the prompt that hold text; for "-", stdin's, each as soon as it arrives (a
    script may write its next question after reading an answer)."""
    if prompt == "-":
        lines: Iterable[str] = stdin_lines()
    else:  # lines end at \n as stdin's do (splitlines also ends them at \f, U+2028, ...)
        lines = valid_text(prompt).split("\n")
    return (line.rstrip("\r\n") for line in lines if line.strip())


def stdin_lines(limit: int = MAX_PROMPT_BYTES) -> Iterator[str]:
    """stdin's lines, each as it arrives; one longer than `limit` bytes is an error (after those
    before it): `--each-line - < /dev/zero` read one line until memory ran out, and a line of
    70 MB was refused as the chat template's fault, ending the run."""
    stream = getattr(sys.stdin, "buffer", sys.stdin)
    number = 0
    while line := stream.readline(limit + 2):  # room for its \r\n
        number += 1
        if len(line.rstrip(b"\r\n" if isinstance(line, bytes) else "\r\n")) > limit:
            raise BadSettingError(
                f"line {number} of stdin is over {limit >> 20} MB: more than any context holds"
            )
        yield line.decode("utf-8", "replace") if isinstance(line, bytes) else valid_text(line)


def read_at_most(limit: int, what: str) -> Callable[[IO], str | bytes]:
    """A reader of a whole stream that refuses one longer than `limit` (/dev/zero was read
    until the machine ran out of memory)."""

    def read(stream: IO) -> str | bytes:
        data = stream.read(limit + 1)
        if len(data) > limit:
            raise BadSettingError(f"{what} is over {limit >> 20} MB: more than any context holds")
        return data

    return read


def read_stdin(read: Callable[[IO], str | bytes]) -> str:
    """`read` applied to stdin's bytes, decoded as UTF-8 whatever the locale (a bad byte must not
    be a traceback); to stdin itself where it has no bytes (a test's StringIO)."""
    data = read(getattr(sys.stdin, "buffer", sys.stdin))
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else valid_text(data)


def read_files(paths: Sequence[Path], prompt: str) -> list[tuple[str, str]]:
    """The (name, text) of each file given with the prompt (`--file`), "-" for stdin's. Read
    before any model loads: a file that is missing, a folder, unreadable or not text fails first."""
    if STDIN in paths and (prompt == "-" or paths.count(STDIN) > 1):
        raise BadSettingError("stdin can be read once: give '-' as the prompt or one --file")
    return [(str(path), read_file(path)) for path in paths]


def read_file(path: Path) -> str:
    """A file's text (bytes that are not UTF-8 become U+FFFD)."""
    if path == STDIN:
        text = read_stdin(read_at_most(MAX_PROMPT_BYTES, "the file on stdin"))
    else:
        try:
            with path.open("rb") as stream:
                data = stream.read(SNIFFED_BYTES)  # a model is not text, before it is too long
                if b"\0" not in data:
                    data += read_at_most(MAX_PROMPT_BYTES, str(path))(stream)
        except FileNotFoundError:
            raise BadSettingError(f"no such file: {path}") from None
        except IsADirectoryError:
            raise BadSettingError(f"{path} is a directory; --file takes a file") from None
        except OSError as e:
            raise BadSettingError(f"cannot read {path}: {e.strerror or e}") from None
        text = data.decode("utf-8", "replace")
    if "\0" in text:  # a model or an archive: tokens of noise that overflow the context
        raise BadSettingError(f"{path} is not text (it holds NUL bytes)")
    return text


def with_files(prompt: str, files: Sequence[tuple[str, str]]) -> str:
    """The prompt after the files' texts, each fenced under its name (stdin's without one). The
    question comes last, where instruction models look for it, and the files first, so that the
    answers of --each-line, which share them, reuse the cache of every token before it."""
    parts = []
    for name, text in files:
        fence = "```"
        while fence in text:  # a longer fence, so that one inside the file does not end it
            fence += "`"
        body = text.removesuffix("\n")
        block = f"{fence}\n{body}\n{fence}"
        parts.append(block if name == str(STDIN) else f"{name}:\n{block}")
    return "\n\n".join([*parts, prompt])


MAX_TEMPLATE_BYTES = 1 << 20  # templates are a few kB; /dev/zero was read until memory ran out


def read_template(path: Path) -> str:
    """A chat template file's text, or one clear error."""
    try:
        with user_path(path, "the chat template").open("rb") as f:
            raw = f.read(MAX_TEMPLATE_BYTES + 1)
        if len(raw) > MAX_TEMPLATE_BYTES:
            raise EdgespecError(f"the chat template {path} is over 1 MB: not a chat template")
        if not raw.strip():  # an empty one was taken as none given: the model's was used
            raise EdgespecError(f"the chat template {path} is empty")
        if b"\0" in raw:  # rendered as it was, with the prompt left out
            raise EdgespecError(f"the chat template {path} is not text (it holds NUL bytes)")
        return raw.decode("utf-8")
    except OSError as e:
        raise EdgespecError(f"cannot read the chat template {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise EdgespecError(f"the chat template {path} is not UTF-8 text") from None
