"""Token tree, n-gram and auto modes on the real SmolLM2 through llama.cpp."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgespec import policy
from edgespec.backend import Context
from edgespec.engine import DRAFT_SINK, DRAFT_WINDOW, catch_up_positions
from edgespec.policy import Costs, ModelOrNgram
from edgespec.tree import TokenTree, verification_batch

from .helpers import assert_same_or_near_tie, first_use_measured_quiet, fresh_logits
from .test_generation import PROMPTS

COPY_PROMPT = (
    "Repeat this code exactly, then stop:\n\n"
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n    return a / b\n"
)


def default_curve(k: int) -> float:
    """Verification costs as on a CPU like the development machine with the Qwen pair: whether
    an n-gram round pays is priced with them. (SmolLM2's own profile, which an earlier test may
    have stored for the session, makes batches so dear that the n-gram rounds under test would
    depend on which tests ran before.)"""
    from edgespec.profile import DEFAULT_RELATIVE, relative_cost

    return relative_cost(DEFAULT_RELATIVE, k)


def price_passes_with_the_default_curve(engine, monkeypatch) -> None:
    """See default_curve; what earlier tests' passes measured of SmolLM2 goes too."""
    from edgespec.engine import DEFAULT_SIZES

    monkeypatch.setattr(engine, "relative_cost", default_curve)
    monkeypatch.setattr(engine, "pass_sizes", DEFAULT_SIZES)
    monkeypatch.setattr(engine, "_batch_factor", None)


def price_passes_with_a_flat_curve(engine, monkeypatch) -> None:
    """Verification slots nearly free (a phone-like curve): a calibrated tree then verifies
    what it grew, where a dear curve would leave its unlikely nodes out of the pass."""
    monkeypatch.setattr(engine, "relative_cost", lambda k: 1 + 0.02 * (k - 1))
    monkeypatch.setattr(engine, "pass_sizes", ())  # a smooth curve: it holds at every size
    monkeypatch.setattr(engine, "_batch_factor", None)


def grow_trees_by_llmcads_triggers_alone(engine, monkeypatch) -> None:
    """Trees grown until LLMCad's confidence threshold or the budget stops them, not the round's
    price: SmolLM2's draft costs about a target step, so priced rounds stop after a draft step or
    two, and the tests that call this are about what larger trees do."""
    monkeypatch.setattr(engine, "_tree_worth_growing", lambda run, tree, evals: True)


def check_greedy(plain_engine, engine, prompt: str, mode: str, n: int = 48, **kw) -> None:
    plain = plain_engine.generate(prompt, max_tokens=n, mode="target")
    spec = engine.generate(prompt, max_tokens=n, mode=mode, **kw)
    assert_same_or_near_tie(
        plain_engine, plain_engine.prompt_tokens(prompt), plain.tokens, spec.tokens
    )
    return spec


@pytest.mark.parametrize("prompt", [*PROMPTS, COPY_PROMPT])
@pytest.mark.parametrize("mode", ["tree", "ngram", "auto"])
def test_greedy_output_equals_plain_decoding_with_a_different_draft(
    plain_engine, q2_draft_engine, mode, prompt
):
    check_greedy(plain_engine, q2_draft_engine, prompt, mode)


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_greedy_tree_output_equals_plain_with_the_target_as_draft(
    plain_engine, self_draft_engine, prompt
):
    spec = check_greedy(plain_engine, self_draft_engine, prompt, "tree", branch_p=0.1)
    assert spec.stats.tree.max_branches > 1  # the low threshold made real branches


def test_ngram_and_auto_need_no_draft_model(plain_engine):
    for mode in ("ngram", "auto"):
        spec = check_greedy(plain_engine, plain_engine, COPY_PROMPT, mode, n=60)
        assert spec.stats.draft_evals == 0


@pytest.mark.parametrize("draft_max", [8, None])
def test_ngram_drafts_copy_heavy_text_well(plain_engine, draft_max, monkeypatch):
    price_passes_with_the_default_curve(plain_engine, monkeypatch)
    result = plain_engine.generate(COPY_PROMPT, max_tokens=60, mode="ngram", draft_max=draft_max)
    assert result.stats.accepted_tokens > 20
    assert result.stats.target_passes < result.stats.n_generated * 0.7


@pytest.mark.parametrize("sampled", [False, True])
def test_ngram_mode_verifies_a_proposal_only_as_far_as_it_pays(plain_engine, sampled, monkeypatch):
    """Proposing four tokens every round made 0.48x plain on chat, where little repeats. Sampled
    text teaches the same acceptance as greedy text (see the n-gram drafter's watch). Judged on
    answers pooled (the prompts greedily, eight seeds sampled): one chat answer verifies one to
    six priced tokens, too few for an acceptance rate (a single answer failed this on a Zen 3,
    greedy at 1/6 against 0.17 and sampled at 0/1 against 0.18). Priced with the default curve:
    the SmolLM2 profile an earlier test may have stored would make the outcome depend on the
    order the tests ran in."""
    price_passes_with_the_default_curve(plain_engine, monkeypatch)
    if sampled:
        runs = [(PROMPTS[0], {"temperature": 0.8, "seed": seed}) for seed in range(8)]
    else:
        runs = [(prompt, {}) for prompt in PROMPTS]
    fixed, priced = [], []
    for prompt, sampling in runs:
        tokens = plain_engine.prompt_tokens(prompt)
        fixed.append(
            plain_engine.generate(tokens, max_tokens=60, mode="ngram", draft_max=4, **sampling)
        )
        priced.append(plain_engine.generate(tokens, max_tokens=60, mode="ngram", **sampling))
    fixed, priced = [r.stats for r in fixed], [r.stats for r in priced]

    def pooled(stats, field):
        return sum(getattr(s, field) for s in stats)

    def choices(name):
        return sum(s.choices.get(name, 0) for s in priced)

    def acceptance(stats):
        return pooled(stats, "accepted_tokens") / max(pooled(stats, "draft_tokens"), 1)

    assert pooled(fixed, "draft_tokens") > 0 and acceptance(fixed) < 0.5
    assert choices("plain") > choices("ngram")
    assert pooled(priced, "draft_tokens") < pooled(fixed, "draft_tokens") / 2
    assert pooled(priced, "draft_tokens") == 0 or acceptance(priced) > acceptance(fixed)


@pytest.mark.parametrize("draft_max", [8, None])
def test_no_pass_verifies_tokens_past_an_end_of_generation(plain_engine, draft_max, monkeypatch):
    """Generation stops at an end-of-generation token, so a proposal copying text that went on
    after one (a chat's earlier turns) is verified only up to it: tokens past it would be work
    no one sees, counted as accepted. Fixed (--draft-max) and priced proposals; auto and the
    model modes take theirs from the priced path (verifying nearly free: it proposes far)."""
    price_passes_with_a_flat_curve(plain_engine, monkeypatch)
    target = plain_engine.target
    eog = target.eos
    turn = target.tokenize(" The cat sat on the mat.", add_special=False)
    more = target.tokenize(" Then the dog came in and sat down too.", add_special=False)
    prompt = [*[*turn, eog, *more] * 6, *turn[:3]]  # the copy goes on through the end
    batches = []
    decode = plain_engine.target_ctx.decode

    def spy(tokens, start_pos, **kw):
        if start_pos >= len(prompt) - 1:  # from the root on: the prompt's batches hold ends
            batches.append(list(tokens))
        return decode(tokens, start_pos, **kw)

    monkeypatch.setattr(plain_engine.target_ctx, "decode", spy)
    result = plain_engine.generate(prompt, max_tokens=40, mode="ngram", draft_max=draft_max)
    verified = [batch for batch in batches if len(batch) > 1]
    assert verified, "no n-gram proposal was verified: the test shows nothing"
    assert any(eog in batch for batch in verified), "no proposal reached the end"
    for batch in verified:
        assert eog not in batch[:-1], f"a pass verified past the end: {batch}"
    assert result.stats.accepted_tokens <= result.stats.n_generated + 1


def test_each_tree_node_gets_the_logits_of_its_own_path(smol_path, plain_engine):
    """One tree pass with several branches gives every node what evaluating its root-to-node path
    alone gives (within batch numerics): the sequence-id method really isolates branches."""
    engine = plain_engine
    prefix = engine.prompt_tokens("The capital of France is")
    tree = TokenTree(prefix[-1])
    budgets = dict(max_branches=4, max_nodes=16)
    tree.expand(0, [(1000, 0.5), (2000, 0.4)], **budgets)  # root: 1000 | 2000
    tree.expand(0, [(1001, 0.6), (1002, 0.35)], **budgets)  # 1000: 1001 | 1002
    tree.expand(1, [(2001, 0.9)], **budgets)  # 2000: 2001
    assert len(tree.branches) == 3 and len(tree.nodes) == 6

    ctx = Context(engine.target, n_ctx=512, n_threads=2, n_seq_max=16)
    root_pos = len(prefix) - 1
    ctx.decode(prefix[:-1], 0, logits="none")
    for seq in range(1, len(tree.branches)):
        ctx.seq_cp(0, seq)
    tokens, depths, seq_ids = verification_batch(tree)
    rows = ctx.decode(
        tokens, root_pos, positions=[root_pos + d for d in depths], seq_ids=seq_ids, logits="all"
    ).copy()
    ctx.close()
    for node in range(len(tree.nodes)):
        path = [tree.nodes[n].token for n in tree.path(node)]
        alone = fresh_logits(engine, prefix[:-1] + path)
        assert rows[node].argmax() == alone.argmax()
        assert np.abs(rows[node] - alone).max() < 0.5, f"node {node}"


