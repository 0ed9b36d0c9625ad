"""`edgespec config`: the settings `edgespec run` starts from, and where each one comes from."""

from __future__ import annotations

import json
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from edgespec.config import Settings, config_path, resolve
from edgespec.errors import EdgespecError

config_app = typer.Typer(
    help="Show the settings of `edgespec run` from config.toml, EDGESPEC_* variables and defaults.",
    no_args_is_help=True,
)


def _fail(message: str, exit_code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(exit_code)


@config_app.command()
def show(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object: {setting: {value, source}}")
    ] = False,
) -> None:
    """Show each setting, its value and its source (flags given to `run` override all of them)."""
    try:
        settings = resolve()
    except EdgespecError as e:
        _fail(str(e), e.exit_code)
    if as_json:
        typer.echo(json.dumps(_as_dict(settings), ensure_ascii=False))
        return
    path = config_path()
    table = Table("setting", "value", "source")
    table.caption = f"config file: {path}" + ("" if path.exists() else " (none yet)")
    for name, value in settings.values().items():
        # Text, not str: a value such as a system message must not be read as rich markup.
        shown = Text("(not set)", style="dim") if value is None else Text(str(value))
        table.add_row(name, shown, Text(settings.source(name)))
    Console(highlight=False).print(table)


@config_app.command()
def path() -> None:
    """Print where config.toml is read from (it need not exist)."""
    typer.echo(str(config_path()))


def _as_dict(settings: Settings) -> dict[str, dict[str, object]]:
    return {
        name: {"value": value, "source": settings.source(name)}
        for name, value in settings.values().items()
    }
