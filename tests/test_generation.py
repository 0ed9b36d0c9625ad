"""Generation on the real SmolLM2-135M through llama.cpp: plain decoding and chain speculation."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from edgespec.backend import Context, Model
from edgespec.errors import BadSettingError, ContextOverflowError
from edgespec.text import Detokenizer, StopMatcher

from .helpers import (
    assert_same_or_near_tie,
    ctrl_c_while_trimming,
    fresh_logits,
    held_in_a_round,
    write_vocab_copy,
)

PROMPTS = [
    "Write a Python function that reverses a linked list.",
    "List the planets of the solar system in order from the sun.",
    "Explain what a hash table is in two sentences.",
    "def fibonacci(n):",
]


def greedy(engine, prompt: str, mode: str, n: int = 48, **kw):
    return engine.generate(prompt, max_tokens=n, mode=mode, **kw)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_chain_with_the_target_as_its_own_draft_reproduces_plain_greedy_output(
    plain_engine, self_draft_engine, prompt
):
    plain = greedy(plain_engine, prompt, "target")
    # Model drafts only: whether a round verifies the n-gram proposal instead depends on timed
    # costs (a CI run beside other work chose it in some rounds: acceptance 0.71 and 0.82).
    spec = greedy(self_draft_engine, prompt, "chain", ngram=False)
    prompt_tokens = plain_engine.prompt_tokens(prompt)
    assert_same_or_near_tie(plain_engine, prompt_tokens, plain.tokens, spec.tokens)
    assert set(spec.stats.choices) == {"chain"}
    assert spec.stats.acceptance_rate > 0.9  # the same model agrees with itself


@pytest.mark.parametrize("prompt", PROMPTS)
def test_chain_with_a_requantized_draft_reproduces_plain_greedy_output(
    plain_engine, q2_draft_engine, prompt
):
    plain = greedy(plain_engine, prompt, "target")
    spec = greedy(q2_draft_engine, prompt, "chain", draft_max=4)
    assert_same_or_near_tie(
        plain_engine, plain_engine.prompt_tokens(prompt), plain.tokens, spec.tokens
    )
    assert spec.stats.draft_tokens > spec.stats.accepted_tokens  # rejections were exercised


def test_statistics_add_up(q4_draft_engine):
    result = greedy(q4_draft_engine, PROMPTS[0], "chain", n=40, draft_max=4)
    s = result.stats
    assert s.mode == "chain" and s.n_generated == len(result.tokens) <= 40
    # a pass with nothing to verify happens only when one token is left to generate
    assert s.verifications <= s.target_passes <= s.verifications + 1
    assert sum(i * c for i, c in enumerate(s.accepted_hist)) == s.accepted_tokens
    assert len(s.accepted_hist) <= 5  # at most draft_max accepted per verification
    # every generated token is an accepted draft token or the target's own, one per pass
    assert s.n_generated <= s.accepted_tokens + s.target_passes
    assert 0 < s.acceptance_rate <= 1 and s.tokens_per_s > 0 and s.peak_rss_mb > 0
    assert s.finish_reason in ("length", "stop")


def test_auto_counts_every_round_among_its_choices_its_first_timed_steps_too(smol_path):
    import edgespec

    engine = edgespec.load(smol_path, n_ctx=256)  # fresh: its first rounds time a plain step
    s = engine.generate(PROMPTS[1], max_tokens=5, mode="auto").stats
    # One target pass a round (no draft here), whether a plain step or an n-gram proposal's:
    # which of the two the rounds after the first two chose is the device's timing (beside a
    # busy core two of five were n-gram rounds).
    assert sum(s.choices.values()) == s.target_passes and s.choices["plain"] >= 2
    assert set(s.choices) <= {"plain", "ngram"}


@pytest.mark.parametrize(
    ("mode", "settings"),
    [("auto", {}), ("ngram", {}), ("ngram", {"draft_max": 4}), ("chain", {}), ("tree", {})],
)
def test_every_rounds_time_and_tokens_are_counted_under_what_drafted_it(
    q4_draft_engine, mode, settings
):
    s = greedy(q4_draft_engine, PROMPTS[0], mode, n=48, **settings).stats
    assert sum(s.choices.values()) == s.target_passes  # every round, one target pass each
    assert set(s.choice_s) == set(s.choice_tokens) == set(s.choices)
    assert all(s.choice_s[c] > 0 and s.choice_tokens[c] >= s.choices[c] for c in s.choices)
    # max_tokens ended it: every decided token was generated, in rounds timed inside decode_s
    assert s.finish_reason == "length" and sum(s.choice_tokens.values()) == s.n_generated
    assert sum(s.choice_s.values()) < s.decode_s


def test_plain_decoding_records_no_rounds_by_choice(plain_engine):
    s = greedy(plain_engine, PROMPTS[1], "target", n=24).stats
    assert s.choices == s.choice_s == s.choice_tokens == {} and s.in_run_ratio is None


def test_a_run_is_compared_with_its_own_plain_steps_once_it_has_enough_of_them():
    from edgespec.stats import MIN_PLAIN_STEPS, Stats

    s = Stats(mode="auto", n_generated=48, decode_s=3.2)
    for _ in range(MIN_PLAIN_STEPS - 1):  # 0.1 s a plain token
        s.record_choice("plain")
        s.record_round(0.1, 1)
    for _ in range(8):  # four tokens in 0.2 s a round: twice the plain steps' rate
        s.record_choice("ngram")
        s.record_round(0.2, 4)
    assert s.plain_rate is None and s.in_run_ratio is None  # too few plain steps to tell
    s.record_choice("plain")
    s.record_round(0.1, 1)
    assert s.choice_tokens == {"plain": MIN_PLAIN_STEPS, "ngram": 32}
    assert s.plain_rate == pytest.approx(10.0) and s.in_run_ratio == pytest.approx(1.5)
    shown = s.to_dict()
    assert shown["in_run_ratio"] == 1.5 and shown["choice_s"] == {"plain": 1.6, "ngram": 1.6}
    assert "_round_choice" not in shown
    assert "rounds plain 16 ngram 8 (1.50x the rate of its own plain steps)" in s.summary()


def test_a_run_of_plain_steps_alone_is_as_fast_as_its_own_plain_steps(smol_path, monkeypatch):
    """Every round a plain step (the n-gram drafter finds nothing to copy): the run's rate over
    its plain steps' is the time between the rounds (a stream's own bookkeeping), a sliver
    under 1."""
    import edgespec
    from edgespec.ngram import NgramDrafter, Proposal

    monkeypatch.setattr(NgramDrafter, "propose", lambda self, tokens, max_len: Proposal([], 0, 0))
    engine = edgespec.load(smol_path, n_ctx=256)
    s = engine.generate(PROMPTS[2], max_tokens=40, mode="ngram").stats
    assert s.choices == {"plain": s.n_generated} == s.choice_tokens
    assert s.in_run_ratio is not None and 0.9 < s.in_run_ratio < 1.0
    assert "own plain steps" not in s.summary()  # nothing drafted to compare with them


def test_without_draft_max_a_chain_drafts_on_while_one_more_token_raises_the_expected_rate(
    q2_draft_engine, monkeypatch
):
    from edgespec import engine as engine_module

    engine, prompt = q2_draft_engine, PROMPTS[1]

    def chain_with(answer):
        """A chain-mode generation where `answer` says whether to draft one more token; the
        lengths of the chains when it was asked."""
        asked: list[int] = []

        def recorded(accept_probs, next_guess, costs):
            asked.append(len(accept_probs))
            return answer(accept_probs, next_guess, costs)

        monkeypatch.setattr(engine_module, "worth_drafting_on", recorded)
        return engine.generate(prompt, max_tokens=80, mode="chain", ngram=False), asked

    judge = engine_module.worth_drafting_on
    _, never = chain_with(lambda *_: False)
    _, always = chain_with(lambda *_: True)
    result, asked = chain_with(judge)

    assert max(never) == 1  # a first chain of 2 measures the draft; then one token each
    assert max(always) > 4  # past the fixed length of four it had before
    assert asked and result.stats.draft_evals >= len(asked) + 2
    plain = greedy(engine, prompt, "target", n=80)
    assert_same_or_near_tie(engine, engine.prompt_tokens(prompt), plain.tokens, result.tokens)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_greedy_chains_weak_tail_goes_unverified_but_every_sampled_draw_is_verified(
    q2_draft_engine, monkeypatch, temperature
):
    """Greedy: verifying a weak tail costs more than it yields, so it is cut. Sampling: which
    draws are verified must not depend on the draws themselves (test_sampling shows the output
    tilting towards the draft's favourites where it does), so every draw is verified."""
    from edgespec import engine as engine_module
    from edgespec.engine import Engine

    # Chains of four, whatever the tokens' chances: tails as weak as the draft makes them.
    monkeypatch.setattr(engine_module, "worth_drafting_on", lambda probs, *_, **__: len(probs) < 4)
    verified_and_drafted: list[tuple[int, int]] = []
    verify_chain = Engine._verify_chain

    def recording(self, run, proposed, from_draft, drafted=None):
        if drafted is not None:
            verified_and_drafted.append((len(proposed), len(drafted[0])))
        return verify_chain(self, run, proposed, from_draft, drafted)

    monkeypatch.setattr(Engine, "_verify_chain", recording)
    for seed in range(3):
        q2_draft_engine.generate(
            PROMPTS[1], max_tokens=60, mode="chain", ngram=False, temperature=temperature,
            seed=seed,
        )  # fmt: skip
    cut = sum(verified < drafted for verified, drafted in verified_and_drafted)
    assert len(verified_and_drafted) > 20
    if temperature:
        assert cut == 0
    else:
        assert cut > 0


def test_after_many_rounds_the_target_cache_holds_exactly_the_committed_tokens(q2_draft_engine):
    engine = q2_draft_engine
    prompt = engine.prompt_tokens("Write a long story about a dragon and a knight.")
    result = engine.generate(prompt, max_tokens=120, mode="chain", draft_max=6)
    assert (
        result.stats.verifications > 10 and result.stats.accepted_tokens < result.stats.draft_tokens
    )
    committed = prompt + result.tokens
    ctx = engine.target_ctx
    # sequence 0 holds every committed token but the last; no other sequence survives
    assert ctx.seq_pos_min(0) == 0
    assert ctx.seq_pos_max(0) == len(committed) - 2
    assert all(ctx.seq_pos_max(s) == -1 for s in range(1, ctx.n_seq_max))
    # Decoding on from the edited cache gives what a fresh prefill of the same tokens gives, up to
    # batch numerics. Their size is calibrated here: a cache built one token at a time (as plain
    # decoding builds it) differs from a fresh prefill by as much (mean |Δlogit| ~0.1 at 160
    # tokens). A single missing or stale token roughly doubles it.
    continued = ctx.decode([committed[-1]], len(committed) - 1)[-1].copy()
    fresh = fresh_logits(engine, committed)
    one_by_one = Context(engine.target, n_ctx=engine.n_ctx, n_threads=2)
    one_by_one.decode(prompt[:-1], 0, logits="none")
    for pos in range(len(prompt) - 1, len(committed)):
        baseline = one_by_one.decode([committed[pos]], pos)[-1]
    numerics = np.abs(baseline - fresh).mean()
    one_by_one.close()
    assert continued.argmax() == fresh.argmax()
    assert np.abs(continued - fresh).mean() <= 1.25 * numerics + 0.01


def test_a_stream_left_unfinished_does_not_touch_the_caches_of_later_generations(
    q2_draft_engine, plain_engine
):
    """A stream abandoned mid-way but kept alive (a saved iterator, a traceback in a notebook)
    settled the caches when it was finally collected, after later generations: the next prompt
    then reused cells that held another text (plain decoding answered A by continuing B)."""
    import gc

    engine = q2_draft_engine
    a = engine.prompt_tokens("Name three colors.")
    b = engine.prompt_tokens("Write a Python function that adds two numbers.")
    left = iter(engine.stream(a, max_tokens=30, mode="chain"))
    assert next(left)
    engine.generate(b, max_tokens=10, mode="chain")
    del left
    gc.collect()
    again = engine.generate(a, max_tokens=20, mode="target").tokens
    reference = plain_engine.generate(a, max_tokens=20, mode="target").tokens
    assert_same_or_near_tie(plain_engine, a, reference, again)


def test_the_draft_cache_never_runs_ahead_of_the_committed_tokens(q2_draft_engine):
    engine = q2_draft_engine
    prompt = engine.prompt_tokens(PROMPTS[2])
    result = engine.generate(prompt, max_tokens=60, mode="chain")
    ctx = engine.draft_ctx
    assert ctx.seq_pos_max(0) <= len(prompt) + len(result.tokens) - 2
    assert all(ctx.seq_pos_max(s) == -1 for s in range(1, ctx.n_seq_max))


def test_generation_stops_at_max_tokens_and_at_a_stop_string(self_draft_engine):
    short = greedy(self_draft_engine, PROMPTS[1], "chain", n=5)
    assert len(short.tokens) == 5 and short.stats.finish_reason == "length"
    full = greedy(self_draft_engine, PROMPTS[1], "chain", n=60)
    stop = full.text[10:14]
    stopped = greedy(self_draft_engine, PROMPTS[1], "chain", n=60, stop=[stop])
    assert stopped.stats.finish_reason == "stop_string"
    assert stopped.text == full.text[: full.text.index(stop)]

    # The tokens run through the one that completed the stop text (as README says of --json).
    def text_of(tokens: list[int]) -> str:
        return b"".join(map(self_draft_engine.target.piece, tokens)).decode(errors="replace")

    assert stopped.tokens == full.tokens[: len(stopped.tokens)]
    assert stop in text_of(stopped.tokens) and stop not in text_of(stopped.tokens[:-1])


def test_generation_ends_at_the_end_of_generation_token(plain_engine):
    result = plain_engine.generate("Say just the word hello.", max_tokens=200, mode="target")
    assert result.stats.finish_reason == "stop" and len(result.tokens) < 200


def test_a_full_context_ends_generation_with_a_reason(smol_path):
    import edgespec

    engine = edgespec.load(smol_path, draft=smol_path, n_ctx=64)
    prompt = engine.prompt_tokens("1, 2, 3, 4, 5, 6, 7, 8,", chat_mode=False)
    result = engine.generate(prompt, max_tokens=500, mode="chain")
    assert result.stats.finish_reason == "context"
    assert len(prompt) + len(result.tokens) == 65  # the last token is decided, never evaluated
    assert "the context is full" in result.stats.summary()


def test_streamed_pieces_are_whole_characters_and_add_up_to_the_text(plain_engine):
    stream = plain_engine.stream(
        "Repeat exactly: 日本語のテキスト 🎉🚀 naïve café", max_tokens=40, mode="target"
    )
    pieces = list(stream)
    assert "".join(pieces) == stream.result.text
    assert all("\ufffd" not in p for p in pieces)
    assert any(ord(c) > 0x3000 for c in stream.result.text)  # the model did produce CJK or emoji


def test_the_detokenizer_holds_back_a_split_character():
    detok = Detokenizer()
    emoji = "🎉".encode()
    assert detok.feed(b"ok " + emoji[:2]) == "ok "
    assert detok.feed(emoji[2:]) == "🎉"


def test_a_character_cut_off_by_the_end_of_generation_is_dropped_not_garbled():
    detok = Detokenizer()
    assert detok.feed("🎉".encode()[:2]) == ""
    assert detok.flush() == ""


def test_the_stop_matcher_holds_back_what_could_start_a_stop_string():
    stops = StopMatcher(["END"])
    assert stops.feed("hello E") == "hello "
    assert stops.feed("N") == ""
    assert stops.feed("D and more") == "" and stops.stopped


def test_text_held_back_for_a_stop_string_that_never_comes_is_released_at_the_end(plain_engine):
    """An answer ending (at max_tokens) in what could begin a stop string lost that tail."""
    full = greedy(plain_engine, PROMPTS[1], "target", n=12)
    stream = plain_engine.stream(
        PROMPTS[1], max_tokens=12, mode="target", stop=[full.text[-3:] + "\u2603"]
    )
    pieces = list(stream)
    assert stream.result.stats.finish_reason == "length"
    assert "".join(pieces) == stream.result.text == full.text


def test_a_byte_that_cannot_be_part_of_a_character_shows_as_a_replacement_character():
    """Not silently dropped: a character cut short inside the answer is marked where it was."""
    detok = Detokenizer()
    assert detok.feed(b"ok \xe6\x97") == "ok "  # the first two bytes of a CJK character
    assert detok.feed(b" and \xff then") == "\ufffd and \ufffd then"


def test_a_character_dropped_at_the_end_does_not_garble_what_is_fed_after():
    detok = Detokenizer()
    detok.feed("🎉".encode()[:2])
    assert detok.flush() == ""
    assert detok.feed(b"ok") == "ok"


def test_the_stop_string_found_first_in_the_text_ends_it_whichever_is_listed_first():
    stops = StopMatcher(["END", "STOP"])
    assert stops.feed("one ST") == "one "
    assert stops.feed("OP two END") == "" and stops.stopped
    assert stops.flush() == ""  # what was held back was the stop string's: it never comes out


def test_a_stop_string_that_repeats_its_own_beginning_is_found_one_character_at_a_time():
    """For "---" the tail "--" may begin it, not only "-": the longest such tail is held."""
    stops = StopMatcher(["---"])
    assert [stops.feed(c) for c in "a text---"] == [*"a text", "", "", ""] and stops.stopped


def test_the_longest_tail_that_could_begin_any_stop_string_is_held_back():
    stops = StopMatcher(["\nUser:", "User:"])  # the second matches less of "\nUs"
    assert stops.feed("Hi\nUs") == "Hi"
    assert stops.feed("er: more") == "" and stops.stopped


def test_text_held_back_comes_out_once_when_the_text_ends():
    stops = StopMatcher(["END"])
    assert stops.feed("the E") == "the "
    assert stops.flush() == "E"
    assert stops.flush() == ""


def test_bad_settings_are_rejected_with_a_clear_message(self_draft_engine, plain_engine):
    with pytest.raises(BadSettingError, match="--temp"):
        self_draft_engine.generate("hi", temperature=-1)
    with pytest.raises(BadSettingError, match="--draft-max"):
        self_draft_engine.generate("hi", draft_max=0)
    with pytest.raises(BadSettingError, match="empty"):
        self_draft_engine.generate("   ")
    with pytest.raises(BadSettingError, match="needs a draft"):
        plain_engine.generate("hi", mode="chain")


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ({"max_tokens": 2.5}, "--max-tokens must be a whole number (got 2.5)"),
        ({"max_tokens": "5"}, "--max-tokens must be a whole number (got '5')"),
        ({"max_tokens": None}, "--max-tokens must be a whole number (got None)"),
        ({"mode": "chain", "draft_max": 1.5}, "--draft-max must be a whole number"),
        ({"mode": "tree", "max_nodes": 2.5}, "--max-nodes must be a whole number"),
        ({"mode": "tree", "branch_p": "x"}, "--branch-p must be a number"),
        ({"stop": None}, "--stop must be text or a sequence of texts"),
        ({"stop": [b"END"]}, "--stop must be text or a sequence of texts"),
        ({"ngram": "no"}, "ngram must be True or False (got 'no')"),  # "no" was true
        ({"chat": "yes"}, "chat must be True or False"),
        ({"system": 5}, "--system must be text (got 5)"),  # was the template's TypeError
        ({"temp": 0.5}, "unknown setting temp; the settings are GenerationConfig's"),
    ],
)
def test_settings_of_the_wrong_type_are_bad_settings_not_crashes(
    self_draft_engine, setting, needle
):
    with pytest.raises(BadSettingError) as error:
        self_draft_engine.generate("hi", **setting)
    assert needle in str(error.value)


