"""The device cost curve: measured on SmolLM2, stored per model/threads/CPUs, interpolated.

Timing assertions state physics that holds on any machine however loaded (32 tokens cost more
than 1), never a tight bound.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from edgespec.backend import Context, Model
from edgespec.cli.app import DEFAULT_DRAFT, DEFAULT_TARGET, resolve_model
from edgespec.cli.profile_cmd import profile
from edgespec.cores import cpu_identity, format_cpu_list, plan_placement
from edgespec.drafts import DraftChoice, choice_path, copy_path
from edgespec.engine import DEFAULT_SIZES, MAX_NGRAM_DRAFT
from edgespec.errors import BadSettingError
from edgespec.files import exclusive
from edgespec.profile import (
    ATTENTION_MARGIN,
    BUSY_MEASUREMENTS,
    DEFAULT_RELATIVE,
    FULL_KS,
    NOISY_QUICK,
    PROFILE_METHOD,
    QUICK_KS,
    AutoMemory,
    DeviceProfile,
    current_cpus,
    curve_from_times,
    faster_attention,
    fastest_steps,
    kept_profile,
    load_auto_memory,
    load_batch_factor,
    load_pipeline_speedup,
    load_profile,
    measure_curve,
    measure_profile,
    measure_times,
    noise,
    profile_model,
    profile_path,
    profiles_dir,
    quick_profile,
    relative_cost,
    save_auto_memory,
    save_batch_factor,
    save_profile,
)

from .helpers import first_use_measured_quiet, hear_ctrl_c, write_tiny_gguf

PREFIX = 64


@pytest.fixture(scope="module")
def smol_ctx(smol_path: Path) -> Context:
    return Context(Model(smol_path), n_ctx=512, n_threads=2)


@pytest.fixture
def home(smol_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # smol_path first: the session fixture must find the model before EDGESPEC_HOME moves.
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def a_profile(model: Path, **changes: object) -> DeviceProfile:
    fields: dict[str, object] = dict(
        model_file=model.name,
        model_size=model.stat().st_size,
        n_threads=2,
        cpus="0-1",
        ks=[1, 2, 3, 4, 5, 6, 7, 8, 16, 32],
        seconds=[0.010, 0.016, 0.018, 0.020, 0.025, 0.030, 0.035, 0.040, 0.070, 0.130],
        measured_at="2025-01-01T00:00:00+00:00",
    )
    fields.update(changes)
    return DeviceProfile(**fields)  # type: ignore[arg-type]


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "some-model.gguf"
    path.write_bytes(b"GGUF" + bytes(100))  # only its name and size make the key
    return path


# --- Measuring on a real model ------------------------------------------------------------------


def test_measure_curve_times_every_k_and_leaves_the_cache_at_the_prefix(smol_ctx):
    curve = measure_curve(smol_ctx, ks=(1, 4, 16, 32), repeats=3, context_tokens=PREFIX)
    assert list(curve) == [1, 4, 16, 32]
    assert all(seconds > 0 for seconds in curve.values())
    assert smol_ctx.seq_pos_max(0) == PREFIX - 1


def test_a_pass_over_32_tokens_costs_more_than_a_step(smol_path):
    # One thread: when other work shares the cores, two threads wait on each other for whole
    # seconds at random (seen on the 2-vCPU build machine); a lone thread only shares its core.
    ctx = Context(Model(smol_path), n_ctx=512, n_threads=1)
    curve = measure_curve(ctx, ks=(1, 32), repeats=5, context_tokens=PREFIX)
    assert curve[32] > curve[1]


def test_the_step_k_1_is_measured_even_when_not_asked_for(smol_ctx):
    curve = measure_curve(smol_ctx, ks=(8, 2), repeats=1, context_tokens=PREFIX)
    assert list(curve) == [1, 2, 8]


def test_steps_timed_while_another_program_holds_the_cores_are_timed_at_their_own_cost(
    smol_path, monkeypatch
):
    """Another program's load only adds time: two of every three steps of one context are held
    back, yet its step costs about the other's, the same model's. (As two models' steps were
    timed before, the medians of each one's rounds of eight, it came out at 7.3.)"""
    model = Model(smol_path)
    one, other = (Context(model, n_ctx=256, n_threads=2) for _ in range(2))
    decode, calls = other.decode, itertools.count()

    def held_back(*args, **kwargs):
        if next(calls) % 3:
            time.sleep(0.03)  # the other program had the core
        return decode(*args, **kwargs)

    monkeypatch.setattr(other, "decode", held_back)
    try:
        one_s, other_s = fastest_steps([one, other])
        assert 1 / 3 < other_s / one_s < 2
        # each step removed again: the caches hold the 32-token prefix only
        assert one.seq_pos_max(0) == other.seq_pos_max(0) == 31
    finally:
        one.close()
        other.close()


def test_a_batch_that_does_not_fit_the_context_is_refused_before_measuring(smol_ctx):
    with pytest.raises(BadSettingError, match="does not fit"):
        measure_curve(smol_ctx, ks=(1, 64), context_tokens=smol_ctx.n_ctx - 32)


def test_quick_profile_measures_the_quick_sizes_and_labels_the_model(smol_ctx, smol_path):
    p = quick_profile(smol_ctx, n_threads=2)
    assert p.ks == list(QUICK_KS)
    assert (p.model_file, p.model_size) == (smol_path.name, smol_path.stat().st_size)
    assert p.n_threads == 2 and p.step_s > 0 and p.relative(1) == pytest.approx(1.0)


@pytest.mark.parametrize(("n_ctx", "ks"), [(64, QUICK_KS), (16, (1, 2, 3, 4, 5, 6, 7, 8, 16))])
def test_a_quick_profile_fits_a_small_context(home, smol_ctx, smol_path, n_ctx, ks):
    """`run -c 64` on first use measured a profile its context could not hold (a prefix of 64
    and a pass of 32) and stopped with the measurement's error. The prefix shrinks to fit; what
    cannot fit at all is left out, so the next run in a larger context measures it again, and a
    run in a context as small finds it (each `-c 16` run measured it again)."""
    small = Context(smol_ctx.model, n_ctx=n_ctx, n_threads=2)
    p = quick_profile(small, n_threads=2, cpus="0-1")
    assert p.ks == list(ks)
    save_profile(p)
    in_any_context = load_profile(smol_path, n_threads=2, cpus="0-1")
    assert (in_any_context is not None) == (set(QUICK_KS) <= set(ks))
    assert load_profile(smol_path, n_threads=2, cpus="0-1", n_ctx=n_ctx) == p


def test_profile_model_can_pin_the_measurement_to_a_cpu_set(smol_path):
    p = profile_model(smol_path, n_threads=1, cpus="0", quick=True)
    assert p.cpus == "0" and p.n_threads == 1 and p.ks == list(QUICK_KS)


def test_the_curve_is_measured_attending_the_way_found_faster(smol_path, monkeypatch):
    import edgespec.profile as profile_module

    monkeypatch.setattr(profile_module, "measure_attention", lambda model, n_threads: (0.5, 0.4))
    attending: list[bool | None] = []
    measure = profile_module.measure_profile

    def recorded(ctx: Context, *args, **kwargs) -> DeviceProfile:
        attending.append(ctx.flash_attn)
        return measure(ctx, *args, **kwargs)

    monkeypatch.setattr(profile_module, "measure_profile", recorded)
    measured = profile_model(smol_path, n_threads=2, quick=True)
    assert attending == [False] and measured.flash_attn is False
    assert measured.attention_s == [0.5, 0.4]


def test_flash_attention_stays_unless_attending_without_it_measured_clearly_faster():
    assert faster_attention(1.0, 1.0) and faster_attention(0.9, 1.0)
    assert faster_attention(1.0, 1.0 - ATTENTION_MARGIN / 2)  # within the margin: noise
    assert not faster_attention(1.0, 1.0 - 2 * ATTENTION_MARGIN)


# --- The curve between and beyond measured points -----------------------------------------------


def test_relative_is_exact_at_measured_ks_and_linear_between(model_file):
    p = a_profile(model_file, ks=[1, 2, 3, 4, 8], seconds=[0.010, 0.016, 0.018, 0.020, 0.040])
    assert p.step_s == 0.010
    assert [p.relative(k) for k in (1, 2, 3, 4, 8)] == pytest.approx([1.0, 1.6, 1.8, 2.0, 4.0])
    assert p.relative(6) == pytest.approx(3.0)
    assert p.cost(6) == pytest.approx(0.030)


def test_relative_grows_in_proportion_to_k_beyond_the_last_measured_k(model_file):
    p = a_profile(model_file, ks=[1, 8, 16], seconds=[0.010, 0.050, 0.045])  # non-monotone end
    assert p.relative(32) == pytest.approx(9.0)  # 4.5 at 16, doubled: never falls with k


def test_a_pass_costs_at_least_a_step_whatever_a_profile_timed_under_load_says(model_file):
    p = a_profile(model_file, ks=[1, 2, 4], seconds=[0.030, 0.015, 0.040])  # T(1) hit by a load
    assert p.relative(2) == 1.0 and p.relative(3) == 1.0  # not 0.5 and 0.92
    assert p.relative(4) == pytest.approx(4 / 3)
    assert p.relative(0.5) == pytest.approx(0.5)  # below a token: a share of one, as before


def test_nothing_costs_nothing_and_negative_sizes_are_refused():
    assert relative_cost(DEFAULT_RELATIVE, 0) == 0.0
    with pytest.raises(ValueError):
        relative_cost(DEFAULT_RELATIVE, -1)


def test_the_default_curve_is_the_steep_q4_k_m_one_from_1_to_32():
    assert relative_cost(DEFAULT_RELATIVE, 1) == 1.0
    assert relative_cost(DEFAULT_RELATIVE, 4) == pytest.approx(2.63)
    assert relative_cost(DEFAULT_RELATIVE, 20) == pytest.approx((5.16 + 8.01) / 2)
    assert relative_cost(DEFAULT_RELATIVE, 32) == pytest.approx(9.30)


# --- Stored profiles ----------------------------------------------------------------------------


def test_a_saved_profile_is_found_again_by_model_file_threads_and_cpus(home, model_file):
    saved = a_profile(model_file)
    path = save_profile(saved)
    assert path.parent == profiles_dir() and path.is_relative_to(home)
    assert load_profile(model_file, n_threads=2, cpus="0-1") == saved


def test_another_thread_count_cpu_set_or_file_size_finds_no_profile(home, model_file):
    save_profile(a_profile(model_file))
    assert load_profile(model_file, n_threads=1, cpus="0-1") is None
    assert load_profile(model_file, n_threads=2, cpus="0") is None
    model_file.write_bytes(b"GGUF" + bytes(200))  # the file was replaced
    assert load_profile(model_file, n_threads=2, cpus="0-1") is None


def test_a_profile_measured_the_old_way_is_measured_again(home, model_file):
    """Before PROFILE_METHOD 2 a curve was two separate medians, which a busy machine bent; such a
    file (it has no "method") counts as no profile, so first use measures one the current way."""
    path = save_profile(a_profile(model_file))
    data = json.loads(path.read_text())
    assert data["method"] == PROFILE_METHOD
    del data["method"]
    path.write_text(json.dumps(data))
    assert load_profile(model_file, n_threads=2, cpus="0-1") is None


@pytest.mark.parametrize(
    "ks",
    [
        # Beyond its last k a curve grows in proportion to k: one that stops at 16 (the quick
        # profiles before 2026-11-25) would never let an n-gram proposal of 17 to 32 look worth it.
        [1, 2, 4, 8, 16],
        # Auto verifies at measured sizes only: without 3, never a proposal of 2 (the quick
        # profiles before 2026-11-25's last change).
        [1, 2, 4, 8, 16, 32],
        # Without 5 to 7 every pass of 5 to 7 tokens was priced as one of 8: on a Zen 3 here 5.1-6.3
        # steps where they cost 2.8-3.9 (the quick profiles before 2026-11-26).
        [1, 2, 3, 4, 8, 16, 32],
    ],
)
def test_a_profile_measured_at_fewer_sizes_than_a_quick_one_is_measured_again(home, model_file, ks):
    seconds = [0.01 * (1 + 0.5 * (k - 1)) for k in ks]
    save_profile(a_profile(model_file, ks=ks, seconds=seconds))
    assert load_profile(model_file, n_threads=2, cpus="0-1") is None
    assert QUICK_KS[-1] == MAX_NGRAM_DRAFT  # what a first use measures reaches it
    save_profile(a_profile(model_file, ks=list(QUICK_KS), seconds=[0.01 * k for k in QUICK_KS]))
    assert load_profile(model_file, n_threads=2, cpus="0-1") is not None


def test_no_profile_for_a_missing_model_file(home, tmp_path):
    assert load_profile(tmp_path / "gone.gguf", n_threads=2) is None


@pytest.mark.parametrize(
    "content",
    ["{not json", "[]", '{"model_file": "x"}', "", '{"ks": [2], "seconds": [0.1]}'],
)
def test_a_corrupt_profile_loads_as_none_and_the_next_save_replaces_it(home, model_file, content):
    path = save_profile(a_profile(model_file))
    path.write_text(content)
    assert load_profile(model_file, n_threads=2, cpus="0-1") is None
    save_profile(a_profile(model_file))
    assert load_profile(model_file, n_threads=2, cpus="0-1") is not None


def test_auto_memory_is_kept_per_pair_threads_and_cpus(home, model_file, tmp_path):
    draft = tmp_path / "some-draft.gguf"
    draft.write_bytes(b"GGUF" + bytes(50))
    assert load_auto_memory(model_file, draft, 2, "0-1") == AutoMemory({})
    save_auto_memory(model_file, draft, 2, "0-1", AutoMemory({"chain": 64}, draft_cost=0.4))
    assert load_auto_memory(model_file, draft, 2, "0-1") == AutoMemory({"chain": 64}, 0.4)
    assert load_auto_memory(model_file, draft, 1, "0-1") == AutoMemory({})
    assert load_auto_memory(draft, model_file, 2, "0-1") == AutoMemory({})
    assert load_auto_memory(model_file, tmp_path / "gone.gguf", 2, "0-1") == AutoMemory({})
    next(profiles_dir().glob("arms-*.json")).write_text("{not json")
    assert load_auto_memory(model_file, draft, 2, "0-1") == AutoMemory({})


def test_auto_memory_keeps_what_share_of_the_ceiling_tries_reached(home, model_file, tmp_path):
    draft = tmp_path / "some-draft.gguf"
    draft.write_bytes(b"GGUF" + bytes(50))
    learnt = AutoMemory({"chain": 16}, 0.3, 26.0, 40.0, share_tries=2.0, rounds_shut=300)
    save_auto_memory(model_file, draft, 2, "0-1", learnt)
    assert load_auto_memory(model_file, draft, 2, "0-1") == learnt
    assert learnt.share == pytest.approx(0.65)
    assert not learnt.same_as(AutoMemory({"chain": 16}, 0.3, 38.0, 60.0, share_tries=3.0))
    assert not learnt.same_as(replace(learnt, share_tokens=30.0))  # 0.75 of the ceiling now
    assert learnt.same_as(replace(learnt, share_tokens=26.4))  # 0.66: the same, as measured
    assert not learnt.same_as(replace(learnt, rounds_shut=301))  # a re-probe counts on them
    saved = next(profiles_dir().glob("arms-*.json"))
    saved.write_text(saved.read_text().replace('"rounds_shut": 300', '"rounds_shut": Infinity'))
    assert load_auto_memory(model_file, draft, 2, "0-1") == AutoMemory({})  # damaged: unknown
    older = next(profiles_dir().glob("arms-*.json"))  # an older edgespec's file: no share
    older.write_text(json.dumps({"probe_every": {"chain": 16}, "draft_cost": 0.3}))
    assert load_auto_memory(model_file, draft, 2, "0-1") == AutoMemory({"chain": 16}, 0.3)


def test_auto_memory_of_an_earlier_edgespec_keeps_the_mean_share_its_tries_reached(
    home, model_file, tmp_path
):
    """It kept the tries' shares summed ("share_total"), not their tokens and reach."""
    draft = tmp_path / "some-draft.gguf"
    draft.write_bytes(b"GGUF" + bytes(50))
    save_auto_memory(model_file, draft, 2, "0-1", AutoMemory({"chain": 16}))
    saved = next(profiles_dir().glob("arms-*.json"))
    saved.write_text(
        json.dumps({"probe_every": {"chain": 16}, "share_total": 3.0, "share_tries": 5.0})
    )
    memory = load_auto_memory(model_file, draft, 2, "0-1")
    assert memory.share == pytest.approx(0.6) and memory.share_tries == 5.0
    for damaged in (
        {"share_total": -1.0, "share_tries": 5.0},
        {"share_tokens": 3.0, "share_reach": 0.0, "share_tries": 2.0},
        {"share_tokens": 3.0, "share_reach": float("nan"), "share_tries": 2.0},
    ):
        saved.write_text(json.dumps({"probe_every": {"chain": 16}, **damaged}))
        memory = load_auto_memory(model_file, draft, 2, "0-1")
        assert (memory.share, memory.share_tries) == (None, 0.0), damaged  # as never measured


def test_the_measured_pass_factor_is_kept_per_target_threads_and_cpus(home, model_file, tmp_path):
    assert load_batch_factor(model_file, 2, "0-1", None) is None
    save_batch_factor(model_file, 2, "0-1", 1.2)
    assert load_batch_factor(model_file, 2, "0-1", None) == 1.2
    assert load_batch_factor(model_file, 2, "0-1", a_profile(model_file)) == 1.2  # older
    assert load_batch_factor(model_file, 1, "0-1", None) is None
    assert load_batch_factor(model_file, 2, "0", None) is None
    assert load_batch_factor(tmp_path / "gone.gguf", 2, "0-1", None) is None
    stored = next(profiles_dir().glob("passes-*.json"))
    stored.write_text('{"batch_factor": "x", "saved_at": "2026-11-26T00:00:00+00:00"}')
    assert load_batch_factor(model_file, 2, "0-1", None) is None
    # an older edgespec's file, with each size's own prices: its factor is read, they are not
    older = {"steps": {"27": 14.5}, "seen": {"27": 1.2}, "batch_factor": 1.02}
    stored.write_text(json.dumps({**older, "saved_at": "2026-11-26T00:00:00+00:00"}))
    assert load_batch_factor(model_file, 2, "0-1", None) == 1.02


def test_what_was_measured_on_another_cpu_is_not_found(home, model_file, tmp_path, monkeypatch):
    """A VM moved to another host here went from a Zen 5 to a Zen 4, where a pass of 16 tokens
    cost 8.4 plain steps instead of 5.3: nothing measured there holds."""
    draft = tmp_path / "some-draft.gguf"
    draft.write_bytes(b"GGUF" + bytes(50))
    monkeypatch.setattr("edgespec.profile.cpu_identity", lambda: "AMD EPYC, Zen 5, AVX-512")
    profile = a_profile(model_file)
    save_profile(profile)
    save_batch_factor(model_file, 2, "0-1", 1.2)
    save_auto_memory(model_file, draft, 2, "0-1", AutoMemory({"chain": 64}, draft_cost=0.3))

    monkeypatch.setattr("edgespec.profile.cpu_identity", lambda: "AMD EPYC, Zen 4, AVX-512")
    assert load_profile(model_file, n_threads=2, cpus="0-1") is None
    assert load_batch_factor(model_file, 2, "0-1", None) is None
    assert load_auto_memory(model_file, draft, 2, "0-1") == AutoMemory({})

    monkeypatch.setattr("edgespec.profile.cpu_identity", lambda: "AMD EPYC, Zen 5, AVX-512")
    assert load_profile(model_file, n_threads=2, cpus="0-1") == profile


def test_a_profile_measured_after_the_passes_supersedes_them(home, model_file):
    save_batch_factor(model_file, 2, "0-1", 1.2)
    remeasured = a_profile(model_file, measured_at="2999-01-01T00:00:00+00:00")
    assert load_batch_factor(model_file, 2, "0-1", remeasured) is None


def test_auto_memory_changes_only_with_what_it_would_decide():
    stored = AutoMemory({"chain": 64}, draft_cost=0.40)
    assert AutoMemory({"chain": 64}, draft_cost=0.41).same_as(stored)  # timing noise
    assert not AutoMemory({"chain": 64}, draft_cost=0.30).same_as(stored)
    assert not AutoMemory({"chain": 128}, draft_cost=0.40).same_as(stored)
    assert not AutoMemory({"chain": 64}).same_as(stored)
    assert AutoMemory({}).same_as(AutoMemory({}))


def test_the_attention_chosen_is_stored_and_an_older_profile_leaves_it_to_llama_cpp(
    home, model_file
):
    save_profile(a_profile(model_file, flash_attn=False, attention_s=[0.5, 0.4]))
    loaded = load_profile(model_file, n_threads=2, cpus="0-1")
    assert loaded is not None and loaded.flash_attn is False and loaded.attention_s == [0.5, 0.4]
    older = a_profile(model_file).to_dict()
    del older["flash_attn"], older["attention_s"]
    assert DeviceProfile.from_dict(older).flash_attn is None
    for bad in ({"flash_attn": "off"}, {"attention_s": [0.5]}):
        save_profile(DeviceProfile.from_dict(older))
        path = next(profiles_dir().glob("some-model*.json"))
        path.write_text(json.dumps({**older, **bad}))
        assert load_profile(model_file, n_threads=2, cpus="0-1") is None


def test_an_engine_attends_as_each_models_profile_chose(home, smol_path, smol_q4_0):
    import edgespec

    placement = plan_placement()
    threads, cpus = len(placement.target_cpus), format_cpu_list(placement.target_cpus)
    save_profile(a_profile(smol_path, n_threads=threads, cpus=cpus, flash_attn=False))
    engine = edgespec.load(smol_path, smol_q4_0, n_ctx=256)
    assert engine.target_ctx.flash_attn is False
    assert engine.draft_ctx is not None and engine.draft_ctx.flash_attn is None  # no profile
    assert engine.generate("Hi", max_tokens=4, mode="chain").stats.n_generated > 0


def test_a_profile_without_the_step_or_with_zero_times_is_corrupt(home, model_file):
    for bad in (a_profile(model_file, ks=[2, 4], seconds=[0.1, 0.2]),
                a_profile(model_file, seconds=[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6])):  # fmt: skip
        save_profile(bad)
        assert load_profile(model_file, n_threads=2, cpus="0-1") is None


# --- The command --------------------------------------------------------------------------------


@pytest.fixture
def runner_app() -> typer.Typer:
    app = typer.Typer()
    app.command()(profile)
    app.command("other")(lambda: None)  # two commands: `profile` stays a subcommand
    return app


def test_profile_quick_json_reports_the_curve_and_saves_it(home, runner_app, smol_path):
    result = CliRunner().invoke(
        runner_app, ["profile", "-m", str(smol_path), "-t", "2", "--quick", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [row["k"] for row in report["rows"]] == list(QUICK_KS)
    assert report["rows"][0]["relative"] == pytest.approx(1.0)
    assert all(
        row["ceiling"] == pytest.approx(row["k"] / row["relative"]) for row in report["rows"]
    )
    assert report["draft"] is None and report["draft_cost"] is None
    assert load_profile(smol_path, n_threads=2) is not None
    # The command times attention with flash attention and without, and keeps the faster,
    # even when quick (the first-use profile does not).
    with_flash, without = report["target"]["attention_s"]
    assert with_flash > 0 and without > 0
    assert report["target"]["flash_attn"] == faster_attention(with_flash, without)


def test_profile_takes_the_target_and_threads_run_would_take_from_the_environment(
    home, runner_app, smol_path, monkeypatch
):
    """EDGESPEC_TARGET / EDGESPEC_THREADS (or config.toml) name what `run` loads: the profile is
    of that model at those threads, not of the default Qwen (which it went to download)."""
    monkeypatch.setenv("EDGESPEC_TARGET", str(smol_path))
    monkeypatch.setenv("EDGESPEC_THREADS", "1")
    result = CliRunner().invoke(runner_app, ["profile", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["target"]["model_file"] == smol_path.name
    assert load_profile(smol_path, n_threads=1) is not None


def test_a_profile_says_which_attention_it_chose_and_what_each_took(home, runner_app, smol_path):
    args = ["profile", "-m", str(smol_path), "-t", "2", "--quick"]
    result = CliRunner().invoke(runner_app, args)
    assert result.exit_code == 0, result.output
    stored = load_profile(smol_path, n_threads=2)
    assert stored is not None and stored.attention_s is not None
    chosen = "with flash attention" if stored.flash_attn else "without flash attention"
    with_flash, without = (f"{s * 1000:.0f} ms" for s in stored.attention_s)
    line = next(line for line in result.stdout.splitlines() if "attends" in line)
    assert f"{smol_path.name} attends {chosen}" in line
    assert f"{with_flash} with it" in line and f"{without} without" in line


def test_a_quick_profile_does_not_replace_a_full_one(home, runner_app, smol_path):
    full = a_profile(
        smol_path, cpus=current_cpus(), ks=list(FULL_KS), seconds=[0.01 * k for k in FULL_KS]
    )
    save_profile(full)
    args = ["profile", "-m", str(smol_path), "-t", "2", "--quick", "--json"]
    result = CliRunner().invoke(runner_app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["saved"] == []
    assert load_profile(smol_path, n_threads=2) == full


def test_profile_with_a_draft_reports_its_cost_in_target_steps(home, runner_app, smol_path):
    args = ["profile", "-m", str(smol_path), "--draft", str(smol_path), "-t", "2", "--quick"]
    result = CliRunner().invoke(runner_app, args)
    assert result.exit_code == 0, result.output
    assert "T(k)/T(1)" in result.stdout and "c_d =" in result.stdout


def test_a_draft_that_is_the_target_with_its_threads_and_cpus_is_measured_once(
    home, runner_app, smol_path
):
    """It was measured twice, the second curve saved over the first under the same key."""
    args = ["profile", "-m", str(smol_path), "--draft", str(smol_path), "-t", "2"]
    result = CliRunner().invoke(runner_app, [*args, "--draft-threads", "2", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["draft"] == report["target"] and report["draft_cost"] == 1.0
    assert len(report["saved"]) == 1


def test_a_draft_that_is_the_target_measured_once_is_spoken_of_once(
    home, runner_app, smol_path, monkeypatch
):
    """Its attention line and its busy-device warning each came twice."""
    measured = a_profile(smol_path, noise=0.5, attention_s=[0.080, 0.070], flash_attn=False)
    monkeypatch.setattr("edgespec.cli.profile_cmd.profile_model", lambda *a, **k: measured)
    args = ["profile", "-m", str(smol_path), "--draft", str(smol_path), "-t", "2"]
    result = CliRunner().invoke(runner_app, [*args, "--draft-threads", "2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert sum("varied by 50%" in line for line in lines) == 1
    assert sum("attention" in line and smol_path.name in line for line in lines) == 1


@pytest.mark.parametrize("noise_, unused", [(0.15, False), (0.5, True)])
def test_a_profile_measured_too_busy_to_price_passes_says_so(
    home, runner_app, smol_path, monkeypatch, noise_, unused
):
    """Above NOISY the warning asks for a quiet measurement; above NOISY_QUICK auto does not
    price passes by it either (DeviceProfile.busy), and the warning says that too."""
    measured = a_profile(smol_path, noise=noise_)
    monkeypatch.setattr("edgespec.cli.profile_cmd.profile_model", lambda *a, **k: measured)
    result = CliRunner().invoke(runner_app, ["profile", "-m", str(smol_path), "-t", "2"])
    assert result.exit_code == 0, result.output
    warning = next(line for line in result.output.splitlines() if "varied by" in line)
    assert ("auto prices passes by a default curve" in warning) == unused


@pytest.mark.parametrize("named", ["nothing", "a target and the draft's name", "the draft's file"])
def test_profile_measures_the_draft_run_would_use(
    home, runner_app, smol_path, tmp_path, monkeypatch, named
):
    """The default draft as `run` loads it (its fastest form here), not the file fetched: with
    no model named, or named by its catalogue name beside a target of one's own (a Q4_0 copy
    of the default target decodes 1.5x faster here; named, the draft was the fetched Q4_K_M
    file). A file named is measured as it is."""
    fetched = {DEFAULT_TARGET: tmp_path / "target.gguf", DEFAULT_DRAFT: tmp_path / "draft.gguf"}
    for path in fetched.values():
        shutil.copy(smol_path, path)
    fastest = copy_path(fetched[DEFAULT_DRAFT])
    shutil.copy(smol_path, fastest)
    choice = DraftChoice(
        original="draft.gguf",
        copy=fastest.name,
        narrowed=fastest.name,
        chosen=fastest.name,
        step_ms={"draft.gguf": 2.0, fastest.name: 1.0},
        n_threads=len(plan_placement().draft_cpus),  # the draft's threads in `run`
        cpu=cpu_identity(),
    )
    choice_path(fetched[DEFAULT_DRAFT]).write_text(json.dumps(asdict(choice)))
    real = resolve_model
    monkeypatch.setattr(
        "edgespec.cli.app.resolve_model",
        lambda name, default, fetch=True: real(name, None, fetch) if name else fetched.get(default),
    )

    own_target = tmp_path / "own-target.gguf"
    shutil.copy(smol_path, own_target)
    models = {
        "nothing": [],
        "a target and the draft's name": ["-m", str(own_target), "--draft", DEFAULT_DRAFT],
        "the draft's file": ["-m", str(own_target), "--draft", str(fetched[DEFAULT_DRAFT])],
    }[named]

    result = CliRunner().invoke(runner_app, ["profile", "-t", "1", "--quick", "--json", *models])

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["target"]["model_file"] == ("target.gguf" if not models else own_target.name)
    draft_file = "draft.gguf" if named == "the draft's file" else fastest.name
    assert report["draft"]["model_file"] == draft_file


def test_the_drafts_name_beside_a_target_of_another_vocabulary_fails_before_any_form_is_made(
    home, runner_app, smol_path, gemma_path, tmp_path, monkeypatch
):
    """Making the draft's forms takes ~25 s on first use; a pair that cannot work says so first."""
    draft = tmp_path / "fetched" / "draft.gguf"
    draft.parent.mkdir()
    shutil.copy(gemma_path, draft)  # a SentencePiece vocabulary: SmolLM2 cannot be its target
    real = resolve_model
    monkeypatch.setattr(
        "edgespec.cli.app.resolve_model",
        lambda name, default, fetch=True: draft if default == DEFAULT_DRAFT else real(name, None),
    )

    result = CliRunner().invoke(
        runner_app, ["profile", "-m", str(smol_path), "--draft", DEFAULT_DRAFT, "--quick"]
    )

    assert f"cannot draft for target {smol_path.name}" in str(result.exception)
    assert [p.name for p in draft.parent.iterdir()] == ["draft.gguf"]  # no form, no choice


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="big and little need two CPUs")
def test_on_big_and_little_cores_profile_measures_each_model_where_run_puts_it(
    home, runner_app, smol_path, smol_q4_0, monkeypatch
):
    """It measured both on every core with a thread each: `run`, the target on the big cores and
    the draft on the little ones, found neither profile and measured its own."""
    import edgespec
    from edgespec.cores import CoreLayout

    big, little = sorted(os.sched_getaffinity(0))[:1], sorted(os.sched_getaffinity(0))[1:]
    layout = CoreLayout(big, little, uniform=False, source="cpu_capacity")
    monkeypatch.setattr("edgespec.cores.detect_cores", lambda **_: layout)
    args = ["profile", "-m", str(smol_path), "--draft", str(smol_q4_0), "--quick", "--json"]
    result = CliRunner().invoke(runner_app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["target"]["n_threads"], report["target"]["cpus"]) == (1, format_cpu_list(big))
    assert (report["draft"]["n_threads"], report["draft"]["cpus"]) == (
        len(little),
        format_cpu_list(little),
    )
    engine = edgespec.load(smol_path, smol_q4_0, n_ctx=256)
    assert engine.placement.target_cpus == big and engine.placement.draft_cpus == little
    assert engine.profile == load_profile(smol_path, 1, format_cpu_list(big)) is not None
    assert engine.draft_profile is not None


def test_profile_refuses_a_thread_count_below_one_before_measuring(home, runner_app, smol_path):
    for flag in ("-t", "--draft-threads"):
        result = CliRunner().invoke(runner_app, ["profile", "-m", str(smol_path), flag, "0"])
        assert result.exit_code != 0
        assert f"{'--threads' if flag == '-t' else flag} must be at least 1" in str(
            result.exception
        )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a pipeline needs two CPUs")
def test_profile_overlap_times_serial_and_pipelined_rounds_on_split_cpus(
    home, runner_app, smol_path
):
    args = ["profile", "-m", str(smol_path), "--draft", str(smol_path), "--quick", "--overlap"]
    result = CliRunner().invoke(runner_app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    overlap = json.loads(result.stdout)["overlap"]
    cpus = sorted(os.sched_getaffinity(0))
    assert (overlap["target_cpus"], overlap["draft_cpus"]) == (cpus[:-1], cpus[-1:])
    assert overlap["target_alone_s"] > 0 and overlap["draft_alone_s"] > 0
    # Two things at once take at least as long as the longer of them alone (slack for a shared
    # VM's noise: pipelined over the longer part alone was 0.97-1.07 in 10 runs here once the
    # parts alone were timed after a pause, overlap.SETTLE_S; 0.89-1.07 before; 0.96-1.13 in six
    # runs on Python 3.12, and 0.87 once inside its whole suite), and the verdict is the ratio
    # of the measured times.
    assert overlap["pipelined_s"] >= 0.8 * max(overlap["target_alone_s"], overlap["draft_alone_s"])
    assert overlap["speedup"] == pytest.approx(overlap["serial_s"] / overlap["pipelined_s"])
    # remembered: `run` with the same CPUs pipelines its chains by default where it paid
    share = [format_cpu_list(c) for c in (cpus[:-1], cpus[-1:])]
    stored = load_pipeline_speedup((smol_path, len(cpus) - 1, share[0]), (smol_path, 1, share[1]))
    assert stored == pytest.approx(overlap["speedup"])
    text = CliRunner().invoke(runner_app, args).stdout
    assert "pipeline, chain of 4" in text
    assert "chains pipeline by default" in text or "chains stay serial unless --pipeline" in text


def test_profile_says_before_measuring_when_it_could_not_keep_the_result(
    runner_app, smol_path, tmp_path, monkeypatch
):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "profiles").write_text("")  # a file where the folder should be
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    measured: list[object] = []  # nothing may be measured
    monkeypatch.setattr(
        "edgespec.cli.profile_cmd.profile_model", lambda *a, **_: measured.append(a)
    )
    result = CliRunner().invoke(runner_app, ["profile", "-m", str(smol_path), "--quick"])
    assert result.exit_code != 0 and measured == []
    assert "cannot keep profiles in" in str(result.exception)
    assert "Not a directory" in str(result.exception)


def test_profile_overlap_without_a_draft_is_a_clear_error(home, runner_app, smol_path):
    result = CliRunner().invoke(runner_app, ["profile", "-m", str(smol_path), "--overlap"])
    assert result.exit_code != 0
    assert "--overlap needs a draft" in str(result.exception)


@pytest.fixture
def narrowed_smol(smol_path, tmp_path) -> Path:
    from edgespec.drafts import narrow

    (tmp_path / smol_path.name).symlink_to(smol_path)  # a narrowed copy lies next to its source
    narrow(tmp_path / smol_path.name, tmp_path / "smol.head2k.gguf", 2048)
    return tmp_path / "smol.head2k.gguf"


@pytest.mark.parametrize(
    "pair, message",
    [("other-vocabulary draft", "cannot draft for target"), ("narrowed target", "can only draft")],
)
def test_profile_refuses_models_run_would_refuse_before_measuring(
    home, runner_app, smol_path, narrowed_smol, tmp_path, monkeypatch, pair, message
):
    """A draft of another vocabulary was measured and its cost over the target's stored; a
    narrowed draft was profiled as a target: minutes for numbers no run could use."""
    measured: list[object] = []  # nothing may be measured
    monkeypatch.setattr(
        "edgespec.cli.profile_cmd.profile_model", lambda *a, **_: measured.append(a)
    )
    other = write_tiny_gguf(tmp_path / "other.gguf", 16)
    models = {
        "other-vocabulary draft": ["-m", str(smol_path), "--draft", str(other)],
        "narrowed target": ["-m", str(narrowed_smol)],
    }[pair]
    result = CliRunner().invoke(runner_app, ["profile", *models, "--quick"])
    assert result.exit_code != 0 and measured == []
    assert message in str(result.exception)


def test_an_engine_profiles_each_model_on_first_use_and_then_finds_the_profiles(
    home, smol_path, smol_q4_0, monkeypatch
):
    import edgespec

    first_use_measured_quiet(monkeypatch)  # else measured again: the busy tests below
    engine = edgespec.load(smol_path, smol_q4_0, n_ctx=256)
    assert engine.profile is None and engine.draft_profile is None
    said: list[str] = []
    engine.profile_if_missing(say=said.append)
    assert sum("first use" in line for line in said) == 2  # and a note if the device was busy
    assert engine.profile is not None and engine.relative_cost(4) == engine.profile.relative(4)
    assert engine.profile.flash_attn is None  # attention is left to llama.cpp (see profile_model)
    assert engine.draft_profile is not None and engine.draft_profile.model_file == smol_q4_0.name
    # The caches were emptied by the measurement, and generation works on.
    assert engine.generate("Hi", max_tokens=4, mode="chain").stats.n_generated > 0

    again = edgespec.load(smol_path, smol_q4_0, n_ctx=256)
    said.clear()
    again.profile_if_missing(say=said.append)
    assert said == [] and again.profile == engine.profile

    # The target's profile as an older edgespec wrote it (no "method"): measured again.
    stored = next(p for p in profiles_dir().glob(f"{smol_path.name}-*.json"))
    data = json.loads(stored.read_text())
    del data["method"]
    stored.write_text(json.dumps(data))
    third = edgespec.load(smol_path, smol_q4_0, n_ctx=256)
    said.clear()
    third.profile_if_missing(say=said.append)
    measuring = [line for line in said if "measuring how fast" in line]
    assert len(measuring) == 1 and smol_path.name in measuring[0]
    assert "older edgespec" in measuring[0]
    assert json.loads(stored.read_text())["method"] == PROFILE_METHOD


def test_runs_started_together_measure_the_device_one_at_a_time_and_once(home, smol_path):
    """Each measured the other's load into its profile, and both did the same work. Here both
    wait while the lock is held (as another edgespec's profile would hold it), then one measures
    and the other uses what it measured."""
    run = [sys.executable, "-m", "edgespec.cli", "run", "-m", str(smol_path), "-n", "4", "Hi"]
    with exclusive(home / "measuring.lock"):
        runs = [
            subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        for process in runs:
            assert process.stderr is not None
            line = ""
            while "waiting" not in line:  # each said so and is waiting
                line = process.stderr.readline()
                assert line, process.communicate(timeout=60)
    said = [process.communicate(timeout=300)[1] for process in runs]
    assert [process.returncode for process in runs] == [0, 0], said
    assert sum("measuring how fast this device runs" in err for err in said) == 1, said


def test_a_first_use_profile_cut_short_leaves_the_engine_knowing_its_caches_are_empty(
    home, smol_path, monkeypatch
):
    """The measurement clears the context; cut short, the engine still believed its cache held
    the last prompt, and the next generation would have reused what was gone."""
    import edgespec
    from edgespec import engine as engine_module

    engine = edgespec.load(smol_path, n_ctx=256)
    plain = engine.generate("Hello there", max_tokens=8, mode="target").text

    def cleared_then_ctrl_c(ctx, *args):
        ctx.clear()
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_module, "quick_profile", cleared_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        engine.profile_if_missing()
    result = engine.generate("Hello there", max_tokens=8, mode="target")
    assert result.text == plain and result.stats.n_prompt_eval == result.stats.n_prompt_tokens


def test_a_first_use_profile_measured_on_a_busy_device_says_so(home, smol_path, monkeypatch):
    """Three runs started together stored profiles 24x too slow without a word."""
    import edgespec
    from edgespec import engine as engine_module

    quick = engine_module.quick_profile
    monkeypatch.setattr(engine_module, "quick_profile", lambda *a: replace(quick(*a), noise=0.32))
    engine = edgespec.load(smol_path, n_ctx=256)
    said: list[str] = []
    engine.profile_if_missing(say=said.append)
    assert any("busy while measuring" in line and "varied by 32%" in line for line in said)
    assert load_profile(smol_path, engine.threads) is not None  # kept all the same


def test_a_busy_first_use_profile_is_measured_again_on_the_next_first_uses_then_kept(
    home, smol_path, monkeypatch
):
    """Beside a busy core here, quick profiles of the 1.5B target put a step at 63-178 ms and
    T(32) at 2.6-17.9 steps (24-27 ms and 8.7-11.1 quiet): stored, such a curve priced every later
    run. The next first uses measure it again, and keep the least noisy once the device has been
    busy BUSY_MEASUREMENTS times in a row."""
    import edgespec
    from edgespec import engine as engine_module

    quick = engine_module.quick_profile
    noises = iter([0.5, 0.4, 0.6, 0.3])  # busy every time: the device of a phone never idle
    monkeypatch.setattr(
        engine_module, "quick_profile", lambda *a: replace(quick(*a), noise=next(noises))
    )
    kept: list[tuple[float, int]] = []
    said: list[str] = []
    for _ in range(BUSY_MEASUREMENTS + 1):
        engine = edgespec.load(smol_path, n_ctx=256)
        engine.profile_if_missing(say=said.append)
        stored = load_profile(smol_path, engine.threads)
        assert stored == engine.profile
        kept.append((stored.noise, stored.busy_measurements))
    assert kept == [(0.5, 1), (0.4, 2), (0.4, 3), (0.4, 3)]  # the least noisy; then no more
    measuring = [line for line in said if "measuring how fast" in line]
    assert len(measuring) == BUSY_MEASUREMENTS and "first use" in measuring[0]
    assert all(line.endswith("again (it was busy the last time)") for line in measuring[1:])
    assert sum("measured again on the next run" in line for line in said) == BUSY_MEASUREMENTS - 1
    assert "`edgespec profile` measures it again once the device is quiet" in said[-1]


def test_a_busy_first_use_profile_measured_again_on_a_quiet_device_is_replaced_for_good(
    home, smol_path, monkeypatch
):
    """One quiet measurement is the device's: it is kept, and not measured again."""
    import edgespec
    from edgespec import engine as engine_module

    quick = engine_module.quick_profile
    noises = iter([0.5, 0.01])
    monkeypatch.setattr(
        engine_module, "quick_profile", lambda *a: replace(quick(*a), noise=next(noises))
    )
    for _ in range(2):
        engine = edgespec.load(smol_path, n_ctx=256)
        engine.profile_if_missing()
    stored = load_profile(smol_path, engine.threads)
    assert stored is not None and (stored.noise, stored.busy_measurements) == (0.01, 0)
    said: list[str] = []
    edgespec.load(smol_path, n_ctx=256).profile_if_missing(say=said.append)  # noises are spent
    assert said == [] and load_profile(smol_path, engine.threads) == stored


def test_a_busy_profile_another_run_measured_while_this_one_waited_is_used_not_measured_again(
    home, smol_path, monkeypatch
):
    """Runs started together on a busy device: the first measures while the others wait, and
    they use what it measured, busy or not (beside a busy core here the second of two such runs
    measured the busy profile again right after the first): a busy profile is measured again at
    a later first use."""
    import edgespec
    from edgespec import engine as engine_module

    engine = edgespec.load(smol_path, n_ctx=256)
    engine.profile_if_missing()
    assert engine.profile is not None
    busy = replace(engine.profile, noise=2 * NOISY_QUICK, busy_measurements=1)
    profile_path(busy).unlink()  # none stored yet: the next run waits for the lock, then looks
    lock = engine_module.measuring_alone

    @contextmanager
    def another_run_measured_meanwhile(say):
        save_profile(busy)
        with lock(say):
            yield

    monkeypatch.setattr(engine_module, "measuring_alone", another_run_measured_meanwhile)
    said: list[str] = []
    later = edgespec.load(smol_path, n_ctx=256)
    later.profile_if_missing(say=said.append)
    assert said == [] and later.profile == busy and busy.measured_again


def test_a_draft_that_is_the_target_is_measured_once_however_busy(home, smol_path, monkeypatch):
    """Its profile is the target's, measured just before: busy, the draft's turn measured it a
    second time in the same first use."""
    import edgespec
    from edgespec import engine as engine_module

    quick = engine_module.quick_profile
    monkeypatch.setattr(
        engine_module, "quick_profile", lambda *a: replace(quick(*a), noise=2 * NOISY_QUICK)
    )
    said: list[str] = []
    engine = edgespec.load(smol_path, smol_path, n_ctx=256)
    engine.profile_if_missing(say=said.append)
    assert sum("measuring how fast" in line for line in said) == 1
    assert engine.draft_profile == engine.profile and engine.profile.busy_measurements == 1


def test_a_profile_measured_busy_neither_prices_passes_nor_governs_threads(home, smol_path):
    """Its curve is the load's as much as the device's: auto prices passes by the default curve,
    and the governors judge decodes by the fastest they see, until a quiet measurement."""
    import edgespec

    engine = edgespec.load(smol_path, n_ctx=256)
    engine.profile_if_missing()
    measured = engine.profile
    assert measured is not None
    steep = replace(measured, seconds=[measured.cost(1) * k**1.5 for k in measured.ks])
    for noise_, busy in [(0.0, False), (2 * NOISY_QUICK, True)]:
        save_profile(replace(steep, noise=noise_, busy_measurements=BUSY_MEASUREMENTS * busy))
        engine = edgespec.load(smol_path, n_ctx=256)
        engine.profile_if_missing()  # nothing to measure: kept after BUSY_MEASUREMENTS
        assert engine.profile is not None and engine.profile.busy == busy
        if busy:
            assert engine.relative_cost(8) == pytest.approx(DEFAULT_RELATIVE[8])
            assert engine.pass_sizes == DEFAULT_SIZES
        else:
            assert engine.relative_cost(8) == pytest.approx(steep.relative(8))
            assert engine.pass_sizes == tuple(steep.ks)
        governor = engine.target_ctx.governor
        assert governor is not None
        assert governor.reference_s == (None if busy else steep.step_s)


def test_what_a_first_use_keeps_of_a_measurement_taken_where_an_earlier_one_was_busy(
    model_file,
):
    quiet = a_profile(model_file, noise=0.02)
    busy = a_profile(model_file, noise=0.5, busy_measurements=1)
    busier = a_profile(model_file, noise=0.7, measured_at="2025-01-02T00:00:00+00:00")
    assert kept_profile(None, quiet) == quiet
    assert kept_profile(busy, quiet) == quiet  # busy_measurements 0: not measured again
    assert kept_profile(None, busier) == replace(busier, busy_measurements=1)
    assert kept_profile(busy, busier) == replace(busy, busy_measurements=2)  # the less noisy
    assert kept_profile(busier, replace(busy, busy_measurements=0)).noise == 0.5
    older = replace(busy, busy_measurements=0)  # stored by an edgespec that did not count them
    assert older.measured_again and kept_profile(older, busier).busy_measurements == 2
    assert not replace(busy, busy_measurements=BUSY_MEASUREMENTS).measured_again
    assert not replace(busy, ks=list(FULL_KS), seconds=[0.01] * len(FULL_KS)).measured_again
    assert not quiet.measured_again and not quiet.busy and busy.busy


def test_ctrl_c_stops_a_profile_measured_on_pinned_cpus_at_its_next_pass(home, smol_path):
    """Measured on a thread of its own (pinned, as on a phone's big cores), a profile did not
    hear Ctrl+C: it measured on for minutes, then saved."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgespec.cli", "profile", "-m", str(smol_path),
         "--target-cpus", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=hear_ctrl_c,
    )  # fmt: skip
    time.sleep(6)  # loaded and measuring: a full profile of SmolLM2 takes a minute or more
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    _, err = proc.communicate(timeout=120)
    # Within a pass or two (the old code measured on for minutes; a loaded machine is slow).
    assert proc.returncode == 130 and time.monotonic() - started < 45, err
    assert "Traceback" not in err and not list(profiles_dir().glob("*.json"))


def test_a_first_use_profile_that_cannot_be_stored_is_used_all_the_same(
    smol_path, smol_q4_0, tmp_path, monkeypatch
):
    """A home that cannot be written (read-only, full, or here below a file) costs the next run
    a new measurement, not this run its answer."""
    import edgespec

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "a-file" / "home"))
    engine = edgespec.load(smol_path, smol_q4_0, n_ctx=256)
    said: list[str] = []
    engine.profile_if_missing(say=said.append)
    assert engine.profile is not None and engine.draft_profile is not None
    assert sum("not kept for the next run: Not a directory" in line for line in said) == 2
    assert engine.generate("Hi", max_tokens=4, mode="auto").stats.n_generated > 0


def test_noise_is_how_far_repeated_steps_or_pass_to_step_ratios_stray_from_their_median():
    steady = {1: [(0.01, 0.01)] * 3, 4: [(0.01, 0.02)] * 3}
    assert noise(steady) == 0.0
    # Everything twice as slow in one round: the steps vary, the ratios do not.
    busy_round = {1: [(0.01, 0.01)] * 3, 4: [(0.01, 0.02), (0.02, 0.04), (0.01, 0.02)]}
    assert noise(busy_round) == 0.0  # one step of six is off: the median deviation is 0
    assert noise({1: [(0.01, 0.01)] * 3, 4: [(0.01, 0.01), (0.01, 0.02), (0.01, 0.03)]}) == (
        pytest.approx(0.5)
    )


# What a pass of k tokens costs, in steps, on the fake machine below.
DRIFT_COST = {1: 1.0, 2: 1.5, 4: 2.0, 8: 5.0, 16: 6.0}


class DriftingMachine:
    """A fake context on a machine that slows down steadily while it is profiled (other work
    starting up): a pass of k tokens takes DRIFT_COST[k] ms times a factor growing from 1 to 2."""

    n_batch = n_ctx = 512
    model = type("FakeModel", (), {"n_vocab": 1000})()

    def __init__(self, total_ms: float) -> None:
        self.now_ms = 0.0
        self.total_ms = total_ms

    def perf_counter(self) -> float:
        return self.now_ms / 1000

    def decode(self, tokens: list[int], start_pos: int, logits: str = "last") -> None:
        k = len(tokens) if len(tokens) in DRIFT_COST else 1  # the prefill: any duration
        self.now_ms += DRIFT_COST[k] * (1 + min(self.now_ms / self.total_ms, 1.0))

    def clear(self) -> None: ...

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None: ...

    def fixed_threads(self) -> AbstractContextManager[None]:
        return nullcontext()


def test_a_machine_slowing_down_while_measured_still_gives_the_devices_curve(monkeypatch):
    machine = DriftingMachine(total_ms=100.0)  # about the length of the 5 rounds below
    monkeypatch.setattr("edgespec.profile.time", machine)
    curve = measure_curve(machine, ks=list(DRIFT_COST), repeats=5)  # type: ignore[arg-type]
    for k, cost in DRIFT_COST.items():
        assert curve[k] / curve[1] == pytest.approx(cost, rel=0.03), k


class HiccupMachine:
    """A fake context whose pass of k tokens takes cost[k] ms, except the first passes of the
    sizes in `hiccups`, which take that many times longer (another process waking up)."""

    n_batch = n_ctx = 512
    model = type("FakeModel", (), {"n_vocab": 1000})()

    def __init__(self, cost: dict[int, float], hiccups: dict[int, float] | None = None) -> None:
        self.now_ms = 0.0
        self.cost = cost
        self.hiccups = dict(hiccups or {})
        self.warmed_up = False

    def perf_counter(self) -> float:
        return self.now_ms / 1000

    def decode(self, tokens: list[int], start_pos: int, logits: str = "last") -> None:
        k = len(tokens)
        if k not in self.cost:  # the prefill: any duration
            self.now_ms += 100.0
            return
        slowdown = self.hiccups.pop(k, 1.0) if self.warmed_up else 1.0
        self.warmed_up = self.warmed_up or k == 1  # the warm-up ends with a step
        self.now_ms += self.cost[k] * slowdown

    def clear(self) -> None: ...

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None: ...

    def fixed_threads(self) -> AbstractContextManager[None]:
        return nullcontext()


# Shaped like this Zen 3's curve, in ms (a step 100): rising up to 8, and 16 little dearer than 8.
ZEN3_MS = {1: 100, 2: 150, 3: 200, 4: 230, 5: 280, 6: 330, 7: 380, 8: 600, 16: 700}


def quick_times(machine: HiccupMachine, monkeypatch) -> dict[int, list[tuple[float, float]]]:
    """measure_times as a first-use profile on a slow CPU: one round fills its budget."""
    monkeypatch.setattr("edgespec.profile.time", machine)
    return measure_times(machine, list(ZEN3_MS), repeats=3, budget_s=0.0)  # type: ignore[arg-type]


def test_a_pass_slowed_once_below_8_tokens_is_timed_again_until_its_curve_rises(monkeypatch):
    # One pass of 5 tokens three times its cost: alone it would price 5 above 6 (8.4 > 3.3 steps),
    # and a size priced too dear is never verified, so never timed again.
    times = quick_times(HiccupMachine(ZEN3_MS, hiccups={5: 3.0}), monkeypatch)
    assert {k: len(pairs) for k, pairs in times.items()} == {
        1: 1, 2: 1, 3: 1, 4: 1, 5: 3, 6: 3, 7: 1, 8: 1, 16: 1
    }  # fmt: skip
    curve = curve_from_times(times)
    assert curve[5] / curve[1] == pytest.approx(2.8)


def test_a_curve_in_order_takes_no_more_passes_than_its_budget(monkeypatch):
    times = quick_times(HiccupMachine(ZEN3_MS, hiccups={7: 1.1, 16: 3.0}), monkeypatch)
    assert all(len(pairs) == 1 for pairs in times.values())


def test_an_inversion_that_holds_is_kept_and_one_above_8_tokens_is_not_timed_again(monkeypatch):
    # A kernel that makes 6 tokens cheaper than 5 on every pass; 16 cheaper than 8 (a Zen 4's
    # bands): the profile reports what it measured, each out-of-order size below 8 timed 3 times.
    cost = {**ZEN3_MS, 5: 340, 16: 550}
    times = quick_times(HiccupMachine(cost), monkeypatch)
    assert len(times[5]) == len(times[6]) == 3 and len(times[8]) == len(times[16]) == 1
    curve = curve_from_times(times)
    assert curve[5] > curve[6] and curve[8] > curve[16]


def test_a_measured_profile_records_its_noise_and_old_files_without_it_still_load(
    smol_ctx, smol_path
):
    measured = measure_profile(smol_ctx, n_threads=2, ks=(1, 2), repeats=3, context_tokens=16)
    assert 0 <= measured.noise < 1
    old = {k: v for k, v in measured.to_dict().items() if k != "noise"}
    assert DeviceProfile.from_dict(old).noise == 0.0
