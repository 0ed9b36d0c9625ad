"""The benchmark: every mode measured against plain decoding, on SmolLM2, small and fast."""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from edgespec.backend import Context
from edgespec.bench import (
    BASELINE,
    LLAMA_MODES,
    BenchPrompt,
    BenchReport,
    ClassSummary,
    Divergence,
    NoiseInterval,
    available_modes,
    checked_modes,
    cpu_generation,
    cpu_simd,
    engine_options,
    engine_runner,
    first_divergence,
    load_prompts,
    noise_interval,
    paired_ratios,
    plain_spread,
    run_bench,
)
from edgespec.cli.bench_cmd import (
    bench,
    class_table,
    divergence_lines,
    overall_lines,
    ratio_bar,
    ratio_chart,
    spread_line,
    thread_lines,
)
from edgespec.errors import BadSettingError

from .helpers import assert_same_or_near_tie, fresh_logits

# Chat prompts of 40 tokens' answers: more plain steps than Stats.in_run_ratio needs.
PROMPTS_40 = ["Why is the sky blue?", "Tell me about the history of tea."]

TINY_SUITE = """
[[prompts]]
name = "add"
class = "code"
max_tokens = 16
text = "Write a Python function that adds two numbers."

[[prompts]]
name = "sky"
class = "chat"
max_tokens = 16
text = "Why is the sky blue?"
"""