def test_one_stop_string_may_be_given_as_text(plain_engine):
    listed = plain_engine.generate(PROMPTS[1], max_tokens=60, mode="target", stop=["Mars"])
    alone = plain_engine.generate(PROMPTS[1], max_tokens=60, mode="target", stop="Mars")
    assert alone.stats.finish_reason == "stop_string"  # not at the first "M", "a", "r" or "s"
    assert alone.text == listed.text and len(alone.text) > 20


@pytest.mark.parametrize(
    "prompt", [[1, 10**6], [1, -5], [1, 2**40], [1, 2.0], b"hello", 42], ids=repr
)
def test_a_prompt_of_bad_token_ids_is_a_bad_setting_and_the_engine_goes_on(plain_engine, prompt):
    with pytest.raises(BadSettingError, match=r"token prompt's ids|a prompt is text"):
        plain_engine.generate(prompt, max_tokens=3, mode="target")
    assert plain_engine.generate(PROMPTS[3], max_tokens=3, mode="target").tokens


def test_a_stream_cut_short_by_another_generation_says_so(plain_engine):
    stream = plain_engine.stream(PROMPTS[1], max_tokens=40, mode="target")
    pieces = iter(stream)
    first = next(pieces)
    plain_engine.generate("Say hi.", max_tokens=3, mode="target")
    # Its result is there without taking another piece (it was None until then).
    assert stream.result is not None and stream.result.stats.finish_reason == "superseded"
    assert stream.result.text == first and len(stream.result.tokens) < 40
    assert "another generation" in stream.result.stats.summary()
    assert list(pieces) == []  # it says nothing more


