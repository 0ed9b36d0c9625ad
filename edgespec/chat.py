"""Chat templates from GGUF metadata, rendered in a sandbox (a GGUF is untrusted input)."""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache

from .errors import EdgespecError

Message = dict[str, str]


class ChatTemplateError(EdgespecError):
    pass


@lru_cache(maxsize=8)
def _compile(template: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    # The same environment Hugging Face uses for these templates, so they render the same way.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
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
    try:
        text = compiled.render(
            messages=messages,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        )
    except Exception as e:  # {{ 1/0 }} as well as raise_exception(...): the template's doing
        raise ChatTemplateError(f"the chat template failed: {_reason(e)}") from e
    if not text.strip():
        raise ChatTemplateError("the chat template made an empty prompt of these messages")
    return text


def _reason(error: Exception) -> str:
    """A template's own errors say what went wrong; Python's need their kind said."""
    import jinja2

    if isinstance(error, jinja2.exceptions.TemplateError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def messages_for(prompt: str, system: str | None = None) -> list[Message]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    return messages