@pytest.mark.parametrize(
    ("prompt", "ngram_rounds"), [(PROMPTS[0], True), (COPY_PROMPT, True), (COPY_PROMPT, False)]
)
def test_after_every_tree_mode_round_each_cache_holds_exactly_the_committed_tokens(
    q2_draft_engine, prompt, ngram_rounds, monkeypatch
):
    """Tree rounds, and rounds that verify the n-gram proposal alone (with ngram_rounds). The
    trees leave nodes out of the pass on the default curve; without n-gram rounds, priced on a
    flat one, they verify their grafted copies (the default curve left the grafts' priors out)."""
    engine = q2_draft_engine
    price_passes_with_the_default_curve(engine, monkeypatch)
    if not ngram_rounds:
        monkeypatch.setattr(ModelOrNgram, "choose", lambda self, ngram_rate: "model")
        price_passes_with_a_flat_curve(engine, monkeypatch)
    grow_trees_by_llmcads_triggers_alone(engine, monkeypatch)
    original = engine._round_tree_mode
    checked = []
    # From an empty cache the draft is caught up on the prompt's start and end only; its cells
    # were moved over the skipped middle (engine._draft_catch_up).
    engine.forget_draft_cache()
    skipped = max(len(engine.prompt_tokens(prompt)) - 1 - DRAFT_SINK - DRAFT_WINDOW, 0)

    def round_and_check(run, room):
        decided = original(run, room)
        for ctx, cached, first in (
            (engine.target_ctx, run.target_cached, 0),
            (engine.draft_ctx, run.draft_cached, skipped),
        ):
            assert ctx.seq_pos_min(0) == first and ctx.seq_pos_max(0) == cached - 1
            assert all(ctx.seq_pos_max(s) == -1 for s in range(1, ctx.n_seq_max))
            # the decided tokens are appended after the round; the last of them, the new root, is
            # in neither cache yet
            assert cached <= len(run.tokens) + len(decided) - 1
        checked.append(len(decided))
        return decided

    engine._round_tree_mode = round_and_check
    try:
        # alpha0 0.01: long n-gram grafts, so that grafted paths are committed too
        result = engine.generate(
            prompt, max_tokens=80, mode="tree", branch_p=0.1, max_branches=4, max_depth=4,
            alpha0=0.01,
        )  # fmt: skip
    finally:
        del engine._round_tree_mode
    assert len(checked) > 5 and result.stats.choices.get("tree", 0) > 0
    if prompt == COPY_PROMPT and ngram_rounds:  # some rounds verified the copy alone
        assert result.stats.choices.get("ngram", 0) > 0
    if prompt == COPY_PROMPT and not ngram_rounds:  # n-gram branches alone carried some text
        assert result.stats.tree.grafted_accepted > 0


def test_a_draft_a_few_tokens_behind_catches_up_on_all_of_them_and_one_far_behind_on_the_ends():
    assert catch_up_positions(10, 50, sink=32, window=24) == list(range(10, 50))
    assert catch_up_positions(0, 100, sink=32, window=24) == [*range(32), *range(76, 100)]
    assert catch_up_positions(40, 100, sink=32, window=24) == list(range(76, 100))
    assert catch_up_positions(20, 100, sink=32, window=24) == [*range(20, 32), *range(76, 100)]


def test_a_draft_far_behind_the_prompt_is_fed_its_start_and_end_and_the_output_stays_plain(
    plain_engine, q2_draft_engine, monkeypatch
):
    """Chain mode on a prompt longer than DRAFT_SINK + DRAFT_WINDOW tokens: the draft evaluates
    the prompt's first DRAFT_SINK tokens and last DRAFT_WINDOW, its cells moved over the rest,
    and drafts from there; the target's output is unchanged."""
    engine = q2_draft_engine
    engine.forget_draft_cache()
    prompt = engine.prompt_tokens(COPY_PROMPT)
    skipped = len(prompt) - 1 - DRAFT_SINK - DRAFT_WINDOW  # the root is evaluated by its round
    assert skipped > 20
    fed: list[int] = []
    decode = engine.draft_ctx.decode

    def counting(tokens, start_pos, **kw):
        fed.append(len(tokens))
        return decode(tokens, start_pos, **kw)

    monkeypatch.setattr(engine.draft_ctx, "decode", counting)
    # The draft's rounds only: on this copy the n-gram's proposals may promise more than they
    # (beside a busy core they did, every round, and the draft never drafted).
    spec = engine.generate(prompt, max_tokens=48, mode="chain", draft_max=4, ngram=False)
    plain = plain_engine.generate(prompt, max_tokens=48, mode="target")

    assert fed[:2] == [DRAFT_SINK, DRAFT_WINDOW]
    assert engine.draft_ctx.seq_pos_min(0) == skipped
    assert engine.draft_ctx.seq_pos_max(0) > len(prompt)  # it drafted on from there
    assert spec.stats.choices.get("chain", 0) > 0 and spec.stats.accepted_tokens > 0
    assert_same_or_near_tie(plain_engine, prompt, plain.tokens, spec.tokens)


@pytest.mark.parametrize(
    "next_prompt",
    [
        "Explain what a hash table is in two sentences.",
        "Repeat this code exactly, then stop:\n\ndef add(a, b):\n    return a + b\n\n\n"
        "def pow(a, b):\n    return a ** b\n",
    ],
)
def test_a_prompt_sharing_less_than_the_draft_was_caught_up_on_catches_it_up_afresh(
    plain_engine, q2_draft_engine, next_prompt
):
    """After a windowed catch-up the draft's cells sit past the text it skipped: a next prompt
    that shares less of the text cannot go on from them. Sharing the chat template's start, it
    would start where nothing is cached; sharing some of the skipped text, it would go on from
    the text's first tokens as if it had seen the rest."""
    engine = q2_draft_engine
    engine.forget_draft_cache()
    first = engine.prompt_tokens(COPY_PROMPT)
    engine.generate(first, max_tokens=8, mode="chain", draft_max=4)
    second = engine.prompt_tokens(next_prompt)
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert shared < len(first) - 1 - DRAFT_WINDOW  # less than the draft was caught up on

    spec = engine.generate(second, max_tokens=24, mode="chain", draft_max=4)
    plain = plain_engine.generate(second, max_tokens=24, mode="target")

    # caught up as from an empty cache (its cells moved over the middle again if it is long)
    assert engine.draft_ctx.seq_pos_min(0) == max(len(second) - 1 - DRAFT_SINK - DRAFT_WINDOW, 0)
    assert_same_or_near_tie(plain_engine, second, plain.tokens, spec.tokens)


@pytest.mark.parametrize(
    ("mode", "short"), [("chain", {"draft_max": 2}), ("tree", {"max_depth": 2})]
)
def test_on_copied_text_a_model_mode_verifies_the_ngram_proposal_alone_and_drafts_less(
    plain_engine, q2_draft_engine, mode, short, monkeypatch
):
    """Where the copy promises more than the draft's rounds make (short ones here, as where a
    draft costs much), the draft rests; the text is the target's either way, and --no-ngram
    leaves the model alone."""
    price_passes_with_the_default_curve(q2_draft_engine, monkeypatch)
    runs = {
        ngram: check_greedy(
            plain_engine, q2_draft_engine, COPY_PROMPT, mode, n=60, ngram=ngram, **short
        )
        for ngram in (True, False)
    }
    assert runs[True].stats.choices.get("ngram", 0) > 0
    assert runs[True].stats.choices.get(mode, 0) > 0  # the model drafted first, to be measured
    assert "ngram" not in runs[False].stats.choices
    evals_per_token = {g: r.stats.draft_evals / r.stats.n_generated for g, r in runs.items()}
    assert evals_per_token[True] < evals_per_token[False]