@pytest.mark.parametrize("use", ["forget_caches", "forget_draft_cache", "catch_up_draft"])
@pytest.mark.parametrize("mode", ["target", "chain"])
def test_work_on_the_caches_ends_a_stream_left_open_as_another_generation_does(
    self_draft_engine, use, mode
):
    """Its rounds went on from caches changed under them: after forget_caches a text that was
    not the target's ("In the depths of the night-night, the sun will shine ..."), after
    catch_up_draft a chain's batch that llama.cpp refused (RuntimeError, status -1)."""
    engine = self_draft_engine
    whole = greedy(engine, PROMPTS[1], mode, n=40, ngram=False)
    stream = engine.stream(PROMPTS[1], max_tokens=40, mode=mode, ngram=False)
    pieces = iter(stream)
    first = [next(pieces) for _ in range(3)]
    getattr(engine, use)()
    assert list(pieces) == []
    assert stream.result.stats.finish_reason == "superseded"
    assert stream.result.text == "".join(first) and whole.text.startswith(stream.result.text)
    assert greedy(engine, PROMPTS[1], mode, n=40, ngram=False).tokens == whole.tokens


def test_a_stream_ended_by_another_thread_ends_there_and_leaves_that_thread_be(plain_engine):
    """Looped over again while the other thread's generation was inside a round, it said the
    engine was busy, where it had ended; taking the engine's lock in between, it made the
    other generation fail so at times."""
    engine = plain_engine
    whole = greedy(engine, PROMPTS[2], "target", n=12)
    stream = engine.stream(PROMPTS[1], max_tokens=20, mode="target")
    pieces = iter(stream)
    first = next(pieces)
    other = lambda: greedy(engine, PROMPTS[2], "target", 12)  # noqa: E731
    # The other generation ends this stream, then holds the engine inside a round.
    with held_in_a_round(engine, other, at_step=2) as results:
        assert list(pieces) == []
        assert stream.result.stats.finish_reason == "superseded" and stream.result.text == first
    assert [r.tokens for r in results] == [whole.tokens]