@pytest.fixture(scope="module")
def tiny_suite(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "prompts.toml"
    path.write_text(TINY_SUITE)
    return path


def invoke_bench(args: list[str]):
    """The bench command with `args`, as its own typer app runs it (CliRunner's result)."""
    app = typer.Typer()
    app.command()(bench)
    return CliRunner().invoke(app, args)


@pytest.fixture(scope="module")
def progress_steps() -> list[tuple[int, int, str]]:
    return []


@pytest.fixture(scope="module")
def report(smol_path, smol_q4_0, tiny_suite, progress_steps) -> BenchReport:
    # One thread: the test machine is shared, and oversubscribed threads stall llama.cpp.
    return run_bench(
        smol_path,
        smol_q4_0,
        [*available_modes(has_draft=True), "chain:2", "chain:5"],
        load_prompts(tiny_suite),
        repeats=1,
        threads=1,
        n_ctx=1024,
        progress=lambda *step: progress_steps.append(step),
    )


def test_every_mode_gives_a_positive_speed_on_every_prompt(report):
    assert report.modes == [*available_modes(has_draft=True), "chain:2", "chain:5"]
    assert report.modes[0] == BASELINE and set(LLAMA_MODES) <= set(report.modes)
    for mode in report.modes:
        for prompt in ("add", "sky"):
            row = report.row(mode, prompt)
            assert row.tokens_per_s > 0 and 0 < row.n_generated <= 16


def test_the_baseline_has_ratio_one_and_the_same_text_as_itself(report):
    for prompt in ("add", "sky"):
        row = report.row(BASELINE, prompt)
        assert row.ratio == 1.0 and row.same_as_target
        assert row.acceptance is None  # plain decoding proposes nothing


@pytest.mark.parametrize("mode", LLAMA_MODES)
def test_llama_decodes_the_same_greedy_tokens_as_the_engine(report, plain_engine, tiny_suite, mode):
    for prompt in load_prompts(tiny_suite):
        prompt_tokens = plain_engine.prompt_tokens(prompt.text)
        plain = report.row(BASELINE, prompt.name).tokens
        other = report.row(mode, prompt.name).tokens
        assert_same_or_near_tie(plain_engine, prompt_tokens, plain, other)


def test_llama_is_timed_like_the_engine_one_pass_per_plain_token(report):
    # The prefill is outside the timed span in both (a re-evaluated prompt would raise).
    for prompt in ("add", "sky"):
        engine_row, llama_row = report.row(BASELINE, prompt), report.row("llama", prompt)
        assert llama_row.passes_per_token == engine_row.passes_per_token
        assert llama_row.acceptance is None


def test_speculative_modes_report_acceptance(report):
    for prompt in ("add", "sky"):
        row = report.row("chain", prompt)
        assert row.acceptance is not None and 0 <= row.acceptance <= 1
        assert row.passes_per_token is not None and row.passes_per_token <= 1


def test_each_row_counts_its_rounds_by_what_drafted_them(report):
    for prompt in ("add", "sky"):
        plain, auto = report.row(BASELINE, prompt), report.row("auto", prompt)
        assert plain.rounds == {}  # plain decoding makes no choices
        assert sum(auto.rounds.values()) > 0 and set(auto.rounds) <= {
            "plain",
            "ngram",
            "chain",
            "tree",
        }
        chain = report.row("chain", prompt)
        assert chain.rounds.get("chain", 0) > 0 and set(chain.rounds) <= {"chain", "ngram"}


def test_a_sized_mode_runs_with_that_size_and_reports_its_own_work(report):
    for prompt in ("add", "sky"):
        short, long = report.row("chain:2", prompt), report.row("chain:5", prompt)
        assert short.draft_evals_per_pass is not None and short.draft_evals_per_pass <= 2
        assert long.draft_evals_per_pass is not None and long.draft_evals_per_pass > 2
        assert short.overhead_ms is not None and short.overhead_ms > 0


def test_a_tree_may_name_its_scheduler_and_a_model_mode_may_turn_the_ngram_drafter_off():
    assert engine_options("tree:9:pacer") == {"mode": "tree", "max_nodes": 9, "scheduler": "pacer"}
    assert engine_options("tree:9") == {"mode": "tree", "max_nodes": 9}
    assert engine_options("tree:9:llmcad")["alpha0"] == 0.01
    assert engine_options("tree:9:fixed")["adaptive_alpha"] is False
    assert engine_options("chain:4:nogram") == {"mode": "chain", "draft_max": 4, "ngram": False}
    assert engine_options("tree:5:greedy:raw:nogram") == {
        "mode": "tree",
        "max_nodes": 5,
        "scheduler": "greedy",
        "calibrated": False,
        "ngram": False,
    }


def test_a_size_on_a_mode_without_one_is_refused(smol_path, tiny_suite):
    for bad in ("target:4", "chain:0", "chain:x", "chain:4:pacer", "chain:4:raw", "tree:4:nobody"):
        with pytest.raises(BadSettingError, match="bad mode"):
            run_bench(smol_path, smol_path, [bad], load_prompts(tiny_suite))


def test_a_bad_mode_is_refused_in_the_words_of_the_mode_not_of_a_flag():
    for mode, said in [
        ("ngram:99999999999999999999", "the size of ngram is its draft length, from 1 to 64"),
        ("chain:65", "the size of chain is its draft length, from 1 to 64"),
        ("tree:1", "the size of tree is its node budget, from 2 to 128"),
        ("tree:9:greedy:pacer", "greedy and pacer contradict"),
        ("tree:9:adaptive:fixed", "adaptive and fixed contradict"),
        ("tree:raw", "tree's size comes first, e.g. tree:8"),
        ("chain:nogram", "chain's size comes first, e.g. chain:8"),
    ]:
        with pytest.raises(BadSettingError, match=f"bad mode '{mode}': {said}"):
            engine_options(mode)
    with pytest.raises(BadSettingError, match="mode 'chain:4' needs a draft model"):
        checked_modes(["chain:4"], has_draft=False)
    # Saying a word twice, or words that agree, is no contradiction.
    assert engine_options("tree:9:pacer:pacer")["scheduler"] == "pacer"
    assert engine_options("tree:9:llmcad:adaptive")["adaptive_alpha"] is True


def test_each_class_summarises_every_mode_over_its_prompts(report):
    assert report.class_names == ["code", "chat"]
    for class_name in report.class_names:
        summaries = report.summaries(class_name)
        assert [s.mode for s in summaries] == report.modes
        baseline = summaries[0]
        assert baseline.median_ratio == baseline.min_ratio == 1.0
        assert baseline.n_same == baseline.n_prompts == 1
        # One repeat: nothing to tell the run's noise by, so no interval is claimed.
        assert all(s.interval is None for s in summaries)
    assert all(report.overall(mode) is None for mode in report.modes)
    assert overall_lines(report) == []


def test_modes_that_step_plainly_are_also_compared_with_their_own_plain_steps(smol_path):
    """The bench's modes that decode plain steps between their drafted rounds (auto, ngram)
    carry their speed over those steps' (Stats.in_run_ratio), a row the median of its runs',
    a class the median of its rows'; plain decoding, the other modes and llama.cpp's own none."""
    prompts = [BenchPrompt(f"p{i}", "chat", text, 40) for i, text in enumerate(PROMPTS_40)]
    modes = ["ngram", "auto", "llama"]
    report = run_bench(smol_path, None, modes, prompts, repeats=1, threads=1, n_ctx=512)
    for prompt in prompts:
        assert report.row(BASELINE, prompt.name).in_run_ratio is None
        assert report.row("llama", prompt.name).in_run_ratio is None
    stepping = [report.row(m, p.name) for m in ("ngram", "auto") for p in prompts]
    assert all(r.in_run_ratio is None or 0.5 < r.in_run_ratio < 3 for r in stepping)
    assert all(r.in_run_ratios == ([r.in_run_ratio] if r.in_run_ratio else []) for r in stepping)
    assert any(r.in_run_ratio is not None for r in stepping)  # 40 tokens, mostly plain steps
    for s in report.summaries("chat"):
        rows = [report.row(s.mode, p.name).in_run_ratio for p in prompts]
        present = [r for r in rows if r is not None]
        assert s.in_run_ratio == (statistics.median(present) if present else None)
    data = json.loads(json.dumps(report.to_dict()))
    assert "in_run_ratio" in data["rows"][0] and "in_run_ratio" in data["classes"][0]


def test_progress_is_reported_before_every_run_and_at_the_end(report, progress_steps):
    n_runs = len(report.modes) * (1 + 2)  # a warm-up, then each of the two prompts once
    assert [done for done, _, _ in progress_steps] == list(range(n_runs + 1))
    assert {total for _, total, _ in progress_steps} == {n_runs}
    assert progress_steps[0][2] == "warm-up target" and progress_steps[-1][2] == "done"


def test_the_report_serialises_to_json_with_the_machine_and_settings(report):
    data = json.loads(json.dumps(report.to_dict()))
    assert data["machine"]["cpu"] and data["machine"]["logical_cpus"] >= 1
    assert data["machine"]["simd"]
    assert data["settings"]["threads"] == 1 and data["settings"]["repeats"] == 1
    assert data["settings"]["target"]["file"].endswith(".gguf")
    assert {p["name"] for p in data["prompts"]} == {"add", "sky"}
    assert len(data["rows"]) == 2 * len(report.modes)


def test_modes_needing_a_draft_are_refused_without_one(smol_path, tiny_suite):
    with pytest.raises(BadSettingError, match="draft"):
        run_bench(smol_path, None, ["chain"], load_prompts(tiny_suite))


def test_a_prompt_longer_than_the_context_is_named_before_a_first_use_profile(
    smol_path, monkeypatch
):
    """It said "the prompt has 5030 tokens" (which?), after profiling for auto."""
    from edgespec.engine import Engine

    monkeypatch.setattr(Engine, "profile_if_missing", lambda *a, **k: pytest.fail("profiled"))
    long = BenchPrompt("long-one", "code", "word " * 400, 8)
    with pytest.raises(BadSettingError, match=r"^prompt long-one: the prompt has \d+ tokens"):
        run_bench(smol_path, None, ["auto"], [long], n_ctx=256)


def test_an_unknown_mode_is_refused_with_the_choices(smol_path, tiny_suite):
    with pytest.raises(BadSettingError, match=r"unknown mode 'fast'.*llama-lookup"):
        run_bench(smol_path, None, ["fast"], load_prompts(tiny_suite))


def test_the_shipped_suite_has_at_least_three_prompts_per_class():
    prompts = load_prompts()
    for class_name, budget in (("code", 192), ("edit", 256), ("chat", 128), ("summary", 128)):
        of_class = [p for p in prompts if p.class_name == class_name]
        assert len(of_class) >= 3
        assert all(16 <= p.max_tokens <= budget for p in of_class)


def test_the_held_out_prompts_load_and_are_none_of_the_shipped_ones():
    held_out = load_prompts(Path(__file__).parent.parent / "scripts" / "holdout_prompts.toml")
    assert {p.class_name for p in held_out} >= {"code", "edit", "summary"}
    shipped = load_prompts()
    assert not {p.name for p in held_out} & {p.name for p in shipped}
    assert not {p.text for p in held_out} & {p.text for p in shipped}


def test_prompts_can_be_chosen_by_class(tiny_suite):
    assert [p.name for p in load_prompts(tiny_suite, classes=["chat"])] == ["sky"]
    with pytest.raises(BadSettingError, match="no prompts of class poetry"):
        load_prompts(tiny_suite, classes=["poetry"])


def test_a_prompt_file_with_a_repeated_name_is_refused(tmp_path):
    path = tmp_path / "twice.toml"
    path.write_text(TINY_SUITE + TINY_SUITE)
    with pytest.raises(BadSettingError, match="unique"):
        load_prompts(path)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"\xff\xfe[[prompts]]", "is not UTF-8 text"),  # UnicodeDecodeError, a traceback
        (b'prompts = "abc"', "prompts must be [[prompts]] entries"),  # AttributeError
        (b"prompts = [1, 2]", "prompts must be [[prompts]] entries"),
        (b"[prompts]\nname = 'a'", "prompts must be [[prompts]] entries"),
        (TINY_SUITE.replace("max_tokens = 16", "max_tokens = true").encode(), "needs max_tokens"),
        (b"x = " + b"[" * 2000 + b"]" * 2000, "nested too deeply"),  # RecursionError
        (TINY_SUITE.replace('class = "chat"', 'class = " "').encode(), "needs a name and a class"),
        (TINY_SUITE.replace('name = "sky"', 'name = ""').encode(), "needs a name and a class"),
    ],
)
def test_a_prompt_file_of_the_wrong_shape_or_encoding_is_one_clear_error(tmp_path, content, needle):
    path = tmp_path / "prompts.toml"
    path.write_bytes(content)
    with pytest.raises(BadSettingError, match=re.escape(needle)):
        load_prompts(path)


