"""`edgespec chat` and the Conversation under it: real SmolLM2, a real terminal, small answers."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import stat
import subprocess
import sys
import time

import pytest

import edgespec
from edgespec.conversation import Conversation, Message
from edgespec.errors import BadSettingError, ContextOverflowError, EdgespecError

from .helpers import ctrl_c_while_trimming, hear_ctrl_c, with_bool_metadata, write_spm_vocab

STATS_LINE = r"\d+ tokens, .*context \d+/\d+"
TIMEOUT = 60.0  # per step: generous, the test machines are small and shared


def chat_argv(smol_path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "edgespec.cli", "chat", "-m", str(smol_path), "--mode",
            "target", "-n", "24", "-c", "512", "-t", "1", *extra]  # fmt: skip


def chat_env(tmp_path) -> dict[str, str]:
    # No user config file; a dumb terminal keeps colour and readline escapes out of the output.
    return {**os.environ, "EDGESPEC_HOME": str(tmp_path / "home"), "TERM": "dumb"}


class Terminal:
    """A command on a pseudo-terminal, driven like a person at the keyboard."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: become the command
            hear_ctrl_c()
            os.execve(argv[0], argv, env)
        self.output = ""  # everything read so far
        self.seen = 0  # output before this offset is matched already
        self.exited = False

    def expect(self, pattern: str, timeout: float = TIMEOUT) -> re.Match[str]:
        """Wait for `pattern` in the output after the previous match; return its match."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.compile(pattern, re.MULTILINE).search(self.output, self.seen)
            if found:
                self.seen = found.end()
                return found
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"no {pattern!r} in:\n{self.output[self.seen :]}")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.fd, 4096)
        except OSError:  # the child closed the terminal
            return False
        self.output += data.decode(errors="replace").replace("\r\n", "\n")
        return bool(data)

    def press(self, key: bytes) -> None:
        """A control key at the prompt. Python's readline misses a Ctrl+C that comes in the
        moment between showing the prompt and waiting for keys, so wait like a person would."""
        time.sleep(0.3)
        os.write(self.fd, key)

    def send_line(self, text: str) -> None:
        os.write(self.fd, text.encode() + b"\r")

    def ask(self, text: str) -> None:
        """Send a message and wait for its answer's summary and the next prompt."""
        self.send_line(text)
        self.expect(STATS_LINE)
        self.expect(r"^>>> ")

    def command(self, text: str) -> str:
        """Run a /command; its output up to the next prompt."""
        self.send_line(text)
        self.expect(re.escape(text) + r"\n")
        start = self.seen
        self.expect(r"^>>> ")
        return self.output[start : self.seen - len(">>> ")]

    def exit_code(self, timeout: float = TIMEOUT) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read(0.1)  # a child blocked on a full terminal would never exit
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.exited = True
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        raise AssertionError("the chat did not exit")

    def kill(self) -> None:
        if not self.exited:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            os.close(self.fd)


def saved(path) -> list[dict]:
    return json.loads(path.read_text())["messages"]


def test_chat_in_a_terminal(smol_path, tmp_path):
    term = Terminal(chat_argv(smol_path), chat_env(tmp_path))
    try:
        term.expect(r"^>>> ")
        term.ask("Hi")
        term.ask("What is 2+2?")

        # Turn two evaluated only its new tokens: turn one's prompt and answer were cached.
        stats = json.loads(term.command("/stats"))
        assert stats["n_prompt_eval"] < stats["n_prompt_tokens"] / 2
        # The answer's turn ended, as the next prompt holds it: what /show says too.
        assert stats["n_ctx_used"] > stats["n_prompt_tokens"] + stats["n_generated"]
        assert f"context: {stats['n_ctx_used']}/512 tokens" in term.command("/show")

        first = tmp_path / "first.json"
        assert "Saved 4 messages" in term.command(f"/save {first}")
        assert [m["content"] for m in saved(first)][::2] == ["Hi", "What is 2+2?"]

        term.command("/clear")
        assert "context: 0/512" in term.command("/show")
        term.command("/set temp 0.5")
        assert "temp: 0.5" in term.command("/show")
        assert "error: temp must be" in term.command("/set temp warm")
        term.command("/set seed 7")
        assert "seed: 7" in term.command("/show")
        assert "Set seed to auto." in term.command("/set seed auto")
        assert "seed: auto" in term.command("/show")
        refused = term.command("/set max_tokens auto")  # it has no automatic value
        assert "max_tokens must be a whole number (got 'auto')" in refused

        assert "Loaded 4 messages" in term.command(f"/load {first}")
        again = tmp_path / "again.json"
        term.command(f"/save {again}")
        assert saved(again) == saved(first)

        # Ctrl+C mid-answer stops the answer, not the chat.
        term.command("/set temp 0")
        term.command("/set max_tokens 300")
        term.send_line("Tell me a long story about a dragon.")
        term.expect(r"dragon\.\n\S.{10}")  # the answer has begun
        os.write(term.fd, b"\x03")  # Ctrl+C
        term.expect(r"^interrupted$")
        term.expect(r"^>>> ")
        term.command("/set max_tokens 24")
        term.ask("What is 2+2?")
        after = tmp_path / "after.json"
        term.command(f"/save {after}")
        story, question, answer = saved(after)[-3:]
        assert story["role"] == "assistant" and story["interrupted"] and story["content"]
        assert question["content"] == "What is 2+2?"
        assert answer["content"] and not answer["interrupted"]

        term.press(b"\x03")  # Ctrl+C at an empty prompt says how to leave
        term.expect(r"/bye or Ctrl\+D")
        term.expect(r"^>>> ")
        term.press(b"\x04")  # Ctrl+D
        assert term.exit_code() == 0
    finally:
        term.kill()


def kept_chats(tmp_path) -> list:
    """The chats kept in the test's EDGESPEC_HOME, oldest first."""
    return sorted((tmp_path / "home" / "chats").glob("*.json"), key=lambda p: p.stat().st_mtime)


def test_a_chat_at_a_terminal_is_kept_after_every_answer_and_a_cleared_one_stays(
    smol_path, tmp_path
):
    term = Terminal(chat_argv(smol_path), chat_env(tmp_path))
    try:
        term.expect(r"^>>> ")
        assert kept_chats(tmp_path) == []  # nothing asked, nothing kept
        assert f"kept in: a new file in {tmp_path}/home/chats" in term.command("/show")
        term.ask("Hi")
        (first,) = kept_chats(tmp_path)
        assert f"kept in: {first}" in term.command("/show")
        assert [m["content"] for m in saved(first)][::2] == ["Hi"]
        assert stat.S_IMODE(first.stat().st_mode) == 0o600  # what a person asked is theirs
        term.ask("What is 2+2?")
        assert [m["content"] for m in saved(first)][::2] == ["Hi", "What is 2+2?"]
        term.command("/clear")
        term.ask("Bye")
        first_again, second = kept_chats(tmp_path)
        assert first_again == first and len(saved(first)) == 4
        assert [m["content"] for m in saved(second)][::2] == ["Bye"]
        term.send_line("/bye")
        assert term.exit_code() == 0
    finally:
        term.kill()
    typed = tmp_path / "home" / "typed-lines"
    assert "What is 2+2?" in typed.read_text() and "/clear" in typed.read_text()  # for ↑
    assert stat.S_IMODE(typed.stat().st_mode) == 0o600


def test_two_chats_at_once_each_keep_the_lines_typed_in_them(smol_path, tmp_path):
    """The last to end wrote the history it began with and its own lines: the other's lost."""
    first = Terminal(chat_argv(smol_path), chat_env(tmp_path))
    second = Terminal(chat_argv(smol_path), chat_env(tmp_path))
    try:
        for term, temp in ((first, "0.1"), (second, "0.2")):
            term.expect(r"^>>> ")
            term.command(f"/set temp {temp}")
        for term in (first, second):
            term.send_line("/bye")
            assert term.exit_code() == 0
    finally:
        first.kill()
        second.kill()
    typed = (tmp_path / "home" / "typed-lines").read_text().splitlines()
    assert typed.count("/set temp 0.1") == typed.count("/set temp 0.2") == 1
    assert typed.count("/bye") == 2


