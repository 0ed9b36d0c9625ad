"""A/B of one change to edgespec's constants, on the bench's prompts, in one process.

    .venv/bin/python scripts/ab.py --set policy.CARRY_AFTER=1000 [--mode auto] [--classes code]
        [--repeats 2] [-n TOKENS] [--temp T] [--target T --draft D] [--prompts FILE] [--json OUT]

Arm A runs edgespec as it is; arm B with each `--set MODULE.NAME=VALUE` in force (a constant of
edgespec.MODULE, set only while B loads and generates). Each arm has its own engine, which keeps
what auto learns from prompt to prompt as the bench's does; plain decoding runs on a third. For
every repeat and prompt: plain decoding, then the two arms, their order swapped every repeat;
each arm's speed is paired with that plain run's (as bench.paired_ratios), and B against A is the
ratio of the two, with a 95 % interval for the run's timing noise. Two bench runs, one before and
one after a change, are an hour apart on a machine whose plain repeats differ by a fifth; paired
per prompt here, a change of a few percent shows (the carried arm, 2026-11-30: code 1.69 ->
1.80x). Models as `edgespec run` takes them by default. With `--temp`, every run samples, repeat r
with seed r (as the bench does): the three runs of a pair draw from the same seed.

Each ratio is also priced: the run's llama.cpp passes (the target's and the draft's, the prompt's
prefill left out) at the stored profiles' prices, in target steps, against the plain run's. That
leaves out Python and the machine's load, whose scatter here (a fifth between repeats) hides a
change of a few percent in what the policy chooses; it is what the choices cost on a quiet
device, not a measured speed (and it prices a pipelined draft's passes as if they ran alone).
And each run over its own plain steps (Stats.in_run_ratio; auto's and ngram's, with 16 of them at
least): plain decoding timed in the same seconds as the rounds that drafted. Here the plain
engine's runs, first of each triple, came out slower than auto's all-plain answers beside them
(paired 1.03-1.20x on chat in one hour, in-run 0.98-1.02; 2026-12-03).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from statistics import geometric_mean
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgespec.bench import BenchPrompt
    from edgespec.engine import Engine


@dataclass(frozen=True)
class Setting:
    module: str  # of edgespec: "policy", "engine", ...
    name: str
    value: object


def parse_setting(text: str) -> Setting:
    """MODULE.NAME=VALUE, VALUE a Python literal of the constant's own type (an int may stand
    for a float). Checked against the module: a typo would otherwise A/B edgespec with itself."""
    target, sep, literal = text.partition("=")
    module, dot, name = target.strip().rpartition(".")
    if not (sep and dot and module and name):
        raise ValueError(f"--set takes MODULE.NAME=VALUE (got {text!r})")
    try:
        value = ast.literal_eval(literal.strip())
    except (ValueError, SyntaxError):
        raise ValueError(f"--set {target}: {literal.strip()!r} is not a Python literal") from None
    try:
        owner = importlib.import_module(f"edgespec.{module}")
    except ModuleNotFoundError:
        raise ValueError(f"--set {target}: edgespec has no module {module!r}") from None
    if not hasattr(owner, name):
        raise ValueError(f"--set {target}: edgespec.{module} has no {name}")
    old = getattr(owner, name)
    if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not type(old):
        raise ValueError(
            f"--set {target}: {value!r} is not of the type of edgespec.{module}.{name} ({old!r})"
        )
    return Setting(module, name, value)


@contextmanager
def in_force(settings: Sequence[Setting]) -> Iterator[None]:
    """Each setting in its module while the block runs; the old values back after it. Code that
    read a constant at import (a default argument, a class attribute) does not see it."""
    modules = [importlib.import_module(f"edgespec.{s.module}") for s in settings]
    old = [getattr(m, s.name) for m, s in zip(modules, settings, strict=True)]
    try:
        for m, s in zip(modules, settings, strict=True):
            setattr(m, s.name, s.value)
        yield
    finally:
        for m, s, value in zip(modules, settings, old, strict=True):
            setattr(m, s.name, value)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="M.NAME=V")
    ap.add_argument("--mode", default="auto", help="the engine mode both arms run")
    ap.add_argument("--classes", help="prompt classes, comma-separated (default: all)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("-n", "--max-tokens", type=int, help="tokens per prompt (default: its own)")
    ap.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0: greedy)")
    ap.add_argument("--target", help="target GGUF or catalogue name (default: run's)")
    ap.add_argument("--draft", help="draft GGUF or catalogue name (default: run's)")
    ap.add_argument("--prompts", type=Path, help="a prompts TOML (default: the bench's suite)")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--json", type=Path, help="also write every ratio and round count here")
    args = ap.parse_args(argv)

    import edgespec
    from edgespec.bench import load_prompts
    from edgespec.cli.app import DEFAULT_TARGET, resolve_draft, resolve_model
    from edgespec.config import resolve
    from edgespec.errors import EdgespecError

    try:
        settings = [parse_setting(s) for s in args.settings]
        if not settings:
            raise ValueError("nothing to compare: give arm B at least one --set")
        if args.repeats < 1:
            raise ValueError(f"--repeats must be at least 1 (got {args.repeats})")
        if not args.temp >= 0:
            raise ValueError(f"--temp must be 0 (greedy) or more (got {args.temp})")
        classes = args.classes.split(",") if args.classes else None
        prompts = load_prompts(args.prompts, classes)
        if args.max_tokens is not None:
            prompts = [replace(p, max_tokens=args.max_tokens) for p in prompts]
        chosen = resolve(dict(target=args.target, draft=args.draft))
        target = resolve_model(chosen.target, DEFAULT_TARGET)
        draft = resolve_draft(chosen)
        plain = edgespec.load(target, None, n_ctx=args.n_ctx)
        engines = {"A": edgespec.load(target, draft, n_ctx=args.n_ctx)}
        with in_force(settings):
            engines["B"] = edgespec.load(target, draft, n_ctx=args.n_ctx)
        for name, engine in engines.items():
            with in_force(settings if name == "B" else ()):
                engine.profile_if_missing(say=lambda line: print(line, file=sys.stderr))
    except (ValueError, EdgespecError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print(f"A: as it is; B: {', '.join(args.settings)}; mode {args.mode}; {draft and draft.name}")
    pricer = PassPricer.of([plain, *engines.values()])
    ratios, priced, rounds, in_run = run_pairs(
        plain, engines, settings, prompts, args.repeats, args.mode, args.temp, pricer
    )
    print("geometric means over prompts and repeats, x plain decoding:")
    for line in summary(prompts, ratios):
        print(line)
    if all(priced[arm] for arm in priced):
        print("priced by the profiles (llama.cpp's passes only; not a measured speed):")
        for line in summary(prompts, priced):
            print(line)
    both = runs_with_both(in_run)
    if both["A"]:
        print("in-run, x each run's own plain steps (runs where both arms had enough of them):")
        for line in summary(prompts, both):
            print(line)
    if args.json is not None:
        report = {"settings": args.settings, "mode": args.mode, "temp": args.temp}
        report |= {"ratios": ratios, "priced": priced, "rounds": rounds, "in_run": in_run}
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


Ratios = dict[str, dict[str, list[float]]]  # arm -> prompt -> one a repeat
InRun = dict[str, dict[str, list[float | None]]]  # None: a run with too few plain steps


def runs_with_both(in_run: InRun) -> Ratios:
    """The in-run ratios of the repeats where both arms have one (Stats.in_run_ratio), paired
    as `summary` pairs them; prompts with none left out."""
    both: Ratios = {"A": {}, "B": {}}
    for prompt, a_runs in in_run["A"].items():
        pairs = [(a, b) for a, b in zip(a_runs, in_run["B"][prompt], strict=True) if a and b]
        if pairs:
            both["A"][prompt] = [a for a, _ in pairs]
            both["B"][prompt] = [b for _, b in pairs]
    return both


class PassPricer:
    """Sums the llama.cpp passes of the engines' generations, each priced by its model's profile
    in target steps (T_model(k)/T_target(1)); those of the target's prefill are left out.
    Installed on Context and Engine for the life of the process (this script's)."""

    def __init__(self, prices: dict[int, Callable[[int], float]]):
        from edgespec.backend import Context
        from edgespec.engine import Engine as EngineClass

        self.steps = 0.0
        self._prices = prices  # by id() of each engine's contexts
        self._prefill = False
        pricer, run, reuse = self, Context._run, EngineClass._reuse

        def priced_run(ctx: Context, batch: Any, n_out: int) -> Any:
            price = pricer._prices.get(id(ctx))
            if price is not None and not pricer._prefill:
                pricer.steps += price(batch.n_tokens)
            return run(ctx, batch, n_out)

        def reuse_unpriced_for_the_target(
            engine: Engine, ctx: Context, attr: str, *a: Any, **k: Any
        ) -> int:
            pricer._prefill = attr == "_target_cache"
            try:
                return reuse(engine, ctx, attr, *a, **k)
            finally:
                pricer._prefill = False

        Context._run = priced_run  # type: ignore[method-assign]
        EngineClass._reuse = reuse_unpriced_for_the_target  # type: ignore[method-assign]

    @classmethod
    def of(cls, engines: Sequence[Engine]) -> PassPricer | None:
        """A pricer for the engines' contexts, or None where a model has no stored profile. The
        engines share their models: each model's profile is whichever engine has one (the plain
        engine, loaded before the arms measured theirs, may have none)."""
        target = next((e.profile for e in engines if e.profile), None)
        draft = next((e.draft_profile for e in engines if e.draft_profile), None)
        if target is None or (draft is None and any(e.draft_ctx for e in engines)):
            return None
        prices: dict[int, Callable[[int], float]] = {}
        for engine in engines:
            prices[id(engine.target_ctx)] = target.relative
            if engine.draft_ctx is not None and draft is not None:
                prices[id(engine.draft_ctx)] = partial(
                    scaled, draft.relative, draft.step_s / target.step_s
                )
        return cls(prices)

    def start(self) -> None:
        self.steps = 0.0


def scaled(relative: Callable[[int], float], scale: float, k: int) -> float:
    """A draft's pass of k tokens in target steps: its own T(k)/T(1) times its step's share."""
    return relative(k) * scale


def run_pairs(
    plain: Engine,
    engines: dict[str, Engine],
    settings: Sequence[Setting],
    prompts: Sequence[BenchPrompt],
    repeats: int,
    mode: str,
    temp: float = 0.0,
    pricer: PassPricer | None = None,
) -> tuple[Ratios, Ratios, dict[str, dict[str, list[dict[str, int]]]], InRun]:
    """Every repeat and prompt: plain decoding, then arms A and B (B first on odd repeats), each
    paired with that plain run. A line each; the ratios, the priced ratios (where `pricer`
    priced every run), each run's rounds by kind, and each run's speed over its own plain
    steps' (auto's, ngram's: timed in the same seconds, which the machine's drift between two
    runs does not move)."""
    ratios: Ratios = {"A": {}, "B": {}}
    in_run: InRun = {"A": {}, "B": {}}
    priced: Ratios = {"A": {}, "B": {}}
    rounds: dict[str, dict[str, list[dict[str, int]]]] = {"A": {}, "B": {}}
    for repeat in range(repeats):
        sampling = {"temperature": temp, "seed": repeat} if temp > 0 else {}
        for p in prompts:
            tokens = plain.prompt_tokens(p.text)
            priced_plain = None
            if pricer is not None:
                pricer.start()
            base = plain.generate(tokens, max_tokens=p.max_tokens, mode="target", **sampling)
            if pricer is not None and pricer.steps:
                priced_plain = base.stats.n_generated / pricer.steps
            plain_rate = base.stats.tokens_per_s
            if plain_rate <= 0:  # an end of text first: no speed to compare
                print(f"{p.name:24s} plain decoding made nothing: left out", flush=True)
                continue
            line = [f"{p.name:24s} plain {plain_rate:5.1f} tok/s"]
            for name in ("A", "B") if repeat % 2 == 0 else ("B", "A"):
                if pricer is not None:
                    pricer.start()
                with in_force(settings if name == "B" else ()):
                    result = engines[name].generate(
                        tokens, max_tokens=p.max_tokens, mode=mode, **sampling
                    )
                stats = result.stats
                ratio = stats.tokens_per_s / plain_rate
                ratios[name].setdefault(p.name, []).append(ratio)
                priced_ratio = ""
                if priced_plain is not None and pricer is not None and pricer.steps:
                    at_prices = stats.n_generated / pricer.steps / priced_plain
                    priced[name].setdefault(p.name, []).append(at_prices)
                    priced_ratio = f" (priced {at_prices:.2f})"
                rounds[name].setdefault(p.name, []).append(dict(stats.choices))
                in_run[name].setdefault(p.name, []).append(stats.in_run_ratio)
                same = "" if sampling or result.tokens == base.tokens else " (text differs)"
                line.append(f"{name} {ratio:.2f}{priced_ratio}{same} {dict(stats.choices)}")
            print(" | ".join(line), flush=True)
    return ratios, priced, rounds, in_run


def summary(prompts: Sequence[BenchPrompt], ratios: Ratios) -> Iterator[str]:
    """By class and over all: each arm's geometric mean, and B over A's with a 95 % interval
    for the run's timing noise (bench.noise_interval; none from one repeat)."""
    from edgespec.bench import noise_interval

    by_class: dict[str, list[str]] = {}
    for p in prompts:
        if p.name in ratios["A"]:
            by_class.setdefault(p.class_name, []).append(p.name)
    for class_name, names in [*by_class.items(), ("all", list(ratios["A"]))]:
        a = [r for n in names for r in ratios["A"][n]]
        b = [r for n in names for r in ratios["B"][n]]
        pairs = [
            [rb / ra for ra, rb in zip(ratios["A"][n], ratios["B"][n], strict=True)] for n in names
        ]
        sure = noise_interval(pairs)
        interval = f" ({sure.low:.3f}-{sure.high:.3f})" if sure else ""
        yield (
            f"  {class_name:8s} A {geometric_mean(a):.3f}  B {geometric_mean(b):.3f}  "
            f"B/A {geometric_mean([r for x in pairs for r in x]):.3f}{interval}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
