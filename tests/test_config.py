"""Settings of `edgespec run`: flag beats environment beats config file beats default, each value
knows its source, and every bad value is a one-line BadSettingError that says where it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgespec import config
from edgespec.cli.config_cmd import config_app
from edgespec.config import Settings, config_dir, config_path, resolve
from edgespec.errors import BadSettingError


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    """A fresh EDGESPEC_HOME, and none of the developer's own EDGESPEC_<SETTING> variables."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    for name in config.NAMES:
        monkeypatch.delenv(f"EDGESPEC_{name.upper()}", raising=False)
    return tmp_path


def write_config(home: Path, text: str) -> Path:
    path = home / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def bad_setting(flags: dict[str, object | None] | None = None) -> str:
    """The message of the BadSettingError that resolve() raises; it must be one line."""
    with pytest.raises(BadSettingError) as caught:
        resolve(flags)
    message = str(caught.value)
    assert "\n" not in message
    assert caught.value.exit_code == 2
    return message


# precedence and sources


def test_with_nothing_set_every_setting_is_its_default():
    settings = resolve({})
    assert settings == Settings()
    assert {settings.source(name) for name in config.NAMES} == {"default"}


def test_a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default(
    home, monkeypatch
):
    path = write_config(home, "temp = 0.3\ntop_k = 40\nctx_size = 1024\n")
    monkeypatch.setenv("EDGESPEC_TEMP", "0.5")
    monkeypatch.setenv("EDGESPEC_TOP_K", "20")

    settings = resolve({"temp": 0.9})

    assert (settings.temp, settings.source("temp")) == (0.9, "flag")
    assert (settings.top_k, settings.source("top_k")) == (20, "env EDGESPEC_TOP_K")
    assert (settings.ctx_size, settings.source("ctx_size")) == (1024, f"file {path}:3")
    assert (settings.max_tokens, settings.source("max_tokens")) == (256, "default")


def test_a_flag_of_none_is_a_flag_not_given(home):
    write_config(home, 'target = "qwen2.5-coder-0.5b"\n')
    settings = resolve({"target": None, "seed": None})
    assert settings.target == "qwen2.5-coder-0.5b"
    assert (settings.seed, settings.source("seed")) == (None, "default")


def test_an_empty_cpu_list_flag_gives_the_default_placement_over_the_file_s(home):
    """The one way back to the detected placement for a run, where config.toml pins CPUs."""
    from edgespec.cores import default_placement, detect_cores, plan_placement

    write_config(home, 'target_cpus = "0"\ndraft_cpus = "0"\n')
    settings = resolve({"target_cpus": ""})
    assert (settings.target_cpus, settings.source("target_cpus")) == ("", "flag")
    placement = plan_placement(settings.target_cpus, None)
    assert placement.target_cpus == default_placement(detect_cores()).target_cpus
    assert plan_placement(settings.target_cpus, settings.draft_cpus).draft_cpus == [0]


def test_the_file_source_names_the_line_of_each_key(home):
    path = write_config(home, '# my settings\n\n  system = "Be brief."\n"draft_max" = 6\n')
    settings = resolve({})
    assert settings.source("system") == f"file {path}:3"
    assert settings.source("draft_max") == f"file {path}:4"


def test_environment_values_take_the_type_of_their_setting(monkeypatch):
    monkeypatch.setenv("EDGESPEC_MAX_TOKENS", "64")
    monkeypatch.setenv("EDGESPEC_TEMP", "1")
    monkeypatch.setenv("EDGESPEC_SYSTEM", "Answer in French.")
    monkeypatch.setenv("EDGESPEC_MODE", "tree")
    settings = resolve({})
    assert settings.max_tokens == 64 and type(settings.max_tokens) is int
    assert settings.temp == 1.0 and type(settings.temp) is float
    assert settings.system == "Answer in French."
    assert settings.mode == "tree"