def test_continue_takes_up_the_latest_kept_chat_and_keeps_it_in_the_same_file(smol_path, tmp_path):
    term = Terminal(chat_argv(smol_path), chat_env(tmp_path))
    try:
        term.expect(r"^>>> ")
        term.ask("My name is Ada.")
        term.send_line("/bye")
        assert term.exit_code() == 0
    finally:
        term.kill()
    (kept,) = kept_chats(tmp_path)
    done = piped_chat(smol_path, tmp_path, "What is my name?\n", "--continue")
    assert done.returncode == 0, done.stderr
    assert f"continuing the chat kept in {kept} (2 messages)" in done.stderr
    assert kept_chats(tmp_path) == [kept]
    assert [m["content"] for m in saved(kept)][::2] == ["My name is Ada.", "What is my name?"]


def test_continue_with_no_kept_chat_is_one_line_before_loading(smol_path, tmp_path):
    done = piped_chat(smol_path, tmp_path, "Hi\n", "--continue")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == (
        f"error: no chat to continue: none is kept in {tmp_path}/home/chats yet"
    )


def test_continue_from_a_damaged_kept_chat_is_one_line_before_any_model_is_looked_at(tmp_path):
    """It came after a first use's downloads and measuring (minutes on a new device)."""
    chats = tmp_path / "home" / "chats"
    chats.mkdir(parents=True)
    (chats / "2026-11-29-000000.json").write_text('{"messages": [')
    done = piped_chat(tmp_path / "not-fetched.gguf", tmp_path, "Hi\n", "--continue")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == (
        f"error: {chats}/2026-11-29-000000.json is not a saved conversation (not JSON)"
    )


@pytest.mark.parametrize(("how", "code"), [("SIGTERM", 143), ("hang up", 129)])
def test_a_kept_chat_ended_mid_answer_keeps_the_answer_so_far(smol_path, tmp_path, how, code):
    """A closed terminal (SIGHUP) or a kill (SIGTERM) lost the whole conversation."""
    term = Terminal(chat_argv(smol_path, "-n", "300"), chat_env(tmp_path))
    try:
        term.expect(r"^>>> ")
        term.ask("Hi")
        term.send_line("Tell me a long story about a dragon.")
        term.expect(r"dragon\.\n\S.{10}")  # the answer has begun
        if how == "SIGTERM":
            os.kill(term.pid, signal.SIGTERM)
            assert term.exit_code() == code
        else:
            os.close(term.fd)  # the terminal goes away: the kernel hangs up on the chat
            term.exited = True
            _, status = os.waitpid(term.pid, 0)
            assert os.waitstatus_to_exitcode(status) == code
    finally:
        term.kill()
    (kept,) = kept_chats(tmp_path)
    *_, question, story = saved(kept)
    assert question["content"] == "Tell me a long story about a dragon."
    assert story["interrupted"] and story["content"]


def test_a_hang_up_ignored_by_nohup_stays_ignored_in_a_kept_chat():
    from edgespec.cli.signals import ended_by_signals

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with ended_by_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert callable(signal.getsignal(signal.SIGTERM))  # ends the chat, keeping it
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_terminal_gone_before_its_hang_up_came_ends_a_kept_chat_as_the_hang_up_would(
    small_engine, tmp_path, monkeypatch
):
    """Closing the terminal fails the answer's next write (EIO), often before the SIGHUP: the
    chat ended as an error, its last question and answer unsaved."""
    import errno as errnos
    import io

    from edgespec.cli.chat_cmd import Repl
    from edgespec.cli.kept_chats import KeptChat
    from edgespec.config import Settings

    class GoneTerminal(io.StringIO):
        def write(self, text: str) -> int:
            if len(asked) == 2:  # the second answer's first piece
                raise OSError(errnos.EIO, "Input/output error")
            return super().write(text)

    asked: list[str] = []
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    conversation = Conversation(small_engine)
    kept = KeptChat(conversation, print, None)
    repl = Repl(conversation, Settings(max_tokens=16), False, kept)
    lines = iter(["Hi", "Tell me a story."])

    def read_line(prompt: str) -> str:
        line = next(lines)
        asked.append(line)
        return line

    repl.read_line = read_line  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stdout", GoneTerminal())
    repl.run()
    assert repl.ended_by == 128 + signal.SIGHUP
    *_, question, answer = saved(kept.path)
    assert question["content"] == "Tell me a story." and answer["interrupted"]


def test_a_chat_that_cannot_be_kept_says_so_once_and_goes_on(smol_path, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "chats").write_text("a file where the folder would be")
    term = Terminal(chat_argv(smol_path), chat_env(tmp_path))
    try:
        term.expect(r"^>>> ")
        term.ask("Hi")
        term.ask("Bye")
        term.send_line("/bye")
        assert term.exit_code() == 0
    finally:
        term.kill()
    assert term.output.count("this chat is not kept") == 1
    assert "/save FILE keeps it" in term.output


def test_only_the_newest_chats_are_kept(tmp_path, monkeypatch):
    from edgespec.cli import kept_chats as kept

    class Conversation:  # what KeptChat uses of one
        messages = ("a message",)

        def save(self, path):
            path.write_text("{}")

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setattr(kept, "KEPT_CHATS", 3)
    paths = []
    for i in range(5):
        chat = kept.KeptChat(Conversation(), print, None)
        chat.save()
        paths.append(chat.path)
        os.utime(chat.path, (1000 + i, 1000 + i))  # in the order they were kept
    assert len(set(paths[-3:])) == 3  # started in the same second, each a file of its own
    assert kept._kept(tmp_path / "chats") == paths[-3:]
    assert kept.latest_chat() == paths[-1]


def piped_chat(smol_path, tmp_path, lines: str, *extra: str) -> subprocess.CompletedProcess:
    """`edgespec chat` with `lines` piped in, to its end."""
    argv, env = chat_argv(smol_path, *extra), chat_env(tmp_path)
    return subprocess.run(argv, input=lines, capture_output=True, text=True, env=env, timeout=120)


def test_a_piped_chat_waiting_for_its_next_message_ends_at_ctrl_c(smol_path, tmp_path):
    """It said "Use /bye or Ctrl+D to exit." and waited on: neither can be typed into a pipe."""
    argv, env = chat_argv(smol_path), chat_env(tmp_path)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=hear_ctrl_c)  # fmt: skip
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write("Hi\n")
    proc.stdin.flush()
    lines = [proc.stderr.readline() for _ in range(1)]
    while not re.search(STATS_LINE, lines[-1]) and lines[-1] and len(lines) < 20:
        lines.append(proc.stderr.readline())  # notes before it, if any
    assert re.search(STATS_LINE, lines[-1]), lines  # answered; it waits for the next message
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130  # the pipe still open: no end of input
    out, err = proc.communicate()
    assert err.strip() == "interrupted" and out.strip()


@pytest.mark.parametrize("interactive", [False, True])
def test_a_ctrl_c_just_as_an_answer_ends_is_taken_as_at_the_wait_for_the_next_message(
    small_engine, interactive
):
    """Beside a busy core the test above's Ctrl+C, sent once the answer's statistics were
    written, came before the chat was back at its wait: "interrupted", and a piped chat waited
    on for a message nobody could send. Piped, it ends (130, as at the wait); at a terminal it
    goes on. The answer is kept either way."""
    from edgespec.cli.chat_cmd import Repl
    from edgespec.config import Settings

    conversation = Conversation(small_engine)
    repl = Repl(conversation, Settings(max_tokens=4, mode="target"), interactive)
    lines = iter(["Hi", "Bye"])

    def read_line(prompt: str) -> str:
        line = next(lines, None)
        if line is None:
            raise EOFError
        return line

    def ctrl_c() -> None:  # pressed as the answer ends, after its statistics
        raise KeyboardInterrupt

    repl.read_line = read_line  # type: ignore[method-assign]
    repl.catch_up_while_idle = ctrl_c  # type: ignore[method-assign]
    if interactive:
        repl.run()
    else:
        with pytest.raises(KeyboardInterrupt):
            repl.run()
    asked = [m.content for m in conversation.messages if m.role == "user"]
    assert asked == (["Hi", "Bye"] if interactive else ["Hi"])
    assert conversation.messages[1].role == "assistant" and not conversation.messages[1].interrupted


