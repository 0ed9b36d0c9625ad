"""The best speed-up any policy could reach on this device with these drafters (an oracle).

    .venv/bin/python scripts/ceiling.py bench.json [--prompts FILE] [--draft-cost C]

For each prompt of a greedy `edgespec bench --json` run, on the target's own tokens: at every
position, how many of the next tokens (a) the n-gram drafter's proposal there has right (the
proposal it makes when every round is a plain step) and (b) the draft model has right (its argmax
teacher-forced on the target's tokens). A dynamic programme then finds the cheapest way through
the text in plain target steps, where each round is a plain step, a verified n-gram proposal or a
model chain, each of whatever length is cheapest: a pass of k tokens is priced by this device's
stored profile of the target (a size between measured ones as the next measured one up, as auto
prices it), each drafted token at the draft's step in target steps (timed here, unless given).

A ceiling, not a forecast: the oracle knows how many tokens will be accepted, and nothing is
timed but the draft's cost. In the columns without a star the draft never evaluates text it did
not draft; in the starred ones it does, as a real draft must, in one batch before its next chain
(priced by the draft's own profile, its last DRAFT_BEHIND_CAP tokens at most): the target's own
token after every chain, and every token of plain and n-gram rounds. The issue's goals
were set against such an oracle on another CPU (in the notes the project began from); this says
what they can be on this one.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from edgespec.engine import DRAFT_WINDOW, MAX_NGRAM_DRAFT

MAX_LEN = MAX_NGRAM_DRAFT  # longest proposal of either drafter
# A draft further behind than this catches up on the text's last this many tokens only (it has
# the text's start: the rest of engine.catch_up_positions).
DRAFT_BEHIND_CAP = DRAFT_WINDOW


def min_steps(
    n_tokens: int,
    ngram_right: Sequence[int],
    draft_right: Sequence[int] | None,
    pass_steps: Callable[[int], float],
    draft_cost: float,
    max_len: int = MAX_LEN,
    catch_up: Callable[[int], float] | None = None,
) -> float:
    """The fewest plain target steps that yield `n_tokens` tokens. At position i (tokens already
    generated) a round is a plain step (1 step, 1 token), or verifies L <= ngram_right[i] n-gram
    tokens (pass_steps(L + 1), L + 1 tokens: the accepted ones and the target's own), or drafts
    and verifies L <= draft_right[i] model tokens (L evaluations of the draft more). No round
    yields past the end: the last token is the target's own in any case.

    A chain's first evaluation takes in the tokens the draft lacks, b of them, at `catch_up(b)`
    target steps (a batch): those of plain and n-gram rounds, and after a chain taken whole its
    last drafted token and the target's own. None: a draft step, whatever b, as if the draft
    knew the text for free, which no real draft does; its others cost `draft_cost` each."""
    cap = DRAFT_BEHIND_CAP
    # what the first evaluation costs at each lag, priced once (a draft is never 0 behind)
    first_evaluation = [0.0] + [catch_up(b) if catch_up else draft_cost for b in range(1, cap + 1)]
    # best[i][b]: the fewest steps from position i with the draft b tokens behind (b <= cap)
    best = [[0.0] * (cap + 1) for _ in range(n_tokens + 1)]
    behind = [min(b, cap) for b in range(cap + max_len + 2)]
    for i in range(n_tokens - 1, -1, -1):
        room = min(max_len, n_tokens - 1 - i)
        # after a chain the draft lacks two tokens: its last drafted one and the target's own
        chain = min(
            (
                (length - 1) * draft_cost + pass_steps(length + 1) + best[i + length + 1][2]
                for length in range(1, min(draft_right[i] if draft_right else 0, room) + 1)
            ),
            default=None,
        )
        copies = [
            (pass_steps(length + 1), i + length + 1, length + 1)
            for length in range(1, min(ngram_right[i], room) + 1)
        ]
        for b in range(1, cap + 1):
            cost = 1.0 + best[i + 1][behind[b + 1]]
            for steps, at, n in copies:
                cost = min(cost, steps + best[at][behind[b + n]])
            if chain is not None:
                cost = min(cost, first_evaluation[b] + chain)
            best[i][b] = cost
    return best[0][1]


def runs_of_agreement(agrees: Sequence[bool]) -> list[int]:
    """For each position, how many consecutive positions from it on agree."""
    runs = [0] * (len(agrees) + 1)
    for i in range(len(agrees) - 1, -1, -1):
        runs[i] = runs[i + 1] + 1 if agrees[i] else 0
    return runs[:-1]


def ngram_right(prompt: Sequence[int], generated: Sequence[int]) -> list[int]:
    """How many tokens of the n-gram drafter's proposal at each generated position are right,
    the drafter proposing and learning every round as in a run of plain steps."""
    from edgespec.ngram import NgramDrafter

    tokens = [*prompt, *generated]
    drafter, right = NgramDrafter(), []
    for position in range(len(prompt), len(tokens)):
        proposal = drafter.propose(tokens[:position], min(MAX_LEN, len(tokens) - position - 1))
        drafter.watch(proposal, position)
        n = 0
        while n < len(proposal.tokens) and proposal.tokens[n] == tokens[position + n]:
            n += 1
        right.append(n)
    return right


def draft_agrees(engine, prompt: Sequence[int], generated: Sequence[int]) -> list[bool]:
    """Whether the draft's argmax, teacher-forced on prompt + generated, is each generated token.
    The answer is fed a token a pass, as drafting feeds it: in one batch a narrowed draft would
    learn the answer's rare tokens (its extra tokens, scored apart) before predicting them
    (palindrome's code on the Zen 3: 0.963 of the tokens agreed that way, 0.925 a token a pass)."""
    ctx, head = engine.draft_ctx, engine.draft.head
    tokens = [*prompt, *generated]
    engine.forget_draft_cache()
    if len(prompt) > 1:
        ctx.decode(prompt[:-1], 0, logits="none")
    agrees = []
    for p in range(len(prompt), len(tokens)):
        best = int(ctx.decode(tokens[p - 1 : p], p - 1)[-1].argmax())
        agrees.append((best if head is None else head.ids[best]) == tokens[p])
    engine.forget_draft_cache()
    return agrees


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("--prompts", type=Path, default=None, help="the run's prompt file")
    parser.add_argument(
        "--draft-cost", type=float, default=None, help="a draft step in target steps"
    )
    args = parser.parse_args()

    import edgespec
    from edgespec.bench import load_prompts
    from edgespec.engine import quiet
    from edgespec.policy import Costs
    from edgespec.profile import fastest_steps

    run = json.loads(args.bench_json.read_text("utf-8"))
    settings = run["settings"]
    if not settings.get("greedy", True):
        parser.error(f"{args.bench_json} is a sampling run (--temp): give a greedy one")
    draft = (settings.get("draft") or {}).get("path")
    engine = edgespec.load(settings["target"]["path"], draft, n_ctx=settings["n_ctx"])
    engine.profile_if_missing(print)
    prices = Costs(engine.relative_cost, engine.pass_sizes)
    draft_cost = args.draft_cost
    if draft_cost is None and engine.draft_ctx is not None:
        target_s, draft_s = fastest_steps([engine.target_ctx, engine.draft_ctx])
        draft_cost = draft_s / target_s
    sizes = ", ".join(f"{k}: {prices.relative(k):.2f}" for k in (2, 3, 4, 8, 16, 32))
    print(f"T(k)/T(1) {sizes}; a draft step {draft_cost or 0:.2f} target steps")

    generated = {row["prompt"]: row["tokens"] for row in run["rows"] if row["mode"] == "target"}
    columns = ["n-gram"]
    if engine.draft_ctx is not None:
        columns += ["model", "both", "model*", "both*"]
        # A profile measured busy prices nothing (engine.quiet): the target's prices instead.
        draft_profile = quiet(engine.draft_profile) or quiet(engine.profile)
        draft_curve = draft_profile.relative if draft_profile else engine.relative_cost

        def catch_up(behind: int) -> float:
            return draft_cost * draft_curve(min(behind, DRAFT_BEHIND_CAP))

    by_class: dict[str, list[list[float]]] = {}
    print(f"{'prompt':28} {'class':8} " + " ".join(f"{c:>7}" for c in columns) + "  draft agrees")
    for prompt in load_prompts(args.prompts):
        if prompt.name not in generated:
            continue
        prompt_tokens, tokens = engine.prompt_tokens(prompt.text), generated[prompt.name]
        ngram = ngram_right(prompt_tokens, tokens)
        no_ngram = [0] * len(tokens)
        ratios = [len(tokens) / min_steps(len(tokens), ngram, None, prices.relative, 0.0)]
        agreement = ""
        if engine.draft_ctx is not None:
            agrees = draft_agrees(engine, prompt_tokens, tokens)
            model = runs_of_agreement(agrees)
            for sync in (None, catch_up):
                for right in (no_ngram, ngram):
                    steps = min_steps(
                        len(tokens), right, model, prices.relative, draft_cost, catch_up=sync
                    )
                    ratios.append(len(tokens) / steps)
            agreement = f"{np.mean(agrees):.0%}"
        cells = " ".join(f"{r:7.2f}" for r in ratios)
        print(f"{prompt.name:28} {prompt.class_name:8} {cells}  {agreement}")
        by_class.setdefault(prompt.class_name, []).append(ratios)
    for class_name, rows in by_class.items():
        medians = " ".join(
            f"{statistics.median(r[i] for r in rows):7.2f}" for i in range(len(columns))
        )
        print(f"{'median':28} {class_name:8} {medians}")
    if len(columns) > 1:
        print(
            "*: the draft evaluates the tokens it did not draft before its next chain, in one batch"
        )


if __name__ == "__main__":
    main()
