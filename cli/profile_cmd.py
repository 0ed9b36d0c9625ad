"""`edgespec profile`: measure this device's cost curve T(k) for a target (and a draft's step)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from edgespec.cores import format_cpu_list, needs_pinning, plan_placement
from edgespec.errors import BadSettingError, EdgespecError
from edgespec.overlap import OverlapReport, measure_overlap
from edgespec.profile import (
    ATTENTION_CONTEXT,
    ATTENTION_K,
    NOISY,
    DeviceProfile,
    load_profile,
    measuring_alone,
    profile_model,
    profiles_dir,
    save_pipeline_speedup,
    save_profile,
)

from . import options as opt


def profile(
    target: opt.Target = None,
    draft: opt.Draft = None,
    threads: Annotated[
        int | None,
        typer.Option("--threads", "-t", help="Target threads [default: one per --target-cpus CPU]"),
    ] = None,
    draft_threads: Annotated[
        int | None, typer.Option(help="Draft threads [default: one per --draft-cpus CPU]")
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Fewer batch sizes and rounds: seconds, not minutes")
    ] = False,
    overlap: Annotated[
        bool,
        typer.Option(
            "--overlap",
            help="Also time a chain round pipelined (draft and target at once on their own "
            "CPUs) against serial: does LLMCad's pipeline pay here? Remembered: where it pays, "
            "run and chat with those CPUs pipeline their chains",
        ),
    ] = False,
    target_cpus: opt.TargetCpus = None,
    draft_cpus: opt.DraftCpus = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Measure how long one target pass over k tokens takes on this device, and save it.

    T(k)/T(1) is what verifying k tokens costs in plain decoding steps; k / (T(k)/T(1)) is the
    speed-up if every proposal of k tokens were accepted. The draft's cost c_d is its step time
    over the target's. Each model's attention, with llama.cpp's flash attention or without, is
    timed first, and the faster kept for every later run.
    """
    # Imported here: app.py imports this module to register the command.
    from edgespec.engine import check_models, check_threads
    from edgespec.gguf_info import read_gguf

    from .app import DEFAULT_TARGET, check_named_models, resolve, resolve_draft, resolve_model

    # The models, threads and CPUs `run` would take: flags, else EDGESPEC_* or config.toml.
    settings = resolve(
        dict(
            target=target, draft=draft, threads=threads, draft_threads=draft_threads,
            target_cpus=target_cpus, draft_cpus=draft_cpus,
        )
    )  # fmt: skip
    check_threads(settings.threads, settings.draft_threads)
    check_named_models(settings)
    target_cpus, draft_cpus = settings.target_cpus, settings.draft_cpus
    # Each model measured where `run` puts it, with its threads, or `run` would not find the
    # profile (its key) and measure one of its own: on a phone the target on the big cores.
    placement = plan_placement(target_cpus, draft_cpus)
    target_threads = settings.threads or len(placement.target_cpus)
    draft_threads = settings.draft_threads or len(placement.draft_cpus)
    target_path = resolve_model(settings.target, DEFAULT_TARGET)
    assert target_path is not None
    # The draft `run` uses: the default one, unnamed or named by its catalogue name, in its
    # fastest form here (made and timed now if it has not been), not the file fetched, which
    # `run` may never load. Chosen with the draft's threads as `run` places them, so both find
    # the same choice record (with -t's count instead, on a phone each would time the forms
    # again for its own count).
    draft_path = resolve_draft(settings)
    if overlap and draft_path is None:
        raise BadSettingError("--overlap needs a draft (--draft)")
    # As `run` would refuse them, before minutes of measuring: a narrowed draft as the target,
    # a draft of another vocabulary (its cost over this target's would mean nothing).
    check_models(read_gguf(target_path), read_gguf(draft_path) if draft_path else None)
    split = split_cpus(target_cpus, draft_cpus) if overlap else ([], [])
    folder = profiles_dir()
    try:  # minutes of measuring are no use where they cannot be kept: said before, not after
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise EdgespecError(f"cannot keep profiles in {folder}: {e.strerror or e}") from None
    status = Console(stderr=True, highlight=False)

    def measure(path: Path, n_threads: int, cpus: list[int]) -> tuple[DeviceProfile, Path | None]:
        where = format_cpu_list(cpus)
        with (
            measuring_alone(status.print),
            status.status(f"measuring {path.name} on {n_threads} threads, CPUs {where}"),
        ):
            pinned = where if needs_pinning(cpus) else None  # as `run` pins
            measured = profile_model(path, n_threads, cpus=pinned, quick=quick)
        stored = load_profile(path, n_threads, where)
        if measured.quick and stored is not None and not stored.quick:
            status.print(f"{path.name}: kept the stored full profile (a quick one is rougher)")
            return measured, None
        return measured, save_profile(measured)

    target_profile, target_saved = measure(target_path, target_threads, placement.target_cpus)
    draft_profile, draft_saved = None, None
    same_key = (draft_threads, placement.draft_cpus) == (target_threads, placement.target_cpus)
    if draft_path is not None and same_key and draft_path.resolve() == target_path.resolve():
        draft_profile, draft_saved = target_profile, target_saved  # measured just now
    elif draft_path is not None:
        draft_profile, draft_saved = measure(draft_path, draft_threads, placement.draft_cpus)
    draft_cost = draft_profile.step_s / target_profile.step_s if draft_profile else None
    overlap_report = None
    if overlap:
        with (
            measuring_alone(status.print),
            status.status("timing serial and pipelined chain rounds"),
        ):
            overlap_report = measure_overlap(target_path, draft_path, *split)
        # Each model on its share, one thread per CPU: as `run` places them with these CPUs.
        target_share, draft_share = split
        save_pipeline_speedup(
            (target_path, len(target_share), format_cpu_list(target_share)),
            (draft_path, len(draft_share), format_cpu_list(draft_share)),
            overlap_report.speedup,
        )
    # A draft that is the target file was saved to the same path: list it once.
    saved = list(dict.fromkeys(p for p in (target_saved, draft_saved) if p))

    if as_json:
        report = {
            "target": target_profile.to_dict(),
            "rows": curve_rows(target_profile),
            "draft": draft_profile.to_dict() if draft_profile else None,
            "draft_cost": draft_cost,
            "overlap": overlap_dict(overlap_report) if overlap_report else None,
            "saved": [str(p) for p in saved],
        }
        typer.echo(json.dumps(report))
        return
    console = Console(highlight=False)
    console.print(curve_table(target_profile))
    if draft_profile and draft_cost is not None:
        console.print(
            f"draft {draft_profile.model_file}: T(1) {draft_profile.step_s * 1000:.2f} ms, "
            f"c_d = {draft_cost:.2f} target steps per draft token",
            soft_wrap=True,
        )
    profiles = [target_profile]
    if draft_profile is not None and draft_profile is not target_profile:  # not said twice
        profiles.append(draft_profile)
    for measured in profiles:
        if measured.attention_s is not None:
            console.print(attention_line(measured), soft_wrap=True)
    for measured in profiles:
        if measured.noise > NOISY:
            unused = "; until then auto prices passes by a default curve" if measured.busy else ""
            status.print(
                f"warning: timings of {measured.model_file} varied by {measured.noise:.0%} "
                f"(a busy machine?); measure again when it is quiet{unused}",
                style="yellow",
                soft_wrap=True,
            )
    if overlap_report:
        console.print(overlap_line(overlap_report), soft_wrap=True)
    for path in saved:
        status.print(f"[dim]saved {path}[/dim]", soft_wrap=True)