def test_the_ngram_branch_carries_copied_text_without_changing_it(
    plain_engine, q2_draft_engine, monkeypatch
):
    """The copy is free to propose and may reach past the draft's --max-depth. (Every round is
    a tree here: verifying the copy alone, which it would often be, is tested above. Alpha 0.1:
    in 60 tokens the n-gram statistics barely leave their priors, whose grafts at alpha 0.3 stop
    after a token or two. On a flat curve: a dear one may leave the grafts' early estimates out
    of the pass.)"""
    monkeypatch.setattr(ModelOrNgram, "choose", lambda self, ngram_rate: "model")
    price_passes_with_a_flat_curve(q2_draft_engine, monkeypatch)
    plain = plain_engine.generate(COPY_PROMPT, max_tokens=60, mode="target")
    runs = {
        graft: q2_draft_engine.generate(
            COPY_PROMPT, max_tokens=60, mode="tree", max_depth=3, ngram=graft, alpha0=0.1
        )
        for graft in (True, False)
    }
    tokens = plain_engine.prompt_tokens(COPY_PROMPT)
    for result in runs.values():
        assert_same_or_near_tie(plain_engine, tokens, plain.tokens, result.tokens)
    assert runs[True].stats.tree.grafted_accepted > 0
    assert runs[False].stats.tree.grafted_accepted == 0
    per_pass = {g: r.stats.n_generated / r.stats.target_passes for g, r in runs.items()}
    assert per_pass[True] > per_pass[False]


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_a_calibrated_tree_stops_spending_draft_work_on_runners_up_of_a_draft_that_is_right(
    plain_engine, self_draft_engine, prompt, monkeypatch
):
    """With the target as its own draft every argmax is accepted, however unsure the draft was:
    the calibrated tree learns that and grows the winning line, where LLMCad's rule on the raw
    probabilities keeps drafting side branches that never win. Both stay lossless. (On a flat
    curve: on SmolLM2's own, where a batch is dear for its tiny step, the calibrated tree
    leaves much of what it drafted out of the pass, as it should.)"""
    grow_trees_by_llmcads_triggers_alone(self_draft_engine, monkeypatch)
    price_passes_with_a_flat_curve(self_draft_engine, monkeypatch)
    runs = {}
    for calibrated in (True, False):
        # From empty caches: cells an earlier generation computed in another batch differ in
        # the last bits, and the two rules differ by a few per cent of accepted tokens here.
        self_draft_engine.forget_caches()
        runs[calibrated] = check_greedy(
            plain_engine, self_draft_engine, prompt, "tree", n=64, branch_p=0.1,
            calibrated=calibrated, ngram=False, alpha0=0.01, adaptive_alpha=False,
        ).stats  # fmt: skip
    per_eval = {c: s.accepted_tokens / s.draft_evals for c, s in runs.items()}
    assert per_eval[True] > per_eval[False]
    assert runs[True].tree.nodes / runs[True].tree.trees > 0  # it still drafted trees
    assert runs[False].tree.max_branches > 1  # the raw rule did branch


def test_a_tree_is_verified_once_one_more_draft_step_would_lower_the_rounds_rate(
    plain_engine, q2_draft_engine, monkeypatch
):
    """SmolLM2's Q2_K copy costs most of a target step a draft step: priced with a CPU's curve,
    drafting on rarely pays, so trees are verified for their price ("cost") after fewer draft
    steps than LLMCad's triggers alone spend, and the text stays the target's."""
    engine = q2_draft_engine
    price_passes_with_the_default_curve(engine, monkeypatch)
    options = {"ngram": False, "alpha0": 0.01, "adaptive_alpha": False}
    priced = check_greedy(plain_engine, engine, PROMPTS[1], "tree", n=48, **options).stats
    grow_trees_by_llmcads_triggers_alone(engine, monkeypatch)
    unpriced = engine.generate(PROMPTS[1], max_tokens=48, mode="tree", **options).stats
    assert priced.tree.triggers.get("cost", 0) > 0 and "cost" not in unpriced.tree.triggers
    per_pass = [s.draft_evals / s.target_passes for s in (priced, unpriced)]
    assert per_pass[0] < per_pass[1]


def test_a_priced_tree_verifies_only_the_nodes_likely_enough_to_pay_for_their_slot(
    plain_engine, q2_draft_engine, monkeypatch
):
    """Grown by LLMCad's triggers alone with many runners-up (branch_p 0.1) and priced with a
    CPU's curve, the calibrated tree leaves its unlikely nodes out of the pass, as a chain its
    weak tail; the text stays the target's. Raw confidences are no chances: LLMCad's tree is
    verified as grown."""
    engine = q2_draft_engine
    price_passes_with_the_default_curve(engine, monkeypatch)
    grow_trees_by_llmcads_triggers_alone(engine, monkeypatch)
    pruned: list[tuple[int, int]] = []  # nodes drafted, nodes verified
    prune = TokenTree.prune

    def recording(tree, keep):
        drafted = len(tree.nodes)
        renumbered = prune(tree, keep)
        pruned.append((drafted, len(tree.nodes)))
        return renumbered

    monkeypatch.setattr(TokenTree, "prune", recording)
    options = {"ngram": False, "branch_p": 0.1, "alpha0": 0.01, "adaptive_alpha": False}
    check_greedy(plain_engine, engine, PROMPTS[1], "tree", n=48, **options)
    assert len(pruned) > 3 and all(verified < drafted for drafted, verified in pruned)
    pruned.clear()
    check_greedy(plain_engine, engine, PROMPTS[1], "tree", n=48, calibrated=False, **options)
    assert not pruned


@pytest.mark.parametrize("adaptive", [True, False])
def test_alpha_moves_after_verifications_only_when_adaptive(q2_draft_engine, adaptive, monkeypatch):
    # On a flat curve: on a dear one a tree may be left out of its pass whole, a plain step
    # that verifies nothing and leaves alpha as it was.
    price_passes_with_a_flat_curve(q2_draft_engine, monkeypatch)
    stats = q2_draft_engine.generate(
        PROMPTS[1], max_tokens=48, mode="tree", alpha0=0.2, adaptive_alpha=adaptive
    ).stats
    alphas = stats.tree.to_dict()
    assert stats.tree.trees > 3
    if adaptive:  # LLMCad's rule: halved after a full acceptance, else the rejected fraction
        assert alphas["alpha_min"] < alphas["alpha_max"]
    else:
        assert alphas["alpha_min"] == alphas["alpha_max"] == 0.2


def test_tree_statistics_describe_the_trees(q2_draft_engine):
    # Without n-gram rounds, which verify proposals outside any tree (when they promise more).
    stats = q2_draft_engine.generate(
        PROMPTS[1], max_tokens=60, mode="tree", branch_p=0.1, ngram=False
    ).stats
    tree = stats.tree.to_dict()
    assert tree["trees"] == sum(stats.tree.triggers.values()) == sum(tree["winner_rank_hist"])
    assert 1 <= tree["max_branches"] <= 4
    assert tree["alpha_min"] <= tree["alpha_median"] <= tree["alpha_max"]
    assert stats.tree.nodes == stats.draft_tokens  # every drafted node is proposed once
    assert tree["tree_nodes_per_verify"] == pytest.approx(
        stats.draft_tokens / tree["trees"], abs=0.01
    )


def test_auto_decodes_plainly_when_the_draft_costs_as_much_as_the_target(
    smol_path, monkeypatch, tmp_path
):
    """A draft as slow as the target can never pay: auto tries it, then decodes plainly. (An
    engine of its own: the session's, after the tests before this one had used it, drafted 17
    chain rounds to 20 plain steps in 2 of 6 runs of this file with the two after it; alone,
    a fresh engine tried one chain round.)"""
    import edgespec

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    engine = edgespec.load(smol_path, draft=smol_path, n_ctx=1024)
    stats = engine.generate(PROMPTS[0], max_tokens=120, mode="auto").stats
    drafted = stats.choices.get("chain", 0) + stats.choices.get("tree", 0)
    assert stats.choices.get("plain", 0) > 3 * drafted


def test_a_new_engine_remembers_that_drafting_lost_on_this_device(smol_path, monkeypatch, tmp_path):
    """A first try of the draft costs catching it up on the whole prompt: a new process (a new
    engine) on the same pair and device does not repeat a try that lost, until its probe is due."""
    import edgespec

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    first = edgespec.load(smol_path, draft=smol_path, n_ctx=1024)  # as slow as the target
    stats = first.generate(PROMPTS[0], max_tokens=40, mode="auto").stats
    assert stats.choices.get("chain", 0) >= 1  # tried, and lost
    again = edgespec.load(smol_path, draft=smol_path, n_ctx=1024)
    stats = again.generate(PROMPTS[1], max_tokens=12, mode="auto").stats
    assert stats.draft_evals == 0 and set(stats.choices) <= {"plain", "ngram"}
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "elsewhere"))  # another device
    fresh = edgespec.load(smol_path, draft=smol_path, n_ctx=1024)
    assert fresh.generate(PROMPTS[1], max_tokens=12, mode="auto").stats.draft_evals > 0