def test_an_empty_environment_variable_counts_as_unset(home, monkeypatch):
    write_config(home, "temp = 0.3\n")
    monkeypatch.setenv("EDGESPEC_TEMP", "")
    assert resolve({}).source("temp").startswith("file ")


def test_a_whole_number_in_the_file_is_a_number_for_a_number_setting(home):
    write_config(home, "temp = 1\n")
    temp = resolve({}).temp
    assert temp == 1.0 and type(temp) is float


def test_a_whole_number_may_be_written_as_the_flag_takes_it_but_only_in_ascii_digits(
    home, monkeypatch
):
    # `-n 2.0` is 2 and `-n ٣` an error (typer): the environment and the file read them alike.
    monkeypatch.setenv("EDGESPEC_MAX_TOKENS", "2.0")
    write_config(home, "seed = 7.0\n")
    settings = resolve({})
    assert settings.max_tokens == 2 and type(settings.max_tokens) is int
    assert settings.seed == 7 and type(settings.seed) is int
    for digits in ("٣", "３", "1.٥"):
        monkeypatch.setenv("EDGESPEC_TEMP", digits)
        assert bad_setting() == f"EDGESPEC_TEMP must be a number (got {digits!r})"


def test_a_file_saved_with_a_byte_order_mark_and_a_cpu_given_as_a_number_are_read(home):
    (home / "config.toml").write_bytes("\ufefftarget_cpus = 1\ndraft_cpus = '0'\n".encode())
    settings = resolve({})
    assert (settings.target_cpus, settings.draft_cpus) == ("1", "0")


def test_resolve_refuses_a_flag_that_is_not_a_setting():
    with pytest.raises(ValueError, match="verbose"):
        resolve({"verbose": True})


# bad values


@pytest.mark.parametrize(
    ("variable", "text", "message"),
    [
        ("EDGESPEC_TEMP", "hot", "EDGESPEC_TEMP must be a number (got 'hot')"),
        ("EDGESPEC_TEMP", "nan", "EDGESPEC_TEMP must be a finite number (got 'nan')"),
        ("EDGESPEC_MAX_TOKENS", "12.5", "EDGESPEC_MAX_TOKENS must be a whole number (got '12.5')"),
        (
            "EDGESPEC_MODE",
            "fast",
            "EDGESPEC_MODE must be one of target, chain, tree, ngram, auto (got 'fast')",
        ),
    ],
)
def test_a_bad_environment_value_names_the_variable(monkeypatch, variable, text, message):
    monkeypatch.setenv(variable, text)
    assert bad_setting() == message


def test_an_edgespec_variable_nothing_reads_is_named_with_the_setting_it_may_mean():
    environ = {
        "EDGESPEC_TEMPERATURE": "0.7",  # the setting is temp
        "EDGESPEC_DRAFTMAX": "4",
        "EDGESPEC_temp": "0.7",  # variables are upper case
        "EDGESPEC_SERVER": "1",
        "EDGESPEC_TEMP": "0.7",  # read: settings, and what the scripts and Makefile set
        "EDGESPEC_HOME": "/tmp",
        "EDGESPEC_DEMO_PROMPT": "hi",
        "EDGESPEC_NPROC": "4",
        "EDGESPEC": "edgespec",  # edgespec-ask.sh's command
        "TEMP": "/tmp",
    }
    assert config.unknown_variables(environ) == [
        "EDGESPEC_DRAFTMAX is not a variable edgespec reads; did you mean EDGESPEC_DRAFT_MAX?",
        "EDGESPEC_SERVER is not a variable edgespec reads",
        "EDGESPEC_TEMPERATURE is not a variable edgespec reads; did you mean EDGESPEC_TEMP?",
        "EDGESPEC_temp is not a variable edgespec reads; did you mean EDGESPEC_TEMP?",
    ]


