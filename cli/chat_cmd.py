"""`edgespec chat`: a conversation in the terminal (ollama's REPL conventions).

Answers stream to stdout, a one-line summary of each goes to stderr. The loop reads messages and
commands; the conversation itself (history, context, files) is edgespec.conversation's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from edgespec.config import CHOICES, Settings, parse_value
from edgespec.errors import BadSettingError, ContextOverflowError, EdgespecError
from edgespec.files import user_path
from edgespec.text import valid_text

from . import options as opt
from .kept_chats import KeptChat, chats_dir, latest_chat, remember_typed_lines
from .prompts import read_file, read_files, read_stdin, read_template, with_files
from .signals import Ended, ended_by_signals

if TYPE_CHECKING:  # the engine imports llama.cpp: only when a chat starts
    from edgespec.conversation import Conversation, Message
    from edgespec.engine import Engine

SETTABLE = ("temp", "top_k", "top_p", "min_p", "seed", "max_tokens", "mode", "draft_max")
AUTO_SETTABLE = ("seed", "mode", "draft_max")  # `/set NAME auto` gives the choice back
MULTILINE = '"""'
HELP = f"""\
/set NAME VALUE   change a setting: {", ".join(SETTABLE)}
                  ({", ".join(AUTO_SETTABLE)}: auto gives the choice back)
/set system TEXT  the system message from the next question on (none: no system message)
/show             settings, models and context use
/stats            the last answer's statistics as JSON
/clear            forget the conversation
/save FILE        save the conversation as JSON
/load FILE        continue a saved conversation
/file FILE        put a file's text before your next message (fenced under its name)
/bye, /exit       leave (or Ctrl+D)
{MULTILINE} ... {MULTILINE}       a message of several lines (Ctrl+C drops it, Ctrl+P recalls it)
Ctrl+C stops an answer and keeps what it said so far. A chat at a terminal is kept after
every answer: edgespec chat --continue takes up the last one."""

err = Console(stderr=True, highlight=False)


def chat(
    target: opt.Target = None,
    draft: opt.Draft = None,
    mode: opt.Mode = None,
    max_tokens: opt.MaxTokens = None,
    temp: opt.Temp = None,
    top_k: opt.TopK = None,
    top_p: opt.TopP = None,
    min_p: opt.MinP = None,
    seed: opt.Seed = None,
    threads: opt.Threads = None,
    draft_threads: opt.DraftThreads = None,
    target_cpus: opt.TargetCpus = None,
    draft_cpus: opt.DraftCpus = None,
    ctx_size: opt.CtxSize = None,
    draft_max: opt.DraftMax = None,
    pipeline: opt.Pipeline = None,
    adapt_threads: opt.AdaptThreads = True,
    system: opt.System = None,
    chat_template: opt.ChatTemplate = None,
    files: opt.Files = None,
    continue_: Annotated[
        bool,
        typer.Option(
            "--continue",
            help="Take up the chat kept last: a chat at a terminal is kept after every answer",
        ),
    ] = False,
    verbose: opt.Verbose = False,
) -> None:
    """Chat with the model; /? lists the commands, /bye or Ctrl+D leaves."""
    from edgespec.conversation import Conversation, read_saved
    from edgespec.engine import GenerationConfig

    from .app import (
        check_pipeline_mode,
        check_template_renders,
        draft_named_or_default,
        generation_options,
        let_stdout_go,
        load_engine,
        note,
        resolve,
        sources_named,
    )

    flags = dict(
        target=target, draft=draft, mode=mode, threads=threads, draft_threads=draft_threads,
        target_cpus=target_cpus, draft_cpus=draft_cpus,
        ctx_size=ctx_size, max_tokens=max_tokens, temp=temp, top_k=top_k, top_p=top_p,
        min_p=min_p, seed=seed, draft_max=draft_max, system=system,
    )  # fmt: skip
    settings = resolve(flags)
    template = read_template(chat_template) if chat_template else None
    if files and Path("-") in files:  # stdin holds the messages
        raise BadSettingError("--file - : chat reads its messages from stdin; name a file")
    attached = read_files(files or [], "")
    kept_path = latest_chat() if continue_ else None
    if continue_ and kept_path is None:
        raise EdgespecError(f"no chat to continue: none is kept in {chats_dir()} yet")
    # Read now: a damaged one is said before any model is fetched, made or loaded.
    continued = (kept_path, read_saved(kept_path)) if kept_path else None
    # Bad values fail before any model is loaded or measured.
    with sources_named(settings):
        GenerationConfig(**generation_options(settings)).validate(draft_named_or_default(settings))
        check_pipeline_mode(pipeline, settings.mode)  # `/set mode` later: chains pipelined only
        # So does a template that cannot serve: not after loading, and a first use's measuring.
        check_template_renders(template, settings)
        engine = load_engine(
            settings, verbose, pipeline, adapt_threads=adapt_threads, named_draft=True
        )
    inputs = (user_path(chat_template, "the chat template"),) if chat_template else ()
    conversation = Conversation(engine, settings.system, template, inputs)
    interactive = sys.stdin.isatty()
    if continued is not None:
        take_up(conversation, *continued, settings, note)
    kept = KeptChat(conversation, note, kept_path) if interactive or kept_path else None
    repl = Repl(conversation, settings, interactive, kept, attached)
    repl.run()
    if repl.ended_by is not None:
        # What is left in stdout's buffer cannot reach a terminal that went away: flushed at
        # exit, it would fail and turn the exit status into Python's 120.
        let_stdout_go()
        raise typer.Exit(repl.ended_by)
    if repl.failures and not repl.interactive:  # a script must learn that its /save failed
        raise EdgespecError(
            f"{repl.failures} of the piped messages and commands failed (see above)"
        )


