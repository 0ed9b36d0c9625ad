"""The settings of `edgespec run`, from flags, the environment, a config file and defaults.

Precedence, highest first: a flag on the command line, an environment variable EDGESPEC_<NAME>
(`EDGESPEC_TEMP=0.7`), a top-level key of config.toml (`temp = 0.7`), the default. Each resolved
value remembers where it came from, so that `edgespec config show` can explain it.

    # config.toml (`edgespec config path` prints where it lives)
    target = "qwen2.5-coder-1.5b"
    temp = 0.7
    ctx_size = 1024
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from difflib import get_close_matches
from pathlib import Path
from typing import get_args, get_type_hints

from edgespec.errors import BadSettingError
from edgespec.files import user_home, user_path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

CONFIG_FILE = "config.toml"
ENV_PREFIX = "EDGESPEC_"
# The same as edgespec.engine.MODES (a test checks), repeated because the engine imports llama.cpp.
MODES = ("target", "chain", "tree", "ngram", "auto")


@dataclass(frozen=True)
class Settings:
    """The settings of `edgespec run`; None means that the command chooses (see its --help)."""

    target: str | None = None
    draft: str | None = None
    mode: str | None = None
    threads: int | None = None
    draft_threads: int | None = None
    target_cpus: str | None = None  # "0-3,6": pin the target's threads there
    draft_cpus: str | None = None
    ctx_size: int = 2048
    max_tokens: int = 256
    temp: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    draft_max: int | None = None  # None: see GenerationConfig.draft_max
    system: str | None = None
    # Where each value came from: "flag", "env EDGESPEC_TEMP", "file /path/config.toml:3" or
    # "default".
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def source(self, name: str) -> str:
        return self.sources.get(name, "default")

    def values(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in NAMES}


NAMES = tuple(f.name for f in fields(Settings) if f.name != "sources")
# The type of each setting, from the annotations above: `int | None` is an int when given.
KINDS: dict[str, type] = {
    name: next(t for t in get_args(hint) or (hint,) if t is not type(None))
    for name, hint in get_type_hints(Settings).items()
    if name in NAMES
}
CHOICES = {"mode": MODES}
MODELS = ("target", "draft")  # a GGUF path or a catalogue name
CPU_LISTS = ("target_cpus", "draft_cpus")
RULES = {int: "a whole number", float: "a number", str: "a string"}

Layer = dict[str, tuple[object, str]]  # setting name -> (value, source)


def config_dir() -> Path:
    """The directory of config.toml: $EDGESPEC_HOME, else $XDG_CONFIG_HOME/edgespec or
    ~/.config/edgespec.

    Without EDGESPEC_HOME this is not the model cache (edgespec.catalogue.home(), by default
    ~/.cache/edgespec), on purpose: a config file is a few lines a person writes and keeps (in
    backups, in dotfiles), while the cache holds gigabytes that can be fetched again and that cache
    cleaners may delete. EDGESPEC_HOME puts both in one directory, for a self-contained install
    or a test.
    """
    home = os.environ.get("EDGESPEC_HOME")
    if home:
        return user_path(home, "EDGESPEC_HOME")
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    # The XDG spec says to ignore a relative XDG_CONFIG_HOME.
    base = Path(xdg) if os.path.isabs(xdg) else user_home() / ".config"
    return base / "edgespec"


def state_dir() -> Path:
    """Where edgespec keeps what it wrote down for the user between runs (chats, typed lines):
    $EDGESPEC_HOME, else $XDG_STATE_HOME/edgespec or ~/.local/state/edgespec. Not the cache,
    which cleaners may empty, nor the config directory, which people keep in their dotfiles."""
    home = os.environ.get("EDGESPEC_HOME")
    if home:
        return user_path(home, "EDGESPEC_HOME")
    xdg = os.environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else user_home() / ".local" / "state"
    return base / "edgespec"


def config_path() -> Path:
    return config_dir() / CONFIG_FILE


def resolve(flags: Mapping[str, object | None] | None = None) -> Settings:
    """The settings to use: flags that are not None, then environment, then config file, then
    defaults. A bad value in the environment or the file is a BadSettingError naming where it is.
    """
    flags = flags or {}
    not_settings = sorted(set(flags) - set(NAMES))
    if not_settings:  # a mistake in the calling code, not in the user's input
        raise ValueError(f"not settings of edgespec run: {', '.join(not_settings)}")
    # Every layer is read and checked even where a higher one overrides it: a broken config file
    # is reported the first time edgespec runs, not on the day a flag stops hiding it.
    file_layer = read_file(config_path())
    env_layer = read_env(os.environ)
    flag_layer = {name: (value, "flag") for name, value in flags.items() if value is not None}
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for layer in (file_layer, env_layer, flag_layer):  # each overrides the one before
        for name, (value, source) in layer.items():
            values[name] = value
            sources[name] = source
    sources = {name: sources.get(name, "default") for name in NAMES}
    return Settings(**values, sources=sources)


def read_env(environ: Mapping[str, str]) -> Layer:
    """The settings given as EDGESPEC_<NAME> variables, converted to their types."""
    layer: Layer = {}
    for name in NAMES:
        variable = ENV_PREFIX + name.upper()
        text = environ.get(variable, "")
        if text == "":  # set but empty is unset, as `EDGESPEC_TEMP= edgespec run ...` intends
            continue
        try:
            layer[name] = (parse_value(name, text), f"env {variable}")
        except _Invalid as e:
            raise BadSettingError(f"{variable} must be {e} (got {text!r})") from None
    return layer


# EDGESPEC_* variables read elsewhere: the home (config_dir), the Makefile's demo prompt, the
# setup scripts' virtual environment and the device facts their tests pretend.
OTHER_VARIABLES = ("HOME", "DEMO_PROMPT", "VENV", "UNAME_M", "LONG_BIT", "MEM_MIB", "NPROC")


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A line for each EDGESPEC_* variable that nothing reads: a typo (EDGESPEC_TEMPERATURE)
    changed nothing without a word, where config.toml's unknown keys are errors. Said, not
    refused: the environment reaches every program, and may hold a variable of someone else's."""
    notes = []
    for variable in sorted(environ):
        name = variable.removeprefix(ENV_PREFIX)
        if name == variable or name in OTHER_VARIABLES:
            continue
        if name.isupper() and name.lower() in NAMES:
            continue
        key = name.lower()
        close = get_close_matches(key, NAMES, n=1, cutoff=0.7)  # a typo: DRAFTMAX, TRHEADS
        close = close or [n for n in NAMES if key.startswith(n)]  # TEMPERATURE for TEMP
        hint = f"; did you mean {ENV_PREFIX}{close[0].upper()}?" if close else ""
        notes.append(f"{variable} is not a variable edgespec reads{hint}")
    return notes