@pytest.mark.parametrize("ended_by", ["break", "another generation"])
def test_time_the_caller_held_the_last_piece_is_not_decoding_time(plain_engine, ended_by):
    """A loop left a second after its last piece counted that second as decoding: decode_s
    2.06 s for 4 tokens, 1.9 tok/s."""
    stream = plain_engine.stream(PROMPTS[1], max_tokens=20, mode="target")
    for i, _ in enumerate(stream):
        if i == 2:
            time.sleep(1.0)
            if ended_by == "break":
                break
            plain_engine.generate("Say hi.", max_tokens=2, mode="target")
    stats = stream.result.stats
    assert stats.finish_reason == ("interrupted" if ended_by == "break" else "superseded")
    assert 0 < stats.decode_s < 0.5 and stats.native_s <= stats.decode_s


def test_settling_the_caches_of_a_superseded_stream_is_not_the_callers_time(
    plain_engine, monkeypatch
):
    """The caller's hold on its last piece was counted until the stream's result was set,
    after its caches were settled: decode_s came out 0.6 ms under the time inside llama_decode
    (CI), and at 0 with a slow settling."""
    trim = type(plain_engine)._trim_caches

    def slow_trim(engine, run):
        time.sleep(0.2)
        trim(engine, run)

    stream = plain_engine.stream(PROMPTS[1], max_tokens=20, mode="target")
    for i, _ in enumerate(stream):
        if i == 2:
            monkeypatch.setattr(type(plain_engine), "_trim_caches", slow_trim)
            plain_engine.generate("Say hi.", max_tokens=2, mode="target")
    monkeypatch.undo()
    stats = stream.result.stats
    assert stats.finish_reason == "superseded"
    assert 0 < stats.native_s <= stats.decode_s < 0.2


