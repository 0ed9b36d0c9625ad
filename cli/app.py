"""The edgespec command line: a thin layer of flags and rendering over the library."""

from __future__ import annotations

import dataclasses
import errno
import itertools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from edgespec import catalogue
from edgespec.config import Settings, resolve, unknown_variables
from edgespec.draft_head import HEAD_TOKENS, narrowed_path
from edgespec.errors import (
    BadSettingError,
    ContextOverflowError,
    EdgespecError,
    ModelFileError,
)
from edgespec.files import regular_destination, user_path, written_into_place
from edgespec.stats import Stats

from . import INTERRUPTED, say_interrupted
from . import options as opt
from .bench_cmd import bench
from .chat_cmd import chat
from .config_cmd import config_app
from .models_cmd import fetch_with_progress, models_app
from .profile_cmd import profile
from .prompts import prompt_lines, read_files, read_prompt, read_template, with_files
from .signals import SIGTERM_ENDS, sigterm_as_ctrl_c

if TYPE_CHECKING:  # the library loads llama.cpp: imported where a command needs it
    from edgespec.engine import Engine, Result, Stream

try:  # typer >= 0.20 vendors its own copy of click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer on click
    from click import exceptions as click_exceptions

app = typer.Typer(
    help="Faster LLM generation on CPUs by speculative decoding (draft proposes, target verifies).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        import edgespec

        try:
            llama = f"llama-cpp-python {version('llama-cpp-python')}"
        except PackageNotFoundError:  # pragma: no cover - edgespec cannot run without it
            llama = "llama-cpp-python not installed"
        print(f"edgespec {edgespec.__version__} ({llama})")
        raise typer.Exit()


@app.callback()
def options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=print_version, is_eager=True, help="Print the version and exit"
        ),
    ] = False,
) -> None:
    """Faster LLM generation on CPUs by speculative decoding (draft proposes, target verifies)."""


app.add_typer(models_app, name="models")
app.add_typer(config_app, name="config")
err = Console(stderr=True, highlight=False)


def note(message: str) -> None:
    """What edgespec does of its own (first-use copies, profiles), dim on stderr, one line each
    in a log (file names taken as they are, not as rich markup)."""
    err.print(message, style="dim", markup=False, soft_wrap=True)


def note_unknown_variables() -> None:
    """Name each EDGESPEC_* variable nothing reads, with the one it may mean."""
    for line in unknown_variables(os.environ):
        note(line)


DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


def resolve_model(value: str | None, default: str | None, fetch: bool = True) -> Path | None:
    """A model is a GGUF path or a catalogue name; a catalogue model is fetched when missing
    (without `fetch`: None)."""
    name = value if value is not None else default
    if name is None:
        return None
    path = user_path(name, "the model path")
    if path.exists() or name not in catalogue.specs():
        if not path.exists():
            from edgespec.gguf_info import missing_model  # here: it imports numpy

            raise missing_model(name)
        return path
    local = catalogue.local_path(name)
    return local if local is not None or not fetch else fetch_with_progress(name, err)


def fetched(model: Path) -> Path:
    """A model's file: `model` itself, or the fetched file of a catalogue name (not fetched
    here: inspecting a model should not download a gigabyte)."""
    path = resolve_model(str(model), None, fetch=False)
    if path is None:
        raise ModelFileError(f"{model} is not fetched yet: edgespec models fetch {model}")
    return path


def check_named_models(settings: Settings) -> None:
    """Models named by path are checked before any is fetched: a typo in the draft's path was
    said after the default target's gigabyte had come down."""
    for name in (settings.target, settings.draft):
        resolve_model(name, None, fetch=False)


