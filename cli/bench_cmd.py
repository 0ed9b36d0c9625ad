"""`edgespec bench`: every decoding mode against plain decoding, on a suite of prompts."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from edgespec.bench import (
    BASELINE,
    NEAR_TIE,
    BenchReport,
    ClassSummary,
    NoiseInterval,
    Progress,
)

from . import options as opt

LEGEND = (
    "× plain: speed over plain decoding in the same repeat of this run (the median over repeats);"
    " accept %: proposed tokens accepted; mean acc.:"
    " accepted per verification; pass/tok: target passes per token; draft/pass: draft model"
    " evaluations per target pass; py ms/pass: edgespec's own time per target pass (outside"
    " llama.cpp); same plain: prompts whose text equals plain decoding (any other is"
    " listed below, with whether it parted at a near tie; – when sampling)."
)
BAR_WIDTH = 40  # cells of the bar at the chart's largest ratio (2.0× at least)
MIN_BAR_WIDTH = 10  # ... where the terminal is narrower: rich wraps what is left
MODE_WIDTH = 12  # the class tables' mode column, at most: longer names wrap
# The class tables' columns left out first where a terminal is too narrow for all (a phone's,
# and a log's 80 columns the first): the speed over plain decoding, its lowest prompt and whether
# the text was plain decoding's are what say whether a mode pays; the rest says why.
NARROW_DROPS = (
    "draft\n/pass",
    "py ms\n/pass",
    "pass\n/tok",
    "mean\nacc.",
    "accept\n%",
    "tok/s",
    "in-run\n×",
)


def bench(
    target: opt.Target = None,
    draft: opt.Draft = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            help="TOML file of [[prompts]] entries: name, class, text, max_tokens "
            "[default: the suite shipped with edgespec]",
            parser=opt.path,
        ),
    ] = None,
    modes: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated modes of target, chain, tree, ngram, auto, llama (plain, "
            "llama-cpp-python's Llama) and llama-lookup (its LlamaPromptLookupDecoding); a size "
            "compares settings: chain:8 drafts 8, tree:16 grows 16 nodes [default: all that can "
            "run]"
        ),
    ] = None,
    classes: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated prompt classes; the shipped suite's are code, edit, chat and "
            "summary [default: all]"
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Runs of every mode on every prompt")] = 3,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            "-t",
            help="Threads of each model [default: one per CPU of each, as run places them]",
        ),
    ] = None,
    ctx_size: Annotated[
        int | None,
        typer.Option(
            "--ctx-size",
            "-c",
            help="Context size in tokens [default: 4096, or less for a model trained for less]",
        ),
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option("--max-tokens", "-n", help="Tokens per prompt [default: each prompt's own]"),
    ] = None,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json", help="Also write the full report to this JSON file", parser=opt.path
        ),
    ] = None,
    temp: Annotated[
        float,
        typer.Option(
            "--temp",
            help="Sample at this temperature in every mode (repeat r with seed r); 0 is greedy",
        ),
    ] = 0.0,
) -> None:
    """Measure decode speed of every mode against plain decoding, in one interleaved run.

    On a CPU speculation can be slower than plain decoding: only a ratio measured in the same
    run says whether it pays, and with two repeats or more the run says how sure it is of each
    (a 95 % interval for its timing noise). Modes are edgespec's and, as baselines,
    llama-cpp-python's plain decoding ("llama") and its prompt-lookup speculation
    ("llama-lookup").
    """
    # Imported here: app.py imports this module to register the command.
    from edgespec.bench import available_modes, checked_modes, load_prompts, run_bench
    from edgespec.engine import check_ctx_size, check_threads
    from edgespec.errors import BadSettingError, EdgespecError
    from edgespec.files import written_into_place
    from edgespec.sampling import SamplingParams

    from .app import (
        DEFAULT_TARGET,
        check_destination,
        check_named_models,
        resolve,
        resolve_draft,
        resolve_model,
    )

    # Bad values fail before anything is said, fetched or loaded.
    SamplingParams(temperature=temp)
    check_threads(threads, None)
    if ctx_size is not None:
        check_ctx_size(ctx_size, None, Path())  # the model's own bound: when it loads
    if repeats < 1:
        raise BadSettingError(f"--repeats must be at least 1 (got {repeats})")
    if json_out is not None:  # so does a file that cannot be written: not after an hour's run
        json_out = check_destination(json_out, prompts)
    for flag, value in (("--modes", modes), ("--classes", classes)):
        if value is not None and not _split(value):  # '' ran everything
            raise BadSettingError(f"{flag} names nothing (got {value!r}); leave it out for all")
    if modes:  # so does an unknown mode (whether a draft is needed is known once it resolved)
        checked_modes(_split(modes), has_draft=True)
    selected = load_prompts(prompts, _split(classes) if classes else None)
    if max_tokens is not None:
        if max_tokens < 1:
            raise BadSettingError(f"--max-tokens must be at least 1 (got {max_tokens})")
        selected = [replace(p, max_tokens=max_tokens) for p in selected]
    # The models `run` would take: flags, else EDGESPEC_TARGET / EDGESPEC_DRAFT or config.toml.
    settings = resolve(dict(target=target, draft=draft))
    check_named_models(settings)
    target_path = resolve_model(settings.target, DEFAULT_TARGET)
    draft_path = resolve_draft(replace(settings, draft_threads=threads))
    assert target_path is not None
    if json_out is not None:  # not over a model it measures, either
        json_out = check_destination(json_out, target_path, draft_path)
    # Now that it is known whether there is a draft, before a word is said; each mode once.
    has_draft = draft_path is not None
    mode_list = checked_modes(_split(modes), has_draft) if modes else available_modes(has_draft)

    status = Console(stderr=True, highlight=False)
    status.print(
        f"benchmarking {', '.join(mode_list)} on {_plural(len(selected), 'prompt')}, "
        f"{_plural(repeats, 'repeat')}",
        style="dim",
        markup=False,
        soft_wrap=True,
    )
    progress = _progress_line(status)
    try:
        report = run_bench(
            target_path,
            draft_path,
            mode_list,
            selected,
            repeats=repeats,
            threads=threads,
            n_ctx=ctx_size,
            progress=progress,
            temperature=temp,
            say=lambda line: status.print(line, style="dim", markup=False, soft_wrap=True),
        )
    except KeyboardInterrupt:
        if progress is not None:  # "interrupted" goes on a line of its own, not after it
            sys.stderr.write("\r\x1b[K")
        raise

    # The report is written first: were printing the tables to fail, the run's results stay.
    unwritten = None
    if json_out is not None:
        try:
            with written_into_place(json_out) as tmp:
                tmp.write_text(json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n")
        except OSError as e:  # a full disk: the tables below are the run's results
            unwritten = EdgespecError(f"cannot write {json_out}: {e.strerror or e}")
    console = Console(highlight=False)
    console.print(_header(report), markup=False, soft_wrap=True)
    for class_name in report.class_names:
        console.print(class_table(report.summaries(class_name), class_name, console.width))
    console.print(LEGEND, style="dim", markup=False)
    if line := spread_line(report):
        console.print(line, markup=False, soft_wrap=True)
    for line in divergence_lines(report) + thread_lines(report):
        console.print(line, markup=False, soft_wrap=True)
    console.print(ratio_chart(report, console.width))
    for line in overall_lines(report):
        console.print(line, markup=False, soft_wrap=True)
    if unwritten is not None:
        raise unwritten
    if json_out is not None:
        status.print(f"wrote {json_out}", style="dim", markup=False)


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _progress_line(status: Console) -> Progress | None:
    """One line on stderr, rewritten in place between runs (never animated: a refresh thread
    would take CPU from the runs being timed). Off when stderr is not a terminal."""
    if not status.is_terminal:
        return None

    def show(done: int, total: int, label: str) -> None:
        sys.stderr.write(f"\r\x1b[K[{done}/{total}] {label}")
        if done == total:
            sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()

    return show


def _header(report: BenchReport) -> str:
    settings = report.settings
    draft = settings.draft.file if settings.draft else "none"
    decoding = "greedy" if settings.greedy else f"sampling at temperature {settings.temperature:g}"
    attention = "without flash attention" if settings.flash_attn is False else "flash attention"
    return (
        f"target {settings.target.file}, draft {draft}, {settings.threads} threads, "
        f"{_plural(settings.repeats, 'repeat')}, {decoding}, {attention}\n"
        f"{report.machine['cpu']} ({_cpu_traits(report.machine)}), {settings.date}"
    )


def _cpu_traits(machine: dict[str, object]) -> str:
    """ "Zen 4, AVX-512": what sets batch costs, as far as the report knows it."""
    traits = [machine.get("generation"), machine.get("simd", "unknown")]
    return ", ".join(str(t) for t in traits if t)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def class_table(summaries: list[ClassSummary], class_name: str, width: int = 80) -> Table:
    """A class's modes, a row each, in `width` columns: where they do not all fit (a phone's
    terminal) the columns least needed to judge a mode are left out, and the caption says so."""
    cells = {  # header (two short lines: all but one of the eleven fit in 80) -> its cells
        "tok/s": [f"{s.tokens_per_s:.1f}" for s in summaries],
        "×\nplain": [_fmt(s.median_ratio, ".2f") for s in summaries],
        "min\n×": [_fmt(s.min_ratio, ".2f") for s in summaries],
        "in-run\n×": [_fmt(s.in_run_ratio, ".2f") for s in summaries],
        "accept\n%": [
            _fmt(None if s.acceptance is None else s.acceptance * 100, ".0f") for s in summaries
        ],
        "mean\nacc.": [_fmt(s.mean_accepted, ".2f") for s in summaries],
        "pass\n/tok": [_fmt(s.passes_per_token, ".2f") for s in summaries],
        "draft\n/pass": [_fmt(s.draft_evals_per_pass, ".1f") for s in summaries],
        "py ms\n/pass": [_fmt(s.overhead_ms, ".2f") for s in summaries],
        "same\nplain": [
            "–" if s.n_same is None else f"{s.n_same}/{s.n_prompts}" for s in summaries
        ],
    }

    def room(header: str) -> int:  # a column's width and the two spaces before it
        return 2 + max(len(text) for text in [*header.split("\n"), *cells[header]])

    mode_width = 2 + min(MODE_WIDTH, max((len(s.mode) for s in summaries), default=0))
    shown = list(cells)
    for header in NARROW_DROPS:
        if mode_width + sum(room(h) for h in shown) <= width:
            break
        shown.remove(header)
    n_prompts = summaries[0].n_prompts if summaries else 0
    left_out = len(cells) - len(shown)
    caption = f"{_plural(left_out, 'column')} left out at this width (--json has all)"
    table = Table(
        # Text, not markup: a class is the prompt file's to name ("[/x]" stopped rich).
        title=Text(f"{class_name} ({_plural(n_prompts, 'prompt')}, medians)"),
        title_justify="left",
        caption=caption if left_out else None,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,  # fits 80 columns
    )
    table.add_column("mode", overflow="fold")  # a long mode wraps, the numbers keep their width
    for header in shown:
        table.add_column(header, justify="right", no_wrap=True)
    ratio_at = shown.index("×\nplain")  # never left out
    for i, s in enumerate(summaries):
        row: list[str | Text] = [cells[h][i] for h in shown]
        row[ratio_at] = Text(row[ratio_at], style="green" if (s.median_ratio or 0) > 1 else "")
        table.add_row(s.mode, *row)
    return table


def spread_line(report: BenchReport) -> str | None:
    """How noisy this run was, from plain decoding's own repeats; None with one repeat."""
    spread = report.plain_spread
    if spread is None:
        return None
    return (
        f"plain decoding's own repeats differed by {spread.median:.0%} (median over prompts), "
        f"up to {spread.largest:.0%} ({spread.prompt}): ratios closer than that may differ by "
        "this run's noise"
    )