def test_a_second_ctrl_c_while_a_stream_settles_the_caches_waits_until_they_are(
    self_draft_engine, monkeypatch
):
    """A chat's Ctrl+C pressed twice: the second stopped the trimming of the caches halfway,
    where a tree's branches were still in them for the next answer. It is raised once they are
    settled, by the close of the loop's iterator (the chat closes it there, as here: left to
    Python's collector, the second Ctrl+C is printed as "Exception ignored in ..." and lost)."""
    engine = self_draft_engine
    whole = greedy(engine, PROMPTS[0], "tree", n=24)
    trimmed = ctrl_c_while_trimming(engine, monkeypatch)  # the second Ctrl+C
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    pieces = iter(engine.stream(PROMPTS[1], max_tokens=40, mode="tree"))
    try:
        with pytest.raises(KeyboardInterrupt):
            for i, _ in enumerate(pieces):
                if i == 3:
                    os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl+C
                    time.sleep(1)
        assert trimmed == []  # the caches settle as the iterator closes
        with pytest.raises(KeyboardInterrupt):
            pieces.close()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert trimmed == [True]
    monkeypatch.undo()
    assert greedy(engine, PROMPTS[0], "tree", n=24).tokens == whole.tokens


def test_a_stream_iterated_again_yields_nothing_more(plain_engine):
    """It generated on, past max_tokens (11 of 10)."""
    stream = plain_engine.stream(PROMPTS[1], max_tokens=10, mode="target")
    text = "".join(stream)
    assert "".join(stream) == "" and stream.result.text == text
    assert stream.result.stats.n_generated == len(stream.result.tokens) <= 10