def test_a_piped_chat_whose_command_failed_exits_non_zero_after_the_rest(smol_path, tmp_path):
    """A script could not tell that its /save never happened: every error line, then exit 0."""
    saved_to = tmp_path / "chat.json"
    lines = f"Hi\n/save /nonexistent/dir/chat.json\n/frobnicate\nBye\n/save {saved_to}\n"
    done = piped_chat(smol_path, tmp_path, lines)
    assert done.returncode == 1
    assert len(re.findall(STATS_LINE, done.stderr)) == 2  # both answered all the same
    assert [m["content"] for m in saved(saved_to)][::2] == ["Hi", "Bye"]
    last = done.stderr.strip().splitlines()[-1]
    assert last == "error: 2 of the piped messages and commands failed (see above)"


def test_a_block_dropped_by_ctrl_c_is_recalled_whole_and_can_be_finished(smol_path, tmp_path):
    """Ctrl+C inside a \"\"\" block dropped it, its lines only in readline's history one by one."""
    term = Terminal(chat_argv(smol_path), chat_env(tmp_path))
    try:
        term.expect(r"^>>> ")
        for line in ('"""', "first line", "second line"):
            term.send_line(line)
            term.expect(r"^\.\.\. ")
        term.press(b"\x03")  # Ctrl+C
        term.expect(r"message dropped; Ctrl\+P")
        term.expect(r"^>>> ")
        term.press(b"\x10")  # Ctrl+P: the block as typed, then Enter: still open
        term.send_line("")
        term.expect(r"^\.\.\. ")
        term.ask('"""')
        path = tmp_path / "chat.json"
        term.send_line(f"/save {path}")  # longer than the line: readline scrolls its echo
        term.expect(r"Saved 2 messages")
        assert [m["content"] for m in saved(path)][::2] == ["first line\nsecond line"]
        term.press(b"\x04")
        assert term.exit_code() == 0
    finally:
        term.kill()


def test_a_chat_at_a_terminal_writing_its_answers_to_a_file_prompts_on_the_terminal(
    smol_path, tmp_path
):
    """`edgespec chat > log.txt` put its >>> prompts in the file and none on the terminal."""
    log = tmp_path / "log.txt"
    into_log = ["/bin/sh", "-c", 'exec "$@" > "$LOG"', "sh", *chat_argv(smol_path)]
    term = Terminal(into_log, {**chat_env(tmp_path), "LOG": str(log)})
    try:
        term.expect(r"^>>> ")
        term.ask("Hi")
        term.press(b"\x04")  # Ctrl+D: leave
        assert term.exit_code() == 0
    finally:
        term.kill()
    assert log.read_text().strip() and ">>>" not in log.read_text()


def test_chat_reads_one_message_per_line_from_a_pipe(smol_path, tmp_path):
    # Lines ending in \r\n (a file from Windows): the \r is no part of the message.
    saved_to = tmp_path / "chat.json"
    done = piped_chat(smol_path, tmp_path, f"Hi\r\nWhat is 2+2?\r\n/save {saved_to}\r\n")
    assert done.returncode == 0, done.stderr
    assert len(re.findall(STATS_LINE, done.stderr)) == 2
    assert done.stdout.strip() and ">>>" not in done.stdout
    assert [m["content"] for m in saved(saved_to)][::2] == ["Hi", "What is 2+2?"]


def test_a_file_goes_before_the_next_message_only_and_a_bad_one_is_an_error_line(
    smol_path, tmp_path
):
    from edgespec.cli.prompts import with_files

    (tmp_path / "notes.txt").write_text("Meeting: Thursday 10:00, room 4.\n")
    saved_to = tmp_path / "chat.json"
    lines = (f"/file {tmp_path}/notes.txt\nWhen?\n/file {tmp_path}/none.txt\n/file\nWhere?\n"
             f"/save {saved_to}\n")  # fmt: skip
    done = piped_chat(smol_path, tmp_path, lines)
    assert done.returncode == 1  # the two /file that failed
    assert f"Attached {tmp_path}/notes.txt (1 line)" in done.stdout
    assert f"error: no such file: {tmp_path}/none.txt" in done.stderr
    assert "error: usage: /file FILE" in done.stderr
    notes = [(f"{tmp_path}/notes.txt", "Meeting: Thursday 10:00, room 4.\n")]
    assert [m["content"] for m in saved(saved_to)][::2] == [with_files("When?", notes), "Where?"]


def test_chat_file_flags_go_before_the_first_message(smol_path, tmp_path):
    from edgespec.cli.prompts import with_files

    files = [tmp_path / "a.txt", tmp_path / "b.py"]
    files[0].write_text("alpha\n")
    files[1].write_text("print('b')")
    saved_to = tmp_path / "chat.json"
    done = piped_chat(smol_path, tmp_path, f"Compare them.\nThanks.\n/save {saved_to}\n",
                      "-f", str(files[0]), "--file", str(files[1]))  # fmt: skip
    assert done.returncode == 0, done.stderr
    first = with_files("Compare them.", [(str(files[0]), "alpha\n"), (str(files[1]), "print('b')")])
    assert [m["content"] for m in saved(saved_to)][::2] == [first, "Thanks."]