def divergence_lines(report: BenchReport) -> list[str]:
    """One line per mode and prompt whose text differs from plain decoding: where, and whether
    the target's two choices there were a near tie (allowed) or not (a bug)."""
    lines = []
    for row in report.rows:
        d = row.divergence
        if d is None:
            continue
        verdict = (
            "a near tie, where llama.cpp's batch numerics may choose either"
            if d.near_tie
            else f"NOT a near tie (those are below {NEAR_TIE}): a lost token, please report it"
        )
        lines.append(
            f"{row.mode} on {row.prompt}: differs from plain at token {d.position} "
            f"(plain {d.plain_token}, {row.mode} {d.mode_token}); the target's logits for the "
            f"two are {abs(d.gap):.2f} apart: {verdict}"
        )
    return lines


def thread_lines(report: BenchReport) -> list[str]:
    """A line naming the runs during which a governor changed threads: other programs took
    cores then, and those ratios measure the load as much as the mode."""
    changed = [
        f"{r.mode} on {r.prompt} ({r.thread_switches}x)" for r in report.rows if r.thread_switches
    ]
    if not changed:
        return []
    return [
        "threads changed as other programs took cores, during: "
        + ", ".join(changed)
        + "; those ratios measure the load as much as the mode"
    ]


def ratio_bar(ratio: float, scale_max: float, width: int = BAR_WIDTH) -> str:
    """`width` cells filled in proportion to ratio / scale_max, with a '│' at 1.0× drawn over
    them: the bar crosses it when the mode beats plain decoding."""
    filled = round(min(ratio, scale_max) / scale_max * width)
    marker = round(1.0 / scale_max * width)
    cells = ["█" if i < filled else " " for i in range(max(width, marker + 1))]
    cells[min(marker, len(cells) - 1)] = "│"
    return "".join(cells)