def test_time_the_caller_spends_with_the_pieces_is_not_decoding_time(plain_engine):
    """A caller sleeping 0.1 s a piece made decode_s 5.4 s for 2.2 s of llama.cpp, and
    overhead_ms_per_pass 102."""
    stream = plain_engine.stream(PROMPTS[1], max_tokens=8, mode="target")
    for _ in stream:
        time.sleep(0.2)
    stats = stream.result.stats
    assert stats.n_generated >= 4 and stats.decode_s < 0.2 * (stats.n_generated - 1)
    assert stats.native_s <= stats.decode_s and stats.overhead_ms_per_pass < 50


def test_a_prompt_of_token_ids_may_be_a_numpy_array_and_none_is_an_empty_prompt(plain_engine):
    ids = plain_engine.target.tokenize(PROMPTS[3], add_special=True)
    as_list = plain_engine.generate(ids, max_tokens=4, mode="target")
    assert plain_engine.generate(np.array(ids), max_tokens=4, mode="target").tokens == (
        as_list.tokens
    )
    with pytest.raises(BadSettingError, match="the prompt is empty"):
        plain_engine.generate([], max_tokens=4)


def test_a_closed_engine_frees_its_threads_and_generates_no_more(smol_path):

    import edgespec

    first, last = min(os.sched_getaffinity(0)), max(os.sched_getaffinity(0))
    before = threading.active_count()
    with edgespec.load(
        smol_path, smol_path, n_ctx=256, target_cpus=str(last), draft_cpus=str(first)
    ) as engine:
        assert engine.generate(PROMPTS[3], max_tokens=4, mode="chain").tokens
        assert threading.active_count() > before  # each model's pinned thread
    assert threading.active_count() == before
    engine.close()  # twice is harmless
    with pytest.raises(BadSettingError, match="closed"):
        engine.generate(PROMPTS[3], max_tokens=4)


@pytest.mark.parametrize(
    "use", ["catch_up_draft", "forget_caches", "prompt_tokens", "with_context"]
)
def test_a_closed_engine_refuses_what_would_touch_its_freed_models(smol_path, use):
    """Each of these crashed the process (a segmentation fault in llama.cpp), or, making a
    larger one, blamed the model file ("could not create a context ...: model cannot be
    NULL")."""
    import edgespec

    engine = edgespec.load(smol_path, smol_path, n_ctx=256)
    engine.close()
    args = {"prompt_tokens": ["Hi"], "with_context": [512]}.get(use, [])
    with pytest.raises(BadSettingError, match="this engine is closed"):
        getattr(engine, use)(*args)


def test_a_stream_made_or_begun_before_the_engine_closed_ends_without_a_crash(smol_path):
    import edgespec

    engine = edgespec.load(smol_path, n_ctx=256)
    not_begun = engine.stream(PROMPTS[1], max_tokens=20, mode="target")
    begun = engine.stream(PROMPTS[1], max_tokens=20, mode="target")
    pieces = iter(begun)
    first = next(pieces)
    engine.close()
    assert list(pieces) == [] and begun.result.text == first
    assert begun.result.stats.finish_reason == "superseded"
    with pytest.raises(BadSettingError, match="this engine is closed"):
        list(not_begun)