def test_a_prompt_file_may_begin_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "prompts.toml"
    path.write_bytes(b"\xef\xbb\xbf" + TINY_SUITE.encode())
    assert [p.name for p in load_prompts(path)] == ["add", "sky"]


def test_an_endless_prompt_file_is_refused_after_a_bound_not_read_into_memory():
    with pytest.raises(BadSettingError, match="/dev/zero is larger than 16 MiB"):
        load_prompts("/dev/zero")


@pytest.mark.parametrize("size", ["¹", "٣", "3.0", "+3"])
def test_a_mode_size_is_ascii_digits(size):
    """A superscript one passed str.isdigit and failed int() with a traceback; an Arabic-Indic
    three ran as 3."""
    with pytest.raises(BadSettingError, match="size comes first"):
        checked_modes([f"chain:{size}"], has_draft=True)


def test_a_class_table_in_80_columns_wraps_a_long_mode_name_not_the_numbers():
    """With the README's own mode names the numbers were cut to "3.…" at 80 columns."""
    from rich.console import Console

    modes = ["target", "tree:9:greedy:nogram", "chain:4:nogram", "tree:5:llmcad", "auto"]
    rows = [ClassSummary(m, "code", 23.4, 1.23, 0.98, 0.91, 3.36, 0.35, 2.5, 1.34, 3, 3, None)
            for m in modes]  # fmt: skip
    console = Console(width=80, record=True)
    console.print(class_table(rows, "code"))
    shown = console.export_text()
    assert "…" not in shown and shown.count("3.36") == len(modes)
    assert all(len(line) <= 80 for line in shown.splitlines())


