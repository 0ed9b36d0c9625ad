"""Flags shared by `run` and `chat`. None means "not given": the config file, the environment or
the default decides (edgespec.config.resolve), so every value flag here defaults to None."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgespec.config import Settings


def path(value: str) -> Path:
    """A file argument's parser: typer reads an empty one as ".", and a command then spoke of a
    directory nobody named ("not a file: .")."""
    if not value:
        raise typer.BadParameter("the path is empty")
    return Path(value)


Target = Annotated[
    str | None,
    typer.Option(
        "--target", "-m", help="Target GGUF path or catalogue name [default: the Qwen 1.5B]"
    ),
]
Draft = Annotated[
    str | None,
    typer.Option(
        help="Draft GGUF path or catalogue name (qwen2.5-coder-0.5b: in its fastest form here) "
        "[default: the Qwen 0.5B, when no target is named (--target, EDGESPEC_TARGET or "
        "config.toml)]"
    ),
]
Mode = Annotated[
    str | None,
    typer.Option(
        help="auto (choose per round what pays on this device), target (plain decoding), "
        "chain, tree (LLMCad token tree) or ngram (prompt lookup) [default: auto]"
    ),
]
MaxTokens = Annotated[
    int | None,
    typer.Option(
        "--max-tokens", "-n", help=f"Tokens to generate at most [default: {Settings.max_tokens}]"
    ),
]
Temp = Annotated[
    float | None, typer.Option("--temp", help="Sampling temperature; 0 is greedy [default: 0]")
]
TopK = Annotated[int | None, typer.Option("--top-k", help="Keep the k most likely tokens (0: off)")]
TopP = Annotated[
    float | None,
    typer.Option("--top-p", help="Keep the most likely tokens up to this mass (1: off)"),
]
MinP = Annotated[
    float | None,
    typer.Option("--min-p", help="Drop tokens below this fraction of the best one (0: off)"),
]
Seed = Annotated[
    int | None,
    typer.Option(
        help="Random seed for sampling: the same text again in --mode target, ngram with "
        "--draft-max, chain with --draft-max, --no-ngram and --no-pipeline, tree with --no-ngram "
        "and --raw-confidence (elsewhere drafting adapts to speed)"
    ),
]
Threads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        "-t",
        help="Target threads, at most (see --fixed-threads) [default: one per --target-cpus CPU]",
    ),
]
DraftThreads = Annotated[
    int | None, typer.Option(help="Draft threads, at most [default: one per --draft-cpus CPU]")
]
AdaptThreads = Annotated[
    bool,
    typer.Option(
        "--adapt-threads/--fixed-threads",
        help="Use a thread fewer while other programs keep a core busy, where that is faster "
        "(a thread on a shared core holds the others back), and all again when it is free",
    ),
]
TargetCpus = Annotated[
    str | None,
    typer.Option(
        metavar="LIST",
        help="CPUs for the target, e.g. 0-3 [default: the big cores; all when cores are equal]",
    ),
]
DraftCpus = Annotated[
    str | None,
    typer.Option(
        metavar="LIST",
        help="CPUs for the draft, e.g. 4-7 [default: the little cores; all when cores are equal]",
    ),
]
CtxSize = Annotated[
    int | None,
    typer.Option(
        "--ctx-size",
        "-c",
        help="Context size in tokens, at most what the target was trained for (a draft "
        "trained for fewer is noted on stderr: it drafts worse past that) "
        f"[default: {Settings.ctx_size}, or less for a model trained for less; more where a "
        "longer prompt or message and its answer need it and memory allows]",
    ),
]
DraftMax = Annotated[
    int | None,
    typer.Option(
        help="Tokens a chain drafts, or an ngram round proposes, per verification [default: "
        "chain: on while one more token raises the expected rate (the draft's calibrated "
        "confidence against this device's costs), at most 16; ngram: as much of its proposal "
        "as pays, at most 32]"
    ),
]
Pipeline = Annotated[
    bool | None,
    typer.Option(
        "--pipeline/--no-pipeline",
        help="LLMCad's pipeline (chain, auto): the draft drafts on while the target verifies, "
        "each on its own --target-cpus/--draft-cpus [default: where `edgespec profile "
        "--overlap` measured it paying]",
    ),
]
System = Annotated[str | None, typer.Option(help="System message (chat template)")]
ChatTemplate = Annotated[
    Path | None,
    typer.Option(
        "--chat-template", help="A Jinja chat template file [default: the GGUF's]", parser=path
    ),
]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's log")]
BranchP = Annotated[float, typer.Option(help="Tree: a candidate this probable starts a branch")]
MaxBranches = Annotated[int, typer.Option(help="Tree: branches at most")]
MaxNodes = Annotated[int, typer.Option(help="Tree: nodes per verification at most (root included)")]
MaxDepth = Annotated[int, typer.Option(help="Tree: depth at most")]
Alpha0 = Annotated[
    float | None,
    typer.Option(
        help="Tree: first confidence threshold for verifying [default: 0.3 fixed, 0.01 adaptive]"
    ),
]
Scheduler = Annotated[str, typer.Option(help="Tree: branch scheduler, pacer (LLMCad) or greedy")]
Ngram = Annotated[
    bool,
    typer.Option(
        "--ngram/--no-ngram",
        help="Chain, tree: also draft with the n-gram drafter (its proposal alone where it "
        "promises more than the model; in greedy trees, a branch)",
    ),
]
Calibrated = Annotated[
    bool,
    typer.Option(
        "--calibrated/--raw-confidence",
        help="Tree: weigh draft tokens by how often the target has accepted tokens the "
        "draft was as sure of, not by the draft's own probability (LLMCad)",
    ),
]
AdaptiveAlpha = Annotated[
    bool | None,
    typer.Option(
        "--adaptive-alpha/--fixed-alpha",
        help="Tree: after each verification move alpha as LLMCad does, or keep --alpha0 "
        "[default: fixed on calibrated confidences, adaptive on raw ones]",
    ),
]
Files = Annotated[
    list[Path] | None,
    typer.Option(
        "--file",
        "-f",
        metavar="<Path>",
        help="A file whose text goes before the prompt (chat: the first message), fenced under "
        "its name; repeatable; run: '-' is stdin's",
        parser=path,
    ),
]
