"""The default draft, in the form this device runs fastest.

What a draft token costs decides whether speculation pays on a CPU (docs/speed.md, "What any
policy could reach here": the same 0.5B draft requantized from Q4_K_M to Q4_0 is worth 3-4x more
speed-up here). Q4_0 has fast kernels on x86 (AVX2/AVX-512) and on ARM (repacked for
dotprod/i8mm), but not on every CPU, so the choice is measured on the device, once, and
remembered next to the model (with the CPU it was measured on: on another, it is measured
again).

The copy's output matrix is Q4_0 too: llama.cpp keeps it at Q8_0 by default, and for a 0.5B model
with a 151,936-token vocabulary it is a third of a draft step here (7 of 19 ms). As Q4_0 the step
took 15 ms, and the draft still agreed with the target's next token as often (88.6 % against
89.2 % over the bench prompts' outputs, teacher-forced). A draft's precision only sets how often
its guesses are accepted; the output is the target's either way.

Then the output matrix is narrowed to the 32,768 most frequent tokens (draft_head.py), and that
copy is used if it is faster still (8.6 -> 7.2 ms a step on the Zen 5 here).
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import llama_cpp

from .backend import Context, Model, no_room, quantize
from .cores import cpu_identity
from .draft_head import HEAD_TOKENS, frequent_tokens, narrowed_path, write_narrowed
from .errors import ModelFileError
from .files import written_into_place
from .profile import BUSY_MEASUREMENTS, measuring_alone, timed_busy, timed_steps

CHEAP_TYPE = "Q4_0"
# Copies an earlier edgespec made, with llama.cpp's default output matrix: removed when the
# current copy replaces them (400 MB each for the default draft).
OLD_COPY_SUFFIXES = (".requant-q4_0.gguf",)
FASTER_BY = 0.95  # the copy must take at most this fraction of the original's time per token


@dataclass
class DraftChoice:
    """Which of a draft and its cheaper copy this device runs faster, as measured."""

    original: str  # file names, in the same directory
    copy: str
    narrowed: str  # the faster of the two with its output narrowed to frequent tokens
    chosen: str
    step_ms: dict[str, float]  # one decode step of each, the fastest (profile.fastest_steps)
    n_threads: int
    cpu: str = ""  # cores.cpu_identity() where it was measured; "" from an older edgespec
    # Timings in a row made while other programs kept the cores busy (profile.timed_busy): the
    # fastest steps' ratio then strays (the narrowed Qwen draft came out at 0.52-1.11 of its
    # base's step beside a busy core, 0.82-0.83 quiet, and above FASTER_BY once in fourteen).
    busy_timings: int = 0

    @property
    def timed_again(self) -> bool:
        """Whether the next first use times the forms again: this choice was timed busy."""
        return 0 < self.busy_timings < BUSY_MEASUREMENTS

    def path(self, directory: Path) -> Path:
        return directory / self.chosen


def copy_path(draft: Path) -> Path:
    return draft.with_name(f"{draft.stem}.{CHEAP_TYPE.lower()}-all.gguf")


def choice_path(draft: Path) -> Path:
    return draft.with_name(f"{draft.stem}.draft-choice.json")


def load_choice(draft: Path, n_threads: int) -> DraftChoice | None:
    try:
        choice = DraftChoice(**json.loads(choice_path(draft).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if choice.n_threads != n_threads or choice.copy != copy_path(draft).name:
        return None
    if choice.cpu != cpu_identity():  # models copied to another device, or a VM that moved
        return None
    if not (draft.parent / choice.narrowed).exists():
        return None
    if not choice.path(draft.parent).exists():
        return None
    return choice


def fastest_draft(
    draft: Path, n_threads: int, say: Callable[[str], None] = lambda _: None
) -> DraftChoice:
    """The draft, a Q4_0 copy of it, or the faster of the two narrowed to frequent tokens,
    whichever decodes fastest here; made and measured on first use (about 30 s for a 0.5B model
    on 2 cores), then read from a small record."""
    choice = load_choice(draft, n_threads)
    if choice is not None and not choice.timed_again:
        return choice
    with measuring_alone(say):
        # Once more: a process that held the lock may have made and measured the forms.
        choice = load_choice(draft, n_threads)
        if choice is not None and not choice.timed_again:
            return choice
        return _measure_forms(draft, n_threads, say, choice.busy_timings if choice else 0)


def _measure_forms(
    draft: Path, n_threads: int, say: Callable[[str], None], busy_timings: int = 0
) -> DraftChoice:
    """Make the draft's cheaper forms where missing, time them and keep the choice;
    `busy_timings`: the earlier timings in a row made on a busy device."""
    copy = copy_path(draft)
    if not copy.exists():
        say(f"making a {CHEAP_TYPE} copy of the draft {draft.name}, once: {copy.name}")
        with written_into_place(copy) as tmp:
            quantize(
                draft,
                tmp,
                llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
                n_threads,
                output_type=llama_cpp.GGML_TYPE_Q4_0,
            )
        for suffix in OLD_COPY_SUFFIXES:
            draft.with_name(draft.stem + suffix).unlink(missing_ok=True)
    again = "again (the device was busy the last time)" if busy_timings else "once"
    say(f"timing both forms of the draft on {n_threads} threads, {again}")
    step_s, busy = step_seconds([draft, copy], n_threads)
    base = copy if step_s[copy] <= FASTER_BY * step_s[draft] else draft
    say(
        f"draft step {step_s[copy] * 1000:.1f} ms as {CHEAP_TYPE}, "
        f"{step_s[draft] * 1000:.1f} ms as fetched"
    )
    narrowed = narrowed_path(base)
    if not narrowed.exists():
        say(f"narrowing the output of {base.name} to frequent tokens, once: {narrowed.name}")
        narrow(base, narrowed)
    narrowed_s, busy_too = step_seconds([base, narrowed], n_threads)
    step_s.update(narrowed_s)
    busy_timings = busy_timings + 1 if busy or busy_too else 0
    faster = step_s[narrowed] <= FASTER_BY * step_s[base]
    choice = DraftChoice(
        original=draft.name,
        copy=copy.name,
        narrowed=narrowed.name,
        chosen=narrowed.name if faster else base.name,
        step_ms={p.name: round(s * 1000, 3) for p, s in step_s.items()},
        n_threads=n_threads,
        cpu=cpu_identity(),
        busy_timings=busy_timings,
    )
    say(
        f"draft step {choice.step_ms[narrowed.name]:.1f} ms narrowed, "
        f"{choice.step_ms[base.name]:.1f} ms not: using {choice.chosen}"
    )
    if choice.timed_again:
        say("(other programs kept the cores busy while timing: timed again on the next run)")
    with written_into_place(choice_path(draft)) as record:
        record.write_text(json.dumps(asdict(choice), indent=2) + "\n")
    return choice


def narrow(src: Path, dst: Path, n_keep: int = HEAD_TOKENS) -> None:
    """Write `dst`, the draft `src` with its output layer narrowed to `n_keep` frequent tokens."""
    model = Model(src, vocab_only=True)
    try:
        always = model.special_tokens() + list(range(min(256, model.n_vocab)))
        ids = frequent_tokens(
            lambda text: model.tokenize(text, add_special=False, parse_special=False),
            model.n_vocab,
            always,
            n_keep,
        )
    finally:
        model.close()
    try:
        with written_into_place(dst) as tmp:
            write_narrowed(src, tmp, ids)
    except OSError as e:  # a full disk says so poorly, without an errno (see no_room)
        full = e.errno in (None, errno.ENOSPC) and no_room(dst.parent, src.stat().st_size)
        raise ModelFileError(f"cannot write {dst}: {full or e.strerror or e}") from None


def step_seconds(paths: list[Path], n_threads: int) -> tuple[dict[Path, float], bool]:
    """Seconds of one plain decode step of each model, the fastest of steps taken in turns
    (profile.fastest_steps), and whether another program kept the cores busy meanwhile."""
    contexts = [Context(Model(p), n_ctx=256, n_threads=n_threads) for p in paths]
    try:
        times = timed_steps(contexts)
        fastest = {path: min(samples) for path, samples in zip(paths, times, strict=True)}
        return fastest, timed_busy(times)
    finally:
        for ctx in contexts:
            ctx.close()