def test_the_passes_auto_mode_made_are_what_the_next_generation_and_run_start_from(
    smol_path, monkeypatch, tmp_path
):
    """A profile is one hour's curve; the passes auto mode makes (here: n-gram proposals of a
    copy) measure how far the present is from it, and the next generation and the next engine
    start from that."""
    import edgespec
    from edgespec.engine import Engine

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    first = edgespec.load(smol_path, n_ctx=1024)
    assert first.generate(COPY_PROMPT, max_tokens=60, mode="auto").stats.choices.get("ngram")
    learnt = first._batch_factor
    assert learnt is not None and learnt > 0  # passes over the curve's price, as timed

    started_with = []
    first_round = Engine._round_auto

    def spy(self, run, room):
        started_with.append((run.costs.batch_factor.value, run.costs.steps(4)))
        return first_round(self, run, room)

    monkeypatch.setattr(Engine, "_round_auto", spy)
    again = edgespec.load(smol_path, n_ctx=1024)
    assert again._batch_factor == pytest.approx(learnt)
    again.generate(PROMPTS[0], max_tokens=4, mode="auto")
    started = min(max(learnt, 1 / policy.START_FACTOR_BOUND), policy.START_FACTOR_BOUND)
    assert started_with[0] == pytest.approx((started, again.relative_cost(4) * started))

    # Stored again only when it moved by more than timing noise.
    from edgespec.profile import load_batch_factor

    def stored() -> float | None:
        return load_batch_factor(*again._passes_key, again.profile)

    # What the engine knows now: `learnt`, or where the generation above started from a factor
    # held within START_FACTOR_BOUND (a first run beside a busy core learnt 0.33), that start.
    known = again._batch_factor
    assert known is not None and stored() == pytest.approx(known)
    moved = Costs(again.relative_cost, again.pass_sizes)
    moved.batch_factor.value = known * 1.02
    again._remember_passes(moved)
    assert stored() == pytest.approx(known)
    moved.batch_factor.value = known * 1.2
    again._remember_passes(moved)
    assert stored() == pytest.approx(known * 1.2) and again._batch_factor == stored()


def test_a_dear_pass_factor_no_pass_measures_again_is_not_kept_for_good(
    smol_path, monkeypatch, tmp_path
):
    """A busy stretch left passes priced at 5x the curve, started from as twice (the bound); at
    that price nothing is verified in a pass, so no pass measures it again. The plain steps draw
    it back, and the next run starts from there."""
    import edgespec
    from edgespec.ngram import NgramDrafter, Proposal
    from edgespec.policy import FACTOR_HALF_LIFE
    from edgespec.profile import load_batch_factor, save_batch_factor

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    key = edgespec.load(smol_path, n_ctx=512)._passes_key
    save_batch_factor(*key, 5.0)
    engine = edgespec.load(smol_path, n_ctx=512)
    assert engine._batch_factor == 5.0
    # No proposal at all, so no pass: only plain steps, whatever the text repeats.
    monkeypatch.setattr(NgramDrafter, "propose", lambda self, tokens, k: Proposal([], 0, 0.0))
    result = engine.generate(PROMPTS[0], max_tokens=FACTOR_HALF_LIFE + 2, mode="auto")
    # two steps that time one, then FACTOR_HALF_LIFE that draw the factor back
    assert result.stats.choices == {"plain": FACTOR_HALF_LIFE + 2}
    halfway = 1 + (policy.START_FACTOR_BOUND - 1) / 2
    assert engine._batch_factor == pytest.approx(halfway, rel=0.01)  # from 2, half-way back to 1
    assert load_batch_factor(*key, engine.profile) == engine._batch_factor


def test_a_profile_measured_on_first_use_supersedes_the_passes_timed_without_one(
    smol_path, monkeypatch, tmp_path
):
    import edgespec
    from edgespec.engine import Engine
    from edgespec.profile import save_batch_factor

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    key = edgespec.load(smol_path, n_ctx=512)._passes_key  # where this engine keeps them
    save_batch_factor(*key, 3.0)
    engine = edgespec.load(smol_path, n_ctx=512)
    assert engine._batch_factor == 3.0  # no profile yet: nothing newer than them
    engine.profile_if_missing()
    assert engine.profile is not None and engine._batch_factor is None
    assert Engine(engine.target)._batch_factor is None  # nor for the next engine


def recorded_draft_timings(monkeypatch) -> list[float]:
    """Each time an engine times a draft step beside a target step: their ratio, in order."""
    import edgespec.engine

    timed_together: list[float] = []
    fastest_steps = edgespec.engine.fastest_steps

    def recording(contexts, **kwargs):
        target_s, draft_s = fastest_steps(contexts, **kwargs)
        timed_together.append(draft_s / target_s)
        return target_s, draft_s

    monkeypatch.setattr(edgespec.engine, "fastest_steps", recording)
    return timed_together


def test_a_new_drafts_cost_is_timed_beside_the_target_not_read_off_a_profile_from_another_hour(
    smol_path, smol_q4_0, monkeypatch, tmp_path
):
    """The target's stored profile is from an hour when steps took ten times as long; the
    draft has none yet. Its quick profile alone would make a draft step look a tenth of what
    it costs: both steps are timed together, and that ratio is what auto starts from, in this
    engine and in the next."""
    import dataclasses

    import edgespec
    import edgespec.profile
    from edgespec.cores import format_cpu_list
    from edgespec.profile import load_auto_memory, profile_path, profiles_dir, save_profile

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    timed_together = recorded_draft_timings(monkeypatch)
    # Measured together, the profiles are trusted here however busy the machine was meanwhile:
    # the next test specifies what their noise changes.
    monkeypatch.setattr(edgespec.profile, "NOISY_QUICK", float("inf"))
    engine = edgespec.load(smol_path, smol_q4_0, n_ctx=512)
    engine.profile_if_missing()  # both measured together: their own ratio is trusted
    together = engine._draft_cost()
    assert together is not None and 0.2 < together < 5  # a Q4_0 copy of the same model
    assert timed_together == []
    slow_hour = dataclasses.replace(
        engine.profile,
        seconds=[10 * t for t in engine.profile.seconds],
        measured_at="2026-11-22T03:00:00+00:00",
    )
    save_profile(slow_hour)
    profile_path(engine.draft_profile).unlink()  # a new draft: no profile, nothing learnt
    for memory_file in profiles_dir().glob("arms-*"):
        memory_file.unlink()

    engine = edgespec.load(smol_path, smol_q4_0, n_ctx=512)
    engine.profile_if_missing()  # measures the draft, and both steps side by side

    # What the timing measured, not the profiles' ratio (a tenth of it, and of another hour's
    # load: on this shared VM the two steps' ratio moved between 0.36 and 1.3 within minutes).
    misleading = engine.draft_profile.step_s / engine.profile.step_s
    (timed,) = timed_together
    assert engine._draft_cost() == pytest.approx(timed)
    assert timed != pytest.approx(misleading)
    assert 0.2 < timed < 5
    cpus = format_cpu_list(engine.placement.target_cpus)
    memory = load_auto_memory(smol_path, smol_q4_0, engine.threads, cpus)
    assert memory.draft_cost == pytest.approx(timed)
    again = edgespec.load(smol_path, smol_q4_0, n_ctx=512)
    assert again._draft_cost() == pytest.approx(timed)
    assert len(timed_together) == 1  # known now: not timed again
    for memory_file in profiles_dir().glob("arms-*"):  # profiles of two hours and
        memory_file.unlink()  # nothing learnt (an upgrade): timed once more, then known
    upgraded = edgespec.load(smol_path, smol_q4_0, n_ctx=512)
    upgraded.profile_if_missing()
    assert len(timed_together) == 2
    assert upgraded._draft_cost() == pytest.approx(timed_together[-1])


def test_profiles_measured_together_on_a_busy_device_do_not_price_the_draft_for_good(
    smol_path, smol_q4_0, monkeypatch, tmp_path
):
    """Two profiles measured together while another program kept a core busy: their steps'
    ratio is of that minute's load (beside a shell loop, a Q4_0 copy of SmolLM2 came out at
    0.61-0.72 of its step in eight pairs and at 0.18 once; quiet, 0.75), and their noise says so
    (0.27-0.95 in those eight, 0.03-0.05 quiet). The draft is timed beside the target instead,
    and what is remembered from then on prices it, not the profiles."""
    import dataclasses

    import edgespec
    from edgespec.profile import (
        BUSY_MEASUREMENTS,
        NOISY_QUICK,
        load_auto_memory,
        profiles_dir,
        save_profile,
    )

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    timed_together = recorded_draft_timings(monkeypatch)
    engine = edgespec.load(smol_path, smol_q4_0, n_ctx=512)
    engine.profile_if_missing()

    def profiles(draft_scale: float, noise: float) -> float:
        """Store the two profiles as measured together with this noise; their ratio."""
        target = dataclasses.replace(engine.profile, noise=0.0)
        draft = dataclasses.replace(
            engine.draft_profile,
            seconds=[draft_scale * t for t in engine.draft_profile.seconds],
            measured_at=target.measured_at,
            noise=noise,
            busy_measurements=BUSY_MEASUREMENTS,  # not measured again: kept as it is
        )
        save_profile(target)
        save_profile(draft)
        for memory_file in profiles_dir().glob("arms-*"):
            memory_file.unlink()
        timed_together.clear()
        return draft.step_s / target.step_s

    quiet = profiles(1.0, noise=0.0)
    engine = edgespec.load(smol_path, smol_q4_0, n_ctx=512)
    engine.profile_if_missing()
    assert engine._draft_cost() == pytest.approx(quiet)  # the device's own ratio: trusted
    assert timed_together == []

    busy = profiles(0.1, noise=2 * NOISY_QUICK)
    engine = edgespec.load(smol_path, smol_q4_0, n_ctx=512)
    engine.profile_if_missing()
    (timed,) = timed_together
    assert engine._draft_cost() == pytest.approx(timed)
    assert 0.2 < timed < 5 and timed != pytest.approx(busy)
    key = engine._arms_key
    assert load_auto_memory(*key).draft_cost == pytest.approx(timed)
    later = edgespec.load(smol_path, smol_q4_0, n_ctx=512)
    later.profile_if_missing()
    assert len(timed_together) == 1  # known now
    assert later._draft_cost() == load_auto_memory(*key).draft_cost != pytest.approx(busy)