def resolve_draft(settings: Settings) -> Path | None:
    """The draft asked for. The default draft, unnamed where no target is named or named by its
    catalogue name beside a target of one's own (a Q4_0 copy of the Qwen 1.5B, say), in the form
    that runs fastest on this device (a Q4_0 copy, made and measured on first use, if it is
    faster): a draft's form changes how fast it drafts, never the text. A file named is used as
    it is."""
    named = settings.draft
    if named is None and settings.target is not None:
        return None
    if named is not None and (named != DEFAULT_DRAFT or user_path(named, "the draft").exists()):
        return resolve_model(named, None)
    from edgespec.cores import plan_placement
    from edgespec.drafts import fastest_draft

    fetched = resolve_model(None, DEFAULT_DRAFT)
    assert fetched is not None
    if settings.target is not None:  # a pair that cannot work fails before any form is made
        from edgespec.gguf_info import check_pair, read_gguf

        target = resolve_model(settings.target, None)
        assert target is not None
        check_pair(read_gguf(fetched), read_gguf(target))
    n_threads = settings.draft_threads or len(
        plan_placement(settings.target_cpus, settings.draft_cpus).draft_cpus
    )
    # No spinner: its refresh thread would take CPU from the timing.
    choice = fastest_draft(fetched, n_threads, say=note)
    return choice.path(fetched.parent)


def check_unused_draft(name: str, target: Path) -> None:
    """A draft named for a mode that uses none is not loaded, but checked as one that is: a
    typo or a draft of another vocabulary passed unseen (a catalogue draft not fetched yet is
    not fetched for it)."""
    from edgespec.gguf_info import check_pair, read_gguf

    if (path := resolve_model(name, None, fetch=False)) is not None:
        check_pair(read_gguf(path), read_gguf(target))


def draft_named_or_default(settings: Settings) -> bool:
    """Whether the settings give a draft (resolve_draft): one named, or the default pair's."""
    return settings.draft is not None or settings.target is None


@contextmanager
def sources_named(settings: Settings) -> Iterator[None]:
    """A bad value's error says where the value came from when that was not a flag: a
    `--temp must be >= 0` the user never typed is EDGESPEC_TEMP's, or config.toml's."""
    try:
        yield
    except BadSettingError as e:
        match = re.match(r"--([a-z][a-z-]*)", str(e))
        source = settings.source(match.group(1).replace("-", "_")) if match else "flag"
        if source in ("flag", "default"):
            raise
        raise BadSettingError(f"{e} (set by {source})") from None


def load_engine(
    settings: Settings,
    verbose: bool,
    pipeline: bool | None = None,
    profile: bool = True,
    adapt_threads: bool = True,
    named_draft: bool = False,
) -> Engine:
    """The engine the settings ask for; the default pair is fetched on first use, and with
    `profile` this device's costs are measured on first use (`profile_if_needed`). With
    `named_draft` a draft named in the settings is loaded in every mode (a chat may switch to
    one that drafts)."""
    import edgespec
    from edgespec.engine import check_threads

    check_threads(settings.threads, settings.draft_threads)  # before any fetching or measuring
    check_named_models(settings)
    target_path = resolve_model(settings.target, DEFAULT_TARGET)
    draft_path = None
    # target and ngram never use a draft: none is loaded for them, unless named for later
    if settings.mode not in ("target", "ngram") or (named_draft and settings.draft is not None):
        draft_path = resolve_draft(settings)
    elif settings.draft is not None:
        check_unused_draft(settings.draft, target_path)
    with load_shown(not verbose) as progress:  # not between llama.cpp's lines
        engine = edgespec.load(
            target_path,
            draft_path,
            # Not asked for: 2048, or less for a model trained for less (load's default).
            n_ctx=settings.ctx_size if settings.source("ctx_size") != "default" else None,
            threads=settings.threads,
            draft_threads=settings.draft_threads,
            target_cpus=settings.target_cpus,
            draft_cpus=settings.draft_cpus,
            pipeline=pipeline,
            adapt_threads=adapt_threads,
            verbose=verbose,
            say=note,
            progress=progress,
        )
    note_draft_trained_shorter(engine)
    note_threads_past_cpus(engine, settings)
    if profile:
        profile_if_needed(engine, settings)
    return engine


SHOW_LOAD_AFTER_S = 1.0  # a load from this VM's disk takes ~1 s: nothing to watch


@contextmanager
def load_shown(wanted: bool = True) -> Iterator[Callable[[float], None] | None]:
    """How much of the model files has loaded, as a percentage on stderr once the load has
    taken a while (a Pi's SD card: ~30 s for the default pair, which a user took for a hang);
    on a terminal only, the line erased when done."""
    if not (wanted and err.is_terminal) or err.quiet:
        yield None
        return
    start, shown = time.monotonic(), -1

    def show(fraction: float) -> None:
        nonlocal shown
        percent = int(fraction * 100)
        if percent != shown and time.monotonic() - start >= SHOW_LOAD_AFTER_S:
            shown = percent
            err.file.write(f"\rloading the models {percent}%")
            err.file.flush()

    try:
        yield show
    finally:
        if shown >= 0:
            err.file.write("\r\x1b[K")
            err.file.flush()


