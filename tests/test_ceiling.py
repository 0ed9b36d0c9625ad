"""scripts/ceiling.py: the oracle that says how fast any policy could be with these drafters."""

import pytest

from .helpers import load_script
from .test_generation import PROMPTS

ceiling = load_script("ceiling")


def flat(_k: int) -> float:
    """A pass of any size costs one step (no CPU is like this: it makes the arithmetic plain)."""
    return 1.0


def linear(k: int) -> float:
    """Every verified token costs a full step: nothing can pay."""
    return float(k)


def half_a_step_a_token(k: int) -> float:
    """Half a step a verified token, and half a step for the pass."""
    return 0.5 * (k + 1)


def test_without_proposals_the_ceiling_is_plain_decoding():
    assert ceiling.min_steps(10, [0] * 10, None, flat, 0.0) == 10


def test_right_proposals_on_a_flat_curve_verify_as_much_as_they_may_at_once():
    # 100 tokens in passes of 33 (32 proposed + the target's own): 100 = 33 + 33 + 33 + 1
    assert ceiling.min_steps(100, [100] * 100, None, flat, 0.0) == 4


def test_no_round_yields_past_the_end():
    # 3 tokens: one pass of 2 proposed tokens and the target's own, not of 3 proposed
    assert ceiling.min_steps(3, [3, 2, 1], None, flat, 0.0) == 1


def test_where_a_verified_token_costs_a_step_speculation_never_pays():
    assert ceiling.min_steps(20, [20] * 20, [20] * 20, linear, 0.0) == 20


def test_a_model_chain_pays_only_if_its_drafting_and_pass_cost_less_than_the_steps_it_saves():
    # A chain of L tokens costs L * c + (L + 2) / 2 steps for L + 1 tokens.
    dear = ceiling.min_steps(12, [0] * 12, [12] * 12, half_a_step_a_token, 0.6)
    cheap = ceiling.min_steps(12, [0] * 12, [12] * 12, half_a_step_a_token, 0.3)
    assert dear == 12  # 1.1 L + 1 > L + 1: plain steps
    assert cheap == pytest.approx(0.3 * 11 + 6.5)  # one chain of 11 and the target's token


def test_the_cheaper_drafter_wins_where_both_are_right():
    # the n-gram costs nothing to draft; the model's chain would cost 0.5 a token more
    both = ceiling.min_steps(9, [9] * 9, [9] * 9, flat, 0.5)
    assert both == ceiling.min_steps(9, [9] * 9, None, flat, 0.0) == 1


def test_the_tokens_a_draft_did_not_draft_are_paid_for_before_its_next_chain():
    model = [0] * 6 + [6, 5, 4, 3, 2, 1]  # right only from the seventh token on
    free = ceiling.min_steps(12, [0] * 12, model, half_a_step_a_token, 0.3)
    assert free == pytest.approx(6 + 5 * 0.3 + 3.5)  # six plain steps, then a chain of five
    synced = ceiling.min_steps(
        12, [0] * 12, model, half_a_step_a_token, 0.3, catch_up=lambda behind: 0.1 * behind
    )
    # seven tokens behind by then (the prompt's last and the six plain ones), in one batch
    assert synced == pytest.approx(6 + 0.7 + 4 * 0.3 + 3.5)


def test_a_chain_taken_whole_leaves_its_last_token_and_the_targets_to_catch_up_on():
    everywhere = [8, 7, 6, 5, 4, 3, 2, 1]
    synced = ceiling.min_steps(
        8, [0] * 8, everywhere, flat, 0.1, max_len=3, catch_up=lambda behind: 0.1 * behind
    )
    # two chains of three: the first catches up on the prompt's last token, the second on two
    assert synced == pytest.approx((0.1 + 2 * 0.1 + 1) + (0.2 + 2 * 0.1 + 1))