def split_cpus(target_cpus: str | None, draft_cpus: str | None) -> tuple[list[int], list[int]]:
    """The CPUs of each model for a pipeline: as placed, and on uniform cores the last CPU for
    the draft and the rest for the target."""
    placement = plan_placement(target_cpus, draft_cpus)
    target, draft = placement.target_cpus, placement.draft_cpus
    if set(target) & set(draft):
        if target_cpus or draft_cpus:
            raise BadSettingError("--overlap needs --target-cpus and --draft-cpus that differ")
        if len(target) < 2:
            raise BadSettingError("--overlap needs at least 2 CPUs")
        target, draft = target[:-1], target[-1:]
    return target, draft


def overlap_dict(r: OverlapReport) -> dict[str, object]:
    return {**asdict(r), "speedup": r.speedup}


def overlap_line(r: OverlapReport) -> str:
    target, draft = format_cpu_list(r.target_cpus), format_cpu_list(r.draft_cpus)
    cpus = f"--target-cpus {target} --draft-cpus {draft}"
    verdict = (
        f"pays here: with {cpus}, chains pipeline by default"
        if r.speedup > 1
        else f"does not pay here: with {cpus}, chains stay serial unless --pipeline"
    )
    return (
        f"pipeline, chain of {r.k}: serial round {r.serial_s * 1000:.1f} ms on all CPUs; "
        f"pipelined {r.pipelined_s * 1000:.1f} ms (target on CPUs "
        f"{format_cpu_list(r.target_cpus)} alone {r.target_alone_s * 1000:.1f} ms, draft on "
        f"{format_cpu_list(r.draft_cpus)} alone {r.draft_alone_s * 1000:.1f} ms): "
        f"{r.speedup:.2f}x, {verdict}"
    )


def attention_line(p: DeviceProfile) -> str:
    assert p.attention_s is not None
    with_flash, without = p.attention_s
    chosen = "with flash attention" if p.flash_attn else "without flash attention"
    return (
        f"{p.model_file} attends {chosen}: a plain step and a pass of {ATTENTION_K} after "
        f"{ATTENTION_CONTEXT} tokens took {with_flash * 1000:.0f} ms with it, "
        f"{without * 1000:.0f} ms without ({without / with_flash:.2f}x)"
    )


def curve_rows(p: DeviceProfile) -> list[dict[str, float]]:
    return [
        {"k": k, "seconds": s, "relative": p.relative(k), "ceiling": k / p.relative(k)}
        for k, s in zip(p.ks, p.seconds, strict=True)
    ]


def curve_table(p: DeviceProfile) -> Table:
    table = Table(
        "k",
        "T(k) ms",
        "T(k)/T(1)",
        "k/(T(k)/T(1))",
        title=f"{p.model_file}, {p.n_threads} threads on CPUs {p.cpus}",
    )
    for column in table.columns:
        column.justify = "right"
    for row in curve_rows(p):
        table.add_row(
            str(row["k"]),
            f"{row['seconds'] * 1000:.2f}",
            f"{row['relative']:.2f}",
            f"{row['ceiling']:.2f}",
        )
    return table
