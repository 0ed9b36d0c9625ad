"""The Python API as a library user meets it: one generation at a time per engine, said
clearly where a second thread or a second loop would run into the first; the errors worth
catching apart importable from `edgespec`; arguments the CLI would check, checked here too."""

from __future__ import annotations

import re

import pytest

import edgespec
from edgespec.errors import BadSettingError, EdgespecError

from .helpers import held_in_a_round

PROMPT = "The three primary colours are"


def test_the_errors_worth_telling_apart_come_from_edgespec_and_are_all_edgespec_errors():
    for name in ("BadSettingError", "ContextOverflowError", "IncompatibleModelsError",
                 "ModelFileError"):  # fmt: skip
        assert issubclass(getattr(edgespec, name), edgespec.EdgespecError)
        assert name in edgespec.__all__


def test_a_stream_looped_over_twice_at_once_is_refused_and_the_first_loop_goes_on(plain_engine):
    whole = plain_engine.generate(PROMPT, max_tokens=12, mode="target", chat=False).text
    stream = plain_engine.stream(PROMPT, max_tokens=12, mode="target", chat=False)
    first_loop = iter(stream)
    first = next(first_loop)
    with pytest.raises(EdgespecError, match="this stream is being iterated already"):
        list(iter(stream))  # ran the same generation again on its caches: ZeroDivisionError
    assert first + "".join(first_loop) == whole == stream.result.text
    assert list(stream) == []  # ended: nothing more


def test_a_second_thread_generating_while_a_round_runs_is_told_the_engine_is_busy(plain_engine):
    """Two threads on one engine failed with "generator already executing", ZeroDivisionError
    or "llama_decode failed" (and two decodes on one context could crash). Here the second
    comes while the first is inside a round: refused, and the first finishes as if alone."""
    engine = plain_engine

    def first() -> str:
        return engine.generate(PROMPT, max_tokens=12, mode="target", chat=False).text

    whole = first()
    with held_in_a_round(engine, first, at_step=3) as texts:
        with pytest.raises(EdgespecError, match="generating in another thread"):
            engine.generate("Another question", max_tokens=4, mode="target")
        with pytest.raises(EdgespecError, match="generating in another thread"):
            engine.catch_up_draft() if engine.draft else engine.close()
    assert texts == [whole]
    assert engine.generate(PROMPT, max_tokens=12, mode="target", chat=False).text == whole


@pytest.mark.parametrize(
    "setting", [{"system": "Answer in French."}, {"chat": True}, {"chat_template": "{{ 1 }}"}]
)
def test_chat_settings_with_a_prompt_of_token_ids_are_refused_not_ignored(plain_engine, setting):
    ids = plain_engine.prompt_tokens(PROMPT, chat_mode=False)
    with pytest.raises(BadSettingError, match="chat, system and chat_template apply to a text"):
        plain_engine.generate(ids, max_tokens=2, **setting)


# A chat template with no control tokens: its prompt is the same text given raw.
QA_TEMPLATE = "{% for m in messages %}Q: {{ m.content }}\n{% endfor %}A:"


def test_a_chat_template_given_is_used_in_place_of_the_gguf_s(plain_engine):
    assert plain_engine.target.info.chat_template is not None  # SmolLM2's ChatML, not used
    given = plain_engine.generate(PROMPT, max_tokens=8, mode="target", chat_template=QA_TEMPLATE)
    raw = plain_engine.generate(f"Q: {PROMPT}\nA:", max_tokens=8, mode="target", chat=False)
    assert given.text == raw.text and given.stats.n_prompt_tokens == raw.stats.n_prompt_tokens


@pytest.mark.parametrize(
    "setting, said",
    [({"chat": False}, "--chat-template is for chat: drop --raw"), ({}, "must be text (got int)")],
)
def test_a_chat_template_for_a_raw_prompt_or_not_text_is_refused(plain_engine, setting, said):
    template = QA_TEMPLATE if setting else 5
    with pytest.raises(BadSettingError, match=re.escape(said)):
        plain_engine.generate(PROMPT, max_tokens=2, chat_template=template, **setting)


def test_a_chat_template_that_leaves_the_prompt_out_is_refused(plain_engine):
    """One that wrote a fixed text had the model answer it, not the prompt, and nothing said so."""
    with pytest.raises(EdgespecError, match="the chat template leaves out the message"):
        plain_engine.generate(PROMPT, max_tokens=2, chat_template="Tell me a joke.")