@pytest.mark.parametrize("width", [40, 50, 80, 100])
def test_a_class_table_on_a_phone_s_terminal_keeps_what_says_whether_a_mode_pays(width):
    """At 50 columns all ten columns left the mode names out and cut every number ("0.…")."""
    from rich.console import Console

    modes = [BASELINE, "chain", "tree", "ngram", "auto", "llama", "llama-lookup"]
    rows = [ClassSummary(m, "code", 23.4, 1.23, 0.98, 0.91, 3.36, 0.35, 2.5, 1.34, 3, 4, None)
            for m in modes]  # fmt: skip
    console = Console(width=width, record=True)
    console.print(class_table(rows, "code", width))
    shown = console.export_text()
    assert "…" not in shown and all(len(line) <= width for line in shown.splitlines())
    cells = [line.split() for line in shown.splitlines()]
    assert [row[0] for row in cells if row and row[0] in modes] == modes
    for row in (row for row in cells if row and row[0] in modes):
        assert {"1.23", "0.98", "3/4"} <= set(row)  # × plain, its lowest prompt, same text
    left_out = "left out at this width (--json has all)" in " ".join(shown.split())
    assert left_out == (width < 100) and (width < 80) == ("3.36" not in shown)
    assert (width < 100) == ("2.5" not in shown)  # in a log's 80 columns, draft steps a pass


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_ratio_chart_fits_its_width_with_every_interval_whole(width):
    """At 80 columns (a log) the bars took the room of the intervals: "0.83–0.…"."""
    from rich.console import Console

    def summary(mode: str, class_name: str, ratio: float) -> ClassSummary:
        interval = NoiseInterval(ratio, ratio - 0.05, ratio + 0.07, 12)
        return ClassSummary(mode, class_name, 23.4, ratio, ratio, 0.9, 2.0, 0.5, 2.5, 1.0, 3, 3,
                            None if mode == BASELINE else interval)  # fmt: skip

    modes = [BASELINE, "chain", "tree", "ngram", "auto", "llama", "llama-lookup"]
    classes = [
        summary(m, c, 0.8 + 0.1 * i) for c in ("code", "summary") for i, m in enumerate(modes)
    ]
    report = BenchReport({}, None, [], [], classes)  # type: ignore[arg-type]
    console = Console(width=width, record=True)
    console.print(ratio_chart(report, width))
    shown = console.export_text()
    assert all(len(line) <= width for line in shown.splitlines())
    for s in classes[1 : len(modes)]:
        assert f"{s.interval.low:.2f}–{s.interval.high:.2f}" in shown
        assert f"{s.median_ratio:.2f}×" in shown
    bars = [line for line in shown.splitlines() if "│" in line and "█" in line]
    assert len(bars) == len(classes)
    assert max(line.count("█") for line in bars) >= 10


def test_a_ratio_bar_marks_one_x_and_grows_with_the_ratio():
    assert ratio_bar(1.0, 2.0, width=10) == "█████│    "
    assert ratio_bar(0.5, 2.0, width=10) == "██   │    "
    assert ratio_bar(2.0, 2.0, width=10) == "█████│████"


def test_a_ratio_pairs_each_repeat_with_plain_decoding_in_the_same_repeat():
    # The machine sped up from one repeat to the next (plain decoding 10, 20, 30 tok/s): the
    # repeats' pairs say 1.1, 0.9 and 1.2, and the ratio is their median, where the two medians
    # (18 against 20 tok/s) would say 0.9, comparing runs of different repeats.
    ratios = paired_ratios([11.0, 18.0, 36.0], [10.0, 20.0, 30.0])
    assert ratios == pytest.approx([1.1, 0.9, 1.2]) and statistics.median(ratios) == 1.1
    # A repeat in which plain decoding made nothing is left out; with none left, no ratio.
    assert paired_ratios([12.0, 5.0], [10.0, 0.0]) == pytest.approx([1.2])
    assert paired_ratios([12.0], [0.0]) == []