def note_draft_trained_shorter(engine: Engine) -> None:
    """A draft trained on fewer tokens than the context holds drafts worse past them (llama.cpp
    says so only in its log, which is off): said, not refused, as the text stays the target's
    whatever the draft proposes."""
    draft = engine.draft
    if draft is not None and 0 < draft.n_ctx_train < engine.n_ctx:
        note(
            f"{draft.path.name} was trained on {draft.n_ctx_train:,} tokens and the context holds "
            f"{engine.n_ctx:,}: past {draft.n_ctx_train:,} its drafts may be accepted less often "
            "(the text is the target's all the same)"
        )


def note_threads_past_cpus(engine: Engine, settings: Settings) -> None:
    """More threads than CPUs share cores, and llama.cpp's threads wait for the slowest at
    every one of a step's barriers (-t 99 on 2 CPUs: 3.3 tok/s against 115). Said, not
    refused: a count in config.toml may have been meant for another device."""
    placement = engine.placement
    roles = [("threads", engine.threads, placement.target_cpus, "target")]
    if engine.draft is not None:
        roles.append(("draft_threads", engine.draft_threads, placement.draft_cpus, "draft"))
    for name, threads, cpus, role in roles:
        n_cpus = len(cpus)
        if threads > n_cpus:
            source = settings.source(name)
            given = f"--{name.replace('_', '-')} {threads}"
            given += "" if source in ("flag", "default") else f" (set by {source})"
            cpus_said = f"{n_cpus} CPU" + ("s" if n_cpus > 1 else "")
            note(
                f"{given} is more threads than the {cpus_said} the {role} may use: they share "
                f"cores and wait for each other at every step; {n_cpus} is the most that helps"
            )


# The tree's flags (GenerationConfig's fields), read by tree rounds only: --mode tree, or auto
# with a draft.
TREE_SETTINGS = (
    "branch_p",
    "max_branches",
    "max_nodes",
    "max_depth",
    "alpha0",
    "scheduler",
    "adaptive_alpha",
)
SAMPLING_SETTINGS = ("top_k", "top_p", "min_p", "seed")


def note_unused_flags(settings: Settings, options: dict[str, object]) -> None:
    """Flags the mode or greedy decoding never reads changed nothing without a word, as in
    llama.cpp (`--top-p 0.9` at the default --temp 0 decodes greedily all the same). Said, not
    refused: the text is right either way, and a script may pass one set of flags to every mode."""
    from edgespec.engine import GenerationConfig

    mode = settings.mode or "auto"
    defaults = GenerationConfig()
    if not (mode == "tree" or (mode == "auto" and draft_named_or_default(settings))):
        tree = [name for name in TREE_SETTINGS if options[name] != getattr(defaults, name)]
        if tree:
            where = "without a draft" if mode == "auto" else f"in --mode {mode}"
            note(
                f"{', '.join(flag_name(name, options[name]) for name in tree)} "
                f"{'does' if len(tree) == 1 else 'do'} nothing {where} (the token tree's "
                "flags: --mode tree, or auto with a draft)"
            )
    if mode not in ("chain", "ngram") and settings.source("draft_max") == "flag":
        why = "; auto chooses each round's own" if mode == "auto" else ""
        note(f"--draft-max does nothing in --mode {mode} (chain and ngram modes' length{why})")
    if settings.temp == 0:
        greedy = [name for name in SAMPLING_SETTINGS if settings.source(name) == "flag"]
        if greedy:
            flags = ", ".join(flag_name(name) for name in greedy)
            note(
                f"{flags} {'does' if len(greedy) == 1 else 'do'} nothing at --temp 0, which "
                "decodes greedily (the most likely token each time); set --temp to sample"
            )


def flag_name(name: str, value: object = None) -> str:
    if name == "adaptive_alpha":
        return "--adaptive-alpha" if value else "--fixed-alpha"
    return "--" + name.replace("_", "-")


