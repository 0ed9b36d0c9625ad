"""Generation: plain decoding of the target and speculative decoding with a draft.

Every mode runs the same loop. A round starts with the last committed token (the "root") not
yet evaluated by the target; the mode evaluates it, possibly with proposed continuations, and
returns the tokens the target decided. Both KV caches are then trimmed so that sequence 0 holds
exactly the committed tokens (the draft may lag behind and catches up in its next round).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path

import numpy as np

from . import chat
from .backend import Context, Model
from .cores import (
    PinnedCall,
    Placement,
    format_cpu_list,
    needs_pinning,
    pinned_thread,
    plan_placement,
    threads_by_cpus,
)
from .draft_head import MAX_EXTRA_TOKENS
from .errors import BadSettingError, ContextOverflowError, EdgespecError, ModelFileError
from .files import user_path
from .gguf_info import GGUFInfo, check_generates, check_pair, read_gguf
from .governor import ThreadGovernor
from .interrupts import interrupts_held
from .memory import RUN_REMEDY, free_memory, memory_need, shortage
from .ngram import NgramDrafter, Proposal
from .policy import (
    Arm,
    AutoPolicy,
    Calibrator,
    CeilingShare,
    Costs,
    LossBudget,
    ModelOrNgram,
    best_pass_size,
    best_proposal_length,
    worth_drafting_on,
    worth_growing,
)
from .profile import (
    DEFAULT_RELATIVE,
    AutoMemory,
    DeviceProfile,
    fastest_steps,
    kept_profile,
    load_auto_memory,
    load_batch_factor,
    load_pipeline_speedup,
    load_profile,
    measuring_alone,
    quick_profile,
    relative_cost,
    save_auto_memory,
    save_batch_factor,
    save_profile,
    steps_in_turns,
)
from .sampling import (
    RowsOnDemand,
    SamplingParams,
    accept_chain,
    accept_point_mass,
    draw_children,
    is_real,
    is_whole,
    probs_from_logits,
    sample,
)
from .scheduler import GreedyScheduler, PacerScheduler, TriggerConfig, next_alpha, verify_cause
from .stats import Stats, TreeStats
from .text import Detokenizer, StopMatcher
from .tree import (
    TokenTree,
    branch_children,
    greedy_accept,
    may_branch,
    sampled_accept,
    sampled_children,
    summarize,
    top_candidates,
    verification_batch,
)

MODES = ("target", "chain", "tree", "ngram", "auto")
MAX_AUTO_DRAFT = 16  # longest model chain auto mode considers (and chain mode, by default)
# Longest n-gram proposal auto and ngram modes consider. Copies run long in edits, and a pass of
# 32 costs less per token than one of 16 (on a Zen 4 here 13.0 steps against 8.5; on a Zen 5 9.3
# against 5.3). Replayed on the bench's outputs (scripts/ngram_replay.py) with the Zen 4 curve,
# 32 against 16 made rename 1.51 -> 1.75x, quote-dates 1.71 -> 2.04x, add-type-hints 1.31 ->
# 1.33x and the held-out edits 1.64-1.83 -> 1.88-2.23x; with the Zen 5 curve rename 2.11 ->
# 2.20x and the held-out edits 2.50-2.74 -> 2.50-3.00x; no prompt lower on either (given
# ngram.FAR_POSITION: without it, edits whose copies break every line lost 1-4 %).
MAX_NGRAM_DRAFT = 32
# The pipeline drafts on past a chain under verification at most this far, and only while the
# tokens stay this likely to be used: the draft shares the memory bus with the target. Drafting
# on regardless made 0.88-0.98 of this on a 1+1 core split here; 0.3 won on chat, lost on code.
MAX_AHEAD = MAX_AUTO_DRAFT
AHEAD_MIN_REACH = 0.1
DRAFT_TIMING_STEPS = 10  # steps of each model timed where a remembered draft cost shuts the gate
CATCH_UP_BATCH = 32  # the pass whose cost per token prices a draft's catching up
# A draft behind the text by more than DRAFT_SINK + DRAFT_WINDOW tokens (a prompt, in chain and
# tree modes; what auto decided without it) is caught up on the text's first DRAFT_SINK tokens
# (the chat template's start, the request's first words) and its last DRAFT_WINDOW only. At ~8 ms
# a token here, catching up on a summary's 300-token prompt took 2.6 of a chain's 12 s, and on
# code it kept auto from trying a chain at all (it passed the 5 % of the answer allowed for it).
# The draft proposes as well from the recent tokens on code; on a long text it proposes less,
# where the n-gram drafter copies. (docs/speed.md, "A draft that sees the recent text only")
DRAFT_SINK = 32
DRAFT_WINDOW = 24
SCHEDULERS = ("pacer", "greedy")
PROFILES_TOGETHER_S = 600  # two profiles this close in time saw the same machine load
# Within this fraction of the stored one, a generation's pass factor is the same (timing noise):
# the stored file is rewritten only when it moved by more.
PASS_FACTOR_TOLERANCE = 0.05
N_SEQ_MAX = 16  # sequence ids per context: room for a tree's branches
MAX_NODES = 128  # largest tree: one verification batch
DEFAULT_CTX = 2048  # tokens of context when none is asked for
ANSWER_ROOM = 512  # tokens of answer a --ctx-size suggested for a prompt leaves room for
MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS: llama.cpp aborts above it
LLMCAD_ALPHA0 = 0.01  # LLMCad's first alpha, adapted after every verification
FIXED_ALPHA = 0.3  # verify once the best branch is less likely than this to be accepted in full


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 256
    mode: str | None = None  # None: speculate when a draft is loaded, else plain
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    # Tokens a chain drafts, an n-gram round proposes. None: chain mode drafts as auto's chains
    # do, while one more token raises the expected rate; n-gram mode verifies as much of its
    # proposal as pays.
    draft_max: int | None = None
    stop: Sequence[str] = ()
    chat: bool | None = None  # None: use the chat template when the target has one
    system: str | None = None
    chat_template: str | None = None  # a Jinja chat template; None: the target's GGUF's
    # token tree (mode "tree")
    branch_p: float = 0.3  # a candidate this probable starts a branch (LLMCad's 30 %)
    max_branches: int = 4
    max_nodes: int = 16  # tree size, root included: bounds the verification batch
    max_depth: int = 8
    alpha0: float | None = None  # initial confidence threshold for verifying; see alpha_rule
    adaptive_alpha: bool | None = None  # LLMCad's update of alpha after each verification
    scheduler: str = "pacer"
    # Chain and tree modes also draft with the n-gram drafter: a round of its own where its
    # proposal promises more than the model (copied text), and a branch of greedy trees.
    ngram: bool = True
    calibrated: bool = True  # trees weigh draft tokens by their learnt acceptance

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, self.seed)

    def alpha_rule(self) -> tuple[float, bool]:
        """The tree's first alpha and whether it adapts, where not given.

        Calibrated confidences (trees by default) are chances that the target accepts the
        branch, and for a given amount of drafting the most tokens come from stopping at a fixed
        such chance: FIXED_ALPHA, measured here. The draft's raw probabilities
        (--raw-confidence) are no such chances; LLMCad's rule from 0.01 on learns how far to
        trust them.
        """
        adaptive = not self.calibrated if self.adaptive_alpha is None else self.adaptive_alpha
        default = LLMCAD_ALPHA0 if adaptive else FIXED_ALPHA
        return (default if self.alpha0 is None else self.alpha0), adaptive

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # one stop string, not one for each of its characters
            object.__setattr__(self, "stop", (self.stop,))

    def validate(self, has_draft: bool) -> None:
        _ = self.sampling  # validates the sampling settings
        # Types first: a float token count or a string fails deep inside drafting otherwise,
        # or not at all (2.5 tokens made 3).
        wholes = {
            "--max-tokens": self.max_tokens,
            "--draft-max": self.draft_max,
            "--max-branches": self.max_branches,
            "--max-nodes": self.max_nodes,
            "--max-depth": self.max_depth,
        }
        for flag, value in wholes.items():
            if not ((value is None and flag == "--draft-max") or is_whole(value)):
                raise BadSettingError(f"{flag} must be a whole number (got {value!r})")
        for flag, value in (("--branch-p", self.branch_p), ("--alpha0", self.alpha0)):
            if not ((value is None and flag == "--alpha0") or is_real(value)):
                raise BadSettingError(f"{flag} must be a number (got {value!r})")
        if not isinstance(self.stop, Sequence) or not all(isinstance(s, str) for s in self.stop):
            raise BadSettingError(f"--stop must be text or a sequence of texts (got {self.stop!r})")
        # A string is true: ngram="no" turned the n-gram drafter on. (None: chosen per run.)
        switches = {"ngram": self.ngram, "calibrated": self.calibrated}
        switches.update(chat=self.chat or False, adaptive_alpha=self.adaptive_alpha or False)
        for name, value in switches.items():
            if not isinstance(value, bool):
                raise BadSettingError(f"{name} must be True or False (got {value!r})")
        if self.system is not None and not isinstance(self.system, str):
            raise BadSettingError(f"--system must be text (got {self.system!r})")
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise BadSettingError(
                f"--chat-template must be text (got {type(self.chat_template).__name__})"
            )
        checks = [
            (self.max_tokens >= 1, f"--max-tokens must be at least 1 (got {self.max_tokens})"),
            (all(self.stop), "--stop must not be empty (it would stop before any text)"),
            (
                self.draft_max is None or 1 <= self.draft_max <= 64,
                f"--draft-max must be between 1 and 64 (got {self.draft_max})",
            ),
            (
                self.mode is None or self.mode in MODES,
                f"--mode must be one of {', '.join(MODES)} (got {self.mode!r})",
            ),
            (
                self.mode in (None, "target", "ngram", "auto") or has_draft,
                f"--mode {self.mode} needs a draft model (--draft)",
            ),
            (0 < self.branch_p <= 1, f"--branch-p must be in (0, 1] (got {self.branch_p})"),
            (
                1 <= self.max_branches <= N_SEQ_MAX,
                f"--max-branches must be between 1 and {N_SEQ_MAX} (got {self.max_branches})",
            ),
            (
                2 <= self.max_nodes <= MAX_NODES,
                f"--max-nodes must be between 2 and {MAX_NODES} (got {self.max_nodes})",
            ),
            (
                1 <= self.max_depth <= 64,
                f"--max-depth must be between 1 and 64 (got {self.max_depth})",
            ),
            (
                self.alpha0 is None or 0 < self.alpha0 <= 1,
                f"--alpha0 must be in (0, 1] (got {self.alpha0})",
            ),
            (
                self.scheduler in SCHEDULERS,
                f"--scheduler must be one of {', '.join(SCHEDULERS)} (got {self.scheduler!r})",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise BadSettingError(message)


GENERATION_SETTINGS = frozenset(f.name for f in fields(GenerationConfig))


@dataclass
class Result:
    text: str
    tokens: list[int]
    stats: Stats

    def to_dict(self) -> dict[str, object]:
        return {"text": self.text, "tokens": self.tokens, "stats": self.stats.to_dict()}


@dataclass
class _Run:
    """The state of one generation: committed tokens and how much of them each cache holds."""

    tokens: list[int]  # prompt + generated; the last one is the root of the next round
    n_prompt: int
    cfg: GenerationConfig
    stats: Stats
    target_cached: int = 0  # tokens[:target_cached] are in the target's sequence 0
    draft_cached: int = 0
    generated: list[int] = field(default_factory=list)
    alpha: float = 0.01  # the tree's verification threshold, carried across rounds
    adaptive_alpha: bool = True
    sampling: SamplingParams = field(default_factory=SamplingParams)
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    ngram: NgramDrafter = field(default_factory=NgramDrafter)
    ngram_budget: LossBudget = field(default_factory=LossBudget)  # what n-gram passes may lose
    # What passes and draft steps cost here, measured while generating (speculative modes).
    costs: Costs = field(default_factory=lambda: Costs(_default_curve, DEFAULT_SIZES))
    policy: AutoPolicy | None = None  # mode "auto"
    drafters: ModelOrNgram = field(default_factory=ModelOrNgram)  # chain and tree modes
    # How often the target agrees with the draft's argmax, by the draft's probability of it:
    # learnt from every verification of this generation (auto's policy shares it).
    calibrator: Calibrator = field(default_factory=Calibrator)
    draft_step_s: float = 0.0  # one draft evaluation in the last drafted chain, catching up aside
    catch_up_s: float = 0.0  # what catching the draft up cost in the last round that drafted
    warmed_up: bool = False  # a plain step was taken since the prompt (the first is not timed)
    last_choice: str = ""  # auto: what drafted the last round ("plain", "ngram", "chain"...)
    pipeline: bool = False  # chains draft on while the target verifies
    ahead: _Ahead | None = None  # what the pipeline drafted that the next chain starts with
    superseded: bool = False  # cut short: another generation began on the engine
    decode_ended_at: float | None = None  # perf_counter() where stats.decode_s was last set


@dataclass
class _Ahead:
    """Draft tokens the pipeline drafted past a chain while the target verified it, which the
    verification left standing (it accepted the chain and chose their first token itself): the
    next chain starts with them. The draft's cache holds all of them but the last."""

    at: int  # they continue the first `at` committed tokens
    tokens: list[int]
    confidences: list[float]


