"""Benchmark: every decoding mode against plain decoding, on the same prompts, in one run.

Speculation can be slower than plain decoding on a CPU (docs/speed.md), so the only honest
figure is a ratio to plain decoding measured in the same run on the same machine. Every mode runs
the same target file with the same threads, context size and prompt tokens, greedily (or all
sampling at one temperature), and is timed over the decode phase only (see `Measurement`).
Besides edgespec's own modes, two baselines from llama-cpp-python's high-level `Llama` are
measured: its plain decoding ("llama") and its prompt-lookup speculative decoding
("llama-lookup").

Runs are interleaved: each repeat goes through every prompt and runs every mode on it in a
shuffled order, so slow drift of a shared machine spreads over the modes instead of biasing the
ones measured last; and a mode's ratio on a prompt pairs each of its runs with plain decoding's
in the same repeat (`paired_ratios`), so drift between repeats cancels. What drift is left, the
repeats' scatter, bounds how sure the run is of each ratio (`noise_interval`).
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

from .backend import Context
from .cores import cpu_generation, cpu_model, cpu_simd
from .engine import (
    MAX_NODES,
    MODES,
    SCHEDULERS,
    Engine,
    GenerationConfig,
    default_threads,
    load,
)
from .errors import BadSettingError, ContextOverflowError, EdgespecError
from .gguf_info import read_gguf
from .sampling import SamplingParams

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

BASELINE = "target"  # edgespec's plain decoding: every ratio is to this mode
LLAMA_MODES = ("llama", "llama-lookup")
BENCH_CTX = 4096  # tokens of context, unless the target was trained for fewer
# Draft length of "llama-lookup". The library's default is 10, but a pass over 11 tokens costs
# about 5.4 plain steps on the reference CPU (docs/speed.md); 4 is within the 4-8 that
# llama.cpp's own lookup was run with there, and the setting of the 0.50x figure it reports for
# this baseline.
LOOKUP_TOKENS = 4
BENCH_REMEDY = "bench a smaller --target (named alone it has no draft) or a smaller --ctx-size"
WARMUP_TOKENS = 8  # an untimed first generation per mode: threads spun up, weights paged in
# llama.cpp's logits for a token depend slightly on how they were computed: batches above 32 rows
# take other kernels, and KV cells out of position order (a token tree leaves holes that later
# tokens fill) change the attention's summation order. Measured on SmolLM2-135M Q4_1 here, the
# gap between the top two candidates moved by up to 0.63 (prefill in batches of 64 vs one token
# at a time) and 0.72 (after branching token trees vs plain decoding). Two candidates closer than
# this are a near tie, where plain and speculative greedy decoding may legitimately differ.
NEAR_TIE = 0.75
PROMPTS_FILE = "bench_prompts.toml"

Progress = Callable[[int, int, str], None]  # (runs done, runs in all, the run about to start)


# ----- prompts -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchPrompt:
    name: str
    class_name: str  # what kind of work: code, edit, chat, summary
    text: str
    max_tokens: int


MAX_PROMPTS_BYTES = 16 * 2**20


def load_prompts(
    path: str | Path | None = None, classes: Iterable[str] | None = None
) -> list[BenchPrompt]:
    """The prompts of a TOML file (default: the suite shipped with edgespec), optionally only
    those of some classes. The file holds `[[prompts]]` entries with name, class, text and
    max_tokens."""
    if path is None:
        raw = resources.files("edgespec").joinpath(PROMPTS_FILE).read_text("utf-8")
        source = PROMPTS_FILE
    else:
        try:
            with Path(path).open("rb") as f:  # at most a bound: --prompts /dev/zero filled memory
                data = f.read(MAX_PROMPTS_BYTES + 1)
        except OSError as e:
            raise BadSettingError(f"cannot read the prompt file {path}: {e.strerror}") from None
        if len(data) > MAX_PROMPTS_BYTES:
            raise BadSettingError(
                f"the prompt file {path} is larger than {MAX_PROMPTS_BYTES // 2**20} MiB"
            )
        try:
            raw = data.decode("utf-8-sig")  # with or without the mark some editors begin with
        except UnicodeDecodeError:
            raise BadSettingError(f"the prompt file {path} is not UTF-8 text") from None
        source = str(path)
    try:
        entries = tomllib.loads(raw).get("prompts", [])
    except tomllib.TOMLDecodeError as e:
        raise BadSettingError(f"{source} is not valid TOML: {e}") from None
    except RecursionError:  # arrays in arrays a thousand deep
        raise BadSettingError(f"{source} is not valid TOML: nested too deeply") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise BadSettingError(f"{source}: prompts must be [[prompts]] entries (tables)")
    prompts = [_prompt_from_entry(entry, source) for entry in entries]
    if not prompts:
        raise BadSettingError(f"{source} has no [[prompts]] entries")
    names = [p.name for p in prompts]
    if len(set(names)) < len(names):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        raise BadSettingError(f"{source}: prompt names must be unique ({', '.join(duplicates)})")
    if classes is not None:
        wanted = list(dict.fromkeys(classes))
        known = list(dict.fromkeys(p.class_name for p in prompts))
        unknown = [c for c in wanted if c not in known]
        if unknown:
            raise BadSettingError(
                f"no prompts of class {', '.join(unknown)} in {source} (it has {', '.join(known)})"
            )
        prompts = [p for p in prompts if p.class_name in wanted]
    return prompts


def _prompt_from_entry(entry: dict[str, object], source: str) -> BenchPrompt:
    name, class_name, text, max_tokens = (
        entry.get(key) for key in ("name", "class", "text", "max_tokens")
    )
    label = name if isinstance(name, str) else repr(entry)[:40]
    if not (isinstance(name, str) and isinstance(class_name, str) and isinstance(text, str)):
        raise BadSettingError(f"{source}: prompt {label} needs a name, a class and a text")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadSettingError(f"{source}: prompt {label} needs max_tokens, a positive integer")
    if not text.strip():
        raise BadSettingError(f"{source}: prompt {label} has an empty text")
    if not (name.strip() and class_name.strip()):  # they name its rows and its class's table
        raise BadSettingError(f"{source}: prompt {label!r} needs a name and a class, not blanks")
    return BenchPrompt(name, class_name, text.strip(), max_tokens)


# ----- modes -------------------------------------------------------------------------------


def needs_draft(mode: str) -> bool:
    """Whether an engine mode needs a draft model (the engine's own validation decides)."""
    try:
        GenerationConfig(mode=mode).validate(has_draft=False)
    except BadSettingError:
        return True
    return False


def available_modes(has_draft: bool) -> list[str]:
    """Every mode that can run: edgespec's (those needing a draft only with one), then llama's."""
    return [m for m in MODES if has_draft or not needs_draft(m)] + list(LLAMA_MODES)


NO_NGRAM = {"ngram": False}  # the model alone: no n-gram rounds or branches
TREE_WORDS = {  # what may follow a tree's size in a bench mode, e.g. "tree:9:greedy:raw"
    **{name: {"scheduler": name} for name in SCHEDULERS},
    "raw": {"calibrated": False},  # LLMCad's raw draft probabilities
    "adaptive": {"adaptive_alpha": True},  # LLMCad's update of alpha
    "fixed": {"adaptive_alpha": False},
    "nogram": NO_NGRAM,
    # LLMCad as published: raw probabilities, alpha from 0.01 on, adapted
    "llmcad": {"calibrated": False, "adaptive_alpha": True, "alpha0": 0.01},
}


def engine_options(mode: str) -> dict[str, Any]:
    """Engine.generate's options for a bench mode: "chain" or, with a size, "chain:8" (draft
    length of chain and ngram, node budget of tree), so that sizes can be compared in one run;
    a tree may also take the words of TREE_WORDS, "tree:9:pacer", "tree:9:llmcad:nogram", and a
    chain "nogram", "chain:4:nogram"."""
    name, _, rest = mode.partition(":")
    if not rest:
        return {"mode": name}
    size, *words = rest.split(":")
    if name not in ("chain", "ngram", "tree"):
        raise BadSettingError(
            f"bad mode {mode!r}: a size goes with chain, ngram or tree, e.g. chain:8"
        )
    if not (size.isascii() and size.isdigit()):  # "tree:raw": the words come after a size
        raise BadSettingError(f"bad mode {mode!r}: {name}'s size comes first, e.g. {name}:8")
    # The size's bounds are the engine's; said here in the mode's words, not a flag's.
    what, low, high = ("node budget", 2, MAX_NODES) if name == "tree" else ("draft length", 1, 64)
    if not low <= int(size) <= high:
        raise BadSettingError(
            f"bad mode {mode!r}: the size of {name} is its {what}, from {low} to {high}"
        )
    options: dict[str, Any] = {
        "mode": name,
        "max_nodes" if name == "tree" else "draft_max": int(size),
    }
    words_of = {"tree": TREE_WORDS, "chain": {"nogram": NO_NGRAM}}.get(name, {})
    said: dict[str, str] = {}  # option -> the word that set it, to catch "tree:9:greedy:pacer"
    for word in words:
        if word not in words_of:
            raise BadSettingError(
                f"bad mode {mode!r}: after its size a chain takes nogram, a tree one of "
                f"{', '.join(TREE_WORDS)}, e.g. tree:9:pacer"
            )
        for key, value in words_of[word].items():
            if key in said and options[key] != value:
                raise BadSettingError(f"bad mode {mode!r}: {said[key]} and {word} contradict")
            options[key] = value
            said[key] = word
    return options


def checked_modes(modes: Sequence[str], has_draft: bool) -> list[str]:
    """The modes to run, baseline first, each once; unknown modes and missing drafts raise."""
    for mode in modes:
        if mode in LLAMA_MODES:
            continue
        if mode.partition(":")[0] not in MODES:
            choices = ", ".join([*MODES, *LLAMA_MODES])
            raise BadSettingError(f"unknown mode {mode!r}; the modes are {choices}")
        options = engine_options(mode)
        if not has_draft and needs_draft(options["mode"]):
            raise BadSettingError(f"mode {mode!r} needs a draft model (--draft)")
        GenerationConfig(**options).validate(has_draft)
    return list(dict.fromkeys([BASELINE, *modes]))


# ----- one generation ----------------------------------------------------------------------


@dataclass
class Measurement:
    """One generation, timed over its decode phase only.

    decode_s starts once the prompt minus its last token is in the target's KV cache and ends
    when the last generated token is known: it includes evaluating the last prompt token and,
    for modes with a draft model, the draft's evaluation of the prompt; never the target's
    prefill, which every mode does the same way.
    """

    tokens: list[int]  # generated tokens, the end-of-generation token not included
    decode_s: float
    target_passes: int  # target evaluations during decoding (plain steps or verifications)
    draft_tokens: int = 0  # tokens proposed for verification
    accepted_tokens: int = 0  # proposed tokens the target agreed with
    verifications: int = 0  # target passes that verified at least one proposed token
    draft_evals: int = 0  # draft model evaluations
    overhead_ms: float | None = None  # our own time per target pass (None: not ours to measure)
    rounds: dict[str, int] = field(default_factory=dict)  # by what drafted them (Stats.choices)
    thread_switches: int = 0  # the governor's, while other programs took cores (governor.py)
    in_run_ratio: float | None = None  # over its own plain steps' rate (Stats.in_run_ratio)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_accepted(self) -> float | None:
        return self.accepted_tokens / self.verifications if self.verifications else None

    @property
    def passes_per_token(self) -> float | None:
        return self.target_passes / len(self.tokens) if self.tokens else None

    @property
    def draft_evals_per_pass(self) -> float | None:
        return self.draft_evals / self.target_passes if self.draft_evals else None


# (prompt tokens, max_tokens, sampling seed) -> measurement; greedy runners ignore the seed.
Runner = Callable[[list[int], int, int], Measurement]


def engine_runner(engine: Engine, mode: str, temperature: float = 0.0) -> Runner:
    options = engine_options(mode)

    def measure(prompt_tokens: list[int], max_tokens: int, seed: int) -> Measurement:
        # Each run starts as `edgespec run` would, without the draft knowing the prompt: the
        # draft catches up when it first drafts, timed, so a chain run of the same prompt just
        # before made the next run's first draft cheaper than it is.
        engine.forget_draft_cache()
        result = engine.generate(
            prompt_tokens, max_tokens=max_tokens, temperature=temperature, seed=seed, **options
        )
        stats = result.stats
        return Measurement(
            tokens=result.tokens,
            decode_s=stats.decode_s,
            target_passes=stats.target_passes,
            draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens,
            verifications=stats.verifications,
            draft_evals=stats.draft_evals,
            overhead_ms=stats.overhead_ms_per_pass,
            rounds=dict(stats.choices),
            thread_switches=stats.thread_switches,
            in_run_ratio=stats.in_run_ratio,
        )

    return measure


class _CountingLlama(Llama):
    """llama-cpp-python's Llama, recording how many tokens each evaluation held."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.pass_sizes: list[int] = []

    def eval(self, tokens: Sequence[int]) -> None:
        self.pass_sizes.append(len(tokens))
        super().eval(tokens)


class LlamaRunner:
    """Decoding through llama-cpp-python's high-level API, plain or with prompt lookup: greedy,
    or sampling at a temperature with no other filter (as the engine's runs here).

    Its settings mirror the engine's target context: same file, threads for decode and batch,
    context size and batch size, and attention with flash attention or without as the engine's
    (`flash_attn`; where the target's profile did not choose, the engine leaves it to llama.cpp,
    which turns it on for the CPU, where Llama's default is off).
    """

    def __init__(
        self,
        model_path: Path,
        *,
        n_ctx: int,
        threads: int,
        is_eog: Callable[[int], bool],
        lookup_tokens: int | None = None,
        temperature: float = 0.0,
        flash_attn: bool = True,
    ):
        self.temperature = temperature
        draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens) if lookup_tokens else None
        self.llm = _CountingLlama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_batch=512,
            n_ubatch=512,
            n_threads=threads,
            n_threads_batch=threads,
            n_gpu_layers=0,
            flash_attn=flash_attn,
            draft_model=draft,
            # A draft model makes Llama keep logits for every evaluated token, but it sizes that
            # buffer by this argument: without it, a prompt longer than n_batch fails to evaluate.
            logits_all=draft is not None,
            verbose=False,
        )
        self.is_eog = is_eog

    def __call__(self, prompt_tokens: list[int], max_tokens: int, seed: int) -> Measurement:
        llm = self.llm
        llm.reset()
        llm.set_seed(seed)
        llm.eval(prompt_tokens[:-1])  # the prefill, untimed as in the engine
        llm.pass_sizes.clear()
        generated: list[int] = []
        stopped_on_eog = False
        # generate() compares the prompt with the tokens already evaluated and keeps that prefix
        # in the cache, so it evaluates only the last prompt token before sampling: the timed
        # span below is the same decode phase as the engine's. Seen on SmolLM2 with an 867-token
        # prompt: n_tokens went 866 -> 867 and the first token took 0.03 s, against one pass of
        # 867 tokens and 7.5 s without the prefill. Checked on every run (pass_sizes[0] == 1).
        start = time.perf_counter()
        # Its own defaults would filter (top-k 40, top-p 0.95, min-p 0.05): off, as in the engine.
        sampling = {"temp": self.temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
        for token in llm.generate(prompt_tokens, **sampling, repeat_penalty=1.0, reset=True):
            if self.is_eog(token):
                stopped_on_eog = True
                break
            generated.append(token)
            if len(generated) >= max_tokens:
                break
        decode_s = time.perf_counter() - start
        sizes = list(llm.pass_sizes)
        if sizes and sizes[0] != 1:
            raise EdgespecError(
                f"llama-cpp-python evaluated {sizes[0]} prompt tokens inside the timed decode "
                "instead of reusing the prefilled cache: its tok/s would not be comparable"
            )
        # Every pass after the first is [the last sampled token, *proposed tokens], and yields
        # the tokens the target agreed with plus one of its own.
        yielded = len(generated) + stopped_on_eog
        return Measurement(
            tokens=generated,
            decode_s=decode_s,
            target_passes=len(sizes),
            draft_tokens=sum(size - 1 for size in sizes),
            accepted_tokens=max(0, yielded - len(sizes)),
            verifications=sum(1 for size in sizes if size > 1),
        )

    def close(self) -> None:
        self.llm.close()


# ----- report ------------------------------------------------------------------------------


@dataclass
class Divergence:
    """Where a mode's greedy output first differs from plain decoding's, and how close the
    target's two choices were there (logits from one batched pass over prompt + common part)."""

    position: int  # in the generated tokens
    plain_token: int
    mode_token: int
    gap: float  # logit of plain's token minus logit of the mode's

    @property
    def near_tie(self) -> bool:
        return abs(self.gap) < NEAR_TIE


def first_divergence(
    engine: Engine, prompt: list[int], plain: list[int], other: list[int]
) -> Divergence | None:
    """None if `other` equals `plain`; else where they part and the target's logit gap there.

    An output shorter than the other stopped on an end-of-generation token, which is not in its
    tokens: its choice there is taken to be the model's EOS.
    """
    n = min(len(plain), len(other))
    position = next((i for i in range(n) if plain[i] != other[i]), n)
    if position == len(plain) == len(other):
        return None
    # Attending as the engine's target does: the gap is the one its plain decoding saw.
    target, attention = engine.target, engine.target_ctx.flash_attn
    ctx = Context(target, n_ctx=engine.n_ctx, n_threads=engine.threads, flash_attn=attention)
    try:
        logits = ctx.decode([*prompt, *plain[:position]], 0)[-1]
        eos = engine.target.eos
        a = plain[position] if position < len(plain) else eos
        b = other[position] if position < len(other) else eos
        return Divergence(position, a, b, float(logits[a] - logits[b]))
    finally:
        ctx.close()


@dataclass
class BenchRow:
    """One mode on one prompt, over all repeats."""

    mode: str
    prompt: str
    class_name: str
    tokens_per_s: float  # median over repeats
    runs_tokens_per_s: list[float]
    ratio: float | None  # to the baseline on this prompt: the median of `ratios`
    n_generated: int
    acceptance: float | None  # median; None when nothing was proposed
    mean_accepted: float | None
    passes_per_token: float | None
    draft_evals_per_pass: float | None
    overhead_ms: float | None  # our own (Python) time per target pass, median
    # Every repeat generated exactly the baseline's tokens; None when sampling, where texts
    # differ by their draws.
    same_as_target: bool | None
    rounds: dict[str, int]  # over all repeats, by what drafted them: "ngram", "chain", "plain"...
    tokens: list[int]  # of the first repeat
    text: str
    divergence: Divergence | None = None  # of the first repeat that differs from the baseline
    ratios: list[float] = field(default_factory=list)  # paired, one per repeat (paired_ratios)
    thread_switches: int = 0  # over all repeats: other programs took cores meanwhile
    # Each repeat's speed over its own plain steps' (Stats.in_run_ratio), in modes that step
    # plainly between their drafted rounds (auto, ngram), and their median (None: none had).
    in_run_ratios: list[float] = field(default_factory=list)
    in_run_ratio: float | None = None


@dataclass
class NoiseInterval:
    """A mode's speed over plain decoding on some prompts, as sure as this run's timing noise
    allows: the geometric mean over the prompts of each one's paired ratios (`paired_ratios`),
    and a 95 % interval for it (`noise_interval`)."""

    mean: float
    low: float
    high: float
    runs: int  # the paired runs it rests on


@dataclass
class ClassSummary:
    """One mode over the prompts of one class: medians of the per-prompt figures."""

    mode: str
    class_name: str
    tokens_per_s: float
    median_ratio: float | None
    min_ratio: float | None
    acceptance: float | None
    mean_accepted: float | None
    passes_per_token: float | None
    draft_evals_per_pass: float | None
    overhead_ms: float | None
    n_same: int | None  # prompts whose output equals the baseline's; None when sampling
    n_prompts: int
    interval: NoiseInterval | None = None  # the class's geometric mean ratio, for the noise
    in_run_ratio: float | None = None  # median of the rows' (BenchRow.in_run_ratio)


@dataclass
class ModelFile:
    file: str
    path: str
    bytes: int

    @classmethod
    def of(cls, path: Path) -> ModelFile:
        return cls(path.name, str(path), path.stat().st_size)


@dataclass
class BenchSettings:
    """What every mode shared in this run."""

    date: str
    target: ModelFile
    draft: ModelFile | None
    threads: int  # the target's and the Llama baselines', for decoding and batches alike; the
    # draft's too where they were given (else one per CPU of its own, as `run` places it)
    n_ctx: int
    repeats: int
    modes: list[str]
    lookup_tokens: int  # draft length of "llama-lookup"
    seed: int  # of the shuffled mode order
    # Sampling's temperature (0: greedy). Repeat r samples with seed r in every mode, so the
    # modes' texts come from the same draws where they draw alike.
    temperature: float = 0.0
    # The target's attention, as its profile chose (None: llama.cpp's choice, flash attention).
    flash_attn: bool | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Spread:
    """How much plain decoding's own repeats of a prompt differed, (fastest - slowest) / median:
    on a shared machine, two modes whose ratios are closer than this may differ by noise."""

    median: float  # over the prompts
    largest: float
    prompt: str  # whose repeats differed the most


def plain_spread(rows: Iterable[BenchRow]) -> Spread | None:
    """The baseline's Spread over `rows`; None without two repeats of a prompt to compare."""
    spreads = [
        ((max(row.runs_tokens_per_s) - min(row.runs_tokens_per_s)) / row.tokens_per_s, row.prompt)
        for row in rows
        if row.mode == BASELINE and len(row.runs_tokens_per_s) > 1 and row.tokens_per_s > 0
    ]
    if not spreads:
        return None
    largest, prompt = max(spreads)
    return Spread(statistics.median(spread for spread, _ in spreads), largest, prompt)


@dataclass
class BenchReport:
    machine: dict[str, object]
    settings: BenchSettings
    prompts: list[dict[str, object]]
    rows: list[BenchRow]
    classes: list[ClassSummary] = field(default_factory=list)

    @property
    def modes(self) -> list[str]:
        return list(dict.fromkeys(row.mode for row in self.rows))

    @property
    def class_names(self) -> list[str]:
        return list(dict.fromkeys(summary.class_name for summary in self.classes))

    def row(self, mode: str, prompt: str) -> BenchRow:
        return next(r for r in self.rows if r.mode == mode and r.prompt == prompt)

    def summaries(self, class_name: str) -> list[ClassSummary]:
        return [s for s in self.classes if s.class_name == class_name]

    @property
    def plain_spread(self) -> Spread | None:
        return plain_spread(self.rows)

    def overall(self, mode: str) -> NoiseInterval | None:
        """`mode` over every prompt of the run (`noise_interval`)."""
        return noise_interval([row.ratios for row in self.rows if row.mode == mode])

    def to_dict(self) -> dict[str, object]:
        spread = self.plain_spread
        overall = {mode: self.overall(mode) for mode in self.modes}
        return {
            "machine": self.machine,
            "settings": {**asdict(self.settings), "greedy": self.settings.greedy},
            "prompts": self.prompts,
            "rows": [asdict(row) for row in self.rows],
            "classes": [asdict(summary) for summary in self.classes],
            "overall": {mode: asdict(i) if i else None for mode, i in overall.items()},
            "plain_spread": asdict(spread) if spread else None,
        }


def _median_or_none(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _row(
    mode: str,
    prompt: BenchPrompt,
    runs: list[Measurement],
    baseline: list[Measurement],
    engine: Engine,
    prompt_tokens: list[int],
    greedy: bool = True,
) -> BenchRow:
    tokens_per_s = statistics.median(m.tokens_per_s for m in runs)
    ratios = paired_ratios([m.tokens_per_s for m in runs], [m.tokens_per_s for m in baseline])
    # Sampled texts differ from plain decoding's by their draws: nothing to compare.
    differing = [m for m in runs if m.tokens != baseline[0].tokens] if greedy else []
    in_run = [m.in_run_ratio for m in runs if m.in_run_ratio is not None]
    return BenchRow(
        mode=mode,
        prompt=prompt.name,
        class_name=prompt.class_name,
        tokens_per_s=tokens_per_s,
        runs_tokens_per_s=[m.tokens_per_s for m in runs],
        ratio=statistics.median(ratios) if ratios else None,
        n_generated=len(runs[0].tokens),
        acceptance=_median_or_none(m.acceptance for m in runs),
        mean_accepted=_median_or_none(m.mean_accepted for m in runs),
        passes_per_token=_median_or_none(m.passes_per_token for m in runs),
        draft_evals_per_pass=_median_or_none(m.draft_evals_per_pass for m in runs),
        overhead_ms=_median_or_none(m.overhead_ms for m in runs),
        same_as_target=not differing if greedy else None,
        rounds=dict(sum((Counter(m.rounds) for m in runs), Counter())),
        thread_switches=sum(m.thread_switches for m in runs),
        tokens=runs[0].tokens,
        text=engine.target.detokenize(runs[0].tokens),
        divergence=(
            first_divergence(engine, prompt_tokens, baseline[0].tokens, differing[0].tokens)
            if differing
            else None
        ),
        ratios=ratios,
        in_run_ratios=in_run,
        in_run_ratio=statistics.median(in_run) if in_run else None,
    )


def paired_ratios(rates: Sequence[float], baseline_rates: Sequence[float]) -> list[float]:
    """Each repeat's rate over plain decoding's in the same repeat (the same prompt, at most a
    few runs apart), leaving out the repeats in which plain decoding made nothing. A row's
    ratio is their median.

    A shared machine drifts between repeats (plain decoding's own repeats of a prompt were 19 %
    apart, median, in a run here), and a ratio of the two medians compares runs up to a whole
    repeat apart. Paired, what the two runs shared cancels: over a three-repeat run of every
    mode here (2026-11-26), the log of a ratio scattered over repeats with a standard deviation
    of 0.079 paired against 0.147 between runs of different repeats."""
    return [r / b for r, b in zip(rates, baseline_rates, strict=True) if b > 0]


# Student's t at 97.5 % for 1..30 degrees of freedom; beyond, 1.96 + 2.4 / df is within 0.003.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def noise_interval(ratios_by_prompt: Sequence[Sequence[float]]) -> NoiseInterval | None:
    """The geometric mean over prompts of each prompt's paired ratios, with a 95 % interval for
    this run's timing noise; None without a prompt run twice (nothing to tell noise by).

    In logs, each prompt's repeats scatter around the prompt's own mean (the prompts differ
    for real: a copy-heavy edit is not a chat); that scatter, pooled over the prompts, is the
    noise, and the mean of the prompts' means is uncertain by it (Student's t). A class median
    over three prompts cannot say whether 1.02x is faster than plain decoding on a machine
    whose repeats differ by a fifth; this can. It speaks for these prompts, not for others."""
    # A sampled run that drew the end of text first made nothing: no speed to average.
    made = [[r for r in ratios if r > 0] for ratios in ratios_by_prompt]
    logs = [np.log(np.asarray(r, dtype=float)) for r in made if r]
    n_runs = sum(len(x) for x in logs)
    df = n_runs - len(logs)
    if df < 1:
        return None
    means = [float(x.mean()) for x in logs]
    squares = sum(float(((x - m) ** 2).sum()) for x, m in zip(logs, means, strict=True))
    # Var(mean of P prompt means) = s^2 / P^2 * sum(1 / repeats of each)
    se = float(np.sqrt(squares / df * sum(1 / len(x) for x in logs))) / len(logs)
    t = _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df
    center, half = float(np.mean(means)), t * se
    return NoiseInterval(
        mean=float(np.exp(center)),
        low=float(np.exp(center - half)),
        high=float(np.exp(center + half)),
        runs=n_runs,
    )


def _class_summary(mode: str, class_name: str, rows: list[BenchRow]) -> ClassSummary:
    ratios = [r.ratio for r in rows if r.ratio is not None]
    return ClassSummary(
        mode=mode,
        class_name=class_name,
        tokens_per_s=statistics.median(r.tokens_per_s for r in rows),
        median_ratio=statistics.median(ratios) if ratios else None,
        min_ratio=min(ratios) if ratios else None,
        acceptance=_median_or_none(r.acceptance for r in rows),
        mean_accepted=_median_or_none(r.mean_accepted for r in rows),
        passes_per_token=_median_or_none(r.passes_per_token for r in rows),
        draft_evals_per_pass=_median_or_none(r.draft_evals_per_pass for r in rows),
        overhead_ms=_median_or_none(r.overhead_ms for r in rows),
        in_run_ratio=_median_or_none(r.in_run_ratio for r in rows),
        n_same=(
            None
            if any(r.same_as_target is None for r in rows)
            else sum(bool(r.same_as_target) for r in rows)
        ),
        n_prompts=len(rows),
        interval=noise_interval([r.ratios for r in rows]),
    )


def machine_info() -> dict[str, object]:
    import llama_cpp

    from . import __version__

    return {
        "cpu": cpu_model(),
        "generation": cpu_generation(),
        "simd": cpu_simd(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": default_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "llama_cpp_python": llama_cpp.__version__,
        "edgespec": __version__,
    }


# ----- the benchmark -----------------------------------------------------------------------


def run_bench(
    target: str | Path,
    draft: str | Path | None,
    modes: Sequence[str],
    prompts: Sequence[BenchPrompt],
    repeats: int = 3,
    threads: int | None = None,
    n_ctx: int | None = None,
    progress: Progress | None = None,
    *,
    say: Callable[[str], object] = lambda _: None,
    lookup_tokens: int = LOOKUP_TOKENS,
    seed: int = 0,
    temperature: float = 0.0,
) -> BenchReport:
    """Run every mode on every prompt `repeats` times, interleaved, and compare them; greedy,
    or sampling at `temperature` (repeat r draws with seed r in every mode).

    `modes` are edgespec's engine modes and "llama" / "llama-lookup"; the baseline "target" is
    always run. One Engine (with the draft) serves every engine mode; each llama mode loads the
    target once more. `progress` is called before each run, never inside a timed span. `n_ctx`:
    None is 4096 (the suite's longest prompts and answers), or less for a model trained for less.
    `say` is told, before the models load, where they need more memory than is available.
    """
    if repeats < 1:
        raise BadSettingError(f"--repeats must be at least 1 (got {repeats})")
    if not prompts:
        raise BadSettingError("no prompts to run")
    SamplingParams(temperature=temperature)  # a bad one is refused as by `edgespec run`
    target, draft = Path(target), Path(draft) if draft is not None else None
    modes = checked_modes(modes, has_draft=draft is not None)
    if n_ctx is None:
        n_ctx = min(BENCH_CTX, read_gguf(target).context_length or BENCH_CTX)
    # -t for both models; without it each takes one thread per CPU of its own, as in `run`.
    engine = load(
        target,
        draft,
        n_ctx=n_ctx,
        threads=threads,
        draft_threads=threads,
        say=say,
        remedy=BENCH_REMEDY,
    )
    threads = engine.threads
    prompt_tokens = {}
    for p in prompts:  # before a first use's profile: a prompt that cannot run fails first
        try:
            prompt_tokens[p.name] = engine.prompt_tokens(p.text)
        except ContextOverflowError as e:
            raise BadSettingError(f"prompt {p.name}: {e}") from None
        # Llama stops with an error when its cache is full; a draft may overshoot by its length.
        if len(prompt_tokens[p.name]) + p.max_tokens + lookup_tokens >= engine.n_ctx:
            raise BadSettingError(
                f"prompt {p.name}: {len(prompt_tokens[p.name])} tokens + {p.max_tokens} to "
                f"generate do not fit a context of {engine.n_ctx}; use a larger --ctx-size"
            )
    if "auto" in modes:
        engine.profile_if_missing()  # as `edgespec run` does on first use

    llama_runners = {
        mode: LlamaRunner(
            target,
            n_ctx=engine.n_ctx,
            threads=threads,
            is_eog=engine.target.is_eog,
            lookup_tokens=lookup_tokens if mode == "llama-lookup" else None,
            temperature=temperature,
            flash_attn=engine.target_ctx.flash_attn is not False,
        )
        for mode in modes
        if mode in LLAMA_MODES
    }
    runners: dict[str, Runner] = {
        mode: llama_runners[mode]
        if mode in LLAMA_MODES
        else engine_runner(engine, mode, temperature)
        for mode in modes
    }
    try:
        runs = _interleaved_runs(runners, prompts, prompt_tokens, repeats, progress, seed)
    finally:
        for runner in llama_runners.values():
            runner.close()

    greedy = temperature == 0
    rows = [
        _row(
            mode,
            p,
            runs[mode, p.name],
            runs[BASELINE, p.name],
            engine,
            prompt_tokens[p.name],
            greedy,
        )
        for p in prompts
        for mode in modes
    ]
    class_names = list(dict.fromkeys(p.class_name for p in prompts))
    classes = [
        _class_summary(mode, c, [r for r in rows if r.mode == mode and r.class_name == c])
        for c in class_names
        for mode in modes
    ]
    settings = BenchSettings(
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        target=ModelFile.of(target),
        draft=ModelFile.of(draft) if draft is not None else None,
        threads=threads,
        n_ctx=engine.n_ctx,
        repeats=repeats,
        modes=modes,
        lookup_tokens=lookup_tokens,
        seed=seed,
        temperature=temperature,
        flash_attn=engine.target_ctx.flash_attn,
    )
    prompt_info = [
        {
            "name": p.name,
            "class": p.class_name,
            "max_tokens": p.max_tokens,
            "prompt_tokens": len(prompt_tokens[p.name]),
        }
        for p in prompts
    ]
    return BenchReport(machine_info(), settings, prompt_info, rows, classes)


def _interleaved_runs(
    runners: dict[str, Runner],
    prompts: Sequence[BenchPrompt],
    prompt_tokens: dict[str, list[int]],
    repeats: int,
    progress: Progress | None,
    seed: int,
) -> dict[tuple[str, str], list[Measurement]]:
    """A short untimed warm-up of every mode, then for each repeat and prompt, every mode in a
    shuffled order. Returns the measurements of each (mode, prompt name)."""
    modes = list(runners)
    total = len(modes) * (1 + repeats * len(prompts))
    done = 0

    def report(label: str) -> None:
        if progress is not None:
            progress(done, total, label)

    first = prompts[0]
    for mode in modes:
        report(f"warm-up {mode}")
        runners[mode](prompt_tokens[first.name], min(WARMUP_TOKENS, first.max_tokens), 0)
        done += 1
    runs: dict[tuple[str, str], list[Measurement]] = {
        (mode, p.name): [] for mode in modes for p in prompts
    }
    order = random.Random(seed)
    for repeat in range(repeats):
        for p in prompts:
            for mode in order.sample(modes, len(modes)):
                report(f"repeat {repeat + 1}/{repeats} {p.class_name}/{p.name} {mode}")
                measure = runners[mode]
                runs[mode, p.name].append(measure(prompt_tokens[p.name], p.max_tokens, repeat))
                done += 1
    report("done")
    return runs