def check_pipeline_mode(pipeline: bool | None, mode: str | None) -> None:
    """--pipeline pipelines chains: asked for in a mode without them, it is a mistake."""
    if pipeline and mode not in (None, "chain", "auto"):
        raise BadSettingError(f"--pipeline works in modes chain and auto, not {mode}")


def profile_if_needed(engine: Engine, settings: Settings) -> None:
    """auto plans with this device's costs; chain and tree price their n-gram rounds with them:
    measured on first use."""
    if settings.mode in (None, "auto", "chain", "tree"):
        engine.profile_if_missing(say=note)


def generation_options(settings: Settings, **tree: object) -> dict[str, object]:
    """Engine.generate's keyword arguments from resolved settings and the tree flags."""
    return dict(
        max_tokens=settings.max_tokens,
        mode=settings.mode,
        temperature=settings.temp,
        top_k=settings.top_k,
        top_p=settings.top_p,
        min_p=settings.min_p,
        seed=settings.seed,
        draft_max=settings.draft_max,
        system=settings.system,
        **tree,
    )


def run(
    prompt: Annotated[str, typer.Argument(help="The prompt; '-' reads it from stdin.")],
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
    stop: Annotated[
        list[str] | None,
        typer.Option(metavar="TEXT", help="Stop when this text appears (repeatable)"),
    ] = None,
    chat: Annotated[
        bool | None,
        typer.Option(
            "--chat/--raw",
            help="Wrap the prompt in the target's chat template [default: if it has one]",
        ),
    ] = None,
    system: opt.System = None,
    chat_template: opt.ChatTemplate = None,
    branch_p: opt.BranchP = 0.3,
    max_branches: opt.MaxBranches = 4,
    max_nodes: opt.MaxNodes = 16,
    max_depth: opt.MaxDepth = 8,
    alpha0: opt.Alpha0 = None,
    scheduler: opt.Scheduler = "pacer",
    adaptive_alpha: opt.AdaptiveAlpha = None,
    ngram: opt.Ngram = True,
    calibrated: opt.Calibrated = True,
    files: opt.Files = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of streaming")
    ] = False,
    each_line: Annotated[
        bool,
        typer.Option(
            "--each-line",
            help="Answer each line of the prompt on its own ('-': each line of stdin as it "
            "comes), the models loaded once; prints one JSON object a line per answer",
        ),
    ] = False,
    verbose: opt.Verbose = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            "-q",
            help="Print nothing on stderr but errors: no summary, notes or progress",
        ),
    ] = False,
) -> None:
    """Generate text for PROMPT, streamed to stdout; a summary goes to stderr."""
    if quiet and verbose:
        raise BadSettingError("--quiet and --verbose ask for opposite things; give one")
    err.quiet = quiet  # main() makes it loud again
    note_unknown_variables()
    flags = dict(
        target=target, draft=draft, mode=mode, threads=threads, draft_threads=draft_threads,
        target_cpus=target_cpus, draft_cpus=draft_cpus,
        ctx_size=ctx_size, max_tokens=max_tokens, temp=temp, top_k=top_k, top_p=top_p,
        min_p=min_p, seed=seed, draft_max=draft_max, system=system,
    )  # fmt: skip
    settings = resolve(flags)
    if chat is False and settings.system is not None:
        if settings.source("system") == "flag":
            raise BadSettingError(
                "--system needs the chat template: drop --raw, or put it in the prompt"
            )
        # One from config.toml or EDGESPEC_SYSTEM is for the prompts that have a template.
        settings = dataclasses.replace(settings, system=None)
    if chat is False and chat_template is not None:
        raise BadSettingError("--chat-template is for chat: drop --raw")
    template = read_template(chat_template) if chat_template else None
    attached = read_files(files or [], prompt)
    if each_line:
        lines = prompt_lines(prompt)
        text = next(lines, "")  # the first, before loading: no prompt at all fails at once
    else:
        text = read_prompt(prompt)
    if not text.strip():
        raise BadSettingError("the prompt is empty")
    options = generation_options(
        settings,
        stop=tuple(stop or ()),
        branch_p=branch_p,
        max_branches=max_branches,
        max_nodes=max_nodes,
        max_depth=max_depth,
        alpha0=alpha0,
        scheduler=scheduler,
        adaptive_alpha=adaptive_alpha,
        ngram=ngram,
        calibrated=calibrated,
        chat_template=template,
    )
    from edgespec.engine import GenerationConfig

    with sources_named(settings):
        # Bad values fail before any model is loaded or measured.
        GenerationConfig(**options).validate(has_draft=draft_named_or_default(settings))
        check_pipeline_mode(pipeline, settings.mode)
        note_unused_flags(settings, options)
        if template is not None:  # so does a template that cannot render a prompt
            check_template_renders(template, settings)
        engine = load_engine(settings, verbose, pipeline, False, adapt_threads)
    has_template = template is not None or engine.target.info.chat_template is not None
    if settings.source("system") != "flag" and not has_template:
        options["system"] = None  # as with --raw: the file's or environment's is for templates
    if each_line:
        prompts = itertools.chain([text], lines)
        answer_each_line(engine, settings, prompts, chat, options, attached)
        return
    # A prompt longer than the context fails here, before a first use's measuring.
    engine, stream = stream_in_context(engine, settings, with_files(text, attached), chat, options)
    profile_if_needed(engine, settings)
    try:
        result = finish(stream, None if as_json else write_now)
    except KeyboardInterrupt:
        # The text so far stays (with --json, in the object: finish_reason "interrupted");
        # main() says it was interrupted.
        if as_json and stream.result is not None:
            sys.stdout.write(json.dumps(stream.result.to_dict(), ensure_ascii=False))
        write_now("\n")
        raise typer.Exit(INTERRUPTED) from None
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
        err.print(f"[dim]{result.stats.summary()}[/dim]", soft_wrap=True)
        if verbose:
            err.print(f"[dim]{placement_report(result.stats)}[/dim]", soft_wrap=True)