DEFAULT_SIZES = tuple(sorted(DEFAULT_RELATIVE))


def catch_up_positions(
    cached: int, end: int, sink: int = DRAFT_SINK, window: int = DRAFT_WINDOW
) -> list[int]:
    """The positions of [cached, end) a draft evaluates to catch up: all of them, or those of the
    text's first `sink` tokens it lacks and its last `window` where there are more."""
    if end - cached <= sink + window:
        return list(range(cached, end))
    return [*range(cached, min(sink, end - window)), *range(end - window, end)]


def quiet(profile: DeviceProfile | None) -> DeviceProfile | None:
    """A profile to price and govern by: not one measured on a busy device (its curve is the
    load's as much as the device's: DeviceProfile.busy)."""
    return profile if profile is not None and not profile.busy else None


def _default_curve(k: int) -> float:
    """T(k)/T(1) where this device has no profile: a curve measured on a CPU like it."""
    return relative_cost(DEFAULT_RELATIVE, k)


class Engine:
    """A target model, optionally a draft model, and one context for each."""

    def __init__(
        self,
        target: Model,
        draft: Model | None = None,
        *,
        n_ctx: int = 2048,
        threads: int | None = None,
        draft_threads: int | None = None,
        placement: Placement | None = None,
        pipeline: bool | None = None,
        adapt_threads: bool = True,
    ):
        """`pipeline`: LLMCad's pipeline for chains (chain and auto modes), the draft drafting
        on while the target verifies, each on CPUs of its own. None: where `edgespec profile
        --overlap` measured it paying on this device with these models and CPUs.
        `adapt_threads`: `threads` and `draft_threads` are the most each model uses; fewer
        while other programs keep cores busy (governor.py). False: always that many."""
        check_ctx_size(n_ctx, target.n_ctx_train, target.path)
        self.placement = placement or plan_placement()
        check_threads(threads, draft_threads)
        check_pipeline(pipeline, draft is not None, self.placement)
        threads = threads or len(self.placement.target_cpus)
        draft_threads = draft_threads or len(self.placement.draft_cpus)
        self.threads, self.draft_threads = threads, draft_threads
        self.target = target
        self.draft = draft
        # T(k)/T(1) of the target on this device: its stored profile, else a measured default.
        self._price_passes_by(
            load_profile(target.path, threads, format_cpu_list(self.placement.target_cpus), n_ctx)
        )
        # The draft's step time, if `edgespec profile` measured it: auto mode can then tell
        # whether drafting can pay here before trying it.
        self.draft_profile = (
            load_profile(
                draft.path, draft_threads, format_cpu_list(self.placement.draft_cpus), n_ctx
            )
            if draft
            else None
        )
        # Each model attends as `edgespec profile` found faster here, if it was measured.
        self.target_ctx = Context(
            target,
            n_ctx=n_ctx,
            n_threads=threads,
            n_seq_max=N_SEQ_MAX,
            pinned=pinned_thread(self.placement.target_cpus, "target"),
            flash_attn=self.profile.flash_attn if self.profile else None,
        )
        self.draft_ctx: Context | None = None
        if draft:
            self.draft_ctx = Context(
                draft,
                n_ctx=n_ctx,
                n_threads=draft_threads,
                n_seq_max=N_SEQ_MAX,
                pinned=pinned_thread(self.placement.draft_cpus, "draft"),
                flash_attn=self.draft_profile.flash_attn if self.draft_profile else None,
                vocab_limit=target.n_vocab,  # a padded vocabulary's extra tokens
            )
        self.adapt_threads = adapt_threads
        self._govern()
        self.n_ctx = self.target_ctx.n_ctx
        # The tokens each cache's sequence 0 holds, from position 0: reused by the next prompt.
        self._target_cache: list[int] = []
        self._draft_cache: list[int] = []
        # The last stream begun and its rounds, until another begins (see _begin).
        self._open: tuple[Stream, Generator[list[int], None, None]] | None = None
        # Held while it computes (see _one_thread); re-entrant: a stream collected inside a
        # round ends there, on the thread that holds it.
        self._busy = threading.RLock()
        self._closed = False
        # Reused for every draft distribution: no per-token allocation of a vocabulary-sized array.
        # Its rows span the target's vocabulary, which verification compares them with: a pair's
        # sizes may differ by up to 128 (Qwen2.5's 0.5B has 151,936 tokens, its 7B 152,064).
        self._draft_vocab = draft.vocab_size if draft else 0
        self._q_rows = np.empty((0, target.n_vocab if draft else 0), dtype=np.float32)
        # Likewise the target's distribution when sampling, at one position at a time: a plain
        # step's, or a verification's, which reads each position's once, before the next's.
        self._p_row = np.empty(target.n_vocab, dtype=np.float32)
        # A narrowed draft's logits row j is token ids[j] (draft_head.py), a list that grows.
        self._draft_head = draft.head if draft is not None else None
        self._draft_id_list = self._draft_head.ids if self._draft_head else None
        n_rows = draft.n_vocab + MAX_EXTRA_TOKENS if self._draft_head else self._draft_vocab
        self._near_mask = np.empty(n_rows, dtype=bool)  # see top_candidates
        # A narrowed draft's distribution over its own rows, before it is spread over the target's
        # ids.
        self._narrowed_probs = np.empty(n_rows if self._draft_head else 0, dtype=np.float32)
        self._target_mask = np.empty(target.n_vocab, dtype=bool)
        # Auto mode's ways of drafting with the model, and what they measured so far (here, or
        # in an earlier run on this device: a try that lost then is not repeated at once).
        self._arms_key = (
            (target.path, draft.path, threads, format_cpu_list(self.placement.target_cpus))
            if draft
            else None
        )
        self._memory = load_auto_memory(*self._arms_key) if self._arms_key else AutoMemory({})
        self.model_arms = [
            Arm.remembered(name, self._memory.probe_every.get(name, 0))
            for name in (("chain", "tree") if draft else ())
        ]
        memory = self._memory
        share = (memory.share_tokens, memory.share_reach, memory.share_tries, memory.rounds_shut)
        self.ceiling_share = CeilingShare(*share)
        # How far auto mode's passes of the target here were from its curve, kept up to date.
        self._passes_key = (target.path, threads, format_cpu_list(self.placement.target_cpus))
        self._batch_factor = load_batch_factor(*self._passes_key, self.profile)
        # A plain step as auto mode's last generation left it: its arms are judged against it,
        # and one step timed at the start of each answer is noisy (35 against 40 tok/s here).
        self._step_s: float | None = None
        self._draft_step_timed = False  # see _start_costs
        # LLMCad's pipeline needs each model on CPUs of its own, decoding on its own pinned
        # thread (cores.py); `edgespec profile --overlap` measures whether it pays.
        target_cpus, draft_cpus = self.placement.target_cpus, self.placement.draft_cpus
        self.can_pipeline = draft is not None and can_pipeline(self.placement)
        self.pipeline = pipeline
        self.pipeline_speedup = (
            load_pipeline_speedup(
                (target.path, threads, format_cpu_list(target_cpus)),
                (draft.path, draft_threads, format_cpu_list(draft_cpus)),
            )
            if self.can_pipeline and draft is not None
            else None
        )

    def close(self) -> None:
        """Free both models and their contexts, and stop their pinned threads, now rather than
        whenever the garbage collector gets to them. The engine cannot generate after it, and a
        stream left open ends ("superseded")."""
        if self._closed:
            return
        with self._alone():  # while the caches exist: a stream's end settles them
            self._closed = True
        for ctx in (self.draft_ctx, self.target_ctx):
            if ctx is not None:
                ctx.close()
        for model in (self.draft, self.target):
            if model is not None:
                model.close()

    def with_context(self, n_ctx: int) -> Engine:
        """An engine of the same models and settings whose contexts hold `n_ctx` tokens (for a
        prompt this one cannot hold), without loading the models again; this one is closed,
        its models left to the new one."""
        self._check_open()  # its models may be freed: llama.cpp said "model cannot be NULL"
        check_ctx_size(n_ctx, self.target.n_ctx_train, self.target.path)
        with self._alone():
            self._closed = True
        for ctx in (self.draft_ctx, self.target_ctx):
            if ctx is not None:
                ctx.close()  # its KV cache freed before the larger one is made
        return Engine(
            self.target,
            self.draft,
            n_ctx=n_ctx,
            threads=self.threads,
            draft_threads=self.draft_threads,
            placement=self.placement,
            pipeline=self.pipeline,
            adapt_threads=self.adapt_threads,
        )

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def profile_if_missing(self, say: Callable[[str], None] = lambda _: None) -> None:
        """Measure and save a quick device profile (seconds, not minutes) of each model that has
        none, or one measured on a busy device (DeviceProfile.measured_again), so that auto mode
        plans with this device's costs from its first round."""
        self._check_open()
        roles = [("target", self.target_ctx, self.threads, self.placement.target_cpus)]
        first_measured = False
        if self.draft_ctx is not None:
            roles.append(("draft", self.draft_ctx, self.draft_threads, self.placement.draft_cpus))
        here: dict[tuple[Path, int, str, int], DeviceProfile] = {}  # measured by this call
        for role, ctx, n_threads, cpus in roles:
            # A draft that is the target's file was profiled just before: busy, it is measured
            # again by a later first use, not by this one twice.
            key = (ctx.model.path, n_threads, format_cpu_list(cpus), ctx.n_ctx)
            measured = seen = here.get(key) or load_profile(*key)
            if key not in here and (measured is None or measured.measured_again):
                with measuring_alone(say), self._alone():
                    # Once more: a process that held the lock may have measured this model
                    # (busy or not: measured again at a later first use, not right after it).
                    measured = load_profile(*key)
                    if measured is None or (measured.measured_again and measured == seen):
                        first_measured = first_measured or measured is None
                        cpu_list = format_cpu_list(cpus)
                        measured = self._quick_profile(ctx, n_threads, cpu_list, say, measured)
                        here[key] = measured
            if role == "target":
                if key in here:  # passes timed before are older than this curve
                    self._batch_factor = None
                self._price_passes_by(measured)
            else:
                self.draft_profile = measured
        if here:
            self._govern()  # judged against what was just measured from now on
        # Profiles from different hours do not tell what a draft step costs in target steps:
        # time both now, unless an earlier run on this device already did. (A profile measured
        # again after a busy first use is of the same device: what that run timed, and its
        # draft rounds corrected since, stays.)
        unknown = first_measured or self._memory.draft_cost is None
        if self.draft_ctx is not None and unknown and not self._profiles_ratio_holds():
            with self._alone():
                self._time_draft_cost()

    def _quick_profile(
        self,
        ctx: Context,
        n_threads: int,
        cpus: str,
        say: Callable[[str], None],
        busy_before: DeviceProfile | None = None,
    ) -> DeviceProfile:
        """Measure a quick profile of `ctx`'s model (again, where `busy_before` was measured on
        a busy device: profile.kept_profile) and keep it where it can be kept."""
        name = ctx.model.path.name
        if busy_before is None:
            say(
                f"measuring how fast this device runs {name} (first use on "
                "this CPU, or a profile from an older edgespec; seconds, or a minute on a "
                "slow device; `edgespec profile` measures in full, and which attention is "
                "faster)"
            )
        else:
            say(f"measuring how fast this device runs {name} again (it was busy the last time)")
        try:
            measured = kept_profile(busy_before, quick_profile(ctx, n_threads, cpus))
        finally:  # the measurement cleared this context, even one cut short
            self._clear_caches()
        if measured.busy:  # kept all the same: it is measured again or, busy each time, kept
            then = (
                "measured again on the next run"
                if measured.measured_again
                else "`edgespec profile` measures it again once the device is quiet"
            )
            say(
                f"(the device was busy while measuring: {name}'s timings varied by "
                f"{measured.noise:.0%}; until it is measured quiet, auto prices passes by "
                f"a default curve; {then})"
            )
        try:
            save_profile(measured)
        except OSError as e:  # a read-only or full home: this run still uses it
            say(f"(not kept for the next run: {e.strerror or e}: {e.filename})")
        return measured

    def _govern(self) -> None:
        """A thread governor for each model, judging its decodes against its profile (its
        step on a quiet device, its curve), or, without one measured quiet, the fastest steps it
        has seen."""
        if not self.adapt_threads:
            return
        for ctx, stored in ((self.target_ctx, self.profile), (self.draft_ctx, self.draft_profile)):
            if ctx is not None:
                profile = quiet(stored)
                governor = ctx.governor or ThreadGovernor(ctx.max_threads)
                governor.reference_s = profile.step_s if profile else None
                ctx.govern(governor, profile.relative if profile else _default_curve)

    def thread_switches(self) -> int:
        """How often the governors have changed a model's threads, so far."""
        contexts = (self.target_ctx, self.draft_ctx)
        return sum(c.governor.switches for c in contexts if c is not None and c.governor)

    def _price_passes_by(self, stored: DeviceProfile | None) -> None:
        """The target's profile, and what auto prices its passes with: the profile's curve at
        the sizes it measured (policy.Costs.sizes), else (none, or one measured busy) the
        default curve."""
        self.profile = stored
        profile = quiet(stored)
        self.relative_cost: Callable[[int], float] = profile.relative if profile else _default_curve
        self.pass_sizes = tuple(profile.ks) if profile else DEFAULT_SIZES

    def _profiles_ratio_holds(self) -> bool:
        """Whether the two models' profiles tell what a draft step costs in target steps: they
        were measured together, under the same load, and on a quiet device. Here a plain step
        took 64 ms in one hour and 50 ms in the next: a new draft's profile over a target's from
        another hour made a draft step look 0.23 of a target step, not 0.30. And two quick
        profiles measured beside a busy core made a Q4_0 copy of SmolLM2 0.61-0.72 of its step
        (0.18 once), where it is 0.75: kept as the device's, no later run would have timed it
        again. Their noise told (0.27-0.95 each, 0.03-0.05 quiet; NOISY_QUICK)."""
        if self.profile is None or self.draft_profile is None:
            return False
        if self.draft_profile == self.profile:  # the draft is the target: a step is a step
            return True
        if self.profile.busy or self.draft_profile.busy:
            return False
        apart = abs(
            datetime.fromisoformat(self.profile.measured_at)
            - datetime.fromisoformat(self.draft_profile.measured_at)
        )
        return apart.total_seconds() <= PROFILES_TOGETHER_S

    def _time_draft_cost(self) -> None:
        """Time a step of each model now, in turns, the fastest of each (profile.fastest_steps),
        and remember their ratio for auto mode: a draft step in target steps."""
        assert self.draft_ctx is not None and self._arms_key is not None
        try:
            target_s, draft_s = fastest_steps([self.target_ctx, self.draft_ctx], turns=12)
        finally:  # the timing cleared both contexts, even one cut short
            self._clear_caches()
        cost = draft_s / target_s
        self._memory = replace(self._memory, draft_cost=cost)
        save_auto_memory(*self._arms_key, self._memory)

    def _draft_cost(self) -> float | None:
        """A draft step in target steps, as known before this generation times one: the stored
        profiles' ratio where it holds (_profiles_ratio_holds; their ratio, not their seconds: the
        machine's load may have changed since, and it changes both models alike); else what was
        timed together, on first use or in an earlier run; else the profiles' ratio anyway."""
        ratio = None
        if self.profile is not None and self.draft_profile is not None:
            ratio = self.draft_profile.step_s / self.profile.step_s
            if self._profiles_ratio_holds():
                return ratio
        return self._memory.draft_cost if self._memory.draft_cost is not None else ratio

    # ----- prompts -------------------------------------------------------------------------
    def prompt_tokens(
        self,
        prompt: str,
        *,
        chat_mode: bool | None = None,
        system: str | None = None,
        template: str | None = None,
    ) -> list[int]:
        """The target's tokens for a text prompt: in a chat template (with `system`), `template`
        or the target's own, where there is one and `chat_mode` is not False, else as plain
        text for completion."""
        self._check_open()
        if not isinstance(prompt, str):
            raise BadSettingError(f"a prompt to tokenize is text, not {type(prompt).__name__}")
        if not prompt.strip():
            raise BadSettingError("the prompt is empty")
        if template is not None and chat_mode is False:
            raise BadSettingError("--chat-template is for chat: drop --raw")
        given = template is not None
        template = template if given else self.target.info.chat_template
        if chat_mode is None:
            chat_mode = template is not None
        if chat_mode:
            if template is None:
                raise EdgespecError(
                    f"{self.target.path.name} has no chat template; give one with "
                    "--chat-template, or use --raw for plain completion"
                )
            # Before the template copies it: a text of 70 MB made one over its bound, which
            # was said as the template's fault.
            self._check_not_surely_too_long(prompt)
            try:
                chat.check_keeps_the_message(template, system)
                tokens = self.chat_tokens(template, chat.messages_for(prompt, system))
            except chat.ChatTemplateError as e:
                if given:
                    raise
                raise chat.ChatTemplateError(  # the GGUF's: what can be done instead
                    f"{e} (the template in {self.target.path.name}: give another with "
                    "--chat-template, or use --raw)"
                ) from None
        elif system is not None:
            why = "--raw" if template is not None else f"{self.target.path.name} has none"
            raise BadSettingError(
                f"a system message needs the chat template ({why}): put it in the prompt"
            )
        else:
            self._check_not_surely_too_long(prompt)
            tokens = self.target.tokenize(prompt, add_special=True, parse_special=False)
        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {beyond(len(tokens), self.n_ctx)}; "
                f"{self.room_for(len(tokens))} prompt",
                needed=len(tokens),
            )
        return tokens

    def room_for(self, n_tokens: int) -> str:
        """What to do about `n_tokens` that do not fit the context: the --ctx-size that holds
        them and an answer (a person cannot guess it from a file's size), else the most the
        target was trained for, else nothing but a shorter text (the caller's noun follows)."""
        trained = self.target.n_ctx_train
        enough = -(-(n_tokens + ANSWER_ROOM) // 1024) * 1024
        if trained <= 0 or enough <= trained:
            return f"use --ctx-size {enough} or a shorter"
        if n_tokens < trained:
            name = self.target.path.name
            return f"use --ctx-size {trained} (what {name} was trained for) or a shorter"
        return f"{self.target.path.name} holds at most {trained} tokens: use a shorter"

    def chat_tokens(
        self, template: str, messages: list[chat.Message], add_generation_prompt: bool = True
    ) -> list[int]:
        """Messages rendered with a chat template and tokenized as the target expects."""
        self._check_open()
        target = self.target
        bos_text = target.token_text(target.bos).decode(errors="replace")
        eos_text = target.token_text(target.eos).decode(errors="replace")

        def rendered(messages: list[chat.Message]) -> str:
            return chat.render(
                template,
                messages,
                bos_token=bos_text,
                eos_token=eos_text,
                add_generation_prompt=add_generation_prompt,
            )

        text = rendered(messages)
        self._check_not_surely_too_long(text)
        # The template may write the BOS token itself; adding another would shift the model.
        add_bos = target.add_bos and not text.startswith(bos_text)
        # The template's control tokens are written as text (`<|im_start|>`), read back as
        # tokens; the same text in a message (a file about chat templates) is text. Only such
        # messages are tokenized apart: elsewhere a piece boundary may tokenize otherwise.
        typed = [
            i
            for i, m in enumerate(messages)
            if isinstance(m.get("content"), str) and target.reads_control_tokens(m["content"])
        ]
        if typed and (pieces := chat.typed_pieces(rendered, messages, text, typed)):
            tokens = target.tokenize_pieces(pieces, add_bos=add_bos)
            if tokens is not None:
                return tokens
        return target.tokenize(text, add_special=add_bos, parse_special=True)

    def _check_not_surely_too_long(self, text: str) -> None:
        """Refuse, before tokenizing, a text too long for the context by its size alone.
        llama.cpp tokenizes special tokens' texts in time quadratic in their number: 2 MB of
        `<|im_start|>x<|im_end|>` took a minute here to be told it does not fit."""
        # Characters, not bytes: no fewer than bytes over the longest token's, and counted
        # without encoding the text a second time.
        n_chars = len(text)
        # The common case, without learning the bound (the vocabulary's longest text: 0.1 s for
        # Qwen's, once): a text this short tokenizes quickly, and real vocabularies have tokens
        # of far more than 8 bytes.
        if n_chars < 8 * self.n_ctx:
            return
        least = n_chars // self.target.longest_token_bytes
        if least < self.n_ctx:
            return
        trained = self.target.n_ctx_train
        if trained <= 0 or least < trained:
            # A bound far below the count (a vocabulary's longest token is dozens of bytes)
            # priced the context that would hold it: 2,093 tokens at least for a text of
            # 288,936, "use --ctx-size 3072". Counted as plain text, special tokens' texts in
            # a few tokens each (in linear time): enough to say what holds it, and a few more.
            n = len(self.target.tokenize(text, add_special=False, parse_special=False))
            raise ContextOverflowError(
                f"the prompt has {beyond(n, self.n_ctx)}; {self.room_for(n)} prompt", needed=n
            )
        raise ContextOverflowError(  # more than the target can hold: the least will do
            f"the prompt has at least {least:,} tokens ({n_chars:,} characters) but the "
            f"context holds {self.n_ctx}; {self.room_for(least)} prompt",
            needed=least,
        )

    # ----- generation ----------------------------------------------------------------------
    def stream(self, prompt: str | Sequence[int], **config) -> Stream:
        """Generate, yielding text as the target accepts it; `.result` holds the Result after."""
        self._check_open()
        unknown = sorted(set(config) - GENERATION_SETTINGS)
        if unknown:  # a TypeError from the dataclass otherwise
            raise BadSettingError(
                f"unknown setting {', '.join(unknown)}; the settings are GenerationConfig's: "
                f"{', '.join(sorted(GENERATION_SETTINGS))}"
            )
        cfg = GenerationConfig(**config)
        cfg.validate(self.draft is not None)
        if cfg.mode is None:
            cfg = replace(cfg, mode="auto")
        if isinstance(prompt, str):
            tokens = self.prompt_tokens(
                prompt, chat_mode=cfg.chat, system=cfg.system, template=cfg.chat_template
            )
        else:
            if cfg.chat or cfg.system is not None or cfg.chat_template is not None:
                raise BadSettingError(  # they were ignored, without a word
                    "chat, system and chat_template apply to a text prompt; a prompt of token "
                    "ids is used as it is (engine.chat_tokens renders messages with a template)"
                )
            tokens = self._token_prompt(prompt)
        return Stream(self, tokens, cfg)

    def _token_prompt(self, prompt: object) -> list[int]:
        """A prompt of token ids, checked: llama.cpp takes an id outside the vocabulary as a
        failed decode, or an overflow of its int32."""
        if isinstance(prompt, np.ndarray) and prompt.ndim == 1:
            prompt = prompt.tolist()
        if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
            raise BadSettingError(
                f"a prompt is text or a sequence of token ids, not {type(prompt).__name__}"
            )
        tokens = list(prompt)
        n_vocab = self.target.n_vocab
        if not all(is_whole(t) and 0 <= t < n_vocab for t in tokens):
            raise BadSettingError(f"a token prompt's ids must be whole numbers in 0..{n_vocab - 1}")
        if not tokens:
            raise BadSettingError("the prompt is empty")
        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {beyond(len(tokens), self.n_ctx)}; "
                "use a larger n_ctx or a shorter prompt",
                needed=len(tokens),
            )
        return tokens

    def generate(self, prompt: str | Sequence[int], **config) -> Result:
        """Generate to the end: `stream` without the pieces. `config`: GenerationConfig's
        fields (max_tokens, mode, temperature, ...), which mirror `edgespec run`'s flags."""
        stream = self.stream(prompt, **config)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def _begin(self, stream: Stream) -> Generator[list[int], None, None]:
        """The rounds of a new generation. One still open (a stream left unfinished and kept
        alive by a reference) is ended first: its end settles the caches, and settled later,
        after this one had used them, it set them back to its own text (the next prompt then
        reused cells that held another)."""
        self._check_open()  # a stream made before the engine was closed
        with self._alone():
            self._open = (stream, self._rounds(stream.run))
            return self._open[1]

    @contextmanager
    def _one_thread(self) -> Iterator[None]:
        """Held while the engine computes (a round, a generation's start, catching the draft up,
        closing): it is not thread-safe, and two threads generating at once failed with numpy's
        and llama.cpp's errors ("generator already executing", "llama_decode failed"), where
        two threads decoding on one context may also crash. Between rounds it is free, so the
        thread iterating a stream may start another generation, which ends the first."""
        self._acquire()
        try:
            yield
        finally:
            self._busy.release()

    @contextmanager
    def _alone(self) -> Iterator[None]:
        """`_one_thread`, a stream left open ended first ("superseded"): for whatever uses the
        caches but that stream's rounds (another generation, forgetting them, catching the
        draft up, measuring, closing). Its rounds would go on from caches changed under them:
        after forget_caches they wrote a text that was not the target's, after catch_up_draft
        llama.cpp refused their batch."""
        with self._one_thread():
            if self._open is not None:
                self._end_open_stream()
            yield

    def _acquire(self) -> None:
        if not self._busy.acquire(blocking=False):
            raise EdgespecError(
                "this engine is generating in another thread; an engine runs one generation "
                "at a time (load one for each thread)"
            )

    def _end_open_stream(self) -> None:
        """End the last stream begun, "superseded", with its result (nothing, if it has ended)."""
        assert self._open is not None
        stream, rounds = self._open
        if stream.result is None:
            stream.run.superseded = True
            rounds.close()
            stream._finish(ended=False)

    def _check_open(self) -> None:
        """Its models are freed once closed: llama.cpp would crash the process on them."""
        if self._closed:
            raise BadSettingError("this engine is closed; load another")

    def _rounds(self, run: _Run) -> Generator[list[int], None, None]:
        """Prefill, then yield each round's decided tokens until the caller stops asking."""
        stats, cfg = run.stats, run.cfg
        t0 = time.perf_counter()
        # Reuse what the caches already hold of this prompt (a chat's history): only the rest
        # is evaluated. The prompt's last token is the first round's root.
        prefix = run.tokens[:-1]
        reused = self._reuse(self.target_ctx, "_target_cache", prefix)
        stats.n_prompt_eval = len(prefix) - reused + 1
        run.target_cached = len(prefix)
        if self.draft_ctx and cfg.mode == "auto":  # the draft catches up if and when it is used
            run.draft_cached = self._reuse(self.draft_ctx, "_draft_cache", prefix, evaluate=False)
        stats.prefill_s = time.perf_counter() - t0
        t_decode = time.perf_counter()
        native_before = self._native_s()
        if self.draft_ctx and cfg.mode in ("chain", "tree"):
            # Timed with the decoding: evaluating the prompt a second time is what speculating
            # costs, not the prompt (a chain that did it in the prefill looked faster than it
            # was, against plain decoding and against auto, which pays its draft's catch-up
            # inside the answer). Apart from the root, as the rounds after it evaluate theirs:
            # a root row computed inside a prompt's batch differs in the last bits, and sampling
            # with a seed would draft differently from a cold cache than from a warm one.
            self._reuse(self.draft_ctx, "_draft_cache", prefix, window=True)
            run.draft_cached = len(prefix)
        run.sampling = cfg.sampling
        run.rng = run.sampling.make_rng()
        run.pipeline = self.pipelines(cfg.mode)
        run.alpha, run.adaptive_alpha = cfg.alpha_rule()
        run.costs = Costs(self.relative_cost, self.pass_sizes)
        if cfg.mode == "auto":
            # Only auto, whose plain steps draw it back and whose passes measure it again: the
            # other modes price passes by the profile. Started from a factor of 8, `ngram` and
            # `tree` decoded a copy plainly to its end: no pass was made to correct it.
            run.costs.start_from(self._batch_factor)
            run.policy = AutoPolicy(
                run.costs, self.model_arms, pipelined=run.pipeline, share=self.ceiling_share
            )
            run.calibrator = run.policy.calibrator
            if self._step_s is not None:
                self._start_costs(run, self._step_s)
        round_fn = {
            "target": self._round_target,
            "chain": self._round_chain_mode,
            "tree": self._round_tree_mode,
            "ngram": self._round_ngram,
            "auto": self._round_auto,
        }[cfg.mode or "target"]
        in_round = False
        try:
            while True:
                room = self.n_ctx - len(run.tokens)  # positions left after the root's
                if room < 0:
                    return
                in_round = True
                started = time.perf_counter()
                decided = round_fn(run, room)
                stats.record_round(time.perf_counter() - started, len(decided))
                in_round = False
                yield decided
                stats.decode_s = time.perf_counter() - t_decode
        finally:
            run.decode_ended_at = time.perf_counter()
            stats.decode_s = run.decode_ended_at - t_decode
            # The target's time behind the pipeline's drafting passed once, not twice.
            stats.native_s = self._native_s() - native_before - stats.overlap_s
            # A second Ctrl+C (a chat's, pressed twice) is raised once the caches are settled:
            # it stopped their trimming halfway, and a tree's branches stayed in the caches.
            with interrupts_held():
                if run.ahead is not None:
                    self._drop_ahead(run)
                if in_round:  # interrupted mid-round (Ctrl+C): the caches may be half edited
                    self._clear_caches()
                else:
                    self._trim_caches(run)
                if run.policy is not None:
                    run.policy.finish()
                    self._step_s = run.costs.step_s.value
                    self._remember_passes(run.costs)
                    if self._arms_key:
                        self._remember(run.policy)

    def pipelines(self, mode: str | None) -> bool:
        """Whether the chains of a generation in `mode` run LLMCad's pipeline: if asked, else
        where it was measured paying on this device with these models and CPUs."""
        if mode not in ("chain", "auto") or not self.can_pipeline:
            return False
        if self.pipeline is None:
            return self.pipeline_speedup is not None and self.pipeline_speedup > 1.0
        return self.pipeline

    def _remember(self, policy: AutoPolicy) -> None:
        """Keep what auto mode learnt about the draft on this device for the next run."""
        assert self._arms_key is not None
        costs = policy.costs
        draft_cost = costs.draft_cost(known=self._memory.draft_cost)  # as timed, if it was
        tried = {arm.name: arm.probe_every for arm in self.model_arms if arm.tried}
        share = self.ceiling_share
        memory = AutoMemory(
            tried, draft_cost, share.tokens, share.reach, share.tries, share.rounds_shut
        )
        # A chat remembers after every answer: the file is written only when it would change.
        if (tried or draft_cost is not None) and not memory.same_as(self._memory):
            save_auto_memory(*self._arms_key, memory)
            self._memory = memory

    def _remember_passes(self, costs: Costs) -> None:
        """Keep how far auto mode's passes (it times plain steps to compare them with) were from
        the curve, for the next generation and the next run; the file is written only when it
        moved by more than timing noise (PASS_FACTOR_TOLERANCE)."""
        factor, known = costs.batch_factor.value, self._batch_factor
        if factor is None or (
            known is not None and abs(factor - known) <= PASS_FACTOR_TOLERANCE * known
        ):
            return
        save_batch_factor(*self._passes_key, factor)
        self._batch_factor = factor

    def _native_s(self) -> float:
        """Seconds both contexts have spent inside llama.cpp's decode so far."""
        return self.target_ctx.decode_s + (self.draft_ctx.decode_s if self.draft_ctx else 0.0)

    def _reuse(
        self,
        ctx: Context,
        attr: str,
        prefix: list[int],
        evaluate: bool = True,
        window: bool = False,
    ) -> int:
        """Keep the longest cached start of `prefix` in sequence 0 and evaluate the rest (unless
        not `evaluate`; the draft: only its start and end with `window`, `_draft_catch_up`);
        returns how many tokens were already there."""
        cached: list[int] = getattr(self, attr)
        keep = 0
        limit = min(len(cached), len(prefix))
        while keep < limit and cached[keep] == prefix[keep]:
            keep += 1
        if keep < len(cached) and ctx.seq_pos_min(0) > 0:
            # A draft caught up with a window (its cells moved over the text it skipped) holds
            # the start of `cached` only as far as that text: start again.
            keep = 0
        ctx.seq_rm(0, keep)
        setattr(self, attr, [])  # unknown until the evaluation below completes
        if not evaluate:
            prefix = prefix[:keep]
        elif window and keep < len(prefix):
            self._draft_catch_up(prefix, keep, logits="none")
        elif keep < len(prefix):
            ctx.decode(prefix[keep:], keep, logits="none")
        setattr(self, attr, list(prefix))
        return keep

    def _draft_catch_up(
        self, tokens: list[int], cached: int, logits: str
    ) -> tuple[np.ndarray, int]:
        """Bring the draft, which holds `tokens[:cached]`, up to all of `tokens`, feeding it only
        the `catch_up_positions`; returns `decode`'s rows and how many tokens it was fed.

        llama.cpp takes a batch only right after the last position cached, so the skipped span
        is not left as a gap: every cell already cached moves forward over it first. Attention
        under RoPE depends on distances alone, and llama.cpp rotates the moved keys inside the
        next decode: here, timed as catching up, not as the next draft step. The skipped tokens'
        rare words stay known to a narrowed draft (`Context.know`)."""
        ctx = self.draft_ctx
        assert ctx is not None
        end = len(tokens)
        where = catch_up_positions(cached, end)
        if len(where) == end - cached:
            return ctx.decode(tokens[cached:], cached, logits=logits), len(where)
        start = end - DRAFT_WINDOW
        head = tokens[cached : cached + len(where) - DRAFT_WINDOW]  # of the first DRAFT_SINK
        if head:
            ctx.decode(head, cached, logits="none")
        ctx.know(tokens[cached + len(head) : start])
        ctx.seq_add(0, 0, -1, start - cached - len(head))
        return ctx.decode(tokens[start:], start, logits=logits), len(where)

    def forget_caches(self) -> None:
        """Empty both caches; the next generation evaluates its whole prompt. A stream left open
        ends ("superseded")."""
        self._check_open()
        with self._alone():
            self._clear_caches()

    def _clear_caches(self) -> None:
        self.target_ctx.clear()
        self._target_cache = []
        self._clear_draft_cache()

    def catch_up_draft(self) -> int:
        """Evaluate with the draft what the target's cache holds and the draft's does not, such as
        a chat's turns that auto decoded without it, and return how many tokens that was. For idle
        time, a chat waiting for its user: inside the next answer, catching up on a long history
        costs seconds (~1.75 ms a token for the 0.5B draft here), and auto tries no draft while
        that is more than a small share of the answer. A stream left open ends ("superseded"):
        its end settles what the target's cache holds."""
        self._check_open()
        if self.draft_ctx is None:
            return 0
        with self._alone():
            held = self._target_cache
            return len(held) - self._reuse(self.draft_ctx, "_draft_cache", held)

    def forget_draft_cache(self) -> None:
        """Empty the draft's cache: the next generation catches it up as a new process would.
        A stream left open ends ("superseded")."""
        self._check_open()
        with self._alone():
            self._clear_draft_cache()

    def _clear_draft_cache(self) -> None:
        if self.draft_ctx:
            self.draft_ctx.clear()
        self._draft_cache = []

    def _draft_candidates(
        self, row: np.ndarray, n: int, first: int | None = None
    ) -> list[tuple[int, float]]:
        """top_candidates of a draft row, as token ids; `first`: the row's argmax, where known."""
        candidates = top_candidates(row, n, self._near_mask[: len(row)], first)
        ids = self._draft_id_list
        return candidates if ids is None else [(ids[t], p) for t, p in candidates]

    def _draft_probs(self, row: np.ndarray, params: SamplingParams, out: np.ndarray) -> np.ndarray:
        """The draft's distribution from its logits row, over the target's token ids, into `out`.
        Tokens only the draft has are never drawn (their mass goes to the others): the target
        could not evaluate them. Tokens only the target has have probability 0.

        Returns the same distribution over the draft's rows, where a draw costs less: a narrowed
        draft's row j is token `_draft_id_list[j]` (32k rows against 152k ids); otherwise row j
        is token j, and it is `out` itself."""
        if self._draft_head is None:  # row i is token i: the ids both models have line up
            n = len(row)  # at most the target's: the draft's rows leave out tokens it lacks
            probs_from_logits(row, params, out=out[:n])
            out[n:] = 0.0  # tokens only the target has
            return out
        probs = probs_from_logits(row, params, out=self._narrowed_probs[: len(row)])
        out.fill(0.0)  # what a narrowed draft cannot propose
        ids = self._draft_head.id_array
        if self._draft_vocab <= len(out):
            out[ids] = probs
        else:  # those past the target's vocabulary have probability 0 (DraftHead.propose_below)
            kept = ids < len(out)
            out[ids[kept]] = probs[kept]
        return probs

    def _draft_sample(
        self, row: np.ndarray, params: SamplingParams, out: np.ndarray, rng: np.random.Generator
    ) -> tuple[int, float]:
        """A token drawn from the draft's distribution, which is left in `out` (_draft_probs),
        and the draft's confidence there (its most likely token's probability)."""
        own = self._draft_probs(row, params, out)
        return self._draw(own, rng), float(own.max())

    def _draw(self, own: np.ndarray, rng: np.random.Generator) -> int:
        """A token id drawn from the draft's distribution over its rows (_draft_probs)."""
        drawn = sample(own, rng)
        return drawn if self._draft_id_list is None else self._draft_id_list[drawn]

    def _draft_rows(self, n: int) -> np.ndarray:
        """A reused (n, vocab) buffer for the draft's distributions at drafted positions."""
        if self._q_rows.shape[0] < n:  # rare; the rows the pipeline carried over are kept
            grown = np.empty((n, self._q_rows.shape[1]), dtype=np.float32)
            grown[: self._q_rows.shape[0]] = self._q_rows
            self._q_rows = grown
        return self._q_rows

    def _record_pass(self, run: _Run, k: int, seconds: float) -> None:
        if run.policy is not None:  # auto times plain steps and corrects the curve with passes
            run.costs.record_pass(k, seconds)
        else:
            run.costs.record_pass_as_step(k, seconds)

    def _round_target(self, run: _Run, room: int) -> list[int]:
        return [self._plain_step(run)[0]]

    def _plain_step(self, run: _Run) -> tuple[int, np.ndarray]:
        """The target's next token after the committed ones, and its logits row."""
        feed = run.tokens[run.target_cached :]
        row = self.target_ctx.decode(feed, run.target_cached)[-1]
        run.target_cached = len(run.tokens)
        run.stats.target_passes += 1
        if run.sampling.greedy:
            return int(row.argmax()), row
        probs = probs_from_logits(row, run.sampling, out=self._p_row)
        return sample(probs, run.rng), row

    def _round_chain_mode(self, run: _Run, room: int) -> list[int]:
        """--mode chain: draft up to --draft-max tokens with the model, verify them in one target
        pass; or the n-gram proposal, where it promises more (`_model_or_ngram`)."""

        def chain(_: Proposal | None) -> list[int]:
            limit = min(room, self._tokens_left(run) - 1)
            if run.cfg.draft_max is None:
                return self._auto_chain(run, min(MAX_AUTO_DRAFT, limit))
            drafted = self._draft_chain(run, min(run.cfg.draft_max, limit))
            return self._verify_chain(run, drafted[0], from_draft=True, drafted=drafted)

        return self._model_or_ngram(run, room, chain)

    @staticmethod
    def _tokens_left(run: _Run) -> int:
        return run.cfg.max_tokens - len(run.generated)

    @classmethod
    def _steps_left(cls, run: _Run) -> float:
        """The plain steps' time the answer may still take: its tokens left at the rate it has
        made them so far (an edit's n-gram rounds copy at twice plain decoding's), at most a
        step a token."""
        left, made, spent = cls._tokens_left(run), len(run.generated), run.stats.decode_s
        step_s = run.costs.step_s.value
        if not made or spent <= 0 or step_s is None:
            return left
        return left * min(spent / made / step_s, 1.0)

    def _round_tree_mode(self, run: _Run, room: int) -> list[int]:
        """--mode tree: the draft's tree, with the n-gram drafter's proposal as one more branch
        (greedy); or that proposal alone, where it promises more (`_model_or_ngram`)."""

        def tree(proposal: Proposal | None) -> list[int]:
            graft = proposal if run.sampling.greedy else None
            return self._round_tree(run, room, graft)

        return self._model_or_ngram(run, room, tree)

    def _model_or_ngram(
        self, run: _Run, room: int, model_round: Callable[[Proposal | None], list[int]]
    ) -> list[int]:
        """A round of the model mode, given the n-gram drafter's proposal (None with --no-ngram),
        unless that proposal promises more tokens per second than the model's rounds have been
        making (policy.ModelOrNgram): then it is verified alone and the draft rests."""
        proposal = None
        if run.cfg.ngram:
            proposal, length, ngram_rate = self._priced_proposal(run, room)
            if length and run.drafters.choose(ngram_rate) == "ngram":
                run.stats.record_choice("ngram")
                return self._verify_ngram(run, proposal.tokens[:length])
        run.stats.record_choice(run.stats.mode)  # "chain" or "tree"
        t0 = time.perf_counter()
        decided = model_round(proposal)
        run.drafters.record_model_round(len(decided), time.perf_counter() - t0)
        return decided

    def _priced_proposal(self, run: _Run, room: int) -> tuple[Proposal, int, float | None]:
        """The n-gram drafter's proposal (up to MAX_NGRAM_DRAFT), and `_ngram_length` of it."""
        limit = min(MAX_NGRAM_DRAFT, room, self._tokens_left(run) - 1)
        proposal = self._end_at_eog(run.ngram.propose(run.tokens, max(limit, 0)))
        run.ngram.watch(proposal, len(run.tokens))  # learn what it was worth, verified or not
        return proposal, *self._ngram_length(run, proposal)

    def _end_at_eog(self, proposal: Proposal) -> Proposal:
        """`proposal` cut after its first end-of-generation token: generation stops there, so
        tokens past it would be verified, and counted as accepted, for nothing (a copy of a
        chat's earlier answer runs on past its end-of-turn into the next message)."""
        is_eog = self.target.is_eog
        for i, token in enumerate(proposal.tokens):
            if is_eog(token):
                del proposal.tokens[i + 1 :], proposal.origins[i + 1 :], proposal.replaced[i + 1 :]
                break
        return proposal

    def _ngram_length(self, run: _Run, proposal: Proposal) -> tuple[int, float | None]:
        """How much of the n-gram proposal to verify for the best expected rate, and that rate;
        (0, None) when none of it beats a plain step (or a step's cost is not measured yet).
        Only as much as the generation's loss budget allows."""
        if not proposal.tokens or run.costs.step_s.value is None:
            return 0, None
        allowed = run.ngram_budget.longest(run.costs, len(proposal.tokens))
        length, rate = best_proposal_length(
            run.ngram.acceptances(proposal.ngram, allowed, proposal.streak), run.costs
        )
        return length, (rate if length else None)

    def _verify_ngram(self, run: _Run, proposed: list[int]) -> list[int]:
        """Verify n-gram tokens (none: a plain step); what the pass gained or lost against plain
        steps, as priced, is charged to the generation's loss budget."""
        price = run.costs.steps(len(proposed) + 1)
        decided = self._verify_chain(run, proposed, from_draft=False)
        run.ngram_budget.record(len(decided), price)
        return decided

    def _draft_chain(
        self,
        run: _Run,
        k: int,
        keep_going: Callable[[list[float]], bool] | None = None,
        take: Callable[[list[float], float], bool] | None = None,
    ) -> tuple[list[int], list[float]]:
        """Up to k draft tokens continuing the committed ones, and the draft's confidence in each:
        its probability of its most likely token there (greedy: the token it drafts).

        Greedy: the draft's argmax; sampling: a draw from its (filtered) distribution, kept in the
        q rows for the verification. `keep_going(confidences)` may stop drafting early. Sampling,
        `take(confidences, confidence)` may also stop the chain before the next token is drawn,
        from the draft's confidence there (see _auto_chain). A chain starts with what the
        pipeline drafted ahead, where the verification left it standing.
        """
        draft, draft_ctx, params = self.draft, self.draft_ctx, run.sampling
        assert draft is not None and draft_ctx is not None
        if k <= 0:
            return [], []
        ahead = self._take_ahead(run)
        proposed: list[int] = ahead.tokens if ahead else []
        confidences: list[float] = ahead.confidences if ahead else []
        q_rows = self._draft_rows(k) if not params.greedy else self._q_rows
        t_start = time.perf_counter()
        n_ahead = len(proposed)
        for n in range(1, min(n_ahead, k) + 1):  # the head start, as far as it goes on
            if take is not None and not take(confidences[: n - 1], confidences[n - 1]):
                k = n - 1
                break
            if draft.is_eog(proposed[n - 1]) or (
                keep_going is not None and not keep_going(confidences[:n])
            ):
                k = n
                break
        if ahead and n_ahead > k:  # a shorter chain: the draft forgets the rest of the start
            del proposed[k:], confidences[k:]
            run.draft_cached = ahead.at + k - 1  # the last token's position, not evaluated
            draft_ctx.seq_rm(0, run.draft_cached)
        run.stats.pipelined_kept += len(proposed)  # what the chain starts with, not all carried
        if proposed:
            pos = run.draft_cached  # the last drafted token's; the draft has not evaluated it
            run.catch_up_s = 0.0
        else:
            row = self._draft_root(run)
            pos = run.draft_cached
        start = evaluated = len(proposed)
        for i in range(start, k):
            evaluated += 1  # a row of the draft's, whether or not its token is taken
            if i:
                row = draft_ctx.decode(proposed[-1:], pos)[-1]
                pos += 1
            if params.greedy and keep_going is None:
                token = int(row.argmax())
                if self._draft_id_list is not None:
                    token = self._draft_id_list[token]
            elif params.greedy:
                # the argmax and its probability
                token, confidence = self._draft_candidates(row, 1)[0]
                confidences.append(confidence)
            else:
                own = self._draft_probs(row, params, q_rows[i])
                confidence = float(own.max())
                if take is not None and not take(confidences, confidence):
                    break
                token = self._draw(own, run.rng)
                confidences.append(confidence)
            proposed.append(token)
            if draft.is_eog(token) or (keep_going is not None and not keep_going(confidences)):
                break
        run.draft_cached = pos
        t_end = time.perf_counter()
        evaluated -= start
        run.stats.draft_s += t_end - t_start
        run.stats.draft_evals += evaluated
        run.draft_step_s = (t_end - t_start - run.catch_up_s) / evaluated if evaluated else 0.0
        return proposed, confidences

    def _take_ahead(self, run: _Run) -> _Ahead | None:
        """The pipeline's head start for this round's chain, if it follows the committed tokens
        (a stop, or a round that did not draft, leaves it behind: then it is dropped)."""
        ahead = run.ahead
        if ahead is not None and ahead.at != len(run.tokens):
            self._drop_ahead(run)
            return None
        run.ahead = None
        return ahead

    def _drop_ahead(self, run: _Run) -> None:
        """Forget the pipeline's head start: the draft's cache keeps only what preceded it, and
        the root is evaluated again (whatever comes next needs its row)."""
        assert run.ahead is not None and self.draft_ctx is not None
        keep = run.ahead.at - 1
        run.ahead = None
        if run.draft_cached > keep:
            self.draft_ctx.seq_rm(0, keep)
            run.draft_cached = keep

    def _draft_root(self, run: _Run) -> np.ndarray:
        """The draft's logits after the root (the last committed token), with the committed
        tokens it has not evaluated yet in the same batch: those decided without it (auto's
        plain and n-gram rounds; the recent ones, where there are many: `_draft_catch_up`) or a
        chain's last accepted token. Their share of the batch's time, priced per token, is kept
        as `run.catch_up_s`."""
        assert self.draft_ctx is not None
        if run.ahead is not None:  # a tree, or a chain with no room, after a pipelined chain
            self._drop_ahead(run)
        t0 = time.perf_counter()
        rows, n_fed = self._draft_catch_up(run.tokens, run.draft_cached, logits="last")
        run.catch_up_s = (time.perf_counter() - t0) * (n_fed - 1) / n_fed
        run.draft_cached = len(run.tokens)
        return rows[-1]

    def _verify_chain(
        self,
        run: _Run,
        proposed: list[int],
        from_draft: bool,
        drafted: tuple[list[int], list[float]] | None = None,
    ) -> list[int]:
        """One target pass over the root and `proposed`; returns the tokens the target decided.
        `drafted`: the chain the draft drafted (`proposed` is its start) and its confidences,
        for the pipeline (`_verify_while_drafting`) to draft on from.

        Greedy: the longest prefix equal to the target's argmaxes, then the target's own token.
        Sampling: speculative sampling against the draft's q rows (accept with min(1, p/q), else
        a sample of the residual); n-gram proposals are point masses (accept with p(x), else a
        sample of p without x). Either way the target's distribution is kept exactly.
        """
        stats, params = run.stats, run.sampling
        root_pos = len(run.tokens) - 1
        batch = [run.tokens[-1], *proposed]
        native_before = self.target_ctx.decode_s
        ahead = None
        if run.pipeline and drafted is not None and drafted[0]:
            logits, ahead = self._verify_while_drafting(run, batch, len(proposed), drafted)
        else:
            logits = self.target_ctx.decode(batch, root_pos, logits="all")
        stats.target_passes += 1
        self._record_pass(run, len(batch), self.target_ctx.decode_s - native_before)
        if params.greedy:
            # Row by row, up to the first disagreement: a row is the whole vocabulary's logits
            # (0.6 MB for Qwen's), and an n-gram pass of 33 whose 4th token is wrong need not
            # read the 29 rows after it (all rows: ~1 ms for a pass of 16 here).
            n_ok, next_token = 0, int(logits[0].argmax())
            while n_ok < len(proposed) and proposed[n_ok] == next_token:
                n_ok += 1
                next_token = int(logits[n_ok].argmax())
        elif from_draft:
            # Every position's distribution in the one buffer, each read before the next is
            # asked for; a rejection's residual overwrites its own.
            p_row = self._p_row
            p_rows = RowsOnDemand(
                len(logits), lambda i: probs_from_logits(logits[i], params, out=p_row)
            )
            n_ok, next_token = accept_chain(
                proposed, self._q_rows[: len(proposed)], p_rows, run.rng, overwrite_p=True
            )
        else:
            n_ok, next_token, p = 0, -1, self._p_row
            for token, row in zip(proposed, logits, strict=False):
                accepted, next_token = accept_point_mass(
                    token, probs_from_logits(row, params, out=p), run.rng, overwrite_p=True
                )
                if accepted is None:
                    break
                n_ok += 1
            if n_ok == len(proposed):
                next_token = sample(probs_from_logits(logits[n_ok], params, out=p), run.rng)
        if proposed:
            stats.record_verification(len(proposed), n_ok)
        committed = root_pos + 1 + n_ok  # positions below this hold committed tokens
        self.target_ctx.seq_rm(0, committed)
        run.target_cached = committed
        if ahead is not None and n_ok == len(proposed) and ahead[0][:1] == [next_token]:
            self._carry_ahead(run, committed + 1, len(proposed), *ahead)
        elif self.draft_ctx is not None and run.draft_cached > committed:
            self.draft_ctx.seq_rm(0, committed)
            run.draft_cached = committed
        return [*proposed[:n_ok], next_token]

    def _verify_while_drafting(
        self, run: _Run, batch: list[int], n_proposed: int, drafted: tuple[list[int], list[float]]
    ) -> tuple[np.ndarray, tuple[list[int], list[float]]]:
        """LLMCad's pipeline: the target verifies `batch` (the root and the first `n_proposed`
        drafted tokens) on its CPUs while the draft, on its own, drafts on from the end of
        `drafted` as if the target were to accept all of it. Returns the target's logits and the
        draft tokens past the verified ones, with their confidences (`_draft_ahead`)."""
        target_ctx = self.target_ctx
        assert target_ctx.pinned is not None  # can_pipeline
        native_before = target_ctx.decode_s
        root_pos = len(run.tokens) - 1
        verifying = target_ctx.pinned.submit(target_ctx.verify, batch, root_pos)
        try:
            ahead = self._draft_ahead(run, n_proposed, drafted, verifying)
            t_wait = time.perf_counter()
            logits = verifying.result()
            waited = time.perf_counter() - t_wait
        except BaseException:  # Ctrl+C: nothing may touch the target's cache while it decodes
            target_ctx.pinned.wait_idle()
            raise
        # Of the target's time, what passed while the draft drafted was not spent waiting.
        run.stats.overlap_s += max(target_ctx.decode_s - native_before - waited, 0.0)
        return logits, ahead

    def _draft_ahead(
        self,
        run: _Run,
        n_proposed: int,
        drafted: tuple[list[int], list[float]],
        verifying: PinnedCall,
    ) -> tuple[list[int], list[float]]:
        """Draft on past the tokens under verification until the target is done, while the
        tokens stay likely to be used (their calibrated chances' product: each is used only if
        the target takes the whole chain and all before it), at most MAX_AHEAD. Returns the
        drafted tokens past the verified ones (those drafted before the pass first) and their
        confidences; the draft's cache holds all but the last."""
        draft, draft_ctx, params = self.draft, self.draft_ctx, run.sampling
        calibrator = run.calibrator
        assert draft is not None and draft_ctx is not None
        tokens, confidences = drafted[0][n_proposed:], drafted[1][n_proposed:]
        reach = 1.0
        for confidence in drafted[1]:
            reach *= calibrator.predict(confidence)
        last = drafted[0][-1]
        pos = run.draft_cached  # `last`'s position: the draft has not evaluated it
        limit = min(MAX_AHEAD, self.n_ctx - 1 - pos, self._tokens_left(run) - n_proposed - 1)
        q_rows = self._draft_rows(n_proposed + MAX_AHEAD + 1) if not params.greedy else None
        t0, evals = time.perf_counter(), 0
        while (
            len(tokens) < limit
            and reach >= AHEAD_MIN_REACH
            and not draft.is_eog(last)
            and not verifying.done()
        ):
            row = draft_ctx.decode([last], pos)[-1]
            pos += 1
            evals += 1
            if q_rows is None:
                last, confidence = self._draft_candidates(row, 1)[0]
            else:
                q = q_rows[n_proposed + len(tokens)]
                last, confidence = self._draft_sample(row, params, q, run.rng)
            tokens.append(last)
            confidences.append(confidence)
            reach *= calibrator.predict(confidence)
        run.draft_cached = pos
        run.stats.draft_s += time.perf_counter() - t0
        run.stats.draft_evals += evals
        run.stats.pipelined_evals += evals
        return tokens, confidences

    def _carry_ahead(
        self, run: _Run, at: int, n_proposed: int, tokens: list[int], confidences: list[float]
    ) -> None:
        """The target took the whole chain and chose after it the token the draft had drafted
        there (`tokens[0]`): what the draft drafted after that starts the next chain."""
        tokens, confidences = tokens[1:], confidences[1:]
        if not tokens:  # the draft has not evaluated the new root: the next round does, as usual
            return
        if not run.sampling.greedy:  # their q rows move to the start of the next chain's
            first = n_proposed + 1
            self._q_rows[: len(tokens)] = self._q_rows[first : first + len(tokens)]
        run.ahead = _Ahead(at, tokens, confidences)

    def _round_ngram(self, run: _Run, room: int) -> list[int]:
        """Prompt lookup: propose what followed the longest recent match of the text's end.

        Without --draft-max, the proposal is verified only as far as it pays, as in auto (a round
        whose proposal does not is a plain step): proposing 4 tokens every round made 0.48x plain
        on chat here, where little repeats, and 1.00x on copy-heavy edits. Sampling prices it
        the same way: a proposed token is accepted with the target's probability of it, the
        chance that the token sampled there is that token, so watching sampled text learns its
        acceptance as watching greedy text does.
        """
        if run.cfg.draft_max is None:
            proposal, length, _ = self._priced_proposal(run, room)
            run.stats.record_choice("ngram" if length else "plain")
            return self._verify_ngram(run, proposal.tokens[:length])
        k = min(run.cfg.draft_max, room, self._tokens_left(run) - 1)
        proposal = self._end_at_eog(run.ngram.propose(run.tokens, max(k, 0)))
        run.stats.record_choice("ngram" if proposal.tokens else "plain")
        decided = self._verify_chain(run, proposal.tokens, from_draft=False)
        run.ngram.record(proposal.ngram, len(proposal.tokens), len(decided) - 1, proposal.streak)
        return decided

    def _round_auto(self, run: _Run, room: int) -> list[int]:
        """Whatever promises the most tokens per second on this device right now (policy.py)."""
        policy, costs = run.policy, run.costs
        limit = min(MAX_AUTO_DRAFT, room, self._tokens_left(run) - 1)
        t0 = time.perf_counter()
        if costs.step_s.value is None:  # the engine's first rounds measure a plain step
            run.stats.record_choice("plain")
            decided = self._round_target(run, room)
            # The first step after the prompt took 27 ms where the next ones took 23-24 here.
            if run.warmed_up:
                self._start_costs(run, time.perf_counter() - t0)
            run.warmed_up = True
            return decided
        proposal, length, ngram_rate = self._priced_proposal(run, room)
        choice = policy.choose(ngram_rate, self._catch_up_s(run), self._steps_left(run))
        run.stats.record_choice(choice)
        run.catch_up_s = 0.0  # set by this round's draft, if it drafts (a chain of 0 does not)
        if choice == "ngram":
            decided = self._verify_ngram(run, proposal.tokens[:length])
            if len(decided) > 1:
                policy.record_copy()
        elif choice == "chain":
            decided = self._auto_chain(run, limit)
        elif choice == "tree":
            decided = self._round_tree(run, room, proposal if run.sampling.greedy else None)
        else:
            token, row = self._plain_step(run)
            costs.record_step(time.perf_counter() - t0)
            if policy.may_draft:  # how sure the target is says when to probe the draft
                sureness = None
                if policy.wants_sureness():
                    top = token if run.sampling.greedy else None  # greedy: the argmax, known
                    sureness = top_candidates(row, 1, self._target_mask, top)[0][1]
                policy.record_plain_step(sureness)
            run.last_choice = choice
            return [token]
        seconds = time.perf_counter() - t0
        if choice in ("chain", "tree"):
            # What catching up on other rounds' tokens cost: a try's price, or an arm's own
            # (policy.record_arm).
            catch_up_s = run.catch_up_s if run.last_choice != choice else 0.0
            policy.record_arm(choice, len(decided), seconds, catch_up_s)
        run.last_choice = choice
        return decided

    def _start_costs(self, run: _Run, step_s: float) -> None:
        """Auto mode's costs start from a plain step of `step_s` seconds, and a draft step in
        target steps as known so far (else the first model round times it).

        What is known may be one earlier generation's measurement, and one that came out high
        (0.34 of a target step here after a busy hour, where 0.25-0.28 is usual) can shut the
        gate for model drafts (policy.models_can_pay): then no draft round comes to measure it
        again, in this run or the next. So where that shuts the gate, a draft step is timed now
        against a target step, once per engine, and remembered. (Not where the two models'
        profiles were measured together on a quiet device: their ratio is the device's.)"""
        costs = run.costs
        costs.step_s.update(step_s)
        relative = self._draft_cost()
        if relative is not None:
            costs.estimate_draft_step(step_s * relative)
        policy = run.policy
        if self._draft_step_timed or policy is None or not policy.arms:
            return
        if relative is None or self._profiles_ratio_holds() or policy.models_can_pay():
            return
        self._draft_step_timed = True
        relative = self._time_draft_step(run)
        if relative is None:
            return
        costs.draft_s.value = None  # replaced, not averaged with what it corrects
        costs.estimate_draft_step(step_s * relative)
        if self._arms_key is not None:
            self._memory = replace(self._memory, draft_cost=relative)
            save_auto_memory(*self._arms_key, self._memory)

    def _time_draft_step(self, run: _Run) -> float | None:
        """A draft step in target steps, measured now: DRAFT_TIMING_STEPS one-token evaluations
        of each model in turn, the fastest of each. Another program's load only adds time, and
        the fastest is each model's step when it had the cores: beside a busy core, SmolLM2
        against a Q2_K copy of itself (0.80 on a quiet machine) came out at 0.60-1.01 so in 20
        runs, 0.12-2.9 from the medians of the later halves, and 0.03-1.4 as it was timed
        before, the median draft step over the answer's first plain step (0.06-10.8 in ten
        other runs; 2026-11-30). The draft's evaluations of committed tokens it lacked stay in
        its cache, as its next catching up would have put them; its others and all the target's
        are removed (and not counted among its passes). None where a context has no room left."""
        draft_ctx, target_ctx = self.draft_ctx, self.target_ctx
        assert draft_ctx is not None
        start, root, held = run.draft_cached, len(run.tokens) - 1, run.target_cached
        if start + DRAFT_TIMING_STEPS >= self.n_ctx or held + 1 >= self.n_ctx:
            return None
        target_token = run.tokens[min(held, root)]
        positions = iter(range(start, start + DRAFT_TIMING_STEPS))

        def draft_step() -> None:
            pos = next(positions)
            draft_ctx.decode([run.tokens[min(pos, root)]], pos)

        def target_step() -> None:
            target_ctx.decode([target_token], held)
            target_ctx.seq_rm(0, held)

        draft_s, target_s = steps_in_turns([draft_step, target_step], DRAFT_TIMING_STEPS)
        caught_up = min(DRAFT_TIMING_STEPS, root - start)
        draft_ctx.seq_rm(0, start + caught_up)
        run.draft_cached = start + caught_up
        run.stats.draft_s += sum(draft_s)
        return min(draft_s) / min(target_s)

    def _catch_up_s(self, run: _Run) -> float:
        """Seconds the draft would spend evaluating the tokens decided without it (auto's plain
        and n-gram rounds; those `catch_up_positions` feeds it) before it could draft: one
        prefill batch, priced per token like the largest pass of its curve. 0 while a draft
        step's cost is unknown."""
        draft_s = run.costs.draft_s.value if run.policy else None
        behind = len(catch_up_positions(run.draft_cached, len(run.tokens))) - 1
        if draft_s is None or behind <= 0:
            return 0.0
        draft_profile = quiet(self.draft_profile)
        curve = draft_profile.relative if draft_profile else _default_curve
        return behind * draft_s * curve(CATCH_UP_BATCH) / CATCH_UP_BATCH

    def _auto_chain(self, run: _Run, limit: int) -> list[int]:
        """A model chain whose length is decided token by token: draft on while one more token
        raises the expected rate, judged from the calibrated confidences and measured costs."""
        calibrator, costs = run.calibrator, run.costs
        accept_probs: list[float] = []

        def keep_going(confidences: list[float]) -> bool:
            accept_probs.append(calibrator.predict(confidences[-1]))
            if not costs.measured:  # first use: a short chain to measure the draft (and, in
                return len(accept_probs) < 2  # chain mode, a first pass stands for a step)
            return worth_drafting_on(accept_probs, accept_probs[-1], costs)

        def take(confidences: list[float], confidence: float) -> bool:
            # Sampling: whether the next token is worth its place in the pass, asked before it
            # is drawn, from how sure the draft is there (its row evaluated: that step is spent).
            # Asked after the draw, of the token drawn, it would tilt the text towards the
            # draft's favourites (see below); unasked, every chain verified at least one token,
            # and a chain of one costs 1.6 plain steps on the Emerald Rapids' curve: on prose
            # the draft gets wrong, `chain` made 0.63-0.78x plain decoding, a token every 2.1-2.3
            # steps (2026-12-01).
            if not costs.measured:
                return True
            guess = calibrator.predict(confidence)
            return worth_drafting_on(accept_probs, guess, costs, evaluated=True)

        sampled_take = None if run.sampling.greedy else take
        drafted = proposed, confidences = self._draft_chain(run, limit, keep_going, sampled_take)
        if run.draft_step_s:
            costs.record_draft_step(run.draft_step_s)
        if costs.measured and len(accept_probs) == len(proposed) and run.sampling.greedy:
            # The drafting is paid for; verify only as far as the tokens pay for their pass.
            # Greedy only: a sampled token must be verified whatever the draft's probability of
            # it turned out to be. Dropping the unlikely draws (verifying the likely ones) tilts
            # the output towards the draft's favourites (test_sampling: p = .5/.3/.2 came out
            # .60/.26/.14); when to stop drafting may depend on the tokens drawn before.
            keep, _ = best_proposal_length(accept_probs, costs)
            proposed = proposed[:keep]
        decided = self._verify_chain(run, proposed, from_draft=True, drafted=drafted)
        n_ok = len(decided) - 1
        for i, confidence in enumerate(confidences[: min(n_ok + 1, len(proposed))]):
            calibrator.record(confidence, i < n_ok)
        return decided

    def _round_tree(self, run: _Run, room: int, ngram: Proposal | None = None) -> list[int]:
        """LLMCad: grow a confidence-scored token tree with the draft until its accumulated
        uncertainty crosses alpha (or a budget), then verify every branch in one target pass.

        An n-gram proposal (greedy only: its tokens are point masses, not draws from the draft)
        is grafted on first, as far as its estimated confidence stays above alpha; the draft may
        then draft through it and the verification covers both (SpecInfer's several drafters).
        """
        stats, cfg, draft, draft_ctx = run.stats, run.cfg, self.draft, self.draft_ctx
        assert draft is not None and draft_ctx is not None
        tokens = run.tokens
        root_pos = len(tokens) - 1
        remaining = cfg.max_tokens - len(run.generated)
        depth_room = max(0, min(room, remaining - 1))  # tree depths that fit and are wanted
        # Each node, the root included, takes a cell of its own: `room + 1` are left.
        max_nodes = min(cfg.max_nodes, room + 1)
        trigger = TriggerConfig(max_nodes=max_nodes, max_depth=min(cfg.max_depth, depth_room))
        scheduler = PacerScheduler(max_nodes - 1) if cfg.scheduler == "pacer" else GreedyScheduler()
        tree = TokenTree(tokens[-1])
        params = run.sampling
        if ngram is not None and ngram.tokens and params.greedy:
            self._graft_ngram(run, tree, ngram, depth_room, max_nodes)
        # Sampling: children are draws from the draft's distribution, kept per node for the
        # verification (SpecInfer); node i's distribution is row i of the reused buffer.
        draws: dict[int, list[int]] = {}
        # Greedy: each evaluated node's draft argmax and its probability, for the calibrator;
        # sampling: the probability of the draft's most likely token there (its confidence).
        argmax_of: dict[int, tuple[int, float]] = {}
        sureness_of: dict[int, float] = {}
        q_rows = self._draft_rows(cfg.max_nodes) if not params.greedy else self._q_rows
        # Calibrated confidences are chances of acceptance: the round can be priced.
        priced = cfg.calibrated
        evals = 0
        t0 = time.perf_counter()
        while (cause := verify_cause(tree, run.alpha, trigger)) is None:
            if priced and evals and not self._tree_worth_growing(run, tree, evals):
                cause = "cost"
                break
            branch = scheduler.pick(tree)
            if branch is None:
                cause = "end"
                break
            leaf = tree.leaf(branch)
            if leaf.parent == -1:  # the root, with what the draft has not seen of the text
                row = self._draft_root(run)
            else:
                row = draft_ctx.decode([leaf.token], root_pos + leaf.depth, seq_ids=[[branch]])[-1]
            stats.draft_evals += 1
            evals += 1
            node = tree.branches[branch].leaf
            if params.greedy:
                # The runner-ups cost a second look at the row (150 against 90 µs a draft step
                # here), wasted where none of them could start a branch.
                first = int(row.argmax())
                candidates = self._draft_candidates(row, 1, first)
                p_top = candidates[0][1]
                chance = run.calibrator.predict(p_top) if cfg.calibrated else None
                can_add_branch = len(tree.branches) < cfg.max_branches
                if can_add_branch and may_branch(p_top if chance is None else chance, cfg.branch_p):
                    candidates = self._draft_candidates(row, cfg.max_branches, first)
                argmax_of[node] = candidates[0]
                children = branch_children(candidates, cfg.branch_p, chance)
            else:
                probs = q_rows[node]
                own_rows = self._draft_probs(row, params, probs)  # drawn from: fewer rows
                # Whether this node's children are worth their places in the pass, and how many
                # to draw (as many as the draft has likely candidates), are decided before they
                # are drawn: from q, never from the draws themselves (as a sampled chain stops,
                # _auto_chain). Where not worth it the node stays a leaf, its step spent.
                chance = None
                if priced:
                    sureness_of[node] = sureness = float(own_rows.max())
                    chance = run.calibrator.predict(sureness)
                    if not self._children_worth_drawing(run, tree, node, evals, chance):
                        # in the draft's cache all the same: the kept branch holds it
                        tree.nodes[node].evaluated = True
                        cause = "cost"
                        break
                room_for = cfg.max_branches - len(tree.branches) + 1
                likely = int(np.count_nonzero(own_rows >= cfg.branch_p))
                drawn = draw_children(own_rows, max(1, min(room_for, likely)), run.rng)
                ids = self._draft_id_list
                draws[node] = drawn if ids is None else [ids[t] for t in drawn]
                children = sampled_children(draws[node], probs, chance)
            copies = tree.expand(
                branch,
                children,
                max_branches=cfg.max_branches,
                max_nodes=max_nodes,  # not cfg's: one expansion added past the context's end
                is_eog=draft.is_eog,
            )
            for copy in copies:
                draft_ctx.seq_cp(copy.src_seq_id, copy.seq_id, 0, root_pos + copy.until_depth)
        drafting_s = time.perf_counter() - t0
        stats.draft_s += drafting_s
        if evals:  # catching the draft up on the root's backlog aside, as in chains
            run.costs.record_draft_step((drafting_s - run.catch_up_s) / evals)
        if priced and params.greedy and run.costs.measured:
            # The drafting is paid for; verify only the nodes likely enough to pay for their
            # slot in the pass, as a chain leaves its weak tail. (Greedy only: a sampled node
            # must be verified whatever its draw turned out to be, see _auto_chain.)
            surest = tree.surest_nodes()
            size, _ = best_pass_size((tree.nodes[n].confidence for n in surest), run.costs)
            if size < len(surest):
                renumbered = tree.prune(surest[:size])
                argmax_of = {renumbered[n]: a for n, a in argmax_of.items() if renumbered[n] >= 0}

        batch_tokens, depths, seq_ids = verification_batch(tree)
        for seq in range(1, len(tree.branches)):  # every branch sees the committed prefix
            self.target_ctx.seq_cp(0, seq)
        native_before = self.target_ctx.decode_s
        logits = self.target_ctx.decode(
            batch_tokens,
            root_pos,
            positions=[root_pos + d for d in depths],
            seq_ids=seq_ids,
            logits="all",
        )
        self._record_pass(run, len(batch_tokens), self.target_ctx.decode_s - native_before)
        if params.greedy:
            target_argmax = logits.argmax(axis=1)
            accepted = greedy_accept(tree, target_argmax)
            # Every evaluated node, on the accepted path or not, is one observation of whether
            # the target agrees with the draft's argmax after that node's path.
            for node, (top, p_top) in argmax_of.items():
                run.calibrator.record(p_top, bool(top == target_argmax[node]))
        else:
            p_row = self._p_row  # each node's read before the next's (as in chains)
            accepted = sampled_accept(
                tree,
                lambda node: probs_from_logits(logits[node], params, out=p_row),
                lambda node: q_rows[node],
                draws,
                run.rng,
                overwrite_target_rows=True,
            )
            # Each node on the accepted path that drew children is one observation of whether
            # the target took a draw made where the draft was that sure: its first (a chain's).
            # The token after the path's last node is the bonus: the first draw there, only if
            # accepted where the budget left it no node.
            after = [*accepted.tokens, accepted.bonus]
            for node, token in zip(accepted.path, after, strict=True):
                if node in sureness_of and node in draws:  # a node that stopped drew none
                    run.calibrator.record(sureness_of[node], token == draws[node][0])
        stats.target_passes += 1
        if len(tree.nodes) > 1:
            stats.record_verification(len(tree.nodes) - 1, len(accepted.tokens))
            summary = summarize(tree, accepted)
            stats.tree.record(summary, cause, run.alpha)
            if run.adaptive_alpha:
                run.alpha = next_alpha(run.alpha, summary.best_drafted, summary.best_accepted)

        end = root_pos + len(accepted.path)  # positions below this hold committed tokens
        self._keep_branch(self.target_ctx, accepted.branch, end, len(tree.branches))
        run.target_cached = end
        # The draft holds the accepted path as far as it evaluated it (a prefix of the path: a
        # node is evaluated only after its parent), in the cache of a drafted branch through it.
        in_draft = [node for node in accepted.path if tree.nodes[node].evaluated]
        if in_draft:
            kept = next(b for b in tree.drafted_branches() if in_draft[-1] in tree.path_of(b))
            run.draft_cached = root_pos + len(in_draft)
            self._keep_branch(draft_ctx, kept, run.draft_cached, len(tree.branches))
        return [*accepted.tokens, accepted.bonus]

    @staticmethod
    def _tree_worth_growing(run: _Run, tree: TokenTree, draft_evals: int) -> bool:
        """Whether drafting on is expected to raise the round's rate (policy.worth_growing; yes
        until a step and a draft step are timed). Verified now, the tree yields the target's
        token plus each node's chance of being accepted; the next evaluation extends the most
        confident open branch. Where batches are dear (this VM: a pass of 16 costs 7.7 steps,
        a draft step 0.3) the tree stops about where a chain would; where they are cheap it
        grows until LLMCad's confidence threshold or the budget stops it."""
        if not run.costs.measured:
            return True
        leaf = max((tree.leaf(b) for b in tree.open_branches()), key=lambda n: n.confidence)
        tokens, verified = tree.expected_tokens(), len(tree.nodes)
        return worth_growing(tokens, verified, draft_evals, leaf.confidence, leaf.prob, run.costs)

    @staticmethod
    def _children_worth_drawing(
        run: _Run, tree: TokenTree, node: int, draft_evals: int, chance: float
    ) -> bool:
        """Sampling: whether children drawn at `node`, just evaluated (its step spent), are
        expected to raise the round's rate, each first draw accepted with `chance`; yes until a
        step and a draft step are timed. As _tree_worth_growing, asked before the draw."""
        if not run.costs.measured:
            return True
        tokens, verified = tree.expected_tokens(), len(tree.nodes)
        reach = tree.nodes[node].confidence
        return worth_growing(tokens, verified, draft_evals - 1, reach, chance, run.costs, spent=1)

    def _graft_ngram(
        self, run: _Run, tree: TokenTree, ngram: Proposal, max_depth: int, max_nodes: int
    ) -> None:
        """Graft the n-gram proposal's tokens whose chance of being reached stays above alpha:
        a row below it is one LLMCad would not verify either. --max-depth bounds the draft's
        work, not this free proposal: inside copied text it may reach deeper (half the nodes)."""
        probs: list[float] = []
        reach = 1.0
        for position in range(min(len(ngram.tokens), max_depth, max_nodes // 2)):
            p = run.ngram.acceptance(ngram.ngram, position, ngram.streak)
            if reach * p < run.alpha:
                break
            reach *= p
            probs.append(p)
        tree.graft(
            ngram.tokens[: len(probs)],
            probs,
            max_branches=run.cfg.max_branches,
            max_nodes=max_nodes,
            is_eog=self.target.is_eog,
        )

    @staticmethod
    def _keep_branch(ctx: Context, branch: int, end: int, n_branches: int) -> None:
        """Make `branch`'s cache, cut at position `end`, the new sequence 0; drop the tree's other
        branches (sequences below `n_branches`: a round starts with sequence 0 alone). Removed
        one by one, not by seq_keep, which rewrites every cell of the cache: 95-180 µs with a
        4096-token context here, twice a round, where a seq_rm took 12 µs and most trees on
        this CPU are one branch."""
        for seq in range(n_branches):
            if seq != branch:
                ctx.seq_rm(seq, 0)
        ctx.seq_rm(branch, end)
        if branch != 0:
            ctx.seq_cp(branch, 0)
            ctx.seq_rm(branch, 0)

    def _trim_caches(self, run: _Run) -> None:
        """Leave sequence 0 of each cache holding only committed tokens (after a stop or Ctrl+C)."""
        n = len(run.tokens) - 1
        for ctx, attr in ((self.target_ctx, "target_cached"), (self.draft_ctx, "draft_cached")):
            if ctx is None:
                continue
            ctx.seq_keep(0)
            cached = min(getattr(run, attr), n)
            ctx.seq_rm(0, cached)
            setattr(run, attr, cached)
        self._target_cache = run.tokens[: run.target_cached]
        self._draft_cache = run.tokens[: run.draft_cached] if self.draft_ctx else []


class Stream:
    """The text pieces of a generation, as the target accepts them, for one iteration (a `for`
    loop); `result` is set when it ends, or when the loop is left early (finish_reason
    "interrupted"; a second iteration then yields nothing)."""

    def __init__(self, engine: Engine, prompt_tokens: list[int], cfg: GenerationConfig):
        self.engine = engine
        self.cfg = cfg
        self.stats = Stats(
            mode=cfg.mode or "target",
            n_prompt_tokens=len(prompt_tokens),
            placement=engine.placement.note,
        )
        if cfg.mode in ("tree", "auto"):
            self.stats.tree = TreeStats()
        self._switches_before = engine.thread_switches()
        self.run = _Run(
            tokens=list(prompt_tokens), n_prompt=len(prompt_tokens), cfg=cfg, stats=self.stats
        )
        self.result: Result | None = None
        self._text: list[str] = []
        self._detok, self._stops = Detokenizer(), StopMatcher(cfg.stop)
        self._reason = ""  # why generation ended, once it has
        self._consumer_s = 0.0  # time the caller held the pieces handed to it
        self._handed_at: float | None = None  # when the piece the caller holds was handed
        self._iterating = False

    def __iter__(self) -> Iterator[str]:
        if self.result is not None:  # iterated before: it has ended, and says nothing more
            return
        if self._iterating:  # a second loop would run the same generation again, on its caches
            raise EdgespecError("this stream is being iterated already; iterate it once")
        self._iterating = True
        run, stops, engine = self.run, self._stops, self.engine
        rounds = engine._begin(self)
        ended = False  # not cut short by the caller (Ctrl+C, an iterator closed early)
        try:
            while not run.superseded:  # ended by another thread: it ends, the lock untouched
                engine._acquire()  # each round (Engine._one_thread)
                try:
                    decided = next(rounds, None)
                finally:
                    engine._busy.release()
                if decided is None:
                    break
                for token in decided:
                    if run.superseded:  # another generation began, or the engine was closed
                        break
                    piece = self._commit(token)
                    if piece:
                        self._text.append(piece)
                        self._handed_at = time.perf_counter()
                        try:
                            yield piece
                        finally:  # the loop left at this piece too (break, Ctrl+C)
                            self._consumer_s += time.perf_counter() - self._handed_at
                            self._handed_at = None
                    if self._reason:
                        break
                if self._reason:
                    break
            if not stops.stopped and not run.superseded:
                tail = stops.feed(self._detok.flush()) + stops.flush()
                if tail:
                    self._text.append(tail)
                    yield tail
            ended = True
        finally:
            if not run.superseded:  # else the generation that ended it closed its rounds
                with engine._busy:  # its end settles the caches: after another thread's round
                    rounds.close()
            self._finish(ended)

    def _finish(self, ended: bool) -> None:
        """Set the statistics and the result, once: when the iteration ends, or when another
        generation or closing the engine ends it while it is left open."""
        if self.result is not None:
            return
        run, stats, engine = self.run, self.stats, self.engine
        stats.n_generated = len(run.generated)
        cut = "superseded" if run.superseded else "context" if ended else "interrupted"
        stats.finish(self._reason or cut)
        held = self._consumer_s  # the caller's time with the pieces is not decoding
        if self._handed_at is not None:  # ended by another generation while it held one:
            # held until decode_s ended, not until now (after the caches were settled: 0.6 ms
            # more, and decode_s came out under the time inside llama_decode)
            ended_at = run.decode_ended_at or time.perf_counter()
            held += max(ended_at - self._handed_at, 0.0)
        stats.decode_s = max(stats.decode_s - held, 0.0)
        stats.threads_by_cpus = threads_by_cpus()
        stats.thread_switches = engine.thread_switches() - self._switches_before
        for role, ctx in (("target", engine.target_ctx), ("draft", engine.draft_ctx)):
            if ctx is not None:
                stats.threads[role] = f"{ctx.threads}/{ctx.max_threads}"
        self.result = Result("".join(self._text), list(run.generated), stats)

    def _commit(self, token: int) -> str:
        """Take one decided token; returns the text it completes, and sets `_reason` at a stop."""
        run, target = self.run, self.engine.target
        run.tokens.append(token)
        if target.is_eog(token):
            self._reason = "stop"
            return ""
        run.generated.append(token)
        piece = self._stops.feed(self._detok.feed(target.piece(token)))
        if self._stops.stopped:
            self._reason = "stop_string"
        elif len(run.generated) >= self.cfg.max_tokens:
            self._reason = "length"
        return piece

    @property
    def text(self) -> str:
        return "".join(self._text)


def beyond(n_tokens: int, n_ctx: int) -> str:
    """`n_tokens` against a context they do not fit (with the answer's first token)."""
    if n_tokens == n_ctx:  # "3,920 tokens but the context holds 3920" read as a contradiction
        return f"{n_tokens:,} tokens, all the context holds ({n_ctx}), leaving no room to answer"
    return f"{n_tokens:,} tokens but the context holds {n_ctx}"


def check_ctx_size(n_ctx: object, trained: int | None, model: Path) -> None:
    """At least 16 tokens, at most what the model was trained for: beyond it llama.cpp's
    attention degrades, and a huge number wrapped around in its 32-bit field (a 256-token
    context, or one that took all the memory and was killed for it)."""
    if not is_whole(n_ctx):
        raise BadSettingError(f"--ctx-size must be a whole number (got {n_ctx!r})")
    assert isinstance(n_ctx, int)
    if n_ctx < 16:
        raise BadSettingError(f"--ctx-size must be at least 16 (got {n_ctx})")
    if trained and n_ctx > trained:
        raise BadSettingError(
            f"--ctx-size must be at most {trained}, the context {Path(model).name} was trained "
            f"for (got {n_ctx})"
        )


def check_threads(threads: int | None, draft_threads: int | None) -> None:
    """None is one thread per CPU of the model's; a number must be 1 to ggml's limit."""
    for flag, value in (("--threads", threads), ("--draft-threads", draft_threads)):
        if value is not None and not is_whole(value):
            raise BadSettingError(f"{flag} must be a whole number (got {value!r})")
        if value is not None and value < 1:
            raise BadSettingError(f"{flag} must be at least 1 (got {value})")
        if value is not None and value > MAX_THREADS:
            raise BadSettingError(f"{flag} must be at most {MAX_THREADS} (got {value})")


def can_pipeline(placement: Placement) -> bool:
    """Whether chains can be pipelined with this placement: each model decodes on a pinned
    thread of its own (cores.py), on CPUs of its own."""
    target, draft = placement.target_cpus, placement.draft_cpus
    return needs_pinning(target) and needs_pinning(draft) and not set(target) & set(draft)


def check_pipeline(pipeline: bool | None, has_draft: bool, placement: Placement) -> None:
    """--pipeline where it cannot run is a mistake, said before any model is loaded."""
    if pipeline and not has_draft:
        raise BadSettingError("--pipeline needs a draft model, in mode chain or auto")
    if pipeline and not can_pipeline(placement):
        raise BadSettingError(
            "--pipeline needs the target and the draft on CPUs of their own (say "
            "--target-cpus 0-2 --draft-cpus 3); here the target runs on CPUs "
            f"{format_cpu_list(placement.target_cpus)} and the draft on "
            f"{format_cpu_list(placement.draft_cpus)}"
        )


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load(
    target: str | Path,
    draft: str | Path | None = None,
    *,
    n_ctx: int | None = None,
    threads: int | None = None,
    draft_threads: int | None = None,
    target_cpus: str | None = None,
    draft_cpus: str | None = None,
    pipeline: bool | None = None,
    adapt_threads: bool = True,
    verbose: bool = False,
    say: Callable[[str], object] = lambda _: None,
    remedy: str = RUN_REMEDY,
    progress: Callable[[float], object] | None = None,
) -> Engine:
    """Load a target (and optionally a draft) GGUF and make an Engine; checks files and pairing.

    `n_ctx`: the context in tokens; None is 2048, or what the target was trained for if less
    (a model of 512 tokens ran only with -c given).

    `target_cpus`/`draft_cpus` ("0-3", "4-7") pin each model's threads; by default the target
    gets the big cores and the draft the little ones, and on uniform cores both use all of them.
    `pipeline`, `adapt_threads`: see Engine. `say` is told, before anything loads, where the
    models take more memory than this device has available (memory.shortage), with `remedy`,
    what else the caller could be asked to do; `progress`, the fraction of the model files
    loaded as they load (from the loading threads; an exception it raises stops the loads and
    is raised here). A Ctrl+C stops the loads at their next tensor (KeyboardInterrupt).
    """
    from .backend import set_verbose

    check_load_settings(
        target_cpus=target_cpus,
        draft_cpus=draft_cpus,
        pipeline=pipeline,
        adapt_threads=adapt_threads,
        verbose=verbose,
        say=say,
        progress=progress,
    )
    set_verbose(verbose)
    target = model_path(target, "the target")
    draft = None if draft is None else model_path(draft, "the draft")
    check_threads(threads, draft_threads)  # bad values fail before any loading
    placement = plan_placement(target_cpus, draft_cpus)  # bad CPU lists too
    check_pipeline(pipeline, draft is not None, placement)
    target_info = read_gguf(target)
    draft_info = read_gguf(draft) if draft is not None else None
    check_models(target_info, draft_info)
    if n_ctx is None:
        n_ctx = min(DEFAULT_CTX, target_info.context_length or DEFAULT_CTX)
    check_ctx_size(n_ctx, target_info.context_length, target_info.path)
    if short := shortage(memory_need(target_info, draft_info, n_ctx), free_memory(), remedy):
        say(short)
    target_model, draft_model = _load_models(target, target_info, draft, draft_info, progress)
    return Engine(
        target_model,
        draft_model,
        n_ctx=n_ctx,
        threads=threads,
        draft_threads=draft_threads,
        placement=placement,
        pipeline=pipeline,
        adapt_threads=adapt_threads,
    )


def check_load_settings(**settings: object) -> None:
    """`load`'s settings of the wrong type, refused: a CPU list given as a number failed as a
    TypeError, pipeline="no" (a string, so true) turned the pipeline on, and a progress that
    was no function blamed the model file once llama.cpp stopped the load."""
    for name in ("target_cpus", "draft_cpus"):
        value = settings[name]
        if value is not None and not isinstance(value, str):
            raise BadSettingError(
                f"{name} is a CPU list like '0-3,6' (got {type(value).__name__} {value!r})"
            )
    for name in ("pipeline", "adapt_threads", "verbose"):
        value = settings[name]
        if not (isinstance(value, bool) or (value is None and name == "pipeline")):
            allowed = "True, False or None" if name == "pipeline" else "True or False"
            raise BadSettingError(f"{name} must be {allowed} (got {value!r})")
    for name in ("say", "progress"):
        value = settings[name]
        if not (callable(value) or (value is None and name == "progress")):
            raise BadSettingError(f"{name} must be a function (got {type(value).__name__})")


def model_path(value: object, what: str) -> Path:
    """A model argument as a path, its `~` expanded (None or a number failed as a TypeError)."""
    if not isinstance(value, (str, os.PathLike)):
        raise BadSettingError(f"{what} is the path of a GGUF file, not {type(value).__name__}")
    return user_path(value, f"{what}'s path")


def check_models(target_info: GGUFInfo, draft_info: GGUFInfo | None) -> None:
    """What the files say, before anything loads: each model can generate, the target is a
    full model, and the draft can draft for it (raises ModelFileError, IncompatibleModelsError)."""
    check_generates(target_info)
    if target_info.narrowed_from is not None:  # its logits cover only some tokens: no target
        raise ModelFileError(
            f"{target_info.path.name} is a narrowed draft (its output keeps {target_info.n_vocab}"
            f" of {target_info.full_vocab} tokens): it can only draft; the target is "
            f"{target_info.narrowed_from} or another full model"
        )
    if draft_info is not None:
        check_generates(draft_info)
        check_pair(draft_info, target_info)


def _load_models(
    target: str | Path,
    target_info: GGUFInfo,
    draft: str | Path | None,
    draft_info: GGUFInfo | None,
    progress: Callable[[float], object] | None = None,
) -> tuple[Model, Model | None]:
    """Both models, the draft loading on a thread of its own while the target loads: reading a
    file and repacking its weights keeps one core busy, so on two cores or more the draft's load
    (0.2-0.35 s here, a fifth of a one-shot `edgespec run`'s start) costs no time. A failure is
    the target's if both fail, as when they loaded one after the other; a Ctrl+C or a failure
    stops both loads at their next tensor. `progress`: the fraction of both files loaded; an
    exception it raises stops both loads, and is raised once they have stopped."""
    infos = [target_info] if draft_info is None else [target_info, draft_info]
    parts = [0.0] * len(infos)
    total = sum(info.file_size for info in infos) or 1
    lock = threading.Lock()
    cancel = threading.Event()
    # Raised inside llama.cpp's callback, it was printed as "Exception ignored" and the load
    # failed as the model file's fault ("could not load ...: unknown reason").
    progress_failed: list[BaseException] = []

    def part(i: int) -> Callable[[float], object] | None:
        def loaded(fraction: float) -> None:
            assert progress is not None
            with lock:  # from both loading threads
                parts[i] = fraction * infos[i].file_size
                try:
                    progress(sum(parts) / total)
                except BaseException as e:
                    progress_failed.append(e)
                    cancel.set()

        return None if progress is None else loaded

    def both() -> tuple[Model, Model | None]:
        if draft is None or draft_info is None:
            return Model(target, target_info, progress=part(0), cancel=cancel), None
        with ThreadPoolExecutor(1, thread_name_prefix="edgespec-load") as pool:
            draft_loading = pool.submit(Model, draft, draft_info, progress=part(1), cancel=cancel)
            try:
                target_model = Model(target, target_info, progress=part(0), cancel=cancel)
                return target_model, draft_loading.result()
            except BaseException:  # the pool waits for the draft: it stops at its next tensor
                cancel.set()
                raise

    try:
        # Ctrl+C held over the pool too, not only over each load: raised inside the pool's or
        # the future's locks (a wait on the draft's load), it could leave one taken, and the
        # pool's exit waited for good; it stops both loads at their next tensor instead.
        with interrupts_held(on_signal=cancel.set):
            models = both()
    except BaseException:
        if progress_failed:  # the load stopped for it (a cancelled load's KeyboardInterrupt)
            raise progress_failed[0] from None
        raise
    if progress_failed:  # at a call whose answer llama.cpp does not read
        raise progress_failed[0]
    return models