def test_profiles_measured_again_after_a_busy_first_use_keep_the_draft_cost_it_learnt(
    smol_path, smol_q4_0, monkeypatch, tmp_path
):
    """Measuring a busy first use's profiles again is of the same device: the draft's cost that
    run timed beside the target, and its draft rounds corrected since, is not timed over."""
    import dataclasses

    import edgespec
    import edgespec.engine
    from edgespec.profile import NOISY_QUICK, load_auto_memory, save_auto_memory

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    quick = edgespec.engine.quick_profile
    monkeypatch.setattr(
        edgespec.engine,
        "quick_profile",
        lambda *a: dataclasses.replace(quick(*a), noise=2 * NOISY_QUICK),
    )
    timed_together = recorded_draft_timings(monkeypatch)
    engine = edgespec.load(smol_path, smol_q4_0, n_ctx=512)
    engine.profile_if_missing()  # busy: the two profiles do not price the draft
    assert len(timed_together) == 1
    learnt = dataclasses.replace(engine._memory, draft_cost=0.6)  # as draft rounds corrected it
    save_auto_memory(*engine._arms_key, learnt)
    said: list[str] = []
    again = edgespec.load(smol_path, smol_q4_0, n_ctx=512)
    again.profile_if_missing(say=said.append)
    assert sum("again (it was busy the last time)" in line for line in said) == 2
    assert len(timed_together) == 1 and again._draft_cost() == 0.6
    assert load_auto_memory(*again._arms_key).draft_cost == 0.6


def test_a_draft_that_is_the_target_costs_a_target_step_however_busy_its_profile_was(
    smol_path, monkeypatch, tmp_path
):
    """One profile for both, so their ratio is exactly 1 whatever load it was measured under:
    timing the model beside itself could only stray from that (beside a busy core two forms of
    the Qwen draft came out at 0.63-1.35 times their quiet ratio)."""
    import dataclasses

    import edgespec
    import edgespec.engine
    from edgespec.profile import BUSY_MEASUREMENTS, NOISY_QUICK, save_profile

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    engine = edgespec.load(smol_path, smol_path, n_ctx=512)
    engine.profile_if_missing()
    # Busy each time it was measured: kept, not measured again.
    busy = dict(noise=2 * NOISY_QUICK, busy_measurements=BUSY_MEASUREMENTS)
    save_profile(dataclasses.replace(engine.profile, **busy))
    timings: list[object] = []

    def timed(contexts, **kwargs):
        timings.append(contexts)
        return [1.0, 1.0]

    monkeypatch.setattr(edgespec.engine, "fastest_steps", timed)
    engine = edgespec.load(smol_path, smol_path, n_ctx=512)
    engine.profile_if_missing()
    assert engine.draft_profile == engine.profile and engine.profile.noise > NOISY_QUICK
    assert engine._draft_cost() == 1.0 and timings == []


def flat_device(engine, draft_cost: float) -> None:
    """Tell an engine it runs on a device where batches are nearly free and a draft step costs
    `draft_cost` target steps: what stored profiles would say."""
    from edgespec.profile import DeviceProfile

    def profile(seconds: float) -> DeviceProfile:
        return DeviceProfile(
            model_file="model.gguf", model_size=1, n_threads=1, cpus="0",
            ks=[1], seconds=[seconds], measured_at="2026-11-22T00:00:00+00:00",
        )  # fmt: skip

    engine.relative_cost = lambda k: 1 + 0.02 * (k - 1)
    engine.pass_sizes = ()  # a smooth curve: it holds at every size
    engine.profile, engine.draft_profile = profile(1.0), profile(draft_cost)
    engine._batch_factor = None  # nor what earlier generations' passes measured


@pytest.mark.parametrize("prompt", [PROMPTS[0], COPY_PROMPT])
def test_auto_drafting_with_the_model_after_plain_rounds_still_equals_plain(
    smol_path, smol_q2_k, plain_engine, prompt, monkeypatch, tmp_path
):
    import edgespec

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))  # no earlier run's memory of this pair
    engine = edgespec.load(smol_path, smol_q2_k, n_ctx=1024)
    flat_device(engine, draft_cost=1e-4)  # a draft this cheap is worth trying
    spec = check_greedy(plain_engine, engine, prompt, "auto", n=80)
    if prompt != COPY_PROMPT:  # where copying pays, n-gram drafts may win every round
        assert spec.stats.draft_evals > 0 and spec.stats.choices.get("chain", 0) > 0


def test_the_time_an_answer_has_left_is_its_tokens_left_at_the_rate_it_made_them_so_far():
    """A probe's catch-up is weighed against it (ANSWER_SHARE): priced as a plain step a token,
    an edit whose n-gram rounds copied at twice plain decoding's rate looked twice as long."""
    from edgespec.engine import Engine, GenerationConfig, _Run
    from edgespec.stats import Stats

    run = _Run(tokens=[1], n_prompt=1, cfg=GenerationConfig(max_tokens=200), stats=Stats())
    assert Engine._steps_left(run) == 200  # nothing measured yet: a plain step a token
    run.costs.step_s.update(0.03)
    run.generated, run.stats.decode_s = [7] * 100, 1.5  # 100 tokens at twice plain's rate
    assert Engine._steps_left(run) == pytest.approx(50.0)
    run.stats.decode_s = 6.0  # slower than plain decoding: still at most a step a token
    assert Engine._steps_left(run) == 100


def test_a_due_probe_is_skipped_where_catching_the_draft_up_would_cost_the_answer_too_much(
    smol_path, smol_q2_k, monkeypatch, tmp_path
):
    """The draft is 300 tokens behind (a long prompt it has not seen); catching up feeds it 56 of
    them (DRAFT_SINK + DRAFT_WINDOW) at 0.2 of a step a token: 11 steps. An 8-token answer must
    not pay that for a probe; an answer that may run 1500 tokens can (ANSWER_SHARE: 5 % of 1500
    steps is 75)."""
    import edgespec

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    prompt = list(range(1000, 1300))  # distinct tokens: no n-gram proposal to take instead
    draft_evals = {}
    for max_tokens in (8, 1500):
        engine = edgespec.load(smol_path, smol_q2_k, n_ctx=2048)
        flat_device(engine, draft_cost=0.2)  # a draft that could pay: its ceiling is ~2x
        for arm in engine.model_arms:  # tried long ago and lost; its probe is long due
            arm.tried, arm.since_try = True, 10**6
        monkeypatch.setattr(policy, "SURE_TEXT", 0.0)  # on text as predictable as any
        monkeypatch.setattr(policy, "SURE_STEPS", 0)
        stream = engine.stream(prompt, max_tokens=max_tokens, mode="auto")
        pieces = iter(stream)
        for _ in zip(range(20), pieces, strict=False):
            pass
        pieces.close()  # type: ignore[attr-defined]
        assert stream.result is not None
        draft_evals[max_tokens] = stream.result.stats.draft_evals
    assert draft_evals[8] == 0
    assert draft_evals[1500] > 0


def test_a_first_try_of_the_draft_is_not_charged_for_catching_it_up_on_the_prompt(
    smol_path, smol_q2_k, monkeypatch, tmp_path
):
    """The draft has not seen a 600-token prompt: catching it up (on the prompt's start and end)
    is the try's price (the probes' schedule weighs it), not the arm's rate, or every first
    chain round would lose."""
    import edgespec
    from edgespec.policy import AutoPolicy

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    prompt = list(range(1000, 1600))  # distinct tokens: no n-gram proposal to take instead
    engine = edgespec.load(smol_path, smol_q2_k, n_ctx=2048)
    flat_device(engine, draft_cost=1e-4)  # a draft this cheap is tried at once
    rounds: list[tuple[str, bool, float]] = []  # each arm round: whose, in a try, judged on
    record_arm = AutoPolicy.record_arm

    def recording(policy: AutoPolicy, name: str, tokens: int, seconds: float, catch_up_s=0.0):
        arm = next(a for a in policy.arms if a.name == name)
        before = arm.try_seconds
        record_arm(policy, name, tokens, seconds, catch_up_s)
        rounds.append((name, arm.trying, arm.try_seconds - before))

    monkeypatch.setattr(AutoPolicy, "record_arm", recording)
    draft_before = engine.draft_ctx.decode_s
    stats = engine.generate(prompt, max_tokens=6, mode="auto").stats
    assert rounds and rounds[0][:2] == ("chain", True) and stats.n_generated == 6
    catching_up = engine.draft_ctx.decode_s - draft_before
    # The draft's time went mostly into the prompt; the try's first round was charged far less.
    assert 0 < rounds[0][2] < 0.5 * catching_up