def test_a_bad_environment_value_is_reported_even_when_a_flag_overrides_it(monkeypatch):
    monkeypatch.setenv("EDGESPEC_TEMP", "hot")
    assert bad_setting({"temp": 0.5}).startswith("EDGESPEC_TEMP must be a number")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('temp = "hot"', 'temp must be a number (got "hot")'),
        ("max_tokens = 12.5", "max_tokens must be a whole number (got 12.5)"),
        ('ctx_size = "2048"', 'ctx_size must be a whole number (got "2048")'),
        ("threads = true", "threads must be a whole number (got true)"),
        ("temp = inf", "temp must be a finite number (got inf)"),
        ("target = 3", "target must be a string (got 3)"),
        ('target = ""', 'target must be a model\'s path or catalogue name (got "")'),
        (
            'draft = "a\\u0000b"',
            'draft must be a model\'s path or catalogue name (got "a\\u0000b")',
        ),
        ("seed = [1, 2]", "seed must be a whole number (got an array)"),
        ('mode = "fast"', 'mode must be one of target, chain, tree, ngram, auto (got "fast")'),
        # A setting written as a table or an array of tables: its header is its line.
        ("[ target ]", "target must be a string (got a table)"),
        ("[[seed]]", "seed must be a whole number (got an array)"),
    ],
)
def test_a_bad_file_value_names_the_file_and_its_line(home, line, message):
    path = write_config(home, f"# edgespec\ndraft_max = 4\n{line}\n")
    assert bad_setting() == f"{path} line 3: {message}"


def test_an_unknown_key_names_its_line_and_suggests_the_setting_meant(home):
    path = write_config(home, "temp = 0.7\ntmep = 0.2\n")
    assert bad_setting() == f"{path} line 2: unknown setting 'tmep'; did you mean temp?"


def test_an_unknown_key_with_no_near_setting_lists_the_settings(home):
    path = write_config(home, "temp = 0.7\n\n[server]\nport = 8080\n")
    message = bad_setting()
    assert message.startswith(f"{path} line 3: unknown setting 'server'; the settings are target,")
    assert "max_tokens" in message


def test_a_flag_style_key_suggests_the_underscored_name(home):
    path = write_config(home, "max-tokens = 64\n")
    assert bad_setting() == f"{path} line 1: unknown setting 'max-tokens'; did you mean max_tokens?"


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("temp = 0.7\nmax_tokens = = 3\n", 2, "invalid value (column 14)"),
        ("temp = 0.7\ntemp = 0.8\n", 2, "cannot overwrite a value"),
        ('temp = 0.7\nsystem = """Be brief.\n', 2, "unterminated string (at the end of the file)"),
    ],
)
def test_a_malformed_file_names_the_file_and_the_line(home, text, line, reason):
    path = write_config(home, text)
    message = bad_setting()
    assert message.startswith(f"{path} line {line}: not valid TOML: ")
    assert reason in message


def test_a_config_file_that_is_not_utf8_is_reported(home):
    path = home / "config.toml"
    path.write_bytes(b'system = "caf\xe9"\n')
    assert bad_setting() == f"cannot read {path}: it is not UTF-8 text"


# where the file is


def test_the_config_directory_is_edgespec_home_then_xdg_then_dot_config(tmp_path, monkeypatch):
    assert config_dir() == tmp_path
    assert config_path() == tmp_path / "config.toml"
    monkeypatch.delenv("EDGESPEC_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_dir() == tmp_path / "xdg" / "edgespec"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/is/ignored")
    assert config_dir() == tmp_path / "me" / ".config" / "edgespec"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert config_dir() == tmp_path / "me" / ".config" / "edgespec"


def test_a_missing_config_file_is_no_error(home):
    assert not (home / "config.toml").exists()
    assert resolve({}) == Settings()


# agreement with the rest of edgespec