def test_only_text_is_tokenized_as_a_prompt(plain_engine):
    with pytest.raises(BadSettingError, match="a prompt to tokenize is text, not int"):
        plain_engine.prompt_tokens(5)


@pytest.mark.parametrize(("target", "said"), [(None, "not NoneType"), (5, "not int"),
                                              ("", "the target's path is empty")])  # fmt: skip
def test_a_model_argument_that_is_no_path_is_a_bad_setting(target, said):
    with pytest.raises(BadSettingError, match=said):
        edgespec.load(target)


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"target_cpus": 1}, "target_cpus is a CPU list like '0-3,6' (got int 1)"),
        ({"draft_cpus": [0]}, "draft_cpus is a CPU list like '0-3,6' (got list [0])"),
        ({"pipeline": "no"}, "pipeline must be True, False or None (got 'no')"),
        ({"adapt_threads": "no"}, "adapt_threads must be True or False (got 'no')"),
        ({"verbose": "no"}, "verbose must be True or False (got 'no')"),
        ({"progress": 5}, "progress must be a function (got int)"),
        ({"say": None}, "say must be a function (got NoneType)"),
    ],
)
def test_load_settings_of_the_wrong_type_are_bad_settings(smol_path, setting, said):
    """A CPU list as a number failed as a TypeError; pipeline="no", a string, turned the
    pipeline on, verbose="no" printed llama.cpp's log; a progress that was no function made
    the load fail as the model file's fault."""
    with pytest.raises(BadSettingError) as error:
        edgespec.load(smol_path, smol_path, n_ctx=256, **setting)
    assert str(error.value) == said


@pytest.mark.parametrize("fails_at", [0.3, 1.0])
def test_an_error_in_the_progress_function_is_raised_as_it_is(smol_path, capfd, fails_at):
    """It was printed as "Exception ignored on calling ctypes callback function", some 16
    times, and the load failed as the model file's fault ("could not load ...: unknown
    reason")."""

    class Enough(Exception):
        pass

    def progress(fraction: float) -> None:
        if fraction >= fails_at:
            raise Enough(f"at {fraction:.2f}")

    with pytest.raises(Enough):
        edgespec.load(smol_path, smol_path, n_ctx=256, progress=progress)
    assert "Exception ignored" not in capfd.readouterr().err
    with edgespec.load(smol_path, smol_path, n_ctx=256, progress=lambda _: None) as engine:
        assert engine.generate(PROMPT, max_tokens=2, mode="target").tokens


def test_a_model_path_may_start_at_the_home_folder(smol_path, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "smol.gguf").symlink_to(smol_path)
    with edgespec.load("~/smol.gguf", n_ctx=256) as engine:
        assert engine.target.path == tmp_path / "smol.gguf"
        assert engine.generate(PROMPT, max_tokens=2, chat=False).stats.n_generated == 2


def test_a_failed_decode_is_said_as_such_not_as_a_thread_governors_division(plain_engine):
    # An empty batch: llama.cpp refuses it. The governor judged the failed call's time first.
    assert plain_engine.target_ctx.governor is not None
    with pytest.raises(RuntimeError, match="llama_decode failed"):
        plain_engine.target_ctx.decode([], 0)


def test_an_engine_with_a_larger_context_keeps_its_models_and_the_old_one_is_closed(smol_path):
    engine = edgespec.load(smol_path, smol_path, n_ctx=256, threads=1)
    long_prompt = "word " * 400
    with pytest.raises(edgespec.ContextOverflowError) as overflow:
        engine.generate(long_prompt, max_tokens=4, chat=False)
    assert overflow.value.needed is not None and overflow.value.needed > 256
    with pytest.raises(edgespec.ContextOverflowError) as of_ids:
        engine.generate(list(range(10, 310)), max_tokens=4)  # a prompt of token ids
    assert of_ids.value.needed == 300
    with pytest.raises(edgespec.ContextOverflowError) as filling:  # no room for the answer
        engine.generate(list(range(10, 266)), max_tokens=4)
    assert "has 256 tokens, all the context holds (256), leaving no room to answer" in str(
        filling.value
    )  # it said "256 tokens but the context holds 256"
    larger = engine.with_context(1024)
    assert larger.target is engine.target and larger.draft is engine.draft  # not loaded again
    assert larger.n_ctx == 1024
    assert larger.generate(long_prompt, max_tokens=4, chat=False).stats.n_generated == 4
    with pytest.raises(EdgespecError, match="closed"):
        engine.generate(PROMPT, max_tokens=4)
    larger.close()
