"""What auto's tries of the draft tell of chains: replayed on traced `chain` answers.

    .venv/bin/python scripts/try_replay.py --target T --draft D [--classes code,chat]
                                           [--repeats 3] [--prompts FILE]

For each prompt of the bench's suite (or FILE), once per repeat: a plain answer (its rate), then a
`--mode chain --no-ngram` answer whose every round is traced (tokens decided, seconds, the part of
them spent catching the draft up). Then a try is started at every round of each traced answer and
run by auto's rules (policy.try_goes_on: judged after TRY_ROUNDS rounds, on while undecided between
TRY_GIVE_UP and MARGIN of plain decoding, at most TRY_MAX_ROUNDS), and what the answers' rounds
made over plain decoding is set against two estimates from the tries: the mean of each try's
own rate over plain decoding's, and all tries' tokens over what plain decoding would have made
in all their time (policy.CeilingShare keeps the second, against the ceiling instead of plain
decoding). No time is measured twice: each try is priced by the rounds' own timings.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from edgespec.engine import Engine, _Run
from edgespec.policy import TRY_ROUNDS, try_goes_on


@dataclass(frozen=True)
class Round:
    tokens: int  # decided by its pass
    seconds: float  # drafting and verifying, catching the draft up aside


@dataclass(frozen=True)
class Try:
    tokens: int
    seconds: float
    rounds: int


def tries_of(rounds: Sequence[Round], plain_rate: float) -> list[Try]:
    """A try begun at every round of an answer, each run by auto's rules to its verdict (tries
    the answer ends before they are judged are left out, as auto does not judge them)."""
    tries = []
    for start in range(len(rounds)):
        tokens, seconds, n = 0, 0.0, 0
        for r in rounds[start:]:
            tokens, seconds, n = tokens + r.tokens, seconds + r.seconds, n + 1
            if not try_goes_on(n, tokens / seconds / plain_rate):
                break
        if n >= TRY_ROUNDS:
            tries.append(Try(tokens, seconds, n))
    return tries


@dataclass(frozen=True)
class Estimates:
    answers: float  # what the answers' rounds made over plain decoding, all together
    tries_mean: float  # the mean of each try's rate over plain decoding's
    tries_together: float  # all tries' tokens over what plain decoding made in their time
    n_tries: int


def estimates(answers: Sequence[tuple[Sequence[Round], float]]) -> Estimates:
    """From (rounds, plain decoding's rate) per answer."""
    made = sum(r.tokens for rounds, _ in answers for r in rounds)
    plain_made = sum(r.seconds * plain for rounds, plain in answers for r in rounds)
    tried = [(t, plain) for rounds, plain in answers for t in tries_of(rounds, plain)]
    if not tried:
        raise ValueError("no answer was long enough for a try")
    return Estimates(
        answers=made / plain_made,
        tries_mean=statistics.mean(t.tokens / t.seconds / plain for t, plain in tried),
        tries_together=sum(t.tokens for t, _ in tried) / sum(t.seconds * p for t, p in tried),
        n_tries=len(tried),
    )


def trace(engine: Engine, prompt_tokens: list[int], max_tokens: int) -> list[Round]:
    """The rounds of a `chain` answer (no n-gram rounds: the model's alone)."""
    rounds: list[Round] = []
    drafted_chain = Engine._auto_chain  # the greedy chain's round, without a --draft-max

    def traced(self: Engine, run: _Run, limit: int) -> list[int]:
        t0 = time.perf_counter()
        decided = drafted_chain(self, run, limit)
        rounds.append(Round(len(decided), time.perf_counter() - t0 - run.catch_up_s))
        return decided

    Engine._auto_chain = traced
    try:
        engine.forget_draft_cache()
        engine.generate(prompt_tokens, max_tokens=max_tokens, mode="chain", ngram=False)
    finally:
        Engine._auto_chain = drafted_chain
    return rounds


def main(argv: Sequence[str] | None = None) -> int:
    import edgespec
    from edgespec.bench import load_prompts

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--classes", default="code", help="prompt classes, comma-separated")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--target", required=True, help="target GGUF")
    ap.add_argument("--draft", required=True, help="draft GGUF")
    ap.add_argument("--prompts", help="a prompts TOML (default: the bench's suite)")
    ap.add_argument("--n-ctx", type=int, default=2048)
    args = ap.parse_args(argv)
    classes = set(args.classes.split(","))
    prompts = [p for p in load_prompts(args.prompts) if p.class_name in classes]
    if not prompts:
        sys.exit(f"no prompt of class {args.classes}")
    engine = edgespec.load(args.target, draft=args.draft, n_ctx=args.n_ctx)
    answers = []
    for _ in range(args.repeats):
        for p in prompts:
            tokens = engine.prompt_tokens(p.text)
            engine.forget_draft_cache()
            plain = engine.generate(tokens, max_tokens=p.max_tokens, mode="target").stats
            rounds = trace(engine, tokens, p.max_tokens)
            answers.append((rounds, plain.tokens_per_s))
            one = estimates([(rounds, plain.tokens_per_s)])
            print(
                f"{p.name:24s} chain {one.answers:.3f}x plain; tries: mean {one.tries_mean:.3f}, "
                f"together {one.tries_together:.3f} ({one.n_tries} tries)"
            )
    total = estimates(answers)
    print(
        f"all: chain {total.answers:.3f}x plain; tries: mean {total.tries_mean:.3f}, together "
        f"{total.tries_together:.3f} ({total.n_tries} tries of {len(answers)} answers)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
