"""scripts/try_replay.py: auto's tries replayed on traced chain rounds, by auto's own rules."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgespec.policy import MARGIN, TRY_MAX_ROUNDS, TRY_ROUNDS

from .helpers import SCRIPTS, load_script

SCRIPT = SCRIPTS / "try_replay.py"
try_replay = load_script("try_replay")
Round = try_replay.Round

PLAIN = 10.0  # tokens a second
BREAK_EVEN = Round(1, 0.1)  # a round making what plain decoding makes
LOST = Round(1, 0.2)  # half of it


def test_a_try_is_judged_after_try_rounds_and_stops_there_when_it_lost():
    tries = try_replay.tries_of([LOST] * 10, PLAIN)
    assert {t.rounds for t in tries} == {TRY_ROUNDS}
    assert len(tries) == 10 - TRY_ROUNDS + 1  # those the answer ends before are not judged


def test_an_undecided_try_goes_on_to_try_max_rounds():
    tries = try_replay.tries_of([BREAK_EVEN] * (TRY_MAX_ROUNDS + 2), PLAIN)
    assert tries[0].rounds == TRY_MAX_ROUNDS
    assert tries[0].tokens / tries[0].seconds == pytest.approx(PLAIN)


def test_a_try_that_beat_plain_decoding_by_the_margin_is_judged_at_once():
    won = Round(2, 0.1)
    assert try_replay.tries_of([won] * 8, PLAIN)[0].rounds == TRY_ROUNDS
    assert 2 * PLAIN > PLAIN * MARGIN


def test_where_chains_gain_in_bursts_tries_together_come_closer_than_their_mean():
    """Four losing rounds, then a run of sure ones: the tries begun on the losing ones stop
    there, low; those begun just before the run go on into it."""
    burst = Round(8, 0.3)
    rounds = ([LOST] * 4 + [BREAK_EVEN] * 2 + [burst] * 2) * 6
    made = try_replay.estimates([(rounds, PLAIN)])
    assert made.answers == pytest.approx(
        sum(r.tokens for r in rounds) / sum(r.seconds for r in rounds) / PLAIN
    )
    assert made.tries_mean < made.tries_together
    assert abs(made.tries_together - made.answers) < abs(made.tries_mean - made.answers)


def test_an_answer_too_short_for_a_try_is_refused():
    with pytest.raises(ValueError, match="long enough"):
        try_replay.estimates([([LOST] * (TRY_ROUNDS - 1), PLAIN)])


def test_the_script_traces_chain_answers_of_real_models(tmp_path, smol_path, smol_q2_k):
    prompts = tmp_path / "prompts.toml"
    text = "Count from 1 to 60, separated by commas: 1, 2, 3,"
    prompts.write_text(f"[[prompts]]\nname = 'count'\nclass = 'code'\nmax_tokens = 80\n"
                       f"text = '{text}'\n")  # fmt: skip
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--target", str(smol_path), "--draft", str(smol_q2_k),
         "--prompts", str(prompts), "--n-ctx", "1024"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "EDGESPEC_HOME": str(tmp_path / "home")},
    ).stdout  # fmt: skip
    row = next(line.split() for line in out.splitlines() if line.startswith("count"))
    chain, mean, together = float(row[2].rstrip("x")), float(row[6].rstrip(",")), float(row[8])
    assert min(chain, mean, together) > 0
    assert "tries of 1 answers" in out
