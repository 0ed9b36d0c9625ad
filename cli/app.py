"""The edgespec command line: a thin layer of flags and rendering over the library."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from edgespec import catalogue
from edgespec.errors import BadSettingError, EdgespecError, ModelFileError

from .models_cmd import fetch_with_progress, models_app

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
app.add_typer(models_app, name="models")
err = Console(stderr=True, highlight=False)

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


def resolve_model(value: str | None, default: str | None) -> Path | None:
    """A model is a GGUF path or a catalogue name; a catalogue model is fetched when missing."""
    name = value if value is not None else default
    if name is None:
        return None
    path = Path(name).expanduser()
    if path.exists() or name not in catalogue.specs():
        if not path.exists():
            raise ModelFileError(f"model file not found: {name}")
        return path
    return catalogue.local_path(name) or fetch_with_progress(name, err)


def read_prompt(prompt: str) -> str:
    if prompt == "-":
        return sys.stdin.read()
    return prompt


@app.command()
def run(
    prompt: Annotated[str, typer.Argument(help="The prompt; '-' reads it from stdin.")],
    target: Annotated[
        str | None,
        typer.Option(
            "--target", "-m", help="Target GGUF path or catalogue name [default: the Qwen 1.5B]"
        ),
    ] = None,
    draft: Annotated[
        str | None,
        typer.Option(
            help="Draft GGUF path or catalogue name [default: the Qwen 0.5B when no --target]"
        ),
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(help="target (plain decoding) or chain [default: chain with a draft]"),
    ] = None,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", "-n", help="Tokens to generate at most")
    ] = 256,
    temp: Annotated[float, typer.Option("--temp", help="Sampling temperature; 0 is greedy")] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Random seed for sampling")] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", "-t", help="Target threads [default: all cores]")
    ] = None,
    draft_threads: Annotated[
        int | None, typer.Option(help="Draft threads [default: as --threads]")
    ] = None,
    ctx_size: Annotated[
        int, typer.Option("--ctx-size", "-c", help="Context size in tokens")
    ] = 2048,
    draft_max: Annotated[int, typer.Option(help="Tokens drafted per verification at most")] = 4,
    stop: Annotated[
        list[str] | None, typer.Option(help="Stop when this text appears (repeatable)")
    ] = None,
    chat: Annotated[
        bool | None,
        typer.Option(
            "--chat/--raw",
            help="Wrap the prompt in the target's chat template [default: if it has one]",
        ),
    ] = None,
    system: Annotated[str | None, typer.Option(help="System message (chat mode)")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of streaming")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's log")] = False,
) -> None:
    """Generate text for PROMPT, streamed to stdout; a summary goes to stderr."""
    import edgespec

    text = read_prompt(prompt)
    if not text.strip():
        raise BadSettingError("the prompt is empty")
    target_path = resolve_model(target, DEFAULT_TARGET)
    draft_path = resolve_model(draft, DEFAULT_DRAFT if target is None else None)
    if mode == "target":
        draft_path = None  # plain decoding: no need to load a draft
    engine = edgespec.load(
        target_path,
        draft_path,
        n_ctx=ctx_size,
        threads=threads,
        draft_threads=draft_threads,
        verbose=verbose,
    )
    stream = engine.stream(
        text,
        max_tokens=max_tokens,
        mode=mode,
        temperature=temp,
        seed=seed,
        draft_max=draft_max,
        stop=tuple(stop or ()),
        chat=chat,
        system=system,
    )
    try:
        for piece in stream:
            if not as_json:
                sys.stdout.write(piece)
                sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        sys.stdout.flush()
        err.print("[dim]interrupted[/dim]")
        raise typer.Exit(130) from None
    result = stream.result
    assert result is not None
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
    else:
        sys.stdout.write("\n")
        err.print(f"[dim]{result.stats.summary()}[/dim]")


@app.command()
def inspect(
    file: Annotated[Path, typer.Argument(help="A GGUF file")],
    other: Annotated[Path | None, typer.Argument(help="A second GGUF: can the two pair?")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show a GGUF's metadata; with two files, whether they can be a draft/target pair."""
    from edgespec.gguf_info import pairing_problem, read_gguf

    infos = [read_gguf(file)] + ([read_gguf(other)] if other else [])
    verdict = None
    if other:
        problem = pairing_problem(infos[0], infos[1])
        verdict = problem or "yes: same vocabulary"
    if as_json:
        out: dict[str, object] = {"models": [i.summary() for i in infos]}
        if other:
            out["pairable"] = verdict.startswith("yes")
            out["reason"] = verdict
        print(json.dumps(out))
        return
    console = Console(highlight=False)
    table = Table(show_header=bool(other))
    table.add_column("")
    for info in infos:
        table.add_column(info.path.name)
    for key in infos[0].summary():
        table.add_row(key, *(str(i.summary()[key]) for i in infos))
    console.print(table)
    if other:
        console.print(f"draft/target pair: {verdict}")


QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K")


@app.command()
def quantize(
    source: Annotated[Path, typer.Argument(help="Input GGUF")],
    dest: Annotated[Path, typer.Argument(help="Output GGUF")],
    type_: Annotated[str, typer.Option("--type", help=f"One of {', '.join(QUANT_TYPES)}")] = "Q4_0",
    threads: Annotated[int, typer.Option("--threads", "-t")] = 0,
) -> None:
    """Write a requantized copy of a GGUF (e.g. a cheaper Q4_0 draft)."""
    import llama_cpp

    from edgespec.backend import quantize as quantize_file
    from edgespec.gguf_info import read_gguf

    if type_.upper() not in QUANT_TYPES:
        raise BadSettingError(f"--type must be one of {', '.join(QUANT_TYPES)} (got {type_!r})")
    info = read_gguf(source)
    if info.file_type not in ("ALL_F32", "F16", "BF16"):
        err.print(
            f"[yellow]warning:[/yellow] {source.name} is already {info.file_type}; "
            "requantizing loses quality"
        )
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_.upper()}")
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        quantize_file(source, tmp, ftype, threads)
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    print(dest)


def main(argv: list[str] | None = None) -> int:
    """Entry point: errors become one line on stderr and an exit code, never a traceback."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="edgespec", standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as e:
        # typer raises this to show help when called with no arguments
        print(e.ctx.get_help() if e.ctx else "", file=sys.stderr)
        return 2
    except click_exceptions.UsageError as e:
        print(f"error: {e.format_message()}", file=sys.stderr)
        return 2
    except typer.Exit as e:
        return e.exit_code
    except (KeyboardInterrupt, typer.Abort):
        print("\ninterrupted", file=sys.stderr)
        return 130
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # `edgespec run ... | head`: the reader went away, not an error
        return 0
    return rv if isinstance(rv, int) else 0