def check_template_renders(template: str | None, settings: Settings) -> None:
    """Before any model is loaded: a chat template, `template` or the target's, that cannot
    render a first question is its error (conversation.check_chat_template)."""
    from edgespec.conversation import check_chat_template
    from edgespec.gguf_info import read_gguf

    target_path = resolve_model(settings.target, DEFAULT_TARGET)
    assert target_path is not None
    check_chat_template(template, read_gguf(target_path), settings.system)


def stream_in_context(
    engine: Engine, settings: Settings, text: str, chat: bool | None, options: dict[str, object]
) -> tuple[Engine, Stream]:
    """`engine.stream(text)`, in a larger context where the prompt is too long for the default
    one (context_for), which is said; and the engine to go on with. Else the overflow's error."""
    try:
        return engine, engine.stream(text, chat=chat, **options)
    except ContextOverflowError as overflow:
        n_ctx = context_for(overflow, engine, settings)
        if n_ctx is None:
            raise
        note(
            f"the prompt has {overflow.needed:,} tokens, more than the default context holds: "
            f"using one of {n_ctx} (--ctx-size sets it)"
        )
        engine = engine.with_context(n_ctx)
        return engine, engine.stream(text, chat=chat, **options)


def context_for(overflow: ContextOverflowError, engine: Engine, settings: Settings) -> int | None:
    """A context for a prompt too long for the default one (a file given with it, as a rule):
    the prompt and its answer, in whole thousands of tokens, at most what the target was trained
    for, where the memory free holds the larger KV caches; None where the size was chosen
    (flag, environment, config.toml) or none would do, and the overflow's error stands."""
    if settings.source("ctx_size") != "default" or overflow.needed is None:
        return None
    n_ctx = -(-(overflow.needed + settings.max_tokens) // 1024) * 1024
    if (trained := engine.target.n_ctx_train) > 0:
        n_ctx = min(n_ctx, trained)
    if n_ctx <= overflow.needed:
        return None
    from edgespec.memory import free_memory, memory_need

    infos = engine.target.info, engine.draft.info if engine.draft else None
    more = memory_need(*infos, n_ctx).kv_cache - memory_need(*infos, engine.n_ctx).kv_cache
    free = free_memory()
    return None if free is not None and more > free.available else n_ctx


def finish(stream: Stream, write: Callable[[str], object] | None) -> Result:
    """The stream's result, each piece of text given to `write` as it comes. A Ctrl+C ends the
    generation where it stood, its text and statistics kept in `stream.result`, and goes on up."""
    pieces = iter(stream)
    try:
        for piece in pieces:
            if write is not None:
                write(piece)
    except KeyboardInterrupt:
        pieces.close()
        raise
    assert stream.result is not None
    return stream.result


def write_now(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def answer_each_line(
    engine: Engine,
    settings: Settings,
    prompts: Iterable[str],
    chat: bool | None,
    options: dict[str, object],
    files: list[tuple[str, str]],
) -> None:
    """One JSON object a line per prompt, its "prompt" first, each written when it is done. A
    prompt longer than the default context gets a larger one, as in `run`; one too long for
    any gets an "error" in place of an answer, and the run ends with an error once every
    prompt is done. `files` go with each prompt (`with_files`)."""
    profiled, answered, too_long, longest = False, 0, 0, 0
    for text in prompts:
        try:
            engine, stream = stream_in_context(
                engine, settings, with_files(text, files), chat, options
            )
        except ContextOverflowError as e:
            write_now(json.dumps({"prompt": text, "error": str(e)}, ensure_ascii=False) + "\n")
            too_long += 1
            longest = max(longest, e.needed or 0)
            continue
        answered += 1
        if not profiled:  # on first use, measured before the first answer's clock starts
            profile_if_needed(engine, settings)
            profiled = True
        try:
            result = finish(stream, None)
        except KeyboardInterrupt:
            if stream.result is not None:  # the answer so far: finish_reason "interrupted"
                answer = {"prompt": text, **stream.result.to_dict()}
                write_now(json.dumps(answer, ensure_ascii=False) + "\n")
            raise typer.Exit(INTERRUPTED) from None
        write_now(json.dumps({"prompt": text, **result.to_dict()}, ensure_ascii=False) + "\n")
    if too_long:
        advice = f"{engine.room_for(longest)} prompt" if longest else "use a larger --ctx-size"
        raise ContextOverflowError(
            f"{too_long} of {answered + too_long} prompts did not fit the context of "
            f'{engine.n_ctx} tokens (their lines say "error"); {advice}'
        )


def placement_report(stats: Stats) -> str:
    """Where the models were to run, and where the process's threads may run (from the kernel)."""
    threads = ", ".join(f"{n} on CPUs {cpus}" for cpus, n in stats.threads_by_cpus.items())
    return f"placement: {stats.placement}; threads: {threads or 'not readable here'}"


def inspect(
    file: Annotated[Path, typer.Argument(help="A GGUF file", parser=opt.path)],
    other: Annotated[
        Path | None, typer.Argument(help="A second GGUF: can the two pair?", parser=opt.path)
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object: {models, pairable, reason}")
    ] = False,
) -> None:
    """Show a GGUF's metadata; with two files, whether they can be a draft/target pair. A
    catalogue name stands for its fetched file, as in run."""
    from edgespec.gguf_info import pairing_problem, read_gguf

    infos = [read_gguf(fetched(file))] + ([read_gguf(fetched(other))] if other else [])
    verdict = None
    if other:
        draft, target = infos
        try:
            problem = pairing_problem(draft, target)
        except ModelFileError as e:  # a narrowed draft without its full one: an answer too
            problem = str(e)
        same = draft.vocab_digest == target.vocab_digest
        verdict = problem or f"yes: {'same vocabulary' if same else 'same token texts'}"
    if as_json:
        out: dict[str, object] = {"models": [i.summary() for i in infos]}
        if other:
            out["pairable"] = verdict.startswith("yes")
            out["reason"] = verdict
        print(json.dumps(out))
        return
    console = Console(highlight=False)
    table = Table(show_header=bool(other))
    # Folded, not cut: at 80 columns the path ended "….gg…", at a phone's 50 "/tmp/s56/qa-c…".
    table.add_column("", overflow="fold")
    # As Text, not markup: a file's name or metadata holding "[/x]" stopped rich with an error.
    for info in infos:
        table.add_column(Text(info.path.name), overflow="fold")
    summaries = [info.summary() for info in infos]
    for key in summaries[0]:
        table.add_row(key, *(Text(str(summary[key])) for summary in summaries))
    console.print(table)
    if other:
        console.print(f"draft/target pair: {verdict}", markup=False, soft_wrap=True)


QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K")
OUTPUT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16")


def quantize(
    source: Annotated[Path, typer.Argument(help="Input GGUF", parser=opt.path)],
    dest: Annotated[Path, typer.Argument(help="Output GGUF", parser=opt.path)],
    type_: Annotated[str, typer.Option("--type", help=f"One of {', '.join(QUANT_TYPES)}")] = "Q4_0",
    threads: Annotated[int, typer.Option("--threads", "-t", help="Threads; 0: one per CPU")] = 0,
    output_type: Annotated[
        str | None,
        typer.Option(
            "--output-type",
            help="Type of the output (logits) matrix, which llama.cpp otherwise keeps at Q6_K or "
            "Q8_0: Q4_0 makes a draft with a large vocabulary a fifth cheaper",
        ),
    ] = None,
) -> None:
    """Write a requantized copy of a GGUF: a cheaper draft (Q4_0), or a target whose batches
    verify faster."""
    import llama_cpp

    from edgespec.backend import quantize as quantize_file
    from edgespec.gguf_info import read_gguf

    if type_.upper() not in QUANT_TYPES:
        raise BadSettingError(f"--type must be one of {', '.join(QUANT_TYPES)} (got {type_!r})")
    if threads:  # 0: llama.cpp's own choice, a thread per CPU
        from edgespec.engine import check_threads

        check_threads(threads, None)
    output_ggml_type = None
    if output_type is not None:
        output_ggml_type = getattr(llama_cpp, f"GGML_TYPE_{output_type.upper()}", None)
        if output_type.upper() not in OUTPUT_TYPES or output_ggml_type is None:
            raise BadSettingError(
                f"--output-type must be one of {', '.join(OUTPUT_TYPES)} (got {output_type!r})"
            )
    info = read_gguf(source)
    dest = check_destination(dest, source)
    if info.file_type not in ("ALL_F32", "F16", "BF16"):
        err.print(
            f"[yellow]warning:[/yellow] {escape(source.name)} is already {info.file_type}; "
            "requantizing loses quality",
            soft_wrap=True,
        )
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_.upper()}")
    with written_into_place(dest) as tmp:
        quantize_file(source, tmp, ftype, threads, output_type=output_ggml_type)
    print(dest)


def check_destination(dest: Path, *sources: Path | None) -> Path:
    """The file to write for `dest`, checked before the work, not after it: not one of the
    `sources` the work reads (the user's only copy of a model, perhaps), not a directory,
    device or pipe, in a folder that exists and can be written. A link is written through:
    the file it names is returned."""
    dest = regular_destination(dest)
    for source in sources:
        if source is not None and dest.exists() and dest.samefile(source):
            raise BadSettingError(f"{dest} is the input file; name another file to write")
    folder = dest.parent
    if not folder.is_dir():
        raise BadSettingError(f"cannot write {dest}: there is no directory {folder}")
    # A file made and removed: os.access alone passed root for /proc, where none can be made.
    probe = folder / f".{dest.name}.{os.getpid()}.probe"
    try:
        probe.touch(exist_ok=False)
    except OSError as e:
        # /proc and kin answer "No such file or directory" for a folder that is there
        why = f"no file can be made in {folder}" if e.errno == errno.ENOENT else e.strerror or e
        raise BadSettingError(f"cannot write {dest}: {why}") from None
    probe.unlink(missing_ok=True)
    return dest


def narrow(
    source: Annotated[Path, typer.Argument(help="Draft GGUF", parser=opt.path)],
    dest: Annotated[
        Path | None,
        typer.Argument(
            help="Output GGUF (default: next to the draft, named .head<N>k.gguf)",
            parser=opt.path,
        ),
    ] = None,
    tokens: Annotated[
        int, typer.Option("--tokens", help="Tokens the output layer keeps")
    ] = HEAD_TOKENS,
) -> None:
    """Write a copy of a draft whose output layer keeps only frequent tokens: a cheaper draft
    step for a large vocabulary. It needs the original next to it (for its embeddings)."""
    from edgespec.drafts import narrow as narrow_file
    from edgespec.gguf_info import check_generates, read_gguf

    info = read_gguf(source)
    check_generates(info)  # a copy of a model that cannot draft would be refused at its use
    if info.narrowed_from is not None:
        raise BadSettingError(f"{source.name} is already narrowed (from {info.narrowed_from})")
    if not 1024 <= tokens < info.n_vocab:
        raise BadSettingError(
            f"--tokens must be at least 1024 and below the vocabulary's {info.n_vocab} "
            f"(got {tokens})"
        )
    # It finds the draft by the name it is given here, in its own folder: a draft that is a
    # link is found as the link, wherever the file it points to lies. The copy is written where
    # its own name leads, through a link too.
    dest = check_destination(dest or narrowed_path(source, tokens), source)
    if dest.absolute().parent.resolve() != source.absolute().parent.resolve():
        raise BadSettingError("the narrowed copy must be written next to its draft")
    narrow_file(source, dest, tokens)
    print(dest)


# `edgespec --help` lists them in this order: what a new user reaches for first, first. Those
# that answer, write files or take minutes stop on SIGTERM as on Ctrl+C: the answer so far kept,
# temporary files removed (`timeout 60 edgespec quantize ...` left a hidden copy as large as the
# model). chat goes on after a Ctrl+C, so SIGTERM ends it as it ends any program.
for command in (run, chat, bench, profile, quantize, narrow, inspect):
    ends = command.__name__ in SIGTERM_ENDS
    app.command()(command if ends else sigterm_as_ctrl_c(command))


def main(argv: list[str] | None = None) -> int:
    """Entry point: errors become one line on stderr and an exit code, never a traceback."""
    try:
        return _main(argv)
    finally:
        err.quiet = False  # `run --quiet` silenced it for its own run


def _usage_message(e: click_exceptions.UsageError) -> str:
    """click's message; a prompt missing was most often meant to come from stdin (`cat notes.txt
    | edgespec run`), so that one says how."""
    message = e.format_message()
    missing = isinstance(e, click_exceptions.MissingParameter) and e.param is not None
    if missing and e.param.name == "prompt":
        return f"{message.rstrip('.')}: give the text, or - to read it from stdin"
    return message


def _main(argv: list[str] | None) -> int:
    if sys.stdout is None:  # started with stdout closed (`>&-`)
        print("error: stdout is closed: there is nowhere to write to", file=sys.stderr)
        return 1
    if sys.stdin is None:  # stdin closed (`<&-`): as empty, which "-" then says
        sys.stdin = open(os.devnull)  # noqa: SIM115 (for the life of the process)
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["run"]:  # run says them itself, unless asked to be --quiet
        note_unknown_variables()
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=args, prog_name="edgespec", standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as e:
        # typer raises this to show help when called with no arguments
        print(e.ctx.get_help() if e.ctx else "", file=sys.stderr)
        return 2
    except click_exceptions.UsageError as e:
        print(f"error: {_usage_message(e)}", file=sys.stderr)
        return 2
    except typer.Exit as e:
        return e.exit_code
    except (KeyboardInterrupt, typer.Abort):
        say_interrupted()
        return INTERRUPTED
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # `edgespec run ... | head`: the reader went away, not an error
        return _reader_gone()
    except SystemExit as e:  # typer turns a broken pipe into sys.exit(1)
        if isinstance(e.__context__, BrokenPipeError):
            return _reader_gone()
        raise
    except OSError as e:  # what the system refused where nothing said it better (a full disk;
        # after BrokenPipeError, which is one too)
        where = f": {e.filename}" if e.filename else ""
        print(f"error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    if rv == INTERRUPTED:  # typer returns this for a Ctrl+C, wherever it came (loading, too);
        print("interrupted", file=sys.stderr)  # run has ended its line of text
    return rv if isinstance(rv, int) else 0


def _reader_gone() -> int:
    """stdout's reader went away (`| head`): exit 0 without the error Python's final flush of
    stdout would print (the recipe of Python's signal docs, "Note on SIGPIPE")."""
    let_stdout_go()
    return 0


def let_stdout_go() -> None:
    """Point stdout at /dev/null: what its buffer still holds has nowhere to go, and flushed
    at exit it would fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