def test_the_chain_in_use_when_an_answer_ended_is_tried_at_the_next_answers_third_round(
    smol_path, smol_q2_k, plain_engine, monkeypatch, tmp_path
):
    """The engine keeps its arms from one answer to the next, and the next answer's policy tries
    the one in use early (policy.CARRY_AFTER), through llama.cpp as any chain round; without the
    carry its probes wait for sure text (here never: SURE_STEPS out of reach), and every code
    answer opened with that many plain steps where chains make 2x."""
    import edgespec
    from edgespec.policy import CARRY_AFTER, AutoPolicy

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    engine = edgespec.load(smol_path, smol_q2_k, n_ctx=1024)
    flat_device(engine, draft_cost=1e-4)  # a draft this cheap can pay
    # Whether drafts can pay, and whether catching the draft up on a new prompt costs the answer
    # too much, rest on the draft steps timed: here they are not the question (beside busy
    # cores the gate shut, and no round was the model's).
    monkeypatch.setattr(AutoPolicy, "_gates", lambda self: (True, True))
    monkeypatch.setattr(policy, "ANSWER_SHARE", float("inf"))
    # Nor is the n-gram's proposal, which ends a carried try (priced by the steps timed, too).
    monkeypatch.setattr("edgespec.engine.MAX_NGRAM_DRAFT", 0)
    engine.generate(PROMPTS[0], max_tokens=8, mode="auto")
    chain = engine.model_arms[0]
    assert chain.name == "chain" and chain.tried  # tried at once on a new device
    # In use when the answer ended (whether this tiny pair's chain wins depends on the hour).
    chain.in_use, chain.tokens.value, chain.seconds.value = True, 3.0, 0.01
    monkeypatch.setattr(policy, "SURE_STEPS", 10**6)  # no probe waits its turn out here
    rounds: list[tuple[int, str, bool]] = []  # each arm round: the round, whose, carried
    record_arm = AutoPolicy.record_arm

    def recording(policy: AutoPolicy, name: str, tokens: int, seconds: float, catch_up_s=0.0):
        arm = next(a for a in policy.arms if a.name == name)
        rounds.append((policy.rounds_chosen, name, arm.carried))
        record_arm(policy, name, tokens, seconds, catch_up_s)

    monkeypatch.setattr(AutoPolicy, "record_arm", recording)
    spec = check_greedy(plain_engine, engine, PROMPTS[1], "auto", n=12)
    # rounds_chosen counts the round being recorded: the carried try began at round CARRY_AFTER.
    assert rounds and rounds[0] == (CARRY_AFTER + 1, "chain", True)
    assert spec.stats.choices["plain"] >= CARRY_AFTER and spec.stats.draft_evals > 0


def test_auto_times_plain_decoding_from_its_second_step_and_keeps_it_for_the_next_answer(
    smol_path, monkeypatch, tmp_path
):
    """The first step after a prompt ran 27 ms where the next ones ran 23-24 (the 1.5B target
    here): timed, it made plain decoding look 15 % slower than it was, and arms that lost to it
    look like they paid. The next answer starts from what this one measured."""
    import edgespec
    from edgespec.engine import Engine

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    engine = edgespec.load(smol_path, n_ctx=1024)
    timed: list[float] = []
    start_costs = Engine._start_costs

    def recording(self: Engine, run, step_s: float) -> None:
        timed.append(step_s)
        start_costs(self, run, step_s)

    monkeypatch.setattr(Engine, "_start_costs", recording)
    engine.generate(PROMPTS[0], max_tokens=1, mode="auto")
    assert timed == []  # one step: not timed
    engine.generate(PROMPTS[0], max_tokens=4, mode="auto")
    assert len(timed) == 1  # the second step
    engine.generate(PROMPTS[1], max_tokens=1, mode="auto")
    assert len(timed) == 2 and timed[1] > 0  # started from the last answer's


def test_a_remembered_draft_cost_that_shuts_the_gate_is_timed_again_once_per_engine(
    smol_path, smol_q2_k, monkeypatch, tmp_path
):
    """A remembered draft cost is one generation's measurement. One far too high shuts auto's
    gate for model drafts, and no draft round would come to correct it: the engine times a draft
    step itself, once, and remembers what it found."""
    import edgespec
    from edgespec.engine import Engine
    from edgespec.profile import AutoMemory, load_auto_memory, save_auto_memory

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    key = edgespec.load(smol_path, smol_q2_k, n_ctx=1024)._arms_key
    save_auto_memory(*key, AutoMemory({}, draft_cost=50.0))
    engine = edgespec.load(smol_path, smol_q2_k, n_ctx=1024)
    engine.profile = engine.draft_profile = None  # no profiles: the memory is all it knows
    assert engine._memory.draft_cost == 50.0
    timings: list[float | None] = []
    time_draft_step = Engine._time_draft_step

    def recording(self: Engine, run) -> float | None:
        timings.append(time_draft_step(self, run))
        return timings[-1]

    monkeypatch.setattr(Engine, "_time_draft_step", recording)
    # A chain first, so that the draft holds the whole text; when auto goes on with it, the draft
    # lacks fewer tokens than the timing evaluates (those beyond the text must not stay cached).
    prompt = engine.prompt_tokens(PROMPTS[0])
    first = engine.generate(prompt, max_tokens=12, mode="chain")
    text = [*prompt, *first.tokens]
    auto = engine.generate(text, max_tokens=12, mode="auto")  # goes on
    assert len(timings) == 1 and timings[0] is not None
    # the two models are alike in size: a draft step costs about a target step, not 50 (timed
    # in turn with target steps: over the answer's first plain step alone, one came out at 7.9
    # beside a busy core)
    assert 1 / 3 < timings[0] < 3
    assert engine._memory.draft_cost == timings[0]
    assert load_auto_memory(*key).draft_cost == engine._memory.draft_cost
    # the draft's cache holds the text it is said to hold: its next row is a fresh context's
    held = engine._draft_cache
    engine.draft_ctx.seq_rm(0, len(held) - 1)
    row = engine.draft_ctx.decode(held[-1:], len(held) - 1)[-1].copy()
    fresh = Context(engine.draft, n_ctx=1024, n_threads=2)
    expected = fresh.decode(held, 0)[-1].copy()
    fresh.close()
    assert row.argmax() == expected.argmax() and np.abs(row - expected).max() < 2.0
    # the target's timing steps left its cache as they found it: the answer is plain decoding's
    plain = engine.generate(text, max_tokens=12, mode="target")
    assert_same_or_near_tie(engine, text, plain.tokens, auto.tokens)
    engine.generate(PROMPTS[1], max_tokens=12, mode="auto")
    assert len(timings) == 1  # once per engine


def test_a_draft_step_timed_while_another_program_holds_the_cores_is_timed_at_its_own_cost(
    smol_path, smol_q2_k, monkeypatch, tmp_path
):
    """Another program's load only adds time: beside a busy core, SmolLM2's steps took 5-190 ms
    where they take 5-7. The draft is timed against the target at the fastest step of each:
    with two in three of its steps held back, a draft alike in size to the target still costs
    about a target step (6.2 of them as it was timed before, its median step over the answer's
    first plain step; 6.1 from the medians of each model's later steps)."""
    import time

    import edgespec
    from edgespec.engine import Engine
    from edgespec.profile import AutoMemory, save_auto_memory

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    key = edgespec.load(smol_path, smol_q2_k, n_ctx=1024)._arms_key
    save_auto_memory(*key, AutoMemory({}, draft_cost=50.0))  # shuts the gate: a timing comes
    engine = edgespec.load(smol_path, smol_q2_k, n_ctx=1024)
    engine.profile = engine.draft_profile = None
    ratios: list[float | None] = []
    time_draft_step = Engine._time_draft_step
    draft_decode = engine.draft_ctx.decode
    calls = itertools.count()

    def held_back(tokens, pos, *args, **kwargs):
        if next(calls) % 3:
            time.sleep(0.03)  # the other program had the core
        return draft_decode(tokens, pos, *args, **kwargs)

    def timed_beside_a_load(self: Engine, run) -> float | None:
        monkeypatch.setattr(engine.draft_ctx, "decode", held_back)
        try:
            ratios.append(time_draft_step(self, run))
        finally:
            monkeypatch.setattr(engine.draft_ctx, "decode", draft_decode)
        return ratios[-1]

    monkeypatch.setattr(Engine, "_time_draft_step", timed_beside_a_load)
    engine.generate(PROMPTS[0], max_tokens=8, mode="auto")
    assert len(ratios) == 1 and ratios[0] is not None
    assert 1 / 3 < ratios[0] < 2
    assert engine._memory.draft_cost == ratios[0]