def test_a_message_longer_than_the_default_context_gets_one_that_holds_it(smol_path, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("The meeting moved to Thursday at 10:00 in room 4.\n" * 130)
    argv = [sys.executable, "-m", "edgespec.cli", "chat", "-m", str(smol_path), "--mode",
            "target", "-n", "8", "-t", "1", "-f", str(notes)]  # fmt: skip
    lines = "When is the meeting?\nThanks.\n/show\n"
    env = chat_env(tmp_path)
    done = subprocess.run(argv, input=lines, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "more than the default context holds: the chat goes on in one of 3072" in done.stderr
    assert len(re.findall(STATS_LINE, done.stderr)) == 2  # both answered
    assert re.search(r"^context: \d+/3072 tokens$", done.stdout, re.MULTILINE)


def test_chat_refuses_a_file_flag_it_cannot_read_before_loading(smol_path, tmp_path):
    for flag, error in [(str(tmp_path), "is a directory"), ("-", "chat reads its messages")]:
        done = piped_chat(smol_path, tmp_path, "Hi\n", "-f", flag)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith("error: ") and error in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_show_prints_a_loaded_system_messages_control_characters_as_escapes(smol_path, tmp_path):
    """A saved conversation's system message may hold terminal escapes: /show printed them raw
    (this one clears the screen)."""
    path = tmp_path / "chat.json"
    path.write_text(json.dumps({"system": "Be\x1b[2J terse.\tOK", "messages": []}))
    done = piped_chat(smol_path, tmp_path, f"/load {path}\n/show\n")
    assert done.returncode == 0, done.stderr
    assert "system: Be\\x1b[2J terse.\tOK\n" in done.stdout and "\x1b" not in done.stdout


def test_set_system_and_commands_typed_after_spaces(smol_path, tmp_path):
    """`   /show` was sent to the model as a message."""
    done = piped_chat(smol_path, tmp_path, "/set system Be brief.\n   /show\n/set system none\n")
    assert done.returncode == 0, done.stderr
    assert "Set the system message." in done.stdout and "system: Be brief." in done.stdout
    assert "Removed the system message." in done.stdout
    assert not re.search(STATS_LINE, done.stderr)  # nothing was asked


def test_set_reads_a_value_as_its_environment_variable_does_and_names_the_setting(
    smol_path, tmp_path
):
    lines = "/set temp -1\n/set temp 0.5 extra\n/set max_tokens ٣\n/set max_tokens 2.0\n/set\n"
    done = piped_chat(smol_path, tmp_path, lines)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: temp must be >= 0 (got -1)",  # not --temp, which was not typed
        "error: temp must be a number (got '0.5 extra')",
        "error: max_tokens must be a whole number (got '٣')",
        "error: usage: /set NAME VALUE, NAME one of temp, top_k, top_p, min_p, seed, max_tokens, "
        "mode, draft_max, system",
        "error: 4 of the piped messages and commands failed (see above)",
    ]
    assert "Set max_tokens to 2." in done.stdout


def test_save_never_replaces_a_pipe_or_the_file_the_chat_itself_writes_to(smol_path, tmp_path):
    """`/save /dev/stdout` with stdout in a log replaced the log (every answer in it lost), and
    a FIFO or a device became a regular file."""
    fifo, log = tmp_path / "fifo", tmp_path / "log.txt"
    os.mkfifo(fifo)
    with log.open("w") as out:
        done = subprocess.run(
            chat_argv(smol_path),
            input=f"Hi\n/save /dev/stdout\n/save {log}\n/save {fifo}\nBye\n",
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env=chat_env(tmp_path),
            timeout=120,
        )
    assert done.returncode == 1, done.stderr  # the chat went on, then said three commands failed
    assert "/dev/stdout is a stream, not a file" in done.stderr
    assert f"{log} is where this program's output goes" in done.stderr
    assert "not a regular file" in done.stderr
    assert len(re.findall(STATS_LINE, done.stderr)) == 2  # the chat went on
    assert not log.read_text().lstrip().startswith("{") and stat.S_ISFIFO(fifo.stat().st_mode)


def test_endless_files_are_refused_not_read_until_memory_runs_out(smol_path, tmp_path):
    """/load /dev/zero or --chat-template /dev/zero read until the kernel killed the process."""
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(65 << 20)  # sparse: no disk, and read as 64 MB of zeros
    done = piped_chat(smol_path, tmp_path, f"/load /dev/zero\n/load {huge}\nHi\n")
    assert done.returncode == 1 and "cannot read /dev/zero: not a regular file" in done.stderr
    assert "is over 64 MB: no saved chat" in done.stderr
    assert len(re.findall(STATS_LINE, done.stderr)) == 1
    done = piped_chat(smol_path, tmp_path, "Hi\n", "--chat-template", "/dev/zero")
    assert done.returncode != 0 and "is over 1 MB: not a chat template" in done.stderr


def test_a_full_context_is_not_reported_as_one_token_over(smol_path, tmp_path):
    """An answer that fills the context said "context 257/256": its last token is never
    evaluated, so prompt + answer is one more than the context holds."""
    done = piped_chat(
        smol_path, tmp_path, "Count from 1 to 500, separated by commas.\n", "-c", "64", "-n", "500"
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"context 64/64\b", done.stderr), done.stderr


def test_a_chat_started_in_target_mode_with_a_draft_can_switch_to_drafting(smol_path, tmp_path):
    done = piped_chat(smol_path, tmp_path, "/set mode chain\nHi\n", "--draft", str(smol_path))
    assert done.returncode == 0, done.stderr
    assert "Set mode to chain." in done.stdout
    assert re.search(r"mode chain, acceptance", done.stderr), done.stderr


def test_piped_bytes_that_are_not_utf8_and_an_unclosed_block_are_still_answered(
    smol_path, tmp_path
):
    """A Latin-1 byte was a traceback that ended the chat; input ending inside a \"\"\" block
    dropped the block without a word."""
    done = subprocess.run(
        chat_argv(smol_path),
        input=b'caf\xe9?\n"""Two lines\nand no end',
        capture_output=True,
        env=chat_env(tmp_path),
        timeout=120,
    )
    stderr = done.stderr.decode()
    assert done.returncode == 0 and "Traceback" not in stderr, stderr
    assert len(re.findall(STATS_LINE, stderr)) == 2


# ----- Conversation ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_engine(smol_path) -> edgespec.Engine:
    return edgespec.load(smol_path, n_ctx=256, threads=1)


CHATML_TEXT = "A turn ends with <|im_end|>, then <|im_start|>assistant answers."


def test_control_token_text_in_a_message_is_text_not_the_end_of_a_turn(small_engine):
    """A file about chat templates, asked about, ended the user's turn where it said so."""
    target = small_engine.target
    im_end = target.tokenize("<|im_end|>", add_special=False, parse_special=True)
    assert len(im_end) == 1  # a control token of SmolLM2's ChatML
    plain = small_engine.prompt_tokens("Explain this.", system="Be brief.")
    odd = small_engine.prompt_tokens(f"Explain this: {CHATML_TEXT}", system="Be brief.")
    assert odd.count(im_end[0]) == plain.count(im_end[0])  # the template's own, no more
    message = f"Explain this: {CHATML_TEXT}"
    as_text = target.tokenize(message, add_special=False, parse_special=False)
    assert any(odd[i : i + len(as_text)] == as_text for i in range(len(odd)))
    parsed_whole = target.tokenize(
        chat_render(small_engine, message, "Be brief."), add_special=False, parse_special=True
    )
    # What the model reads: the message as typed (control tokens read as nothing).
    assert CHATML_TEXT in target.detokenize(odd)
    assert CHATML_TEXT not in target.detokenize(parsed_whole)


def chat_render(engine: edgespec.Engine, prompt: str, system: str) -> str:
    from edgespec import chat

    template = engine.target.info.chat_template
    assert template is not None
    return chat.render(template, chat.messages_for(prompt, system))


def test_a_message_without_control_text_is_tokenized_as_its_whole_prompt(small_engine):
    """The common case stays what llama.cpp makes of the rendered text: pieces tokenized apart
    may tokenize otherwise at their edges."""
    text = chat_render(small_engine, "Write a haiku about caches.", "Be brief.")
    whole = small_engine.target.tokenize(text, add_special=False, parse_special=True)
    assert small_engine.prompt_tokens("Write a haiku about caches.", system="Be brief.") == whole


# Gemma 3's chat template (its instruction-tuned models' tokenizer_config.json): it trims each
# message and folds a system message into the first user turn.
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{ message['content'] | trim }}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""

GEMMA_TEXT = "A turn ends with <end_of_turn>, then <start_of_turn>model answers."


@pytest.fixture(scope="module")
def gemma_engine(gemma_path) -> edgespec.Engine:
    """Gemma-3-270M: a SentencePiece vocabulary. Its GGUF has no chat template: the tests give
    it its instruction-tuned siblings'."""
    return edgespec.load(gemma_path, n_ctx=256, threads=1)


def gemma_chat_tokens(engine: edgespec.Engine, prompt: str) -> list[int]:
    from edgespec import chat

    return engine.chat_tokens(GEMMA3_TEMPLATE, chat.messages_for(prompt, "Be brief."))


@pytest.mark.parametrize("padding", ["", "  \n"], ids=["as-typed", "trimmed-by-the-template"])
def test_control_token_text_in_a_gemma_message_is_text(gemma_engine, padding):
    """SentencePiece vocabularies were all tokenized whole, control text and all: Gemma's puts
    no space before a piece, so its messages are cut out and tokenized as text."""
    target = gemma_engine.target
    end_of_turn = target.tokenize("<end_of_turn>", add_special=False, parse_special=True)
    assert len(end_of_turn) == 1 and not target.spaces_pieces
    plain = gemma_chat_tokens(gemma_engine, "Explain this.")
    message = f"Explain this: {GEMMA_TEXT}"
    odd = gemma_chat_tokens(gemma_engine, padding + message + padding)
    assert odd.count(end_of_turn[0]) == plain.count(end_of_turn[0]) == 1
    as_text = target.tokenize(message, add_special=False, parse_special=False)
    assert any(odd[i : i + len(as_text)] == as_text for i in range(len(odd)))
    assert GEMMA_TEXT in target.detokenize(odd)


def test_a_gemma_message_without_control_text_is_tokenized_as_its_whole_prompt(gemma_engine):
    from edgespec import chat

    target = gemma_engine.target
    messages = chat.messages_for("Write a haiku about caches.", "Be brief.")
    text = chat.render(GEMMA3_TEMPLATE, messages, bos_token="<bos>")
    whole = target.tokenize(text, add_special=False, parse_special=True)
    assert whole[0] == target.bos and whole.count(target.bos) == 1  # the template's, no other
    assert gemma_chat_tokens(gemma_engine, "Write a haiku about caches.") == whole


# Vocabularies that tokenize a chat's pieces differently, each with two of its control tokens
# and whether it puts a space before the text a tokenization starts with.
VOCABULARIES = {
    "smollm2 (byte-level BPE)": ("<|im_start|>", "<|im_end|>", False),
    "gemma (SentencePiece)": ("<start_of_turn>", "<end_of_turn>", False),
    "llama-style (SentencePiece, a space first)": ("<|user|>", "<|end|>", True),
    "gemma told to put a space first": ("<start_of_turn>", "<end_of_turn>", True),
}


