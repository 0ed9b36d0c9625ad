"""Replay auto mode's n-gram path on a bench run's real outputs, against an oracle.

    .venv/bin/python scripts/ngram_replay.py bench.json [--prompts FILE]

For each prompt of a greedy `edgespec bench --json` run: the prompt's tokens and the target's own
greedy tokens are replayed round by round. "auto" decides as `--mode auto` does between a plain
step and an n-gram proposal (the same drafter, learning and length choice; no model drafts);
"oracle" knows how many proposed tokens are right and verifies exactly those. Every round is
priced with this device's curve T(k)/T(1) (its stored profile), so the figures are free of
timing noise: they say what the policy leaves on the table, not how fast a run was. A change
tuned here should gain on scripts/holdout_prompts.toml too (its header says how to replay it).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edgespec.engine import MAX_NGRAM_DRAFT
from edgespec.ngram import NgramDrafter
from edgespec.policy import NGRAM_MARGIN, Costs, LossBudget, best_proposal_length


@dataclass
class Replay:
    speedup: float  # over plain decoding, in target steps
    passes: Counter[int]  # target passes by the number of tokens they verified (1: a plain step)


def replay(
    prompt: Sequence[int],
    generated: Sequence[int],
    curve: Callable[[int], float],
    oracle: bool,
    sizes: tuple[int, ...] = (),
) -> Replay:
    """The n-gram path on this text, decided by auto's policy or by the oracle; `sizes`: where
    the curve was measured (policy.Costs.sizes)."""
    tokens = [*prompt, *generated]
    end, position = len(tokens), len(prompt)
    drafter, budget = NgramDrafter(), LossBudget()
    costs = Costs(curve, sizes)
    costs.step_s.update(1.0)  # seconds in units of one plain step
    steps = 1.0  # auto's first round is a plain step that measures the step
    passes = Counter([1])
    position += 1
    while position < end:
        # as in the engine: no proposal past the last token to generate
        proposal = drafter.propose(tokens[:position], min(MAX_NGRAM_DRAFT, end - position - 1))
        right = 0
        while right < len(proposal.tokens) and proposal.tokens[right] == tokens[position + right]:
            right += 1
        length, rate = 0, 0.0
        if proposal.tokens:
            allowed = budget.longest(costs, len(proposal.tokens))
            length, rate = best_proposal_length(
                drafter.acceptances(proposal.ngram, allowed, proposal.streak), costs
            )
        drafter.watch(proposal, position)
        if oracle:
            length, rate = right, float("inf")
        if length > 0 and rate > NGRAM_MARGIN / costs.verify_s(1):  # auto's test: beat a plain step
            steps += costs.relative(length + 1)
            passes[length + 1] += 1
            position += min(right, length) + 1
            budget.record(min(right, length) + 1, costs.steps(length + 1))
        else:
            steps += 1.0
            passes[1] += 1
            position += 1
    return Replay(len(generated) / steps, passes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("--prompts", type=Path, default=None, help="the run's prompt file")
    args = parser.parse_args()

    import edgespec
    from edgespec.bench import load_prompts

    run = json.loads(args.bench_json.read_text("utf-8"))
    settings = run["settings"]
    if not settings.get("greedy", True):  # auto's decisions are replayed on greedy text only
        parser.error(f"{args.bench_json} is a sampling run (--temp): replay a greedy one")
    engine = edgespec.load(settings["target"]["path"], n_ctx=settings["n_ctx"])
    generated = {row["prompt"]: row["tokens"] for row in run["rows"] if row["mode"] == "target"}
    by_class: dict[str, dict[str, list[float]]] = {}
    print(f"{'prompt':28} {'class':8} {'auto':>6} {'oracle':>6}  auto's passes (tokens: how many)")
    for prompt in load_prompts(args.prompts):
        if prompt.name not in generated:
            continue
        tokens = engine.prompt_tokens(prompt.text)
        auto, oracle = (
            replay(
                tokens,
                generated[prompt.name],
                engine.relative_cost,
                oracle=is_oracle,
                sizes=engine.pass_sizes,
            )
            for is_oracle in (False, True)
        )
        sizes = " ".join(f"{k}:{n}" for k, n in sorted(auto.passes.items()))
        ratios = f"{auto.speedup:6.2f} {oracle.speedup:6.2f}"
        print(f"{prompt.name:28} {prompt.class_name:8} {ratios}  {sizes}")
        of_class = by_class.setdefault(prompt.class_name, {"auto": [], "oracle": []})
        of_class["auto"].append(auto.speedup)
        of_class["oracle"].append(oracle.speedup)
    for class_name, ratios in by_class.items():
        medians = "  ".join(f"{name} {statistics.median(r):.2f}" for name, r in ratios.items())
        print(f"median {class_name:8} {medians}")


if __name__ == "__main__":
    main()