def test_the_noise_interval_holds_the_true_ratio_in_95_of_100_runs():
    # Four prompts on which a mode is truly 1.0, 1.1, 0.95 and 1.2x plain decoding; each paired
    # run is off by timing noise (log-normal, the scatter measured here), three repeats each
    # and one prompt with a repeat lost. The interval must hold the true geometric mean in
    # about 95 % of such runs: narrower and it claims more than the run shows.
    rng = np.random.default_rng(7)
    true_logs = np.log([1.0, 1.1, 0.95, 1.2])
    truth = float(np.exp(true_logs.mean()))
    repeats = [3, 3, 3, 2]
    held, widths = 0, []
    for _ in range(4000):
        noise = [rng.normal(0, 0.08, n) for n in repeats]
        ratios = [np.exp(m + e) for m, e in zip(true_logs, noise, strict=True)]
        interval = noise_interval(ratios)
        assert interval is not None and interval.low < interval.mean < interval.high
        assert interval.runs == 11
        held += interval.low <= truth <= interval.high
        widths.append(interval.high / interval.low)
    assert 0.93 <= held / 4000 <= 0.97
    # Less noise, a narrower interval.
    quiet = [np.exp(m + rng.normal(0, 0.02, 3)) for m in true_logs]
    quiet_interval = noise_interval(quiet)
    assert quiet_interval is not None
    assert quiet_interval.high / quiet_interval.low < np.median(widths)


def test_the_noise_interval_needs_a_prompt_run_twice_and_is_a_point_without_noise():
    assert noise_interval([[1.1], [0.9]]) is None  # one repeat each: no noise to measure
    assert noise_interval([]) is None
    exact = noise_interval([[1.21, 1.21], [1.0, 1.0]])  # every repeat alike
    assert exact is not None and exact.runs == 4
    assert exact.low == pytest.approx(1.1) and exact.high == pytest.approx(1.1)
    assert exact.mean == pytest.approx(1.1)  # the geometric mean of the prompts, not 1.105
    # A (sampled) run that made nothing has no speed to average: it is left out.
    assert noise_interval([[1.21, 1.21, 0.0], [1.0, 1.0]]) == exact


def test_the_run_says_how_much_plain_decodings_own_repeats_differed(report):
    plain = [row for row in report.rows if row.mode == BASELINE]
    steady = replace(plain[0], prompt="steady", runs_tokens_per_s=[36.0, 36.0], tokens_per_s=36.0)
    noisy = replace(plain[0], prompt="noisy", runs_tokens_per_s=[40.0, 34.0], tokens_per_s=37.5)
    calm = replace(plain[0], prompt="calm", runs_tokens_per_s=[36.0, 37.5], tokens_per_s=36.75)
    others = [replace(r, runs_tokens_per_s=[10.0, 50.0]) for r in report.rows if r.mode != BASELINE]
    spread = plain_spread([steady, noisy, calm, *others])  # other modes' repeats do not count
    assert spread is not None and spread.prompt == "noisy"
    assert spread.largest == pytest.approx(6 / 37.5)
    assert spread.median == pytest.approx(1.5 / 36.75)
    # One repeat has nothing to compare: the report says nothing rather than 0 %.
    assert report.settings.repeats == 1 and report.plain_spread is None
    assert report.to_dict()["plain_spread"] is None and spread_line(report) is None


def test_the_command_prints_a_table_per_class_and_a_chart_and_writes_json(
    smol_path, tiny_suite, tmp_path
):
    out = tmp_path / "bench.json"
    args = ["-m", str(smol_path), "--prompts", str(tiny_suite), "--modes", "target,llama"]
    args += ["--repeats", "2", "-t", "1", "-n", "8", "-c", "1024", "--json", str(out)]
    result = invoke_bench(args)
    assert result.exit_code == 0, result.output
    for expected in ("code (1 prompt,", "chat (1 prompt,", "× plain", "llama", "│"):
        assert expected in result.stdout
    assert "plain decoding's own repeats differed by" in result.stdout
    assert "greedy" in result.stdout
    data = json.loads(out.read_text())
    assert data["settings"]["greedy"] is True and data["settings"]["temperature"] == 0
    assert {row["mode"] for row in data["rows"]} == {"target", "llama"}
    assert all(row["n_generated"] <= 8 for row in data["rows"])
    spread = data["plain_spread"]
    assert 0 <= spread["median"] <= spread["largest"] and spread["prompt"] in ("add", "sky")
    # Two repeats: each ratio rests on its paired runs, and the run says how sure it is of them.
    for row in data["rows"]:
        assert len(row["ratios"]) == 2 and row["ratio"] == pytest.approx(
            statistics.median(row["ratios"])
        )
    llama = data["overall"]["llama"]
    assert llama["runs"] == 4 and llama["low"] <= llama["mean"] <= llama["high"]
    assert all(c["interval"]["runs"] == 2 for c in data["classes"])
    assert "over all prompts, the geometric mean" in result.stdout
    assert f"llama: {llama['mean']:.2f}× ({llama['low']:.2f}–{llama['high']:.2f}" in result.stdout


