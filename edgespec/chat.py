"""Chat templates from GGUF metadata, rendered in a sandbox (a GGUF is untrusted input)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from datetime import datetime
from functools import lru_cache

from .errors import EdgespecError

Message = dict[str, str]


class ChatTemplateError(EdgespecError):
    pass


# What a template may write: far more than any context holds (64 MB, the cap on a prompt read
# from stdin, is 16 million tokens at the least).
MAX_RENDERED_CHARS = 1 << 26


@lru_cache(maxsize=8)
def _compile(template: str):
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox bounds range() but not a repetition: "{{ 'A' * 100000000 }}", twenty
        bytes of template, took 11 GB before anything could refuse its text."""

        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator: str, left, right):
            if operator == "**" and isinstance(right, int) and right > 1024:
                raise jinja2.exceptions.SecurityError(f"a power of {right} is too large")
            times, seq = (left, right) if isinstance(left, int) else (right, left)
            if (
                operator == "*"
                and isinstance(times, int)
                and isinstance(seq, (str, list, tuple))
                and len(seq) * times > MAX_RENDERED_CHARS
            ):
                raise jinja2.exceptions.SecurityError(
                    f"a repetition of {len(seq) * times:,} items is too long"
                )
            return super().call_binop(context, operator, left, right)

    class Generation(jinja2.ext.Extension):
        """`{% generation %}…{% endgeneration %}`, which marks an assistant's text for training
        in Hugging Face's rendering: its body, as it is."""

        tags = frozenset({"generation"})

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller) -> str:
            return caller()

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
        """Hugging Face's: JSON as it is, where jinja's own escapes <, >, & and ' for HTML."""
        return json.dumps(
            value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
            sort_keys=sort_keys,
        )  # fmt: skip

    # The same environment Hugging Face uses for these templates (bounded as above), so they
    # render the same way.
    env = BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, "jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = tojson
    try:
        return env.from_string(template)
    except Exception as e:  # a GGUF's template is untrusted: whatever fails is its fault
        raise ChatTemplateError(f"the chat template does not parse: {_reason(e)}") from e


def render(
    template: str,
    messages: list[Message],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
) -> str:
    compiled = _compile(template)
    pieces, size = [], 0
    try:
        for piece in compiled.generate(
            messages=messages,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        ):
            size += len(piece)
            if size > MAX_RENDERED_CHARS:  # a loop of long pieces: no text a context holds
                raise ChatTemplateError(
                    f"the chat template made a text of over {MAX_RENDERED_CHARS:,} characters"
                )
            pieces.append(piece)
    except ChatTemplateError:
        raise
    except Exception as e:  # {{ 1/0 }} as well as raise_exception(...): the template's doing
        raise ChatTemplateError(f"the chat template failed: {_reason(e)}") from e
    text = "".join(pieces)
    if not text.strip():
        raise ChatTemplateError("the chat template made an empty prompt of these messages")
    return text


def _reason(error: Exception) -> str:
    """A template's own errors say what went wrong; Python's need their kind said."""
    import jinja2

    if isinstance(error, jinja2.exceptions.TemplateError):
        return str(error)
    return f"{type(error).__name__}: {error}"


# Where a message's content goes, in a rendering that marks it: characters of a private-use
# plane no text a person types holds.
_MARK = "\U000f0000{}\U000f0001"
_MARKS = re.compile("(\U000f0000\\d+\U000f0001)")


def typed_pieces(
    render_messages: Callable[[list[Message]], str],
    messages: list[Message],
    text: str,
    typed: Collection[int],
) -> list[tuple[str, bool]] | None:
    """`text`, the messages as `render_messages` renders them, cut into the template's own text
    and the contents of the messages numbered in `typed`, each piece with whether it is one of
    those: text people typed, whose `<|im_end|>` is text, not the end of a turn. None where
    the template does not put those contents into `text` as they are, or trimmed (Gemma's
    trims them), but edits them."""
    marked = [
        {**m, "content": _MARK.format(i)} if i in typed else m for i, m in enumerate(messages)
    ]
    parts = _MARKS.split(render_messages(marked))
    for as_put in (str, str.strip):
        pieces = []
        for i, part in enumerate(parts):
            if i % 2:  # a mark
                pieces.append((as_put(messages[int(part[1:-1])]["content"]), True))
            elif part:
                pieces.append((part, False))
        if "".join(piece for piece, _ in pieces) == text:
            return pieces
    return None


# A question no template writes itself: where what it renders lacks it, the template left the
# message out.
PROBE = "Which prime follows 7919?"


@lru_cache(maxsize=8)  # `run` checks before loading, the engine at every text prompt
def check_keeps_the_message(template: str, system: str | None = None) -> None:
    """Refuse a template that leaves out the message it is given: one that wrote a fixed text
    had the model answer that text instead of the question, and nothing said so."""
    if PROBE not in render(template, messages_for(PROBE, system)):
        raise ChatTemplateError(
            "the chat template leaves out the message: what it writes does not hold the question"
        )


def messages_for(prompt: str, system: str | None = None) -> list[Message]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    return messages