def test_what_share_of_its_ceiling_the_draft_reached_is_kept_across_answers_and_runs(
    smol_path, smol_q2_k, monkeypatch, tmp_path
):
    import edgespec
    from edgespec.policy import CeilingShare
    from edgespec.profile import AutoMemory, load_auto_memory, save_auto_memory

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    key = edgespec.load(smol_path, smol_q2_k, n_ctx=1024)._arms_key
    learnt = AutoMemory({"chain": 16}, 0.3, 24.0, 40.0, share_tries=2.0, rounds_shut=300)
    save_auto_memory(*key, learnt)
    engine = edgespec.load(smol_path, smol_q2_k, n_ctx=1024)
    assert engine.ceiling_share == CeilingShare(24.0, 40.0, 2.0, rounds_shut=300)
    engine.ceiling_share.record(4.0, 10.0)  # as a try on sure text would
    engine.generate(PROMPTS[0], max_tokens=8, mode="auto")
    memory = load_auto_memory(*key)
    assert (memory.share_tokens, memory.share_reach, memory.share_tries) == pytest.approx(
        (28.0, 50.0, 3.0)
    )
    # the rounds the share kept drafts out, counted on from 300 here, count on in the next run
    assert memory.rounds_shut == engine.ceiling_share.rounds_shut
    assert edgespec.load(smol_path, smol_q2_k, n_ctx=1024).ceiling_share == engine.ceiling_share


def test_a_gate_the_share_keeps_shut_lets_a_try_of_the_draft_through_now_and_then(
    smol_path, smol_q2_k, monkeypatch, tmp_path
):
    """With real models: drafts could pay here at their best, but the tries so far reached so
    little of that that the gate is shut; once REPROBE_EVERY rounds have been decided so, a try
    comes on text the target is sure of, and the count starts again. How sure the target is of
    its plain steps is measured only as that try draws near (SURE_LEAD)."""
    import edgespec
    import edgespec.engine
    from edgespec.policy import REPROBE_EVERY, SURE_STEPS, CeilingShare

    measured = []  # for each call: whether it read a plain step's sureness off the target's row

    def top_candidates(row, n, mask, *args):
        measured.append(mask is engine._target_mask)
        return real_top_candidates(row, n, mask, *args)

    real_top_candidates = edgespec.engine.top_candidates
    monkeypatch.setattr(edgespec.engine, "top_candidates", top_candidates)

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    engine = edgespec.load(smol_path, smol_q2_k, n_ctx=1024)
    flat_device(engine, draft_cost=0.2)
    engine.relative_cost = lambda k: 1 + 0.4 * (k - 1)  # a CPU's curve: a ceiling of ~1.5
    # ... which the tiny model's real passes would correct: an n-gram pass of 3 here cost 1.4x
    # the curve's price, which took the ceiling to 1.09, and in some runs below the margin, where
    # the gate is not shut by the share (nor are rounds counted as such), but by the ceiling.
    monkeypatch.setattr(Costs, "record_pass", lambda self, k, seconds: None)
    # No n-gram proposal priced to pay: a copy starts the sureness afresh (record_copy), and
    # on this counting text copies came every other round once the numbers had two digits, so
    # whether ten sure plain steps came in a row before that was a matter of where the
    # n-gram's price fell, which the machine's load moved (no try at all in 2 of 5 runs beside
    # a busy core). What is tested here is the share's gate, not the n-gram.
    monkeypatch.setattr(edgespec.engine.Engine, "_ngram_length", lambda self, run, p: (0, None))
    prompt = "Count from 1 to 100, separated by commas: 1, 2, 3, 4, 5, 6, 7, 8,"
    engine.ceiling_share = CeilingShare(0.0, 80.0, 8.0, rounds_shut=0)  # tries that reached nothing
    shut = engine.generate(prompt, max_tokens=48, mode="auto").stats
    assert "chain" not in shut.choices
    # every round counted, but the first two (they time a plain step: nothing is chosen)
    assert engine.ceiling_share.rounds_shut == sum(shut.choices.values()) - 2
    assert not any(measured)  # far from the re-probe: no step measured
    engine.ceiling_share.rounds_shut = REPROBE_EVERY
    # long enough an answer that catching the draft up on the prompt fits it (ANSWER_SHARE)
    reprobed = engine.generate(prompt, max_tokens=300, mode="auto").stats
    assert reprobed.choices.get("chain", 0) >= 1
    assert engine.ceiling_share.rounds_shut < sum(reprobed.choices.values())
    assert SURE_STEPS <= sum(measured) < reprobed.choices["plain"]  # the try waited for them


def test_a_tree_round_prices_the_draft_step_without_catching_it_up_on_the_prompt(
    smol_path, smol_q2_k, monkeypatch, tmp_path
):
    """As for chains: a tree's first round evaluates the prompt with its root; a draft step
    priced with that in it made drafting look too dear to pay (auto's gate shut for the rest
    of a chat answer here)."""
    import edgespec
    from edgespec.engine import Engine
    from edgespec.policy import Arm, Costs

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    prompt = list(range(1000, 2200))  # distinct tokens: no n-gram proposal to take instead
    engine = edgespec.load(smol_path, smol_q2_k, n_ctx=2048)
    flat_device(engine, draft_cost=1e-4)
    engine.model_arms = [Arm("tree")]
    rounds: list[tuple[int, float, list[float]]] = []  # draft evals, draft seconds, steps priced
    round_tree, record_draft_step = Engine._round_tree, Costs.record_draft_step

    def tree_round(self: Engine, run, *args, **kwargs):
        evals, draft_s = run.stats.draft_evals, self.draft_ctx.decode_s
        rounds.append((0, 0.0, []))
        decided = round_tree(self, run, *args, **kwargs)
        rounds[-1] = (
            run.stats.draft_evals - evals,
            self.draft_ctx.decode_s - draft_s,
            rounds[-1][2],
        )
        return decided

    def recording(costs: Costs, seconds: float) -> None:
        rounds[-1][2].append(seconds)
        record_draft_step(costs, seconds)

    monkeypatch.setattr(Engine, "_round_tree", tree_round)
    monkeypatch.setattr(Costs, "record_draft_step", recording)
    engine.generate(prompt, max_tokens=8, mode="auto")
    evals, draft_s, priced = rounds[0]
    assert evals >= 1 and len(priced) == 1
    # Most of the draft's time went into the prompt; a step was priced at far less.
    assert priced[0] * evals < 0.5 * draft_s


def test_a_generation_that_timed_no_draft_step_does_not_remember_a_draft_cost(
    smol_path, monkeypatch, tmp_path
):
    """Its draft cost is only the estimate it started from (here the profiles' 10 steps),
    drifted with the plain steps it timed: nothing to keep for the next run."""
    import edgespec
    from edgespec.cores import format_cpu_list
    from edgespec.profile import load_auto_memory

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    engine = edgespec.load(smol_path, smol_path, n_ctx=1024)
    flat_device(engine, draft_cost=10.0)  # can never pay: auto decodes plainly
    stats = engine.generate(PROMPTS[0], max_tokens=24, mode="auto").stats
    assert stats.draft_evals == 0
    cpus = format_cpu_list(engine.placement.target_cpus)
    assert load_auto_memory(smol_path, smol_path, engine.threads, cpus).draft_cost is None


def test_auto_leaves_a_draft_that_cannot_pay_untouched(smol_path, plain_engine):
    import edgespec

    engine = edgespec.load(smol_path, smol_path, n_ctx=1024)
    flat_device(engine, draft_cost=10.0)  # ten target steps a token: can never pay
    engine.relative_cost = lambda k: float(k)  # and a verification as dear as k steps
    engine.pass_sizes = ()
    draft_time = engine.draft_ctx.decode_s
    spec = check_greedy(plain_engine, engine, PROMPTS[0], "auto", n=40)
    assert spec.stats.draft_evals == 0 and set(spec.stats.choices) <= {"plain", "ngram"}
    assert engine.draft_ctx.decode_s == draft_time  # not even the prompt was evaluated by it


def test_every_n_gram_proposal_auto_takes_tells_its_policy_the_text_is_a_copy(
    smol_path, smol_q2_k, monkeypatch, tmp_path
):
    """A try of the draft waits for sure text after a copy (AutoPolicy.record_copy): the real
    engine says so after each n-gram round that took one of its tokens, and only then."""
    import edgespec
    from edgespec.engine import Engine
    from edgespec.policy import AutoPolicy

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    engine = edgespec.load(smol_path, smol_q2_k, n_ctx=1024)
    flat_device(engine, draft_cost=1e-4)
    events: list[str] = []
    verify_ngram, record_copy = Engine._verify_ngram, AutoPolicy.record_copy

    def ngram_round(self, run, proposed):
        decided = verify_ngram(self, run, proposed)
        events.append("copied" if len(decided) > 1 else "missed")
        return decided

    def told(policy):
        events.append("told")
        record_copy(policy)

    monkeypatch.setattr(Engine, "_verify_ngram", ngram_round)
    monkeypatch.setattr(AutoPolicy, "record_copy", told)
    stats = engine.generate(COPY_PROMPT, max_tokens=80, mode="auto").stats
    assert stats.choices.get("ngram", 0) >= 1 and "copied" in events
    for i, event in enumerate(events):  # told right after each copy, never otherwise
        assert (event == "told") == (i > 0 and events[i - 1] == "copied")
    assert events[-1] != "copied"