@pytest.fixture(scope="module", params=list(VOCABULARIES))
def vocabulary(request, tmp_path_factory, smol_path, gemma_path):
    """A vocabulary-only model, with the control tokens that open and close a turn in it and
    whether it puts a space first."""
    from edgespec.backend import Model

    name = request.param
    made = tmp_path_factory.mktemp("vocab")
    if name.startswith("smollm2"):
        path = smol_path
    elif name == "gemma (SentencePiece)":
        path = gemma_path
    elif name.startswith("llama-style"):
        words = ["▁Explain", "▁this", "▁turn", "▁ends", "▁with", "user", "assistant", "▁hello"]
        path = write_spm_vocab(smol_path, made / "llama-style.gguf", ["<|user|>", "<|end|>"], words)
    else:  # its "\n" is a user-defined token: llama.cpp puts a space after it too
        key = "tokenizer.ggml.add_space_prefix"
        path = with_bool_metadata(gemma_path, made / "gemma-spacing.gguf", key, True)
    return Model(path, vocab_only=True), *VOCABULARIES[name]


TURN_TEXT = "Explain this: a turn ends with {}, hello."


def test_a_vocabulary_that_puts_a_space_before_each_piece_is_told_apart(vocabulary):
    """As Llama 2's and Mistral's do; SentencePiece's were all taken to (Gemma's does not)."""
    model, _, _, spaces_first = vocabulary
    assert model.spaces_pieces is spaces_first


def turn_pieces(open_: str, close: str, typed: str, after: str = "\n") -> list[tuple[str, bool]]:
    return [(f"{open_}user{after}", False), (typed, True), (f"{close}\n{open_}assistant\n", False)]


@pytest.mark.parametrize("after", ["\n", ":"], ids=["after-a-newline", "after-a-colon"])
def test_typed_text_tokenizes_in_pieces_as_in_the_whole_text(vocabulary, after):
    """The pieces' edges included: where a vocabulary puts a space before a text (after a
    special token, and Gemma's "\n" is one) and where it does not (after other text)."""
    model, open_, close, _ = vocabulary
    pieces = turn_pieces(open_, close, TURN_TEXT.format("END"), after)
    whole = "".join(text for text, _ in pieces)
    expected = model.tokenize(whole, add_special=True, parse_special=True)
    assert model.tokenize_pieces(pieces, add_bos=model.add_bos) == expected


def test_control_text_in_a_typed_piece_is_text(vocabulary):
    model, open_, close, _ = vocabulary
    tokens = model.tokenize_pieces(
        turn_pieces(open_, close, TURN_TEXT.format(close)), add_bos=model.add_bos
    )
    assert tokens is not None
    (close_id,) = model.tokenize(close, add_special=False, parse_special=True)
    (open_id,) = model.tokenize(open_, add_special=False, parse_special=True)
    assert tokens.count(close_id) == 1 and tokens.count(open_id) == 2  # the template's
    # Read as text, as the same words without the control text would be.
    placeholder = model.tokenize_pieces(
        turn_pieces(open_, close, TURN_TEXT.format("END")), add_bos=model.add_bos
    )
    assert placeholder is not None
    assert model.detokenize(tokens) == model.detokenize(placeholder).replace("END", close)


@pytest.mark.parametrize(
    ("put", "typed", "as_put"),
    [
        ("{{ m.content }}", "say <s>", "say <s>"),
        ("{{ m.content | trim }}", " say <s>\n", "say <s>"),
    ],
    ids=["as-typed", "trimmed"],
)
def test_typed_pieces_are_found_where_the_template_puts_contents_as_they_are(put, typed, as_put):
    from edgespec.chat import messages_for, render, typed_pieces

    template = "{% for m in messages %}<s>{{ m.role }}: " + put + "</s>{% endfor %}"
    messages = messages_for(typed, "sys")
    text = render(template, messages)
    assert typed_pieces(lambda ms: render(template, ms), messages, text, [1]) == [
        ("<s>system: sys</s><s>user: ", False),
        (as_put, True),
        ("</s>", False),
    ]


def test_typed_pieces_are_not_found_where_the_template_edits_contents():
    from edgespec.chat import messages_for, render, typed_pieces

    edits = "{% for m in messages %}<s>{{ m.content | upper }}</s>{% endfor %}"
    messages = messages_for("say <s>", "sys")
    edited = render(edits, messages)
    assert typed_pieces(lambda ms: render(edits, ms), messages, edited, [1]) is None


def turns(n: int, words: int) -> list[Message]:
    return [
        Message(role, f"{role} {i}: " + "lorem ipsum " * words)
        for i in range(n)
        for role in ("user", "assistant")
    ]


def answer(conversation: Conversation, text: str, **options) -> str:
    return "".join(conversation.ask(text, mode="target", **options))


def test_overflow_leaves_the_oldest_turns_out_of_the_prompt_but_in_the_history(
    small_engine, tmp_path
):
    conversation = Conversation(small_engine, system="Answer in one word.")
    conversation.messages = turns(4, words=10)  # about 4 x 50 tokens: too many for 256 - 32
    reply = conversation.ask("Hi", mode="target", max_tokens=32)
    "".join(reply)
    assert reply.dropped >= 1
    seen = conversation.messages[conversation.in_context :]
    assert seen[0].role == "user" and seen[0].content.startswith(f"user {reply.dropped}:")
    assert [m.content for m in seen[-2:-1]] == ["Hi"] and seen[-1].role == "assistant"
    assert conversation.system == "Answer in one word."
    assert reply.stream.result.stats.n_prompt_tokens + 32 <= small_engine.n_ctx
    # Nothing is lost: the conversation, and what /save writes, keep every turn.
    assert conversation.messages[:8] == turns(4, words=10) and len(conversation.messages) == 10
    conversation.save(tmp_path / "chat.json")
    assert len(json.loads((tmp_path / "chat.json").read_text())["messages"]) == 10
    # The next question starts where this prompt started: no turn left out twice.
    assert answer(conversation, "Again", max_tokens=8) and conversation.in_context >= 2


def test_a_long_loaded_history_is_fitted_in_few_renderings_to_the_turns_that_fit(
    small_engine, monkeypatch
):
    """One rendering a turn left out made a /load of 1,000 turns a 4-minute wait."""
    conversation = Conversation(small_engine)
    conversation.messages = turns(1000, words=2)  # in_context 0, as after /load
    rendered = []
    render = conversation.prompt_tokens
    monkeypatch.setattr(conversation, "prompt_tokens", lambda m: rendered.append(m) or render(m))
    reply = conversation.ask("Hi", mode="target", max_tokens=8)
    assert len(rendered) <= 12  # log2(1,001 possible starts), and one more
    kept = conversation.messages[conversation.in_context :]
    # The most turns that fit: one more would not.
    assert len(render(kept)) + 8 <= small_engine.n_ctx
    assert (
        len(render(conversation.messages[conversation.in_context - 2 :])) + 8 > small_engine.n_ctx
    )
    assert reply.dropped == conversation.in_context // 2 and kept[0].role == "user"


def test_loading_more_than_the_context_holds_says_how_many_turns_the_model_will_not_see(
    small_engine, tmp_path
):
    """/show after such a /load counted every loaded message ("36136/256 tokens")."""
    saved_to = tmp_path / "long.json"
    long = Conversation(small_engine)
    long.messages = turns(100, words=2)
    long.save(saved_to)
    conversation = Conversation(small_engine)
    out_of_view = conversation.load(saved_to)
    assert len(conversation.messages) == 200  # all kept
    assert out_of_view == conversation.in_context // 2 > 0
    assert 0 < conversation.context_used() <= small_engine.n_ctx
    # The next question drops only what it needs room for beyond that.
    reply = conversation.ask("Hi", mode="target", max_tokens=8)
    assert "".join(reply) and reply.dropped < out_of_view


SYSTEMLESS = (  # as Gemma's: a system message is refused
    "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}"
    "{% endif %}{{ m.content }}\n{% endfor %}"
)