def test_a_class_named_like_markup_is_printed_as_written(smol_path, tmp_path):
    """A class "[/x]" stopped rich with a MarkupError after the whole run; "[bold]c" lost its
    brackets."""
    prompts = tmp_path / "odd.toml"
    prompts.write_text(
        '[[prompts]]\nname = "a"\nclass = "[/x] [bold]c"\ntext = "Hi"\nmax_tokens = 2\n'
    )
    args = ["-m", str(smol_path), "--prompts", str(prompts), "--modes", "target", "--repeats", "1"]
    result = invoke_bench([*args, "-t", "1", "-n", "2", "-c", "512"])
    assert result.exit_code == 0, result.output
    assert "[/x] [bold]c (1 prompt, medians)" in result.stdout


def test_the_json_report_is_written_before_the_tables_are_printed(
    smol_path, tiny_suite, tmp_path, monkeypatch
):
    """A run can take an hour: a failure while printing its tables must not take its report."""

    def failing_table(*args):
        raise RuntimeError("the terminal went away")

    monkeypatch.setattr("edgespec.cli.bench_cmd.class_table", failing_table)
    out = tmp_path / "bench.json"
    args = ["-m", str(smol_path), "--prompts", str(tiny_suite), "--modes", "target"]
    args += ["--repeats", "1", "-t", "1", "-n", "2", "-c", "512", "--json", str(out)]
    result = invoke_bench(args)
    assert isinstance(result.exception, RuntimeError)
    assert {row["mode"] for row in json.loads(out.read_text())["rows"]} == {"target"}


def test_a_sampling_bench_draws_repeat_r_with_seed_r_in_every_mode_and_compares_no_texts(
    smol_path, tiny_suite, plain_engine
):
    report = run_bench(
        smol_path, None, ["target", "llama"], load_prompts(tiny_suite), repeats=1, n_ctx=1024,
        temperature=0.8,
    )  # fmt: skip
    assert not report.settings.greedy and report.settings.temperature == 0.8
    for row in report.rows:  # sampled texts differ by their draws: no verdict on them
        assert row.same_as_target is None and row.divergence is None and row.tokens_per_s > 0
    assert all(summary.n_same is None for summary in report.classes)
    prompt = plain_engine.prompt_tokens(load_prompts(tiny_suite)[1].text)
    greedy = plain_engine.generate(prompt, max_tokens=16, mode="target").tokens
    drawn = plain_engine.generate(prompt, max_tokens=16, mode="target", temperature=0.8, seed=0)
    assert report.row("target", "sky").tokens == drawn.tokens != greedy
    assert report.row("llama", "sky").tokens != greedy  # llama-cpp-python samples too
    with pytest.raises(BadSettingError, match="--temp"):
        run_bench(smol_path, None, ["target"], load_prompts(tiny_suite), temperature=-0.5)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="big and little need two CPUs")
def test_on_big_and_little_cores_the_bench_gives_each_model_the_threads_run_gives_it(
    smol_path, smol_q4_0, tiny_suite, monkeypatch
):
    """It gave the target a thread for every CPU, where `run` gives it one per big core."""
    from edgespec.cores import CoreLayout

    big, little = sorted(os.sched_getaffinity(0))[:1], sorted(os.sched_getaffinity(0))[1:]
    layout = CoreLayout(big, little, uniform=False, source="cpu_capacity")
    monkeypatch.setattr("edgespec.cores.detect_cores", lambda **_: layout)
    prompts = load_prompts(tiny_suite)[:1]
    report = run_bench(smol_path, smol_q4_0, ["target"], prompts, repeats=1, n_ctx=512)
    assert report.settings.threads == len(big)
    with pytest.raises(BadSettingError, match="--threads must be at least 1"):
        run_bench(smol_path, smol_q4_0, ["target"], prompts, repeats=1, threads=0)


def test_the_command_says_when_it_sampled_and_gives_no_text_verdict(smol_path, tiny_suite):
    args = ["-m", str(smol_path), "--prompts", str(tiny_suite), "--modes", "target,llama"]
    result = invoke_bench([*args, "--repeats", "1", "-n", "4", "--temp", "0.7"])
    assert result.exit_code == 0, result.output
    assert "sampling at temperature 0.7" in result.stdout and "greedy" not in result.stdout
    assert "/1" not in result.stdout  # the "same plain" column: no 1/1 or 0/1, a dash


def test_a_text_differing_from_plain_is_explained_and_only_at_a_near_tie(report):
    for row in report.rows:
        assert (row.divergence is None) == row.same_as_target, row.prompt
        assert row.divergence is None or row.divergence.near_tie, (row.mode, row.divergence)


def test_first_divergence_finds_where_two_outputs_part_and_the_targets_gap_there(plain_engine):
    prompt = plain_engine.prompt_tokens("Write a haiku about the sea.")
    plain = plain_engine.generate(prompt, max_tokens=12, mode="target").tokens
    assert len(plain) == 12
    assert first_divergence(plain_engine, prompt, plain, list(plain)) is None
    at = 5
    logits = fresh_logits(plain_engine, [*prompt, *plain[:at]])
    second, unlikely = int(np.argsort(logits)[-2]), int(logits.argmin())
    close = first_divergence(plain_engine, prompt, plain, [*plain[:at], second, 7])
    assert close is not None and (close.position, close.mode_token) == (at, second)
    assert close.gap == pytest.approx(float(logits[plain[at]] - logits[second]), abs=1e-4)
    far = first_divergence(plain_engine, prompt, plain, [*plain[:at], unlikely])
    assert far is not None and far.gap > 5 and not far.near_tie
    ended = first_divergence(plain_engine, prompt, plain, plain[:at])  # stopped early
    assert ended is not None and ended.mode_token == plain_engine.target.eos