def read_file(path: Path) -> Layer:
    """The settings in a config file (none if it does not exist), checked against their types."""
    try:
        text = path.read_text("utf-8-sig")  # Windows editors may begin the file with a BOM
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError:
        raise BadSettingError(f"cannot read {path}: it is not UTF-8 text") from None
    except OSError as e:
        raise BadSettingError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadSettingError(_toml_error(path, text, e)) from None
    layer: Layer = {}
    for key, value in table.items():
        line = line_of(text, key)
        where = f"{path} line {line}" if line else str(path)
        if key not in KINDS:
            raise BadSettingError(f"{where}: unknown setting {key!r}{_suggestion(key)}")
        try:
            layer[key] = (_checked(key, value), f"file {path}:{line}" if line else f"file {path}")
        except _Invalid as e:
            raise BadSettingError(f"{where}: {key} must be {e} (got {_as_toml(value)})") from None
    return layer


def line_of(text: str, key: str) -> int | None:
    """The line that sets a top-level `key`: a small scan of the text, not a second TOML parser."""
    name = re.escape(key)
    # key = 1, "key" = 1, key.sub = 1; and table headers [key], [[key]], [key.sub].
    # [ \t] rather than \s, which would run across blank lines to the next line's key.
    assignment = rf"^[ \t]*(?:{name}|\"{name}\"|'{name}')[ \t]*[=.]"
    header = rf"^[ \t]*\[\[?[ \t]*{name}[ \t]*[\].]"
    match = re.search(f"{assignment}|{header}", text, re.MULTILINE)
    return text.count("\n", 0, match.start()) + 1 if match else None