def test_the_defaults_are_those_of_the_library():
    from edgespec.engine import DEFAULT_CTX, GenerationConfig, load
    from edgespec.sampling import SamplingParams

    generation, sampling = GenerationConfig(), SamplingParams()
    defaults = Settings()
    assert defaults.max_tokens == generation.max_tokens
    assert defaults.draft_max == generation.draft_max
    assert defaults.temp == generation.temperature == sampling.temperature
    assert (defaults.top_k, defaults.top_p, defaults.min_p) == (
        sampling.top_k,
        sampling.top_p,
        sampling.min_p,
    )
    # load's None: 2048, or less for a model trained for less
    assert defaults.ctx_size == DEFAULT_CTX and load.__kwdefaults__["n_ctx"] is None


def test_the_modes_a_setting_accepts_are_the_engines():
    from edgespec.engine import MODES

    assert config.MODES == MODES


# edgespec config


def test_config_show_json_gives_each_value_and_its_source(home, monkeypatch):
    path = write_config(home, "ctx_size = 1024\n")
    monkeypatch.setenv("EDGESPEC_TEMP", "0.5")

    result = CliRunner().invoke(config_app, ["show", "--json"])

    assert result.exit_code == 0
    shown = json.loads(result.stdout)
    assert list(shown) == list(config.NAMES)
    assert shown["temp"] == {"value": 0.5, "source": "env EDGESPEC_TEMP"}
    assert shown["ctx_size"] == {"value": 1024, "source": f"file {path}:1"}
    assert shown["seed"] == {"value": None, "source": "default"}


def test_config_show_prints_a_table_of_settings_values_and_sources(monkeypatch):
    monkeypatch.setenv("EDGESPEC_TEMP", "0.5")
    result = CliRunner().invoke(config_app, ["show"])
    assert result.exit_code == 0
    temp_row = next(line for line in result.stdout.splitlines() if " temp " in line)
    assert "0.5" in temp_row and "env EDGESPEC_TEMP" in temp_row


def test_config_show_says_what_run_uses_for_what_nobody_set(home, monkeypatch):
    for name in ("TARGET", "DRAFT", "MODE"):
        monkeypatch.delenv(f"EDGESPEC_{name}", raising=False)
    rows = CliRunner().invoke(config_app, ["show"]).stdout.splitlines()
    row = {name: next(line for line in rows if f" {name} " in line) for name in config.NAMES}
    assert "not set: qwen2.5-coder-1.5b" in row["target"]
    assert "not set: qwen2.5-coder-0.5b" in row["draft"] and "not set: auto" in row["mode"]
    monkeypatch.setenv("EDGESPEC_TARGET", "my.gguf")  # a target named: no default draft
    rows = CliRunner().invoke(config_app, ["show"]).stdout.splitlines()
    assert "not set: none" in next(line for line in rows if " draft " in line)


def test_config_show_reports_a_bad_file_in_one_line(home):
    path = write_config(home, 'ctx_size = "big"\n')
    result = CliRunner().invoke(config_app, ["show"])
    assert result.exit_code == 2
    assert result.stderr == (f'error: {path} line 1: ctx_size must be a whole number (got "big")\n')


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("temp", "-1", "--temp must be >= 0 (got -1)"),
        ("ctx_size", "5", "--ctx-size must be at least 16 (got 5)"),
    ],
)
def test_config_show_shows_a_value_run_would_refuse_and_then_says_why(
    home, monkeypatch, name, value, error
):
    """Out-of-range values were listed without a word; `run` refused them."""
    monkeypatch.setenv(f"EDGESPEC_{name.upper()}", value)
    result = CliRunner().invoke(config_app, ["show"])
    assert result.exit_code == 2
    assert value in next(line for line in result.stdout.splitlines() if f" {name} " in line)
    assert result.stderr == f"error: {error} (set by env EDGESPEC_{name.upper()})\n"


def test_config_path_prints_where_the_file_is_read_from(home):
    result = CliRunner().invoke(config_app, ["path"])
    assert result.exit_code == 0
    assert result.stdout == f"{home / 'config.toml'}\n"
