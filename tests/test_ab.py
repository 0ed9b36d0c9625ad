"""scripts/ab.py: a change to edgespec's constants against edgespec as it is, paired per prompt."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edgespec import engine, policy

from .helpers import SCRIPTS, load_script
from .test_modes import COPY_PROMPT

SCRIPT = SCRIPTS / "ab.py"
ab = load_script("ab")


def test_a_setting_names_a_constant_of_an_edgespec_module_and_a_literal_of_its_type():
    assert ab.parse_setting("policy.CARRY_AFTER=1000") == ab.Setting("policy", "CARRY_AFTER", 1000)
    # An int may stand for a float: MARGIN=1 means 1.0.
    assert ab.parse_setting(" policy.MARGIN = 1 ").value == 1.0
    assert isinstance(ab.parse_setting("policy.MARGIN=1").value, float)


@pytest.mark.parametrize(
    "text, says",
    [
        ("policy.CARRY_AFTER", "MODULE.NAME=VALUE"),
        ("CARRY_AFTER=3", "MODULE.NAME=VALUE"),
        ("policy.CARRY_AFTER=three", "not a Python literal"),
        ("polcy.CARRY_AFTER=3", "no module 'polcy'"),
        ("policy.CARRY_AFTR=3", "edgespec.policy has no CARRY_AFTR"),  # else A/B'd with itself
        ("policy.CARRY_AFTER=2.5", "2.5 is not of the type of edgespec.policy.CARRY_AFTER (2)"),
        ("policy.MARGIN=True", "True is not of the type"),
    ],
)
def test_a_setting_that_would_not_change_what_it_says_is_refused(text, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        ab.parse_setting(text)


def test_settings_are_in_force_inside_the_block_only_even_when_it_fails():
    before = policy.CARRY_AFTER, engine.MAX_NGRAM_DRAFT
    settings = [ab.Setting("policy", "CARRY_AFTER", 99), ab.Setting("engine", "MAX_NGRAM_DRAFT", 0)]
    with pytest.raises(RuntimeError), ab.in_force(settings):
        assert (policy.CARRY_AFTER, engine.MAX_NGRAM_DRAFT) == (99, 0)
        raise RuntimeError
    after = policy.CARRY_AFTER, engine.MAX_NGRAM_DRAFT
    assert after == before


def test_a_bad_setting_is_one_line_and_exit_2_before_any_model_loads(tmp_path):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--set", "policy.NO_SUCH=1", "--target", "missing.gguf"],
        capture_output=True, text=True,
        env={**os.environ, "EDGESPEC_HOME": str(tmp_path)},
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr == "error: --set policy.NO_SUCH: edgespec.policy has no NO_SUCH\n"


def test_a_negative_temperature_is_one_line_and_exit_2_before_any_model_loads(tmp_path):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--set", "policy.MARGIN=1.0", "--temp", "-1",
         "--target", "missing.gguf"],
        capture_output=True, text=True,
        env={**os.environ, "EDGESPEC_HOME": str(tmp_path)},
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr == "error: --temp must be 0 (greedy) or more (got -1.0)\n"


@pytest.mark.parametrize("temp", ["0", "0.3"])
def test_arm_b_runs_with_the_change_and_arm_a_without_it(tmp_path, smol_path, smol_q4_0, temp):
    """No n-gram proposal can be made in B (none longer than 0 tokens), where A copies; both
    are paired with the same plain runs, each repeat; greedy, or sampling (--temp)."""
    prompts = tmp_path / "prompts.toml"
    prompts.write_text(
        f"[[prompts]]\nname = 'copy'\nclass = 'edit'\nmax_tokens = 60\ntext = '''{COPY_PROMPT}'''\n"
    )
    out = tmp_path / "ab.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--set", "engine.MAX_NGRAM_DRAFT=0", "--mode", "ngram",
         "--repeats", "2", "--target", str(smol_path), "--draft", str(smol_q4_0),
         "--prompts", str(prompts), "--n-ctx", "1024", "--json", str(out), "--temp", temp],
        capture_output=True, text=True, check=True,
        env={**os.environ, "EDGESPEC_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert report["temp"] == float(temp)
    assert [r.get("ngram", 0) > 0 for r in report["rounds"]["A"]["copy"]] == [True, True]
    assert [r.get("ngram", 0) for r in report["rounds"]["B"]["copy"]] == [0, 0]
    assert all(len(report["ratios"][arm]["copy"]) == 2 for arm in "AB")
    assert all(r > 0 for arm in "AB" for r in report["ratios"][arm]["copy"])
    # Priced by the profiles, B's passes are plain decoding's, one step a token, and A's
    # copies are batches: greedy, fewer passes for the same tokens. (Sampled, a copy's draw may
    # part from it early and a round pay less than its pass: 0.9987 once in CI, 1.015-1.65 here.)
    assert report["priced"]["B"]["copy"] == [pytest.approx(1.0)] * 2
    if temp == "0":
        assert all(r > 1.0 for r in report["priced"]["A"]["copy"]), report["priced"]
    else:
        assert all(r != pytest.approx(1.0) for r in report["priced"]["A"]["copy"])
    # B decodes plainly: each run at about the rate of its own plain steps (A's copies may leave
    # fewer than 16 plain steps in 60 tokens: no in-run ratio, and none of B's to pair with).
    assert all(0.5 < r <= 1.0 for r in report["in_run"]["B"]["copy"]), report["in_run"]
    lines = run.stdout.splitlines()
    priced = lines.index("priced by the profiles (llama.cpp's passes only; not a measured speed):")
    summary = lines[priced + 2].split()  # (edit, then) all A <mean> B <mean> B/A <mean> (interval)
    assert summary[0] == "all" and summary[5] == "B/A" and summary[7].startswith("(")
