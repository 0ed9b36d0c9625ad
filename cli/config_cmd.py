"""`edgespec config`: the settings `edgespec run` starts from, and where each one comes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from edgespec.config import Settings, config_path, resolve
from edgespec.errors import BadSettingError, EdgespecError

config_app = typer.Typer(
    help="Show the settings of `edgespec run` from config.toml, EDGESPEC_* variables and defaults;"
    " alone, `config show`."
)


@config_app.callback(invoke_without_command=True)
def config(ctx: typer.Context) -> None:
    """Alone: `config show` (the group's help is config_app's)."""
    if ctx.invoked_subcommand is None:  # as `models` alone lists the models
        show()


def _fail(message: str, exit_code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(exit_code)


@config_app.command()
def show(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object: {setting: {value, source}}")
    ] = False,
) -> None:
    """Show each setting, its value and its source (flags given to `run` override all of them);
    a value `run` would refuse is then an error."""
    try:
        settings = resolve()
    except EdgespecError as e:
        _fail(str(e), e.exit_code)
    if as_json:
        typer.echo(json.dumps(_as_dict(settings), ensure_ascii=False))
    else:
        _print_table(settings)
    try:
        _check(settings)
    except BadSettingError as e:
        _fail(str(e), e.exit_code)


def _print_table(settings: Settings) -> None:
    path = config_path()
    table = Table("setting", "value", "source")
    table.caption = f"config file: {path}" + ("" if path.exists() else " (none yet)")
    for name, value in settings.values().items():
        # Text, not str: a value such as a system message must not be read as rich markup.
        shown = Text(str(value)) if value is not None else Text(_unset(name, settings), "dim")
        table.add_row(name, shown, Text(settings.source(name)))
    Console(highlight=False).print(table)


def _unset(name: str, settings: Settings) -> str:
    """What `run` does about a setting nobody set: "(not set)" alone did not say which model
    or mode a run would use."""
    from .app import DEFAULT_DRAFT, DEFAULT_TARGET, draft_named_or_default

    default_draft = f"{DEFAULT_DRAFT}, in its fastest form here"
    meaning = {
        "target": DEFAULT_TARGET,
        "draft": default_draft if draft_named_or_default(settings) else "none",
        "mode": "auto",
        "threads": "one per CPU of target_cpus",
        "draft_threads": "one per CPU of draft_cpus",
        "target_cpus": "the big cores; all when cores are equal",
        "draft_cpus": "the little cores; all when cores are equal",
        "seed": "random",
        "draft_max": "chosen each round",
        "system": "the chat template's own, if any",
    }.get(name)
    return f"(not set: {meaning})" if meaning else "(not set)"


@config_app.command()
def path() -> None:
    """Print where config.toml is read from (it need not exist)."""
    typer.echo(str(config_path()))


def _check(settings: Settings) -> None:
    """What `run` checks of these values before loading a model (not the models' files)."""
    from edgespec.cores import plan_placement
    from edgespec.engine import GenerationConfig, check_ctx_size, check_threads

    from .app import draft_named_or_default, generation_options, sources_named

    with sources_named(settings):
        GenerationConfig(**generation_options(settings)).validate(
            has_draft=draft_named_or_default(settings)
        )
        check_threads(settings.threads, settings.draft_threads)
        check_ctx_size(settings.ctx_size, None, Path())  # the model's own bound: when it loads
        plan_placement(settings.target_cpus, settings.draft_cpus)


def _as_dict(settings: Settings) -> dict[str, dict[str, object]]:
    return {
        name: {"value": value, "source": settings.source(name)}
        for name, value in settings.values().items()
    }