def test_the_command_says_which_texts_differ_and_whether_at_a_near_tie(report):
    row = report.rows[0]
    near = replace(row, mode="auto", divergence=Divergence(3, 10, 11, 0.2))
    far = replace(row, mode="chain", divergence=Divergence(4, 10, 12, 2.5))
    lines = divergence_lines(replace(report, rows=[row, near, far]))
    assert len(lines) == 2
    assert lines[0].startswith(f"auto on {row.prompt}: differs from plain at token 3")
    assert "0.20 apart: a near tie" in lines[0]
    assert "2.50 apart: NOT a near tie" in lines[1]


def test_the_command_names_the_runs_during_which_threads_changed(report):
    # Both models ran on the bench's one thread, so no governor had a count to change to.
    assert all(r.thread_switches == 0 for r in report.rows)
    assert thread_lines(report) == []
    busy = replace(report.rows[0], mode="auto", thread_switches=2)
    (line,) = thread_lines(replace(report, rows=[report.rows[1], busy]))
    assert f"auto on {busy.prompt} (2x)" in line and "other programs took cores" in line


def test_a_measurement_carries_the_governors_thread_switches(smol_path):
    import edgespec

    from .test_governor import KeepsEveryTrial

    engine = edgespec.load(smol_path, n_ctx=512, threads=2)
    engine.target_ctx.govern(KeepsEveryTrial(2), relative_cost=lambda k: 1.0)
    measured = engine_runner(engine, "target")(engine.prompt_tokens("Count to twenty:"), 30, 0)
    assert measured.thread_switches >= 2


@pytest.mark.parametrize(
    ("cpuinfo", "simd"),
    [
        ("model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw\n", "AVX-512"),
        ("model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n", "AVX2"),
        (
            "model name\t: Intel(R) Xeon(R)\nflags\t\t: avx2 avx512f amx_bf16 amx_tile amx_int8\n",
            "AVX-512 AMX",
        ),
        (
            "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 asimddp\nModel\t: Raspberry Pi 5\n",
            "DOTPROD NEON",
        ),
        ("processor\t: 0\nFeatures\t: fp asimd asimddp sve i8mm bf16\n", "SVE I8MM DOTPROD NEON"),
        ("processor\t: 0\n", "unknown"),
    ],
    ids=["x86-avx512", "x86-avx2", "xeon-amx", "raspberry-pi-5", "phone-armv9", "nothing"],
)
def test_the_bench_names_the_vector_extensions_that_set_batch_costs(tmp_path, cpuinfo, simd):
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert cpu_simd(path) == simd


def test_a_machine_without_cpuinfo_has_unknown_extensions(tmp_path):
    assert cpu_simd(tmp_path / "missing") == "unknown"


def _x86(vendor: str, family: int, model: int) -> str:
    return f"vendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\nflags\t: avx2\n"


@pytest.mark.parametrize(
    ("cpuinfo", "generation"),
    [
        (_x86("AuthenticAMD", 25, 17), "Zen 4"),  # EPYC 9004 (Genoa)
        (_x86("AuthenticAMD", 25, 0x1F), "Zen 4"),  # the last of Linux's 0x10-0x1f range
        (_x86("AuthenticAMD", 26, 2), "Zen 5"),  # EPYC 9005 (Turin)
        (_x86("AuthenticAMD", 25, 1), "Zen 3"),  # EPYC 7003 (Milan)
        (_x86("AuthenticAMD", 23, 49), "Zen 2"),  # EPYC 7002 (Rome)
        (_x86("GenuineIntel", 6, 143), "Sapphire Rapids"),
        (_x86("GenuineIntel", 6, 207), "Emerald Rapids"),  # this machine since 2026-11-30
        (_x86("GenuineIntel", 6, 60), "family 6 model 60"),  # a desktop Haswell: no name here
        ("processor\t: 0\nCPU part\t: 0xd0b\nFeatures\t: fp asimd\n", ""),  # ARM
    ],
    ids=[
        "zen4",
        "zen4-last",
        "zen5",
        "zen3",
        "zen2",
        "sapphire-rapids",
        "emerald-rapids",
        "unnamed-intel",
        "arm",
    ],
)
def test_the_bench_names_the_x86_generation_the_model_name_hides(tmp_path, cpuinfo, generation):
    """One "AMD EPYC" was a Zen 5 one day and a Zen 4 the next, whose batches cost 1.6x more."""
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert cpu_generation(path) == generation


def test_the_header_names_the_generation_and_extensions(smol_path, tiny_suite, monkeypatch):
    monkeypatch.setattr("edgespec.bench.cpu_generation", lambda: "Zen 4")
    monkeypatch.setattr("edgespec.bench.cpu_simd", lambda: "AVX-512")
    args = ["-m", str(smol_path), "--prompts", str(tiny_suite), "--modes", "target"]
    result = invoke_bench([*args, "--repeats", "1", "-n", "2"])
    assert result.exit_code == 0, result.output
    assert "(Zen 4, AVX-512)" in result.stdout