class _Invalid(ValueError):
    """A value that does not fit its setting; the message is the rule it breaks."""


def _rule(name: str) -> str:
    if name in CHOICES:
        return f"one of {', '.join(CHOICES[name])}"
    return RULES[KINDS[name]]


def parse_value(name: str, text: str) -> object:
    """A setting given as text (an environment variable, chat's /set) as its type, read as the
    flag reads it: ASCII digits only (int() and float() also take other scripts' digits, ٣ or
    ３, which the flags refuse), and a whole number may be written 2.0 (as `-n 2.0` may)."""
    kind = KINDS[name]
    if kind is str:
        return _checked(name, text)
    if not text.isascii():
        raise _Invalid(_rule(name))
    try:
        value: object = kind(text)
    except ValueError:
        try:
            value = float(text)  # 2.0 for a whole number: _checked takes it as 2
        except ValueError:
            raise _Invalid(_rule(name)) from None
    return _checked(name, value)


def _checked(name: str, value: object) -> object:
    """`value` if it fits the setting (a whole number fits a number setting, as a float; a
    float with nothing after the point a whole-number setting, as `-n 2.0` does)."""
    kind = KINDS[name]
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if name in CPU_LISTS and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # target_cpus = 3: one CPU, as --target-cpus 3
    accepted = (int, float) if kind is float else kind
    if isinstance(value, bool) or not isinstance(value, accepted):  # TOML true is not a number
        raise _Invalid(_rule(name))
    if kind is float:
        value = float(value)
        if not math.isfinite(value):
            raise _Invalid("a finite number")
    if name in CHOICES and value not in CHOICES[name]:
        raise _Invalid(_rule(name))
    if name in MODELS:  # as run reads it: '' was ".", a NUL a ValueError
        try:
            user_path(value, name)
        except BadSettingError:
            raise _Invalid("a model's path or catalogue name") from None
    return value


def _as_toml(value: object) -> str:
    """A value as it would be written in the file, for error messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string, escapes and all
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return str(value)


def _suggestion(key: str) -> str:
    # 0.7 catches typos (tmep, treads, max-tokens) but not mere neighbours (server → seed)
    close = get_close_matches(key.replace("-", "_"), NAMES, n=1, cutoff=0.7)
    if close:
        return f"; did you mean {close[0]}?"
    return f"; the settings are {', '.join(NAMES)}"


def _toml_error(path: Path, text: str, error: Exception) -> str:
    """tomllib's message ("Invalid value (at line 3, column 8)") as one line naming the file."""
    message = str(error).splitlines()[0] if str(error) else "not valid TOML"
    found = re.fullmatch(r"(.*) \(at (?:line (\d+), column (\d+)|end of document)\)", message)
    if not found:
        return f"{path}: not valid TOML: {message}"
    reason, line, column = found.groups()
    if line is None:  # the error is at the end of the file, on its last line
        line = str(text.count("\n") + (0 if text.endswith("\n") else 1))
        return (
            f"{path} line {line}: not valid TOML: {_lower_first(reason)} (at the end of the file)"
        )
    return f"{path} line {line}: not valid TOML: {_lower_first(reason)} (column {column})"


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