@pytest.mark.parametrize("first", ["model", "context"])
def test_a_model_is_freed_after_its_last_context_whichever_is_finalised_first(smol_path, first):
    """An engine and its last stream are a cycle, which the garbage collector finalises in any
    order: a context freed after its model crashed a test run in llama_free."""
    model = Model(smol_path)
    contexts = [Context(model, n_ctx=256, n_threads=1) for _ in range(2)]
    contexts[0].decode([1, 2, 3], 0)
    if first == "model":
        model.__del__()
        assert model._model  # still there for the contexts' own freeing
    for ctx in contexts:
        ctx.__del__()
    assert bool(model._model) == (first == "context")
    model.__del__()
    assert not model._model


def test_a_prompt_longer_than_the_context_is_rejected(smol_path):
    import edgespec

    engine = edgespec.load(smol_path, n_ctx=32)
    with pytest.raises(ContextOverflowError, match="context holds 32"):
        engine.generate("word " * 100)


def test_a_context_attends_with_flash_attention_or_without_as_told(plain_engine):
    """Two kernels round differently, so the logits tell which ran: unsaid, llama.cpp's choice
    for the CPU (flash attention); told otherwise, the other, which chooses the same tokens."""
    model = plain_engine.target
    tokens = model.tokenize("The quick brown fox jumps over the lazy dog. " * 20, add_special=True)
    rows = {}
    for flash_attn in (None, True, False):
        ctx = Context(model, n_ctx=512, n_threads=2, flash_attn=flash_attn)
        ctx.decode(tokens, 0, logits="none")
        rows[flash_attn] = ctx.decode(tokens[:8], len(tokens), logits="all").copy()
        ctx.close()
    assert np.array_equal(rows[None], rows[True])
    assert not np.array_equal(rows[True], rows[False])
    assert np.array_equal(rows[True].argmax(axis=1), rows[False].argmax(axis=1))


def test_batch_logits_are_read_in_batch_order(plain_engine):
    """The engine reads all rows at once; they must match row-by-row reads (get_logits_ith)."""
    import llama_cpp

    ctx = Context(plain_engine.target, n_ctx=128, n_threads=2)
    tokens = plain_engine.target.tokenize("The quick brown fox", add_special=True)
    rows = ctx.decode(tokens, 0, logits="all").copy()
    for i in range(len(tokens)):
        ith = np.ctypeslib.as_array(
            llama_cpp.llama_get_logits_ith(ctx._ctx, i), shape=(rows.shape[1],)
        )
        assert np.array_equal(rows[i], ith)
    ctx.close()


def test_a_prompt_that_extends_the_last_one_evaluates_only_its_new_tokens(self_draft_engine):
    """A chat's second turn: the history is in the caches already."""
    engine = self_draft_engine
    engine.forget_caches()
    first_prompt = engine.prompt_tokens(PROMPTS[1])
    first = engine.generate(first_prompt, max_tokens=20, mode="chain")
    assert first.stats.n_prompt_eval == len(first_prompt)
    follow_up = engine.target.tokenize(" Which one is largest?", add_special=False)
    second_prompt = first_prompt + first.tokens + follow_up
    second = engine.generate(second_prompt, max_tokens=20, mode="chain")
    # the history minus its last token was cached; the new tokens (and that one) are evaluated
    assert second.stats.n_prompt_eval <= len(follow_up) + 2
    # and the result is what a fresh start gives
    engine.forget_caches()
    fresh = engine.generate(second_prompt, max_tokens=20, mode="chain")
    assert fresh.stats.n_prompt_eval == len(second_prompt)
    assert_same_or_near_tie(engine, second_prompt, fresh.tokens, second.tokens)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to split")
def test_each_model_decodes_on_its_own_cpus_and_the_output_is_unchanged(smol_path, plain_engine):
    import edgespec

    first, last = min(os.sched_getaffinity(0)), max(os.sched_getaffinity(0))
    engine = edgespec.load(
        smol_path, smol_path, n_ctx=256, threads=2, draft_threads=1,
        target_cpus=str(last), draft_cpus=str(first),
    )  # fmt: skip
    spec = greedy(engine, PROMPTS[3], "chain", n=24)
    plain = greedy(plain_engine, PROMPTS[3], "target", n=24)
    prompt_tokens = plain_engine.prompt_tokens(PROMPTS[3])
    assert_same_or_near_tie(plain_engine, prompt_tokens, plain.tokens, spec.tokens)
    # Read back from the kernel: the target's pinned thread and its OpenMP worker sit on `last`,
    # the draft's single thread on `first`.
    assert spec.stats.threads_by_cpus.get(str(last), 0) >= 2
    assert spec.stats.threads_by_cpus.get(str(first), 0) >= 1
    assert f"target on CPUs {last}, draft on CPUs {first}" in spec.stats.placement


def _mapped_files() -> set[str]:
    with open("/proc/self/maps") as maps:
        return {line.split(maxsplit=5)[5].strip() for line in maps if len(line.split()) == 6}


def test_weights_are_read_into_memory_not_mapped_from_the_file(smol_q4_0):
    # Mapped weights are page cache the OS may drop mid-generation (seen: 23 -> 0.4 tokens/s).
    # This llama.cpp has no `use_mmap` field: a misspelt ctypes field is silently ignored,
    # so check what the process actually maps.
    from edgespec.backend import Model

    in_memory = Model(smol_q4_0)
    assert str(smol_q4_0.resolve()) not in _mapped_files()
    mapped = Model(smol_q4_0, use_mmap=True)
    assert str(smol_q4_0.resolve()) in _mapped_files()
    in_memory.close()
    mapped.close()