def profiled_to_attend_without_flash_attention(
    model: Path, threads: int, home: Path, monkeypatch
) -> None:
    """A home whose profile of `model` found attention without flash attention faster, for the
    engines loaded after it."""
    from edgespec.cores import format_cpu_list, plan_placement
    from edgespec.profile import DeviceProfile, save_profile

    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    ks = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32]
    save_profile(
        DeviceProfile(
            model_file=model.name,
            model_size=model.stat().st_size,
            n_threads=threads,
            cpus=format_cpu_list(plan_placement().target_cpus),
            ks=ks,
            seconds=[0.01 * k for k in ks],
            measured_at="2026-01-01T00:00:00+00:00",
            flash_attn=False,
        )
    )


def test_the_gap_at_a_divergence_is_read_attending_as_the_engines_target(
    smol_path, tmp_path, monkeypatch
):
    """Flash attention's logits differ from the other kernel's (by up to 0.7 on SmolLM2): a
    target attending without it has its gap read without it too."""
    import edgespec

    profiled_to_attend_without_flash_attention(smol_path, 2, tmp_path, monkeypatch)
    engine = edgespec.load(smol_path, n_ctx=512, threads=2)
    assert engine.target_ctx.flash_attn is False
    prompt = engine.prompt_tokens("Write a haiku about the sea.")
    plain = engine.generate(prompt, max_tokens=8, mode="target").tokens
    at = 4
    ctx = Context(engine.target, n_ctx=512, n_threads=2, flash_attn=False)
    logits = ctx.decode([*prompt, *plain[:at]], 0)[-1].copy()
    ctx.close()
    # The best other token than plain decoding's: read in one batch, the row may rank them the
    # other way round where they are nearly tied (AMX's batch numerics here).
    logits_but_plain = logits.copy()
    logits_but_plain[plain[at]] = -np.inf
    second = int(np.argmax(logits_but_plain))
    parted = first_divergence(engine, prompt, plain, [*plain[:at], second])
    assert parted is not None and parted.position == at
    assert parted.gap == pytest.approx(float(logits[plain[at]] - logits[second]), abs=1e-4)


def test_llama_attends_as_the_engines_target_and_the_header_says_how(
    smol_path, tiny_suite, tmp_path, monkeypatch
):
    """A fair baseline: where the target's profile found attention without flash attention
    faster, Llama attends so too."""
    from edgespec import bench as bench_module

    profiled_to_attend_without_flash_attention(smol_path, 1, tmp_path, monkeypatch)
    told: list[bool] = []

    class Runner(bench_module.LlamaRunner):
        def __init__(self, *args, **kwargs):
            told.append(kwargs["flash_attn"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(bench_module, "LlamaRunner", Runner)
    args = ["-m", str(smol_path), "--prompts", str(tiny_suite), "--modes", "target,llama"]
    result = invoke_bench([*args, "--repeats", "1", "-n", "2", "-t", "1"])
    assert result.exit_code == 0, result.output
    assert told == [False] and "without flash attention" in result.stdout


def test_every_engine_run_starts_with_a_draft_that_has_not_seen_the_prompt(q4_draft_engine):
    """As `edgespec run` starts: a chain run of the same prompt just before would have left the
    draft holding it, and auto, which catches the draft up while decoding, would pay less for
    its first try than a new process does."""
    engine = q4_draft_engine
    prompt = engine.prompt_tokens("Count from one to twenty: one, two, three,")
    draft_knew = []
    generate = engine.generate

    def recording(*args, **kwargs):
        draft_knew.append(len(engine._draft_cache))
        return generate(*args, **kwargs)

    engine.generate = recording  # type: ignore[method-assign]
    try:
        for mode in ("chain", "auto", "tree", "auto"):
            engine_runner(engine, mode)(prompt, 8, 0)
    finally:
        del engine.generate
    assert draft_knew == [0, 0, 0, 0]


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_the_drafts_evaluation_of_the_prompt_is_timed_with_the_decoding(q4_draft_engine, mode):
    """Evaluating the prompt a second time, with the draft, is what speculating costs: a chain
    that did it in the untimed prefill looked faster than it was against plain decoding."""
    engine = q4_draft_engine
    prompt = engine.prompt_tokens("Write a Python function that reverses a string.")
    engine.forget_draft_cache()
    draft_calls = []
    decode = engine.draft_ctx.decode

    def recording(tokens, *args, **kwargs):
        draft_calls.append((time.perf_counter(), len(tokens)))
        return decode(tokens, *args, **kwargs)

    engine.draft_ctx.decode = recording  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        result = engine.generate(prompt, max_tokens=24, mode=mode)
    finally:
        del engine.draft_ctx.decode
    prefill_ended = started + result.stats.prefill_s
    assert any(n >= len(prompt) - 1 for _, n in draft_calls), "the draft drafted on the prompt"
    assert all(at >= prefill_ended for at, _ in draft_calls)