def test_a_draft_far_behind_catches_up_on_the_texts_last_tokens_only():
    asked: list[int] = []

    def catch_up(behind: int) -> float:
        asked.append(behind)
        return 0.01 * behind

    model = [0] * 90 + [10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    steps = ceiling.min_steps(100, [0] * 100, model, half_a_step_a_token, 0.1, catch_up=catch_up)
    assert max(asked) == ceiling.DRAFT_BEHIND_CAP
    # 90 plain steps, then a chain of nine whose first evaluation takes in the last 24 of the
    # 91 tokens the draft lacks
    assert steps == pytest.approx(90 + 0.01 * ceiling.DRAFT_BEHIND_CAP + 8 * 0.1 + 5.5)


def test_a_run_of_agreement_counts_the_agreeing_positions_from_each_one_on():
    assert ceiling.runs_of_agreement([True, True, False, True]) == [2, 1, 0, 1]
    assert ceiling.runs_of_agreement([]) == []


def test_the_ngram_proposals_are_judged_against_the_text_that_follows():
    prompt = [5, 6, 7, 8, 9]
    generated = [5, 6, 7, 8, 9, 1]  # copies the prompt, then departs from it
    right = ceiling.ngram_right(prompt, generated)
    assert len(right) == len(generated)
    assert right[0] == 0  # "9" ends the prompt: nothing followed it yet
    assert right[1] == 4  # after "5", the copy of "6 7 8 9": all four right
    assert right[-1] == 0  # the last token: nothing after it to propose against


def test_a_draft_identical_to_the_target_agrees_with_its_greedy_text(self_draft_engine):
    engine = self_draft_engine
    prompt = engine.prompt_tokens(PROMPTS[0])
    text = engine.generate(prompt, mode="target", max_tokens=48).tokens
    agrees = ceiling.draft_agrees(engine, prompt, text)
    assert len(agrees) == len(text)
    # Teacher-forced in one batch, llama.cpp's numerics may part at a near tie, rarely; a
    # position off by one would agree about as often as the text repeats its own tokens.
    assert sum(agrees) >= 0.95 * len(text)


@pytest.mark.parametrize("curve", ["as measured", "a batch below a step"])
def test_on_a_real_pair_the_draft_catching_up_only_costs(
    smol_path, smol_q2_k, tmp_path, monkeypatch, capsys, curve
):
    """The script end to end on a bench run's text, SmolLM2 and its Q2_K copy: the starred
    columns, where the draft reads what it did not draft, are never above those where it knows
    the text for free; also where the profile says a batch costs less than a step, as one
    measured beside a busy core did."""
    import json
    import sys

    import edgespec
    import edgespec.profile

    if curve == "a batch below a step":  # every pass past one token timed at half its time
        measured = edgespec.profile.relative_cost
        monkeypatch.setattr(
            edgespec.profile,
            "relative_cost",
            lambda curve, k: measured(curve, k) * (0.5 if k > 1 else 1),
        )

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))  # its own quick profile, measured here
    text = "Count from 1 to 40, separated by commas: 1, 2, 3, 4,"
    prompts = tmp_path / "prompts.toml"
    prompts.write_text(
        f'[[prompts]]\nname = "count"\nclass = "code"\nmax_tokens = 48\ntext = "{text}"\n'
    )
    engine = edgespec.load(smol_path, smol_q2_k, n_ctx=1024)
    tokens = engine.generate(engine.prompt_tokens(text), mode="target", max_tokens=48).tokens
    engine.close()
    run = {
        "settings": {
            "target": {"path": str(smol_path)},
            "draft": {"path": str(smol_q2_k)},
            "n_ctx": 1024,
            "greedy": True,
        },
        "rows": [{"prompt": "count", "mode": "target", "tokens": tokens}],
    }
    bench_json = tmp_path / "run.json"
    bench_json.write_text(json.dumps(run))
    argv = ["ceiling.py", str(bench_json), "--prompts", str(prompts), "--draft-cost", "0.3"]
    monkeypatch.setattr(sys, "argv", argv)
    ceiling.main()
    out = capsys.readouterr().out
    cells = next(line for line in out.splitlines() if line.startswith("count")).split()
    ngram, model, both, model_synced, both_synced = map(float, cells[2:7])
    assert model_synced <= model and both_synced <= both
    assert min(ngram, model, both) >= 1.0  # the oracle never does worse than plain decoding
    assert "*: the draft evaluates" in out