def test_a_system_message_the_template_refuses_fails_at_load_and_at_set(small_engine, tmp_path):
    """Loaded, it made every question fail, and nothing but another /load removed it."""
    conversation = Conversation(small_engine, template=SYSTEMLESS)
    answer(conversation, "Hi", max_tokens=4)
    before = list(conversation.messages)
    saved_to = tmp_path / "with-system.json"
    saved_to.write_text(json.dumps({"system": "Be brief.", "messages": []}))
    with pytest.raises(EdgespecError, match="no system role"):
        conversation.load(saved_to)
    with pytest.raises(EdgespecError, match="no system role"):
        conversation.set_system("Be brief.")
    assert conversation.system is None and conversation.messages == before
    assert answer(conversation, "Again", max_tokens=4)  # the chat goes on


def test_the_system_message_can_be_changed_and_removed(small_engine):
    conversation = Conversation(small_engine, system="Be brief.")
    conversation.set_system("Answer in French.")
    assert (
        conversation.prompt_tokens()
        == Conversation(small_engine, system="Answer in French.").prompt_tokens()
    )
    conversation.set_system(None)
    assert conversation.prompt_tokens() == Conversation(small_engine).prompt_tokens()


def test_a_max_tokens_beyond_the_context_keeps_the_history_in_the_prompt(small_engine):
    """Room for the answer is reserved up to half the context: `-n 3000` with a context of 256
    left out every earlier turn at every question (a chat that forgot the user's name)."""
    conversation = Conversation(small_engine)
    answer(conversation, "My name is Ada.", max_tokens=8)
    reply = conversation.ask("What is my name?", mode="target", max_tokens=10_000)
    "".join(reply)
    assert reply.dropped == 0 and conversation.in_context == 0
    assert reply.stream.result.stats.n_prompt_tokens > 20  # the first turn is in the prompt


def test_text_that_was_not_utf8_is_asked_and_saved(small_engine, tmp_path):
    """Bytes that are not UTF-8 (kept by Python as lone surrogates) become U+FFFD."""
    conversation = Conversation(small_engine, system="Be brief\ud800")  # as JSON may hold it
    assert answer(conversation, "caf\udce9 au lait", max_tokens=4)  # a Latin-1 byte piped in
    assert conversation.messages[0].content == "caf\ufffd au lait"
    assert conversation.system.startswith("Be brief\ufffd")
    conversation.save(tmp_path / "chat.json")  # a lone surrogate made saving fail


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{{ raise_exception('roles must alternate') }}", "failed: roles must alternate"),
        ("{{ 1/0 }}", "failed: ZeroDivisionError"),  # Python's errors, not only jinja's
        ("{{ messages + 1 }}", "failed: TypeError"),
        ("{% for m in messages %}", "does not parse"),
        ("{# nothing #}", "made an empty prompt"),
        ("You are a pirate. Say arr.", "leaves out the message"),  # answered in its place
    ],
)
def test_a_chat_template_that_fails_is_an_error_at_the_start(small_engine, template, reason):
    """Before, every question failed with it and the chat went on (and exited 0); a template
    failing with a Python error was a traceback, and one rendering nothing an empty prompt."""
    with pytest.raises(EdgespecError, match="the chat template " + reason):
        Conversation(small_engine, template=template)


@pytest.mark.parametrize(
    ("template", "rendered"),
    [
        # jinja's own tojson escapes for HTML: "a \u003cb\u003e \u0026 \u0027c\u0027"
        ("{{ messages[0].content | tojson }}", "\"a <b> & 'c' ünï\""),
        (
            "{{ messages[0] | tojson(indent=1) }}",
            '{\n "role": "user",\n "content": "a <b> & \'c\' ünï"\n}',
        ),
        ("{% generation %}{{ messages[0].role }}{% endgeneration %}", "user"),
    ],
    ids=["tojson", "tojson-indented", "generation-block"],
)
def test_templates_render_as_hugging_face_renders_them(template, rendered):
    """A GGUF's template was written for Hugging Face's renderer: its tojson filter (jinja's
    own escaped text for HTML) and its `{% generation %}` blocks (which did not parse here)."""
    from edgespec.chat import render

    assert render(template, [{"role": "user", "content": "a <b> & 'c' ünï"}]) == rendered


def test_a_message_too_long_for_the_context_is_an_error_and_changes_nothing(small_engine):
    conversation = Conversation(small_engine)
    conversation.messages = turns(1, words=2)
    before = list(conversation.messages)
    with pytest.raises(ContextOverflowError, match="--ctx-size"):
        conversation.ask("lorem ipsum " * 200, max_tokens=8)
    assert conversation.messages == before


def test_an_answer_cut_short_is_kept_as_interrupted(small_engine):
    conversation = Conversation(small_engine)
    pieces = iter(conversation.ask("Tell me a story.", mode="target", max_tokens=64))
    partial = next(pieces) + next(pieces)
    pieces.close()  # what Ctrl+C in the middle of the loop amounts to
    assert conversation.messages[-1] == Message("assistant", partial, interrupted=True)
    assert conversation.last_stats.finish_reason == "interrupted"
    assert answer(conversation, "Thanks!", max_tokens=8)  # and the chat goes on
    assert not conversation.messages[-1].interrupted


def test_save_and_load_round_trip(small_engine, tmp_path):
    conversation = Conversation(small_engine, system="Be brief.")
    answer(conversation, "Hi", max_tokens=8)
    path = tmp_path / "chat.json"
    conversation.save(path)
    loaded = Conversation(small_engine)
    loaded.load(path)
    assert loaded.system == "Be brief."
    assert loaded.messages == conversation.messages
    assert loaded.prompt_tokens() == conversation.prompt_tokens()
    assert [p.name for p in tmp_path.iterdir()] == ["chat.json"]  # no temporary file left


def test_saving_over_a_file_keeps_its_permissions_and_a_link_stays_a_link(small_engine, tmp_path):
    conversation = Conversation(small_engine)
    answer(conversation, "Hi", max_tokens=4)
    shared = tmp_path / "shared.json"
    shared.write_text("{}")
    shared.chmod(0o644)
    link = tmp_path / "latest.json"
    link.symlink_to(shared)
    conversation.save(link)
    assert link.is_symlink() and json.loads(shared.read_text())["messages"]
    assert shared.stat().st_mode & 0o777 == 0o644  # not the temporary file's 0o600
    fresh = tmp_path / "new.json"
    conversation.save(fresh)
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~current_umask()


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", '"messages" list'),
        ('{"messages": [{"role": "robot", "content": "beep"}]}', "role 'robot'"),
        ('{"messages": [{"role": "user", "content": 3}]}', "message 0"),
        ('{"system": 1, "messages": []}', '"system"'),
        (
            '{"messages": [{"role": "assistant", "content": "hi", "interrupted": "no"}]}',
            'a boolean "interrupted"',
        ),
    ],
)
def test_loading_a_bad_file_is_a_clear_error_and_keeps_the_conversation(
    small_engine, tmp_path, content, why
):
    conversation = Conversation(small_engine)
    conversation.messages = turns(1, words=1)
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(EdgespecError, match=f"{re.escape(str(path))} is not a saved conversation"):
        conversation.load(path)
    with pytest.raises(EdgespecError, match=re.escape(why)):
        conversation.load(path)
    assert conversation.messages == turns(1, words=1)


def test_a_missing_file_is_a_clear_error(small_engine, tmp_path):
    with pytest.raises(EdgespecError, match="cannot read"):
        Conversation(small_engine).load(tmp_path / "nowhere.json")


# ----- the draft between answers --------------------------------------------------------------
def chat_with_lines(engine: edgespec.Engine, lines: list[str], interactive: bool) -> list[tuple]:
    """Run the REPL on `lines`; for each line after the first answer, whether the draft was
    catching up when the line came, and whether it then held what the target held."""
    from edgespec.cli.chat_cmd import Repl
    from edgespec.config import Settings

    engine.forget_caches()
    repl = Repl(Conversation(engine), Settings(max_tokens=16), interactive)
    queue = iter(lines)
    seen = []

    def read_line(prompt: str) -> str:
        line = next(queue, None)
        if line is None:
            raise EOFError
        return line

    settle = repl.settle

    def settle_and_look() -> None:
        catching_up = repl.catching_up is not None
        settle()
        if engine._target_cache:
            seen.append((catching_up, engine._draft_cache == engine._target_cache))

    repl.read_line = read_line  # type: ignore[method-assign]
    repl.settle = settle_and_look  # type: ignore[method-assign]
    repl.run()
    return seen