def test_a_long_copy_is_verified_in_proposals_longer_than_16_and_equals_plain(
    smol_path, plain_engine, monkeypatch
):
    """A pass of 32 costs less a token than one of 16 on CPUs here (a Zen 4: 13.0 against 8.5
    steps), so n-gram proposals reach 32 tokens where the copy runs on."""
    import edgespec
    from edgespec.engine import Engine

    from .conftest import N_CTX

    source = "".join(f"def f{i}(a, b):\n    return a * {i} + b - {i}\n\n\n" for i in range(8))
    engine = edgespec.load(smol_path, n_ctx=N_CTX)
    flat_device(engine, draft_cost=0.2)
    # The text twice, and the start of a third copy: SmolLM copies on (asked in a chat to repeat
    # code, it writes calls of the functions instead).
    prompt = engine.prompt_tokens(source + source + "def f0", chat_mode=False)
    lengths: list[int] = []
    verify_chain = Engine._verify_chain

    def recording(self, run, proposed, *args, **kwargs):
        lengths.append(len(proposed))
        return verify_chain(self, run, proposed, *args, **kwargs)

    monkeypatch.setattr(Engine, "_verify_chain", recording)
    plain = plain_engine.generate(prompt, max_tokens=120, mode="target")
    copied = engine.generate(prompt, max_tokens=120, mode="ngram")
    assert_same_or_near_tie(plain_engine, prompt, plain.tokens, copied.tokens)
    assert max(lengths) > 16


def test_auto_verifies_n_gram_proposals_at_the_sizes_its_profile_measured(
    smol_path, plain_engine, monkeypatch, tmp_path
):
    """On the real SmolLM: auto prices passes with the profile measured on first use, at its
    sizes; a pass of another size is verified only where the whole proposal is shorter than
    the next measured size (never in place of that size), and the text stays plain's."""
    import edgespec
    from edgespec.engine import Engine

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    first_use_measured_quiet(monkeypatch)  # measured busy, it would not price passes
    engine = edgespec.load(smol_path, n_ctx=1024)
    engine.profile_if_missing()  # as `run` does: a quick profile, on first use
    sizes_seen, choices = [], []
    ngram_length = Engine._ngram_length

    def recording(self, run, proposal):
        sizes_seen.append(run.costs.sizes)
        length, rate = ngram_length(self, run, proposal)
        choices.append((len(proposal.tokens), length))
        return length, rate

    monkeypatch.setattr(Engine, "_ngram_length", recording)
    prompt = engine.prompt_tokens(COPY_PROMPT)
    plain = plain_engine.generate(prompt, max_tokens=80, mode="target")
    spec = engine.generate(prompt, max_tokens=80, mode="auto")
    assert_same_or_near_tie(plain_engine, prompt, plain.tokens, spec.tokens)
    sizes = tuple(engine.profile.ks)
    assert set(sizes_seen) == {sizes} and sizes == tuple(engine.pass_sizes)
    verified = [(proposed, length) for proposed, length in choices if length]
    assert verified, "no n-gram pass: the test would say little"
    for proposed, length in verified:
        assert length + 1 in sizes or length + 1 > sizes[-1] or length == proposed


def test_wrong_n_gram_proposals_lose_no_more_than_the_loss_budget(plain_engine, monkeypatch):
    """On the real SmolLM, a drafter sure of proposals that are always wrong (the worst case of
    estimates learnt on other text): auto verifies them only while what their passes lost, as
    priced, stays within LOSS_ALLOWANCE plain steps, and the text is plain decoding's."""
    from edgespec.ngram import NgramDrafter, Proposal

    engine = plain_engine
    price_passes_with_the_default_curve(engine, monkeypatch)
    wrong = engine.target.tokenize(" xylophone", add_special=False)[0]

    def propose(self, tokens, max_len):
        n = max(max_len, 0)
        return Proposal([wrong] * n, 4, 0.999, True, [0] * n, [False] * n)

    monkeypatch.setattr(NgramDrafter, "propose", propose)
    monkeypatch.setattr(
        NgramDrafter, "acceptances", lambda self, n, length, s=False: [0.999] * length
    )
    charged = []
    record = policy.LossBudget.record

    def recording(self, tokens, pass_steps):
        charged.append((tokens, pass_steps))
        record(self, tokens, pass_steps)

    monkeypatch.setattr(policy.LossBudget, "record", recording)
    prompt = engine.prompt_tokens(PROMPTS[0])
    plain = engine.generate(prompt, max_tokens=60, mode="target")
    charged.clear()
    spec = engine.generate(prompt, max_tokens=60, mode="auto")
    assert_same_or_near_tie(plain_engine, prompt, plain.tokens, spec.tokens)
    passes = [(tokens, steps) for tokens, steps in charged if steps > 1]
    assert passes, "no n-gram pass was verified: the test would say little"
    lost = sum(steps - tokens for tokens, steps in charged)
    assert lost <= policy.LOSS_ALLOWANCE + 1e-9
    assert lost > policy.LOSS_ALLOWANCE / 2  # the budget, not the estimates, stopped them


@pytest.mark.parametrize("calibrated", [True, False])
def test_a_tree_near_the_end_of_the_context_fits_what_is_left_of_it(
    smol_path, smol_q4_0, plain_engine, calibrated
):
    """A tree has up to --max-nodes nodes, each in a cell of its own: within --max-nodes of a
    full context the verification failed (llama_decode status 1, a traceback, and --json lost
    every token). Only its depth was bounded by what was left."""
    import edgespec

    engine = edgespec.load(smol_path, smol_q4_0, n_ctx=256)  # 256 cells: none to spare
    prompt = "Repeat this text verbatim: " + " ".join(f"{i} apples, {i} pears;" for i in range(30))
    tokens = engine.target.tokenize(prompt, add_special=True)[:200]
    result = engine.generate(tokens, max_tokens=128, mode="tree", calibrated=calibrated)
    assert result.stats.finish_reason == "context"
    assert len(tokens) + result.stats.n_generated == 256 + 1  # the last one is never evaluated
    plain = plain_engine.generate(tokens, max_tokens=result.stats.n_generated, mode="target")
    assert_same_or_near_tie(plain_engine, tokens, plain.tokens, result.tokens)


def test_a_wide_tree_near_the_end_of_the_context_never_expands_past_it(smol_path, smol_q4_0):
    """The node budget bounded when the tree was verified, but one expansion of up to
    --max-branches children (and the n-gram graft) still took --max-nodes as its bound: a wide
    sampled tree overshot the cells left, and verification failed (llama_decode status 1)."""
    import edgespec

    engine = edgespec.load(smol_path, smol_q4_0, n_ctx=256)
    wide = dict(mode="tree", branch_p=0.05, max_branches=16, max_nodes=64, seed=1)
    prompt = engine.prompt_tokens("Tell me a story about a cat. " * 28, chat_mode=False) * 2
    for cut, temperature in itertools.product(range(216, 254, 3), (0.0, 1.0)):
        result = engine.generate(prompt[:cut], max_tokens=60, temperature=temperature, **wide)
        assert result.stats.finish_reason in ("context", "length", "stop"), (cut, temperature)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_greedy_chain_is_verified_as_far_as_it_pays_a_sampled_one_whole(
    self_draft_engine, monkeypatch, temperature
):
    """Verifying only a sampled chain's likely draws tilts the output towards the draft's
    favourites (test_sampling: p = .5/.3/.2 came out .60/.26/.14); a greedy chain's unlikely
    tail is left unverified where it does not pay for its place in the pass. (Drafting is let
    run on: SmolLM2 drafting for itself costs a target step a token, where a sampled chain now
    stops before its first draw.)"""
    from edgespec import engine as engine_module

    priced = []
    real = engine_module.best_proposal_length

    def spy(accept_probs, costs):
        priced.append(len(accept_probs))
        return real(accept_probs, costs)

    monkeypatch.setattr(engine_module, "best_proposal_length", spy)  # n-gram off: chains alone
    monkeypatch.setattr(engine_module, "worth_drafting_on", lambda *args, **kwargs: True)
    result = self_draft_engine.generate(
        PROMPTS[0], max_tokens=48, mode="chain", ngram=False, temperature=temperature, seed=1
    )
    assert result.stats.draft_tokens > 8
    assert bool(priced) == (temperature == 0)


@pytest.mark.parametrize("mode", ["ngram", "tree"])
def test_a_dear_stored_pass_factor_does_not_keep_a_mode_from_its_passes(
    self_draft_engine, monkeypatch, mode
):
    """A factor of 8 (one of 4.3 was stored by an auto answer timed beside other programs) had
    `ngram` and `tree` decode a copy plainly to its end: they time no plain step that would
    draw it back, and made no pass that would measure it."""
    monkeypatch.setattr(self_draft_engine, "_batch_factor", 8.0)
    result = self_draft_engine.generate(COPY_PROMPT, max_tokens=60, mode=mode)
    # Locked out: a pass a token. Free: 16-31 passes for 54 tokens on the Zen 4, by the profile
    # each test run measures first.
    assert result.stats.target_passes < result.stats.n_generated * 3 / 4
