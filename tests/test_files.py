"""Files written into place: a reader sees the old file or the whole new one."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgespec import catalogue
from edgespec.config import config_dir
from edgespec.errors import BadSettingError
from edgespec.files import (
    LEFTOVER_AGE_S,
    remove_leftovers,
    temporaries_of,
    user_home,
    user_path,
    written_into_place,
)


def test_the_file_appears_whole_once_the_block_ends(tmp_path):
    path = tmp_path / "record.json"
    path.write_text("old")
    with written_into_place(path) as tmp:
        tmp.write_text("new")
        assert path.read_text() == "old" and tmp.parent == path.parent and tmp != path
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_block_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "record.json"
    path.write_text("old")
    with pytest.raises(OSError, match="disk full"), written_into_place(path) as tmp:
        tmp.write_text("half")
        raise OSError("disk full")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_folder_below_a_file_raises_what_the_write_met_not_the_cleanup(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(NotADirectoryError), written_into_place(tmp_path / "a-file" / "x") as tmp:
        tmp.write_text("new")


def aged(path, seconds: float = LEFTOVER_AGE_S + 60):
    """`path` as if nothing had written to it for `seconds`."""
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_what_a_writer_killed_outright_left_goes_but_a_running_writers_file_stays(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # its process id is free now
    path = tmp_path / "draft.q4_0.gguf"
    left = tmp_path / f".draft.q4_0.gguf.{dead.pid}.tmp"
    aged(left.write_bytes(b"half a model") and left)
    busy = tmp_path / f".draft.q4_0.gguf.{os.getppid()}.tmp"  # another process still writing
    aged(busy.write_bytes(b"a model in the making") and busy)
    # A writer whose id means nothing here (another container's): it writes, so it lives.
    elsewhere = tmp_path / f".draft.q4_0.gguf.{dead.pid + 100_000}.tmp"
    elsewhere.write_bytes(b"written a moment ago")
    with written_into_place(path) as tmp:
        tmp.write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [busy.name, elsewhere.name, path.name]
    )


def test_a_link_is_written_through_and_a_pipe_is_never_replaced(tmp_path):
    real, link, fifo = tmp_path / "real.json", tmp_path / "link.json", tmp_path / "fifo"
    link.symlink_to(real)
    with written_into_place(link) as tmp:
        tmp.write_text("new")
    assert link.is_symlink() and real.read_text() == "new"
    os.mkfifo(fifo)
    with pytest.raises(BadSettingError, match="is not a regular file"), written_into_place(fifo):
        pass
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_streams_name_is_refused_so_that_the_file_it_is_redirected_to_survives(tmp_path):
    """`bench --json /dev/stdout >> run.log` replaced run.log (the link leads to it) with the
    report: the log's earlier lines were lost."""
    log = tmp_path / "run.log"
    log.write_text("yesterday's results\n")
    script = (
        "import sys; from pathlib import Path; from edgespec.files import written_into_place\n"
        "try:\n"
        "    with written_into_place(Path(sys.argv[1])) as tmp: tmp.write_text('report')\n"
        "except Exception as e: raise SystemExit(str(e))\n"
    )
    refusals = {
        "/dev/stdout": "/dev/stdout is a stream, not a file; name a file to write",
        str(log): f"{log} is where this program's output goes, and replacing it would lose "
        "that output; name another file",
    }
    for name, refusal in refusals.items():
        with log.open("a") as out:
            done = subprocess.run([sys.executable, "-c", script, name], stdout=out,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert done.stderr.strip() == refusal
        assert log.read_text() == "yesterday's results\n"


def test_the_file_this_programs_errors_go_to_is_not_replaced_either(tmp_path):
    """`--json run.log 2>> run.log`: stderr, not only stdout, may be the file named."""
    log = tmp_path / "run.log"
    log.write_text("yesterday's errors\n")
    script = (
        "import sys; from pathlib import Path; from edgespec.files import written_into_place\n"
        "with written_into_place(Path(sys.argv[1])) as tmp: tmp.write_text('report')\n"
    )
    with log.open("a") as err:
        done = subprocess.run([sys.executable, "-c", script, str(log)], stderr=err)
    assert done.returncode != 0
    assert log.read_text().startswith("yesterday's errors\n")
    assert "is where this program's output goes" in log.read_text()


@pytest.mark.parametrize(
    "name",
    [
        "/dev/stderr",
        "/dev/fd/1",
        "/proc/self/fd/2",
        "/proc/1/fd/0",
        "/proc/thread-self/fd/1",
    ],
)
def test_every_name_of_an_open_file_is_a_stream(name):
    with (
        pytest.raises(BadSettingError, match="is a stream, not a file"),
        written_into_place(Path(name)),
    ):
        pass


def test_a_stream_named_relative_to_the_working_folder_is_a_stream(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = Path(os.path.relpath("/dev/stdout"))  # ../../dev/stdout
    with pytest.raises(BadSettingError, match="is a stream, not a file"), written_into_place(name):
        pass


def test_a_loop_of_links_is_a_clear_error(tmp_path):
    (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
    refused = pytest.raises(BadSettingError, match=r"a\.json is a link that leads back to itself")
    with refused, written_into_place(tmp_path / "a.json"):
        pass


def test_an_empty_home_means_the_users_own_not_the_root_folder(monkeypatch):
    """Path.home() makes HOME="" the root folder: the models went to /.cache."""
    own = Path(pwd.getpwuid(os.getuid()).pw_dir)
    monkeypatch.setenv("HOME", "")
    monkeypatch.delenv("EDGESPEC_HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert user_home() == own
    assert catalogue.home() == own / ".cache" / "edgespec"
    assert config_dir() == own / ".config" / "edgespec"
    monkeypatch.setenv("HOME", "/somewhere")
    assert catalogue.home() == Path("/somewhere/.cache/edgespec")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the file is empty"),  # Path('') is "."
        ("a\0b", "the file 'a\\x00b' holds a NUL character"),  # the system's ValueError
        ("~edgespec-no-such-user/x", "the file ~edgespec-no-such-user/x begins with "
         "~edgespec-no-such-user, but there is no user 'edgespec-no-such-user'"),  # RuntimeError
    ],
)  # fmt: skip
def test_a_path_that_cannot_be_one_is_a_clear_error(text, message):
    with pytest.raises(BadSettingError) as caught:
        user_path(text, "the file")
    assert str(caught.value) == message


def test_a_path_is_taken_with_its_tilde_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert user_path("~/chat.json", "the file") == tmp_path / "chat.json"


def test_two_writers_of_one_file_never_write_into_one_temporary_file(tmp_path):
    """Two processes making the same file on first use (scripts started together): each writes
    its own temporary file, so neither's is overwritten by the other's or moved away under it."""
    path = tmp_path / "draft.q4_0.gguf"
    script = (
        "import sys; from pathlib import Path; from edgespec.files import written_into_place\n"
        "with written_into_place(Path(sys.argv[1])) as tmp:\n"
        "    tmp.write_text('first')\n"
        "    print('written', flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    first = subprocess.Popen([sys.executable, "-c", script, str(path)], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert first.stdout is not None and first.stdin is not None
    assert first.stdout.readline() == "written\n"
    with written_into_place(path) as tmp:  # the second, while the first is inside its block
        tmp.write_text("second")
    assert path.read_text() == "second"
    first.stdin.write("\n")
    first.stdin.close()
    assert first.wait(timeout=60) == 0
    assert path.read_text() == "first"  # the last to finish wins, whole
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_writer_killed_outright_leaves_nothing_even_where_the_name_holds_regex_characters(
    tmp_path,
):
    """Only whole temporary names of this file count: "+" and "()" are literal characters, and
    a user's backup that merely begins like a temporary file is no leftover."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    path = tmp_path / "c++ (q4).gguf"
    left = tmp_path / f".{path.name}.{dead.pid}.tmp"
    backup = tmp_path / f".{path.name}.{dead.pid}.tmp.bak"
    for file in (left, backup):
        aged(file.write_bytes(b"half a model") and file)
    remove_leftovers(tmp_path, temporaries_of(path))
    assert [p.name for p in tmp_path.iterdir()] == [backup.name]


DOWNLOADS = r"\.download-(\d+)-.*"  # as the catalogue names its folders


def test_a_left_folder_that_a_file_inside_was_written_to_lately_stays(tmp_path):
    """A folder's time changes only when files come and go in it: a writer in another
    container, whose process id means nothing here, still writing into its file, keeps it."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    folder = tmp_path / f".download-{dead.pid + 100_000}-x1y2"
    folder.mkdir()
    (folder / "llm-1.0-py3-none-any.whl").write_bytes(b"downloading")  # written just now
    aged(folder)
    remove_leftovers(tmp_path, DOWNLOADS)
    assert (folder / "llm-1.0-py3-none-any.whl").read_bytes() == b"downloading"


def test_a_left_link_to_a_folder_goes_and_the_folder_it_names_stays(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    elsewhere = tmp_path / "models"
    elsewhere.mkdir()
    (elsewhere / "model.gguf").write_bytes(b"GGUF")
    link = tmp_path / f".download-{dead.pid}-x1y2"
    link.symlink_to(elsewhere, target_is_directory=True)
    then = time.time() - LEFTOVER_AGE_S - 60
    os.utime(link, (then, then), follow_symlinks=False)
    remove_leftovers(tmp_path, DOWNLOADS)
    assert not link.is_symlink() and (elsewhere / "model.gguf").read_bytes() == b"GGUF"


def test_a_writer_of_another_user_counts_as_running(tmp_path, monkeypatch):
    """Signalling another user's process is refused (EPERM): it is there, so its temporary
    file, however old, is not removed."""

    def not_permitted(pid: int, signal: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    path = tmp_path / "draft.q4_0.gguf"
    theirs = tmp_path / f".{path.name}.{os.getpid() + 1}.tmp"
    aged(theirs.write_bytes(b"a model in the making") and theirs)
    monkeypatch.setattr(os, "kill", not_permitted)
    remove_leftovers(tmp_path, temporaries_of(path))
    assert theirs.exists()