def test_while_a_person_types_the_draft_catches_up_on_the_last_answer(q4_draft_engine):
    # Whether auto drafted during the answer (SmolLM2 with a copy of itself) does not matter.
    seen = chat_with_lines(q4_draft_engine, ["Hi", "What is 2+2?"], interactive=True)
    assert seen[0] == (True, True)


def test_piped_messages_leave_the_draft_to_catch_up_inside_the_answer(q4_draft_engine):
    """Nobody types between piped lines: the work would only move from the answer to before it."""
    seen = chat_with_lines(q4_draft_engine, ["Hi", "What is 2+2?"], interactive=False)
    assert seen and not any(catching_up for catching_up, _ in seen)


def test_ctrl_c_while_the_draft_catches_up_keeps_the_question_and_the_next_answer_waits(
    q4_draft_engine, monkeypatch
):
    """Ctrl+C cut a Thread.join short, after which the thread looked finished (Python 3.11): the
    next answer drafted while the catching up still decoded the draft, and llama.cpp aborted the
    process. The question typed before that Ctrl+C was dropped, too."""
    import threading

    from edgespec.cli import chat_cmd
    from edgespec.config import Settings

    busy = threading.Event()

    def slow_catch_up(engine: edgespec.Engine) -> None:  # the draft's catching up, drawn out
        busy.set()
        time.sleep(1.5)
        busy.clear()

    monkeypatch.setattr(chat_cmd, "catch_up_quietly", slow_catch_up)
    q4_draft_engine.forget_caches()
    conversation = Conversation(q4_draft_engine)
    repl = chat_cmd.Repl(conversation, Settings(max_tokens=8, mode="chain"), interactive=True)
    repl.answer("Hi")
    assert busy.wait(5)  # catching up while the person types
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    # As in a terminal (a test run started in the background ignores SIGINT).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        repl.answer("What is 2+2?")  # Ctrl+C while it waits for the draft
    finally:
        signal.signal(signal.SIGINT, previous)
    assert conversation.messages[-2:] == [
        Message("user", "What is 2+2?"),
        Message("assistant", "", interrupted=True),
    ]
    repl.settle()
    assert not busy.is_set()  # waited for, this time too


def test_a_chat_refuses_files_it_cannot_load_or_must_not_save_and_goes_on(smol_path, tmp_path):
    """Found by fuzzing: /load of JSON nested thousands deep ended the chat with a traceback
    (the conversation unsaved); /load of a FIFO without a writer waited forever; /save over
    the model or the template in use replaced it with the conversation's JSON."""
    import shutil

    model = tmp_path / "model.gguf"
    shutil.copy(smol_path, model)
    template = tmp_path / "chat.j2"
    template.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    deep = tmp_path / "deep.json"
    # Python 3.13 reads 3,000 deep; none of 3.10-3.13 reads 10,000.
    deep.write_text('{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    kept = tmp_path / "kept.json"
    lines = f"Hi\n/load {deep}\n/load {fifo}\n/save {model}\n/save {template}\n/save {kept}\n"
    done = piped_chat(model, tmp_path, lines, "--chat-template", str(template))
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {deep} is not a saved conversation (nested too deeply)",
        f"error: cannot read {fifo}: not a regular file",
        f"error: cannot save {model}: this chat reads it; name another file",
        f"error: cannot save {template}: this chat reads it; name another file",
        "error: 4 of the piped messages and commands failed (see above)",
    ]
    assert model.stat().st_size == smol_path.stat().st_size
    assert template.read_text().startswith("{% for m in messages %}")
    assert saved(kept)[0]["content"] == "Hi"  # the chat went on


@pytest.mark.parametrize(
    "template, message",
    [
        ("", "is empty"),  # taken as none given: the model's own was used
        ("{{ 'A' * 100000000 }}", "a repetition of 100,000,000 items is too long"),  # 11 GB
        ("{% for i in range(100000) %}{{ 'A' * 1000 }}{% endfor %}", "a text of over"),
    ],
)
def test_a_chat_template_file_that_is_empty_or_writes_without_bound_is_refused(
    smol_path, tmp_path, template, message
):
    path = tmp_path / "t.j2"
    path.write_text(template)
    done = piped_chat(smol_path, tmp_path, "Hi\n", "--chat-template", str(path))
    assert done.returncode == 1 and message in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr


def test_show_counts_the_context_after_a_load_beyond_it_and_with_a_template_that_needs_a_question(
    small_engine, tmp_path
):
    """/show failed ("the chat template made an empty prompt") after a /load whose only turn
    lay beyond the context, and after every answer with a template that renders only with a
    question to answer (answers that had streamed were counted as failures)."""
    one_long_turn = tmp_path / "long.json"
    one_long_turn.write_text(json.dumps({"messages": [
        {"role": "user", "content": "word " * 2000, "interrupted": False}]}))  # fmt: skip
    conversation = Conversation(small_engine)
    conversation.load(one_long_turn)
    assert conversation.context_used() == 0
    needs_a_question = (
        "{% if not add_generation_prompt %}{{ raise_exception('no question') }}{% endif %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
    )
    conversation = Conversation(small_engine, template=needs_a_question)
    assert "".join(conversation.ask("Hi", mode="target", max_tokens=4))
    assert 0 < conversation.context_used() <= small_engine.n_ctx


def test_a_prompt_too_long_by_its_size_alone_is_refused_before_tokenizing(
    small_engine, monkeypatch
):
    """llama.cpp tokenizes special tokens' texts in time quadratic in their number: 2 MB of
    them took a minute to be told they do not fit. Counted, it is counted as plain text."""
    text = "<|im_start|>x<|im_end|>\n" * 20_000
    target, parsed = small_engine.target, []
    tokenize = target.tokenize

    def recorded(text, *, add_special, parse_special=True):
        parsed.append(parse_special and len(text) > 100_000)
        return tokenize(text, add_special=add_special, parse_special=parse_special)

    monkeypatch.setattr(target, "tokenize", recorded)
    with pytest.raises(ContextOverflowError, match=r"the prompt has [\d,]+ tokens but"):
        small_engine.prompt_tokens(text, chat_mode=False)
    with pytest.raises(ContextOverflowError, match=r"the prompt has [\d,]+ tokens but"):
        Conversation(small_engine).ask(text)
    assert parsed and not any(parsed)
    monkeypatch.setattr(target, "longest_token_bytes", 1)  # a bound past what it was trained for
    with pytest.raises(ContextOverflowError, match=r"the prompt has at least [\d,]+ tokens"):
        small_engine.prompt_tokens(text, chat_mode=False)


def test_a_system_message_that_leaves_no_room_for_a_question_is_refused_where_it_is_set(
    small_engine, tmp_path
):
    """It was taken ("Set the system message."), and every question after it was told that
    the question was too long; loaded from a file or given with --system, the same."""
    conversation = Conversation(small_engine, system="Be brief.")
    too_long = "word " * 300  # the context holds 256 tokens
    refused = "the system message leaves no room for a question in the context (256 tokens)"
    with pytest.raises(ContextOverflowError, match=re.escape(refused)):
        conversation.set_system(too_long)
    assert conversation.system == "Be brief."
    saved_to = tmp_path / "big-system.json"
    saved_to.write_text(json.dumps({"system": too_long, "messages": []}))
    with pytest.raises(ContextOverflowError, match=re.escape(refused)):
        conversation.load(saved_to)
    assert conversation.system == "Be brief."
    with pytest.raises(ContextOverflowError, match=re.escape(refused)):  # --system
        Conversation(small_engine, system=too_long)


# ----- bounds, and what save and load keep -----------------------------------------------------
def words_filling(conversation: Conversation, size: int, before: list[Message]) -> str:
    """A question after `before` whose prompt is exactly `size` tokens (" a" is one token)."""
    base = len(conversation.prompt_tokens([*before, Message("user", "a")]))
    text = "a" + " a" * (size - base)
    assert len(conversation.prompt_tokens([*before, Message("user", text)])) == size
    return text