def take_up(
    conversation: Conversation,
    path: Path,
    saved: tuple[str | None, list[Message]],
    settings: Settings,
    note: Callable[[str], None],
) -> None:
    """Continue the kept chat read from `path` (--continue); a --system typed now replaces its
    own."""
    out_of_view = conversation.restore(*saved)
    if settings.system is not None and settings.source("system") == "flag":
        conversation.set_system(settings.system)
    n = len(conversation.messages)
    note(f"continuing the chat kept in {path} ({n} message{'s' * (n != 1)})")
    if out_of_view:
        note(
            f"the oldest {out_of_view} turn(s) do not fit the context: the model does not see them"
        )


class Repl:
    def __init__(
        self,
        conversation: Conversation,
        settings: Settings,
        interactive: bool,
        kept: KeptChat | None = None,
        attached: list[tuple[str, str]] | None = None,
    ):
        self.conversation = conversation
        self.settings = settings
        self.interactive = interactive  # a terminal: prompts and line editing
        self.kept = kept  # saves the conversation after each answer (kept_chats.py)
        self.ended_by: int | None = None  # the exit code of a SIGHUP or SIGTERM that ended it
        self.catching_up: threading.Event | None = None  # set once the draft has caught up
        self.failures = 0  # messages and commands refused with an error line
        # (name, text) of the files for the next message (--file, /file)
        self.attached: list[tuple[str, str]] = attached or []

    def run(self) -> None:
        """Read and answer until /bye, the input's end, or (for a kept chat) SIGHUP or SIGTERM,
        after which `ended_by` holds the signal's exit code: the answer in progress is kept,
        cut short, as at Ctrl+C."""
        write_typed_lines = remember_typed_lines() if self.interactive else lambda: None
        signals = ended_by_signals() if self.kept is not None else contextlib.nullcontext()
        try:
            with signals:  # kept through the save: a second signal then is ignored
                try:
                    self.loop()
                except Ended as e:
                    self.ended_by = e.exit_code
                except OSError as e:
                    # The terminal went away mid-answer and the write failed before its
                    # SIGHUP came: the same end.
                    if e.errno != errno.EIO or self.kept is None:
                        raise
                    self.ended_by = 128 + signal.SIGHUP
                if self.ended_by is not None:
                    self.keep()
        finally:
            self.settle()
            write_typed_lines()

    def loop(self) -> None:
        while True:
            try:
                text = self.read_message()
            except KeyboardInterrupt:
                if not self.interactive:  # nobody can type /bye into a pipe: it ends (130)
                    raise
                print()
                err.print("[dim]Use /bye or Ctrl+D to exit.[/dim]")
                continue
            except EOFError:
                if self.interactive:
                    print()
                return
            if not text.strip():
                continue
            try:
                if text.lstrip().startswith("/"):
                    self.settle()
                    if not self.command(text.strip()):
                        return
                else:
                    self.answer(text)
            except EdgespecError as e:
                err.print(f"error: {escape(str(e))}", soft_wrap=True)  # one line, piped too
                self.failures += 1
            except KeyboardInterrupt:  # outside an answer (which handles its own): just stop
                # ... or, piped, end as at the wait: a Ctrl+C sent as an answer ended came here
                # when the chat was slow to get back to its wait, and it waited on for good.
                if not self.interactive:
                    raise
                print()
                err.print("[dim]interrupted[/dim]")

    # ----- input -----------------------------------------------------------------------------
    def read_line(self, prompt: str) -> str:
        if self.interactive and sys.stdout.isatty():
            return valid_text(input(prompt))
        if self.interactive:  # answers to a file (`chat > log`): the prompt to the terminal
            sys.stderr.write(prompt)
            sys.stderr.flush()
            return valid_text(input())
        line = read_stdin(lambda f: f.readline())
        if not line:
            raise EOFError
        return line.rstrip("\r\n")  # a file written on Windows ends its lines in \r\n

    def read_message(self) -> str:
        """One line, or the lines between two \"\"\" (the first may follow them directly)."""
        line = self.read_line(">>> ")
        if not line.lstrip().startswith(MULTILINE):
            return line
        lines = [line.lstrip()[len(MULTILINE) :]]
        try:
            while not lines[-1].rstrip().endswith(MULTILINE):
                lines.append(self.read_line("... "))
        except EOFError:  # input ended inside the block: what was typed is still the message
            return "\n".join(lines).strip()
        except KeyboardInterrupt:
            # Readline kept the block's lines one by one, and one at a time they make no
            # message: it keeps the block as typed too, to take up again and close.
            if self.interactive and "readline" in sys.modules:
                sys.modules["readline"].add_history("\n".join([line, *lines[1:]]))
                print()
                err.print("[dim]message dropped; Ctrl+P (or ↑) brings it back[/dim]")
                return ""
            raise
        lines[-1] = lines[-1].rstrip()[: -len(MULTILINE)]
        return "\n".join(lines).strip()

    # ----- answers ---------------------------------------------------------------------------
    def answer(self, text: str) -> None:
        # Asked before waiting for the draft (only the target's tokenizer is used): a Ctrl+C
        # during the wait then keeps the question, with an empty answer cut short.
        files, self.attached = self.attached, []
        text = with_files(text, files)
        try:
            reply = self.conversation.ask(text, **self.generation_options())
        except ContextOverflowError as overflow:
            if not self.grow_context(overflow):
                raise
            reply = self.conversation.ask(text, **self.generation_options())
        if reply.dropped:
            err.print(
                f"[dim]the oldest {reply.dropped} turn(s) no longer fit the context: the model no "
                "longer sees them (/save still keeps them)[/dim]",
                soft_wrap=True,
            )
        pieces = iter(reply)
        try:
            self.settle()
            for piece in pieces:
                sys.stdout.write(piece)
                sys.stdout.flush()
        except (Ended, OSError):
            pieces.close()  # now, not when the traceback lets the generator go
            reply.close()
            raise
        except KeyboardInterrupt:
            # Closed here, not where Python drops it: a second Ctrl+C while the caches settle is
            # raised once they have, and there it was printed as "Exception ignored in …" with
            # a traceback. It interrupts the same answer.
            with contextlib.suppress(KeyboardInterrupt):
                pieces.close()
            reply.close()
            self.keep()
            sys.stdout.write("\n")
            err.print("[dim]interrupted[/dim]")
            return
        self.keep()
        sys.stdout.write("\n")
        sys.stdout.flush()
        stats = self.conversation.last_stats
        if stats is not None:
            # As /show counts it: the answer's turn ended, as the next prompt will hold it.
            n_ctx = self.conversation.engine.n_ctx
            summary = f"{stats.summary()}, context {self.conversation.context_used()}/{n_ctx}"
            err.print(f"[dim]{summary}[/dim]", soft_wrap=True)
        self.catch_up_while_idle()

    def grow_context(self, overflow: ContextOverflowError) -> bool:
        """A message too long for the default context (a file with it, as a rule) gets one that
        holds it and its answer, as `run` gives a long prompt (app.context_for); the
        conversation goes on in it, re-evaluated once. False where none would do."""
        from .app import context_for, note

        engine = self.conversation.engine
        n_ctx = context_for(overflow, engine, self.settings)
        if n_ctx is None:
            return False
        self.settle()  # the draft's catching up uses the contexts about to be replaced
        note(
            f"the message needs {overflow.needed:,} tokens, more than the default context "
            f"holds: the chat goes on in one of {n_ctx} (--ctx-size sets it)"
        )
        self.conversation.engine = engine.with_context(n_ctx)
        return True

    def keep(self) -> None:
        if self.kept is not None:
            self.kept.save()

    # ----- the draft, between answers --------------------------------------------------------
    def catch_up_while_idle(self) -> None:
        """While a person types the next message, the draft evaluates the turns it did not draft
        (auto decodes chat plainly): caught up inside the next answer, a history of a few hundred
        tokens already cost more than auto lets a try cost, and a code request after chat
        questions was answered without drafting (docs/how-it-works.md, "Chat": what drafting then
        gained). Not for piped input: nobody types there."""
        engine = self.conversation.engine
        if not self.interactive or engine.draft is None:
            return
        if self.generation_options().get("mode") in ("target", "ngram"):
            return
        caught_up = threading.Event()

        def catch_up() -> None:
            try:
                catch_up_quietly(engine)
            finally:
                caught_up.set()

        threading.Thread(target=catch_up, daemon=True).start()
        self.catching_up = caught_up

    def settle(self) -> None:
        """Wait for the draft's catching up: the engine does one thing at a time. Waited for on
        an Event, not by Thread.join: a join cut short by Ctrl+C leaves the thread looking
        finished (Python 3.11), and the next answer drafted while it still decoded the draft:
        llama.cpp aborted the whole process (GGML_ASSERT), the conversation lost."""
        if self.catching_up is not None:
            self.catching_up.wait()
            self.catching_up = None

    def generation_options(self, settings: Settings | None = None) -> dict[str, object]:
        from .app import generation_options

        options = generation_options(settings or self.settings)
        del options["system"]  # the conversation renders its own system message
        return options

    # ----- commands --------------------------------------------------------------------------
    def command(self, line: str) -> bool:
        """Run a /command; False means leave."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/bye", "/exit"):
            return False
        if name in ("/?", "/help"):
            print(HELP)
        elif name == "/clear":
            self.conversation.clear()
            if self.kept is not None:
                self.kept.start_new()  # the cleared one stays kept as it was
            print("Cleared the conversation.")
        elif name == "/set":
            self.set(arg)
        elif name == "/show":
            self.show()
        elif name == "/stats":
            self.print_stats()
        elif name == "/save":
            self.conversation.save(need_file(arg, name))
            print(f"Saved {len(self.conversation.messages)} messages to {arg}.")
        elif name == "/file":
            self.attach(need_file(arg, name))
        elif name == "/load":
            out_of_view = self.conversation.load(need_file(arg, name))
            if self.kept is not None:
                self.kept.start_new()  # the replaced one stays kept as it was
            print(f"Loaded {len(self.conversation.messages)} messages from {arg}.")
            if out_of_view:
                err.print(
                    f"[dim]the oldest {out_of_view} turn(s) do not fit the context: the model "
                    "does not see them (/save still keeps them)[/dim]",
                    soft_wrap=True,
                )
        else:
            raise BadSettingError(f"unknown command {name}; /? lists the commands")
        return True

    def attach(self, name: str) -> None:
        if name == "-":  # stdin holds the messages
            raise BadSettingError("/file takes a file's path")
        text = read_file(Path(name).expanduser())
        self.attached.append((name, text))
        lines = text.count("\n") + (not text.endswith("\n"))
        print(
            f"Attached {name} ({lines} line{'s' * (lines != 1)}): it goes before your next message."
        )

    def set(self, arg: str) -> None:
        name, _, text = arg.partition(" ")
        name, text = name.replace("-", "_"), text.strip()
        if name == "system" and text:
            self.conversation.set_system(None if text == "none" else text)
            print("Removed the system message." if text == "none" else "Set the system message.")
            return
        if name not in SETTABLE or not text:
            names = ", ".join((*SETTABLE, "system"))
            raise BadSettingError(f"usage: /set NAME VALUE, NAME one of {names}")
        value: object
        if text == "auto" and name in AUTO_SETTABLE:  # back to the default: chosen per answer
            value = None
        else:
            try:
                value = parse_value(name, text)  # as EDGESPEC_<NAME> reads it
            except ValueError as e:
                also = " or auto" if name in AUTO_SETTABLE and name not in CHOICES else ""
                raise BadSettingError(f"{name} must be {e}{also} (got {text!r})") from None
        settings = dataclasses.replace(self.settings, **{name: value})
        from edgespec.engine import GenerationConfig

        engine = self.conversation.engine
        try:
            GenerationConfig(**self.generation_options(settings)).validate(engine.draft is not None)
        except BadSettingError as e:  # it names the flag: "--temp must be >= 0"
            raise BadSettingError(re.sub(r"^--([a-z-]+)", _setting_name, str(e))) from None
        self.settings = settings
        print(f"Set {name} to {shown(name, value)}.")

    def show(self) -> None:
        engine, settings = self.conversation.engine, self.settings
        print(f"target: {engine.target.path.name}")
        print(f"draft: {engine.draft.path.name if engine.draft else 'none'}")
        for name in SETTABLE:
            value = getattr(settings, name)
            print(f"{name}: {shown(name, value)}")
        print(f"system: {visible(self.conversation.system or '(none)')}")
        print(f"context: {self.conversation.context_used()}/{engine.n_ctx} tokens")
        if self.kept is not None and not self.kept.failed:
            where = self.kept.path or f"a new file in {chats_dir()}, from the next answer on"
            print(f"kept in: {where}")

    def print_stats(self) -> None:
        stats = self.conversation.last_stats
        if stats is None:
            raise BadSettingError("no answer yet")
        out = stats.to_dict()
        out["n_ctx_used"] = self.conversation.context_used()
        print(json.dumps(out))


# Control characters but tab and newline, shown as escapes: a system message /load took from a
# file may hold terminal escape sequences, which /show printed raw (to recolour or clear the
# screen, or worse).
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(32), *range(127, 160)) if c not in (9, 10)}


def visible(text: str) -> str:
    return text.translate(_CONTROLS)


def shown(name: str, value: object) -> str:
    """A setting's value as /set takes it: None is "auto" (a random seed, for seed)."""
    return "auto" if name in AUTO_SETTABLE and value is None else str(value)


def catch_up_quietly(engine: Engine) -> None:
    """Engine.catch_up_draft, for a thread: should it fail, the next answer catches the draft up
    itself (the engine forgets what it had not finished) and reports what fails then."""
    with contextlib.suppress(Exception):  # a thread's traceback would land mid-prompt
        engine.catch_up_draft()


def need_file(arg: str, command: str) -> str:
    if not arg:
        raise BadSettingError(f"usage: {command} FILE")
    return arg


def _setting_name(flag: re.Match[str]) -> str:
    """A flag in an error as /set names its setting: --max-tokens is max_tokens."""
    return flag.group(1).replace("-", "_")
