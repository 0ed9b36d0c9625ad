"""A multi-turn chat with one engine: the history, its rendering, and saving it to a file.

The whole conversation is rendered with the chat template and tokenized for every question. The
engine reuses the KV cache of whatever start of that prompt it already holds (the previous prompt
and answer), so each turn evaluates only the new tokens.

    conversation = Conversation(engine, system="Be brief.")
    for piece in conversation.ask("Hi", max_tokens=64):
        print(piece, end="")
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .chat import ChatTemplateError, check_keeps_the_message
from .engine import GenerationConfig, beyond
from .errors import BadSettingError, ContextOverflowError, EdgespecError
from .files import regular_destination, user_path, written_into_place
from .text import valid_text

if TYPE_CHECKING:
    from .engine import Engine, Stream
    from .gguf_info import GGUFInfo
    from .stats import Stats

ROLES = ("user", "assistant")
# What /load reads at most: far more than a chat holds (/dev/zero was read until the machine
# ran out of memory).
MAX_SAVED_BYTES = 64 << 20


@dataclass
class Message:
    role: str  # "user" or "assistant"; the system message is kept apart
    content: str
    interrupted: bool = False  # an answer cut short (Ctrl+C)


class Reply:
    """The answer to one question, streamed: iterate for text pieces.

    The answer joins the conversation when the iteration ends, whichever way: complete, or cut
    short by a KeyboardInterrupt (which is re-raised) or by closing the iterator early, in which
    case the partial answer is kept with `interrupted=True` and the conversation stays usable.
    """

    def __init__(self, conversation: Conversation, stream: Stream, dropped: int):
        self.conversation = conversation
        self.stream = stream
        # Oldest turns that no longer fit the context: the model does not see them from this
        # question on (the conversation keeps them, and saves them).
        self.dropped = dropped
        self._ended = False

    def __iter__(self) -> Iterator[str]:
        finished = False
        try:
            yield from self.stream
            finished = True
        finally:
            self.close(interrupted=not finished)

    def close(self, interrupted: bool = True) -> None:
        """End the answer where it is: one that never began (Ctrl+C before its first token)
        joins the conversation empty and interrupted, so the question stays, answered."""
        if not self._ended:
            self._ended = True
            self.conversation._answered(self.stream, interrupted)


def chat_template(given: str | None, target: GGUFInfo) -> str:
    """The template a chat with `target` uses: `given` (--chat-template), else the GGUF's."""
    template = given or target.chat_template
    if template is None:
        raise EdgespecError(
            f"{target.path.name} has no chat template; give one with --chat-template"
        )
    return template


def check_chat_template(given: str | None, target: GGUFInfo, system: str | None) -> None:
    """Fail now, before any model is loaded, where a chat could not render a first question:
    no template, one that fails or one that leaves the question out (rendered as Conversation
    will, but without the model's BOS and EOS texts, which only the loaded model knows)."""
    try:
        check_keeps_the_message(chat_template(given, target), system)
    except ChatTemplateError as e:
        if given is not None:
            raise
        raise ChatTemplateError(  # the GGUF's: what can be done instead
            f"{e} (the template in {target.path.name}: give another with --chat-template)"
        ) from None