def test_a_message_of_only_spaces_is_refused_as_empty(small_engine):
    conversation = Conversation(small_engine)
    with pytest.raises(BadSettingError, match="the message is empty"):
        conversation.ask(" \n\t ")
    assert conversation.messages == []


def test_a_question_whose_prompt_fills_the_context_is_refused_naming_the_flag(small_engine):
    """At exactly the context's size no token is left for an answer: refused by the chat, in
    the chat's words, not by the engine's check ("a larger n_ctx")."""
    conversation = Conversation(small_engine)
    question = words_filling(conversation, small_engine.n_ctx, [])
    with pytest.raises(ContextOverflowError, match="use --ctx-size 1024 or a shorter message"):
        conversation.ask(question, max_tokens=8)
    assert conversation.messages == []


def test_an_overflow_names_the_context_that_holds_the_text_up_to_what_the_model_was_trained_for(
    small_engine,
):
    trained, name = small_engine.target.n_ctx_train, small_engine.target.path.name
    assert small_engine.room_for(300) == "use --ctx-size 1024 or a shorter"  # and 512 to answer
    assert small_engine.room_for(trained - 100) == (
        f"use --ctx-size {trained} (what {name} was trained for) or a shorter"
    )
    assert small_engine.room_for(trained) == f"{name} holds at most {trained} tokens: use a shorter"


def test_a_prompt_and_the_room_for_its_answer_may_fill_the_context_exactly(small_engine):
    """A turn that fits to the last token stays in the prompt."""
    conversation = Conversation(small_engine)
    conversation.messages = turns(1, words=2)
    question = words_filling(conversation, 150, conversation.messages)
    reply = conversation.ask(question, mode="target", max_tokens=small_engine.n_ctx - 150)
    reply.close()
    assert reply.dropped == 0 and conversation.in_context == 0


def test_a_max_tokens_beyond_the_context_leaves_half_the_context_for_the_answer(small_engine):
    conversation = Conversation(small_engine)
    conversation.messages = turns(4, words=10)  # about 200 tokens
    reply = conversation.ask("Hi", mode="target", max_tokens=10_000)
    prompt = conversation.prompt_tokens(conversation.messages[conversation.in_context :])
    reply.close()
    assert reply.dropped >= 1
    assert len(prompt) + small_engine.n_ctx // 2 <= small_engine.n_ctx


def test_turns_left_out_of_one_prompt_do_not_come_back_in_a_later_one(small_engine):
    """A smaller max_tokens later leaves room for more, but the prompt begins where the last
    one did: the caches hold that start, and the model has already answered without them."""
    conversation = Conversation(small_engine)
    conversation.messages = turns(4, words=10)
    conversation.ask("Hi", mode="target", max_tokens=128).close()
    left_out = conversation.in_context
    assert left_out > 0
    conversation.ask("Again", mode="target", max_tokens=4).close()
    assert conversation.in_context >= left_out


def test_a_system_message_may_leave_a_question_one_token_of_room_but_not_none(small_engine):
    n_ctx = small_engine.n_ctx
    probe = Conversation(small_engine, system="a")
    base = len(probe.prompt_tokens([Message("user", "Hello")]))
    Conversation(small_engine, system="a" + " a" * (n_ctx - 1 - base))  # n_ctx - 1 tokens: taken
    with pytest.raises(ContextOverflowError, match="leaves no room for a question"):
        Conversation(small_engine, system="a" + " a" * (n_ctx - base))


@pytest.mark.parametrize("fixed_text", ["'x' * 100000", "'word ' * 300"])
@pytest.mark.parametrize("system", [None, "Be brief."])
def test_a_chat_template_too_long_for_the_context_is_an_error_at_the_start_naming_it(
    small_engine, fixed_text, system
):
    """Not at every question after it, blaming the question, nor at the start blaming a
    three-token system message. Too long by its characters, or only once tokenized."""
    huge = f"{{{{ {fixed_text} }}}}{{% for m in messages %}}{{{{ m.content }}}}{{% endfor %}}"
    with pytest.raises(ContextOverflowError, match="the chat template's own text leaves no room"):
        Conversation(small_engine, system, template=huge)


def test_the_context_used_ends_where_the_next_questions_turn_begins(small_engine):
    """It counts the answer's turn and its end, not the start of an answer that the next
    prompt does not hold (/show overcounted by the generation prompt)."""
    conversation = Conversation(small_engine)
    conversation.messages = [Message("user", "Hi"), Message("assistant", "Hello there.")]
    following = conversation.prompt_tokens([*conversation.messages, Message("user", "Next")])
    used = conversation.context_used()
    assert small_engine.target.detokenize(following[used:]).startswith("user\nNext")


def test_saving_over_a_private_file_keeps_it_private(small_engine, tmp_path):
    """The temporary file is made with the umask's permissions (0o644 under 022): a chat
    saved over a 0o600 file must not become readable by others."""
    conversation = Conversation(small_engine)
    conversation.messages = turns(1, words=1)
    private = tmp_path / "private.json"
    private.write_text("{}")
    private.chmod(0o600)
    conversation.save(private)
    assert private.stat().st_mode & 0o777 == 0o600
    assert len(json.loads(private.read_text())["messages"]) == 2


def test_a_saved_conversation_keeps_its_characters_readable_and_its_interrupted_answers(
    small_engine, tmp_path
):
    conversation = Conversation(small_engine, system="Réponds en français.")
    conversation.messages = [
        Message("user", "Un café ☕ ?"),
        Message("assistant", "Bien sûr", interrupted=True),
    ]
    path = tmp_path / "chat.json"
    conversation.save(path)
    assert "Un café ☕ ?" in path.read_text("utf-8")  # not "caf\u00e9"
    loaded = Conversation(small_engine)
    loaded.load(path)
    assert loaded.messages == conversation.messages and loaded.messages[-1].interrupted


def test_loading_a_conversation_forgets_the_statistics_of_the_last_answer(small_engine, tmp_path):
    """They were the answer's of the conversation replaced, not of the one loaded."""
    conversation = Conversation(small_engine)
    path = tmp_path / "chat.json"
    conversation.save(path)
    answer(conversation, "Hi", max_tokens=2)
    assert conversation.last_stats is not None
    conversation.load(path)
    assert conversation.last_stats is None


def test_a_system_message_the_template_refuses_only_with_the_history_is_refused_at_set(
    small_engine,
):
    """Checked with the turns the next prompt holds, not only with a first question: taken,
    it made every later question fail."""
    template = (
        "{% if messages[0].role == 'system' and messages | length > 2 %}"
        "{{ raise_exception('a system message only begins a chat') }}{% endif %}"
        "{% for m in messages %}{{ m.content }}\n{% endfor %}"
    )
    conversation = Conversation(small_engine, template=template)
    conversation.messages = turns(1, words=1)
    with pytest.raises(EdgespecError, match="a system message only begins a chat"):
        conversation.set_system("Be brief.")
    assert conversation.system is None


def test_ctrl_c_pressed_twice_in_an_answer_interrupts_it_once_and_settles_its_caches(
    self_draft_engine, monkeypatch
):
    """The first Ctrl+C came while the answer's text was written, the second while the caches
    were settled: that one was raised where Python dropped the answer's generator, and printed
    "Exception ignored in: <generator object Reply.__iter__ …>" with its traceback."""
    from edgespec.cli import chat_cmd
    from edgespec.config import Settings

    engine = self_draft_engine

    class PressedWhileWriting:  # the first Ctrl+C, at the third piece of text
        def __init__(self) -> None:
            self.pieces: list[str] = []
            self.pressed = False

        def write(self, text: str) -> None:
            if len(self.pieces) == 2 and not self.pressed:
                self.pressed = True
                raise KeyboardInterrupt
            self.pieces.append(text)

        def flush(self) -> None:
            pass

    dropped: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    trimmed = ctrl_c_while_trimming(engine, monkeypatch)  # the second Ctrl+C
    monkeypatch.setattr(sys, "stdout", PressedWhileWriting())
    conversation = Conversation(engine)
    repl = chat_cmd.Repl(conversation, Settings(max_tokens=40, mode="tree"), interactive=True)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        repl.answer("Tell me about the sea.")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert trimmed == [True] and not dropped
    assert conversation.messages[-1].role == "assistant"
    assert conversation.messages[-1].interrupted