def test_catching_the_draft_up_leaves_it_holding_what_the_target_holds(q4_draft_engine):
    """Between a chat's turns: the turn the draft did not draft is evaluated while nobody waits,
    and the next answer's draft starts from the whole history."""
    engine = q4_draft_engine
    engine.forget_caches()
    first_prompt = engine.prompt_tokens(PROMPTS[1])
    first = engine.generate(first_prompt, max_tokens=20, mode="target")  # without the draft
    assert engine._draft_cache == []
    held = len(engine._target_cache)
    assert held >= len(first_prompt) + len(first.tokens) - 2
    assert engine.catch_up_draft() == held
    assert engine._draft_cache == engine._target_cache
    assert engine.draft_ctx.seq_pos_max(0) == held - 1
    assert engine.catch_up_draft() == 0  # nothing new since

    follow_up = engine.target.tokenize(" Which one is largest?", add_special=False)
    second_prompt = first_prompt + first.tokens + follow_up
    draft_batches = []
    decode = engine.draft_ctx.decode

    def recording(tokens, *args, **kwargs):
        draft_batches.append(len(tokens))
        return decode(tokens, *args, **kwargs)

    engine.draft_ctx.decode = recording  # type: ignore[method-assign]
    try:
        second = engine.generate(second_prompt, max_tokens=20, mode="chain")
    finally:
        del engine.draft_ctx.decode
    assert max(draft_batches) <= len(follow_up) + 2  # only the new tokens were left to evaluate
    plain = engine.generate(second_prompt, max_tokens=20, mode="target")
    assert_same_or_near_tie(engine, second_prompt, plain.tokens, second.tokens)


def test_a_token_longer_than_256_bytes_keeps_all_its_text(smol_path, tmp_path):
    """Pieces were read into 256 bytes: a longer one came out empty, lost from the answer."""
    copy = write_vocab_copy(smol_path, tmp_path / "long-token.gguf", {1000: "a" * 300})
    model = Model(copy, vocab_only=True)
    assert model.piece(1000) == b"a" * 300
    assert model.piece(999) == Model(smol_path, vocab_only=True).piece(999)


def test_a_batch_whose_deepest_row_is_beyond_the_context_is_refused_whatever_its_order(smol_path):
    """A tree's batch need not end with its deepest row; only the last row was checked."""
    ctx = Context(Model(smol_path), n_ctx=64, n_threads=1)
    try:
        with pytest.raises(ContextOverflowError, match="position 64 is beyond the context"):
            ctx.decode([1, 2, 3], 0, positions=[10, 64, 11], seq_ids=[[0], [0], [0]])
    finally:
        ctx.close()


def test_a_target_token_the_draft_lacks_reaches_the_draft_as_a_stand_in(smol_path, tmp_path):
    """A target with tokens added (as a fine-tuned model's chat template may use) and the draft
    it was made from: a prompt holding one made llama.cpp refuse the draft's batch, a traceback."""
    import edgespec

    from .helpers import with_extra_tokens

    wider = with_extra_tokens(smol_path, tmp_path / "wider.gguf", 8)
    engine = edgespec.load(wider, draft=smol_path, n_ctx=512)
    prompt = engine.prompt_tokens("Say <extra_3> hello, then count to ten.", chat_mode=False)
    assert max(prompt) >= engine.draft.n_vocab  # an id the draft lacks
    plain = greedy(engine, prompt, "target", n=24)
    for mode in ("chain", "tree", "auto"):
        spec = greedy(engine, prompt, mode, n=24)
        assert_same_or_near_tie(engine, prompt, plain.tokens, spec.tokens)
    engine.close()


def test_a_model_without_a_bos_token_has_no_text_for_it_not_an_abort(smol_path):
    """A model with no BOS (-1, RWKV's tokenizer) whose chat template writes bos_token: asking
    llama.cpp for the text of -1 aborted the process."""
    model = Model(smol_path, vocab_only=True)
    assert model.token_text(-1) == b"" and model.token_text(model.n_vocab) == b""
    assert model.token_text(model.eos)  # a real one still has its text


def test_a_model_trained_for_a_short_context_gets_it_when_none_is_asked_for(smol_path, tmp_path):
    """The default 2048 tokens refused a model trained for 512 unless -c was typed."""
    import edgespec
    from edgespec.draft_head import rewrite_gguf

    short = tmp_path / "smol-512.gguf"
    n_vocab = Model(smol_path, vocab_only=True).n_vocab

    def edit(name, value):
        return 512 if name.endswith(".context_length") else value

    rewrite_gguf(smol_path, short, edit, range(n_vocab))
    engine = edgespec.load(short)
    assert engine.n_ctx == 512 and engine.generate("Hi", max_tokens=4, mode="target").tokens
    engine.close()
    with pytest.raises(BadSettingError, match="at most 512"):  # asked for, it is still checked
        edgespec.load(short, n_ctx=1024)