def ratio_chart(report: BenchReport, width: int = 80) -> Table:
    """Median speed over plain decoding per mode and class, as bars against a 1.0× line, and
    how sure the run is of each (`NoiseInterval`; none with one repeat), in `width` columns."""
    ratios = [s.median_ratio for s in report.classes if s.median_ratio is not None]
    # At least 0..2×, so that 1.0× sits mid-bar and small differences stay visible.
    scale_max = max(2.0, *ratios) if ratios else 2.0
    # The bars take what the other columns leave (two spaces between columns): at 80 columns,
    # a log's width, full bars cut the intervals to "0.83–0.…".
    others = [
        max(map(len, report.class_names), default=0),
        max((len(s.mode) for s in report.classes), default=0),
        len(f"{scale_max:.2f}×"),
        max((len(_interval(s.interval)) for s in report.classes), default=0),
    ]
    bar_width = max(MIN_BAR_WIDTH, min(BAR_WIDTH, width - sum(others) - 2 * len(others)))
    chart = Table(
        title=(
            f"speed over plain decoding (│ = 1.0×, bar end = {scale_max:.2f}×): class medians, "
            "then the 95 % interval of the class's geometric mean for this run's timing noise"
        ),
        title_justify="left",
        box=None,
        show_header=False,
        pad_edge=False,
    )
    chart.add_column("class", no_wrap=True)
    chart.add_column("mode", no_wrap=True)
    chart.add_column("bar", no_wrap=True)
    chart.add_column("ratio", justify="right", no_wrap=True)
    chart.add_column("interval", no_wrap=True)
    for class_name in report.class_names:
        for i, s in enumerate(report.summaries(class_name)):
            if s.median_ratio is None:
                bar, label, style = "", "–", ""
            else:
                bar = ratio_bar(s.median_ratio, scale_max, bar_width)
                label = f"{s.median_ratio:.2f}×"
                style = "dim" if s.mode == BASELINE else "green" if s.median_ratio > 1 else "red"
            interval = "" if s.mode == BASELINE else _interval(s.interval)
            row = (Text(class_name if i == 0 else ""), s.mode, Text(bar, style=style), label,
                   interval)  # fmt: skip
            chart.add_row(*row)
    return chart


def _interval(interval: NoiseInterval | None) -> str:
    return "" if interval is None else f"{interval.low:.2f}–{interval.high:.2f}"


def overall_lines(report: BenchReport) -> list[str]:
    """Each mode over every prompt, with how sure this run is of it; nothing with one repeat."""
    lines = []
    for mode in report.modes:
        interval = report.overall(mode)
        if mode != BASELINE and interval is not None:
            lines.append(
                f"  {mode}: {interval.mean:.2f}× ({_interval(interval)}, "
                f"{_plural(interval.runs, 'paired run')})"
            )
    if lines:
        lines.insert(
            0,
            "over all prompts, the geometric mean of the paired runs' ratios, and its 95 % "
            "interval for this run's timing noise (bars whose interval holds 1.00 are not "
            "told apart from plain decoding by this run):",
        )
    return lines