class Conversation:
    def __init__(
        self,
        engine: Engine,
        system: str | None = None,
        template: str | None = None,
        inputs: tuple[Path, ...] = (),
    ):
        """`inputs`: files the chat reads besides its models (a --chat-template), never saved
        over."""
        self.engine = engine
        self.inputs = inputs
        self.system = valid_text(system) if system is not None else None
        self.template = chat_template(template, engine.target.info)
        check_chat_template(template, engine.target.info, self.system)
        self.messages: list[Message] = []  # the whole conversation, as saved
        self.in_context = 0  # messages[in_context:] are those the last question's prompt held
        self.last_stats: Stats | None = None
        # A template that cannot render a first question fails now, not at every question; so
        # does a system message too long to leave room for one.
        self._check_first_question()

    # ----- asking ----------------------------------------------------------------------------
    def ask(self, text: str, **gen_options: object) -> Reply:
        """Ask `text`; `gen_options` are GenerationConfig fields (max_tokens, temperature, ...).

        The prompt leaves out the oldest turns where the conversation and room for the answer
        (max_tokens, at most half the context) do not fit the context (Reply.dropped says how
        many more than before); the conversation keeps them. If the question alone (with the
        system message) leaves no room for an answer, ContextOverflowError; when it fits but
        max_tokens does not, the answer may end at the context's end.
        """
        text = valid_text(text)
        if not text.strip():
            raise BadSettingError("the message is empty")
        max_tokens = gen_options.get("max_tokens", GenerationConfig.max_tokens)
        assert isinstance(max_tokens, int)
        messages = [*self.messages, Message("user", text)]
        room = min(max_tokens, self.engine.n_ctx // 2)
        tokens, start = self._fitted(messages, room, self.in_context)
        if len(tokens) >= self.engine.n_ctx:
            raise ContextOverflowError(
                f"the message needs {beyond(len(tokens), self.engine.n_ctx)}; "
                f"{self.engine.room_for(len(tokens))} message",
                needed=len(tokens),
            )
        stream = self.engine.stream(tokens, **gen_options)  # validates the options
        # Only now: a failed ask leaves the conversation as it was.
        turns_left_out = sum(m.role == "user" for m in messages[self.in_context : start])
        self.messages, self.in_context = messages, start
        return Reply(self, stream, turns_left_out)

    def _fitted(self, messages: list[Message], room: int, first: int) -> tuple[list[int], int]:
        """The prompt tokens of `messages` from the first turn on (at least `first`, where the
        last prompt began) for which the prompt and `room` fit the context, and where it begins;
        the last turn's when none fits. Older turns stay out: bringing one back would change the
        prompt's start, and the caches hold the last one's."""
        first = min(first, len(messages) - 1)
        # Where a prompt may begin: where the last one did, or at a later turn (a user message
        # and the answer after it). The fewer turns, the fewer tokens: the first start that
        # fits is found by bisection, a few renderings where one a turn made a /load of 1,000
        # turns into a 4-minute wait.
        later = range(first + 1, len(messages))
        starts = [first, *(i for i in later if messages[i].role == "user")]
        lo, hi = 0, len(starts) - 1
        tokens_at: dict[int, list[int]] = {}
        while lo < hi:
            mid = (lo + hi) // 2
            try:
                tokens_at[mid] = self.prompt_tokens(messages[starts[mid] :])
            except ContextOverflowError:  # too long by its size alone: never tokenized
                lo = mid + 1
                continue
            if len(tokens_at[mid]) + room <= self.engine.n_ctx:
                hi = mid
            else:
                lo = mid + 1
        start = starts[lo]
        return tokens_at.get(lo) or self.prompt_tokens(messages[start:]), start

    def _answered(self, stream: Stream, interrupted: bool) -> None:
        self.messages.append(Message("assistant", stream.text, interrupted))
        if stream.result is not None:
            self.last_stats = stream.result.stats

    # ----- rendering -------------------------------------------------------------------------
    def prompt_tokens(
        self, messages: list[Message] | None = None, add_generation_prompt: bool = True
    ) -> list[int]:
        """The conversation (or `messages`) rendered with the chat template and tokenized."""
        messages = self.messages if messages is None else messages
        rendered = [{"role": "system", "content": self.system}] if self.system else []
        rendered += [{"role": m.role, "content": m.content} for m in messages]
        return self.engine.chat_tokens(self.template, rendered, add_generation_prompt)

    def context_used(self) -> int:
        """Tokens the conversation takes in the context: the messages the last prompt held and
        the answer to it, with the end of its turn the next prompt adds (0 when it is empty). At
        most the context: an answer that filled it ended before its turn did."""
        held = self.messages[self.in_context :]
        if not held:  # none, or a /load whose turns all lie beyond the context
            return 0
        try:
            rendered = self.prompt_tokens(held, False)
        except ChatTemplateError:  # a template that renders only with a question to answer
            rendered = self.prompt_tokens(held, True)
        except ContextOverflowError:
            return self.engine.n_ctx
        return min(len(rendered), self.engine.n_ctx)

    # ----- state -----------------------------------------------------------------------------
    def clear(self) -> None:
        """Forget the messages (not the system message)."""
        self.messages = []
        self.in_context = 0
        self.last_stats = None

    def to_json(self) -> dict[str, object]:
        return {"system": self.system, "messages": [asdict(m) for m in self.messages]}

    def save(self, path: str | Path) -> None:
        """Write the conversation as JSON, atomically: a crash never leaves half a file. A link
        is written through, to the file it names; a file saved over keeps its permissions."""
        path = regular_destination(user_path(path, "the file"))  # not stdout's file either
        models = [m.path for m in (self.engine.target, self.engine.draft) if m is not None]
        for source in (*models, *self.inputs):  # `/save model.gguf` replaced the model
            if path.exists() and source.exists() and path.samefile(source):
                raise EdgespecError(f"cannot save {path}: this chat reads it; name another file")
        text = json.dumps(self.to_json(), ensure_ascii=False, indent=2) + "\n"
        try:
            with written_into_place(path) as tmp:
                tmp.write_text(text, "utf-8")
                if path.exists():  # saved over: its permissions stay
                    os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        except OSError as e:
            raise EdgespecError(f"cannot save {path}: {e.strerror or e}") from None

    def set_system(self, system: str | None) -> None:
        """Change the system message (None: none) for the questions from now on; one the chat
        template cannot render is refused, the conversation left as it was."""
        system = valid_text(system) if system is not None else None
        kept = self.system
        self.system = system
        try:
            self._check_first_question()
            self.prompt_tokens([*self.messages[self.in_context :], Message("user", "Hello")])
        except BaseException:
            self.system = kept
            raise

    def _check_first_question(self) -> None:
        """Render a first question after the system message, once: a template that cannot
        fails here (ChatTemplateError), and so does one whose own text, or a system message,
        the context cannot hold with a question (each was taken, and every question after it
        was told it was too long, blaming the question or the system message)."""
        if self._leaves_room_for_a_question():
            return
        if self.system is not None:
            kept, self.system = self.system, None
            try:
                template_fits = self._leaves_room_for_a_question()
            finally:
                self.system = kept
            if template_fits:
                raise ContextOverflowError(
                    f"the system message leaves no room for a question in the context "
                    f"({self.engine.n_ctx} tokens); use a larger --ctx-size or a shorter one"
                )
        raise ContextOverflowError(
            f"the chat template's own text leaves no room for a question in the context "
            f"({self.engine.n_ctx} tokens); use a larger --ctx-size or another template"
        )

    def _leaves_room_for_a_question(self) -> bool:
        try:
            return len(self.prompt_tokens([Message("user", "Hello")])) < self.engine.n_ctx
        except ContextOverflowError:  # too long by its size alone
            return False

    def load(self, path: str | Path) -> int:
        """Replace the conversation (system message included) with the one saved in `path`, and
        return how many of its oldest turns the context cannot hold (the model will not see
        them; the conversation keeps them). A conversation the chat template cannot render is
        refused, the current one left as it was."""
        return self.restore(*read_saved(path))

    def restore(self, system: str | None, messages: list[Message]) -> int:
        """`load` of a conversation read already (`read_saved`)."""
        kept = self.system
        self.system = system
        try:
            # Rendered now, with a question after it, not at the next question: a template
            # that rejects it (a system message, say) fails here, and /show counts what the
            # context can hold.
            self._check_first_question()
            start = self._fitted([*messages, Message("user", "Hello")], 0, 0)[1]
        except BaseException:
            self.system = kept
            raise
        self.messages, self.in_context = messages, start
        self.last_stats = None
        return sum(m.role == "user" for m in messages[:start])


def read_saved(path: str | Path) -> tuple[str | None, list[Message]]:
    """The system message and messages of a conversation saved in `path` (`/save`), checked;
    no model needed, so a damaged file can fail before any is loaded."""
    path = user_path(path, "the file")
    if path.exists() and not path.is_file():  # a FIFO with no writer waited forever
        raise EdgespecError(f"cannot read {path}: not a regular file")
    try:
        with path.open("rb") as f:  # not endless (/dev/zero), nor larger than any context
            raw = f.read(MAX_SAVED_BYTES + 1)
        if len(raw) > MAX_SAVED_BYTES:
            raise EdgespecError(f"{path} is over {MAX_SAVED_BYTES >> 20} MB: no saved chat")
        data = json.loads(raw.decode("utf-8"))
    except OSError as e:
        raise EdgespecError(f"cannot read {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise EdgespecError(f"{path} is not a saved conversation (not JSON)") from None
    except RecursionError:  # arrays in arrays thousands deep: the chat ended, unsaved
        raise EdgespecError(f"{path} is not a saved conversation (nested too deeply)") from None
    return _parsed(data, path)


def _parsed(data: object, path: Path) -> tuple[str | None, list[Message]]:
    """The system message and messages of a saved conversation, checked."""

    def bad(why: str) -> EdgespecError:
        return EdgespecError(f"{path} is not a saved conversation: {why}")

    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise bad('expected an object with a "messages" list')
    system = data.get("system")
    if system is not None and not isinstance(system, str):
        raise bad('"system" must be a string or null')
    messages = []
    for i, item in enumerate(data["messages"]):
        if not isinstance(item, dict):
            raise bad(f"message {i} is not an object")
        role, content = item.get("role"), item.get("content")
        interrupted = item.get("interrupted", False)
        if role not in ROLES:
            raise bad(f"message {i} has role {role!r}, not one of {', '.join(ROLES)}")
        if not isinstance(content, str) or not isinstance(interrupted, bool):
            raise bad(f'message {i} needs a string "content" and a boolean "interrupted"')
        messages.append(Message(role, valid_text(content), interrupted))
    return (valid_text(system) if system is not None else None), messages
