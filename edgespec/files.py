"""Files written so that whoever reads them sees the old one or the whole new one."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import BadSettingError


def user_home() -> Path:
    """$HOME, or the password database's home when HOME is empty: Path.home() makes an empty HOME
    "/", which put the models under /.cache."""
    if home := os.environ.get("HOME"):
        return Path(home)
    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        raise BadSettingError("HOME is empty and the user has no home: set EDGESPEC_HOME") from None


def user_path(name: str | os.PathLike[str], what: str) -> Path:
    """`name` as a path, its `~` expanded: one that is empty, holds a NUL or names an unknown
    user is an error here, not "." (Path('')), a ValueError from the system or a RuntimeError
    from expanduser later."""
    text = os.fspath(name)
    if not text:
        raise BadSettingError(f"{what} is empty")
    if "\0" in text:
        raise BadSettingError(f"{what} {text!r} holds a NUL character")
    try:
        return Path(text).expanduser()
    except RuntimeError:  # ~someone with no such user
        user = text.split(os.sep, 1)[0][1:]
        message = f"{what} {text} begins with ~{user}, but there is no user {user!r}"
        raise BadSettingError(message) from None


# Names of a process's open files: /dev/stdout, /dev/fd/1, /proc/self/fd/1 and kin.
STREAM_NAME = re.compile(r"/dev/(std(in|out|err)|fd/\d+)|/proc/(self|thread-self|\d+)/fd/\d+")


def regular_destination(path: Path) -> Path:
    """The file to write for `path`: a link is written through, to the file it names; a
    directory, device or pipe is refused (moved onto, /dev/full or a FIFO became a file), and
    so are a stream's name and the file this process's output goes to: `--json /dev/stdout >>
    log` (or `--json log`) replaced the log with the finished file, and a pipe cannot be written
    by name."""
    if STREAM_NAME.fullmatch(os.path.abspath(path)):
        raise BadSettingError(f"{path} is a stream, not a file; name a file to write")
    if path.is_symlink():
        try:
            path = path.resolve(strict=True)
        except FileNotFoundError:  # a link to a file still to be made
            path = path.resolve()
        except (RuntimeError, OSError):  # a loop of links (RuntimeError before Python 3.13,
            # whose lenient resolve() leaves a loop's path as it is)
            raise BadSettingError(f"{path} is a link that leads back to itself") from None
    if path.is_file() and _is_own_output(path):
        raise BadSettingError(
            f"{path} is where this program's output goes, and replacing it would lose that "
            "output; name another file"
        )
    if path.is_dir():
        raise BadSettingError(f"{path} is a directory; name the file to write")
    if path.exists() and not path.is_file():
        raise BadSettingError(f"{path} is not a regular file; name a file to write")
    return path


def _is_own_output(path: Path) -> bool:
    """Whether `path` is the file this process's stdout or stderr writes to."""
    try:
        target = path.stat()
    except OSError:  # nothing there yet
        return False
    for fd in (1, 2):
        try:
            stream = os.fstat(fd)
        except OSError:  # closed
            continue
        if (stream.st_dev, stream.st_ino) == (target.st_dev, target.st_ino):
            return True
    return False


@contextlib.contextmanager
def written_into_place(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` (regular_destination) for the block to write, moved onto
    it when the block ends without an error and removed otherwise. It is this process's own:
    two processes making the same file on first use (scripts started together) never write into
    one file, nor remove the other's. What a writer killed outright left of it goes first."""
    path = regular_destination(path)
    remove_leftovers(path.parent, temporaries_of(path))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        tmp.replace(path)
    finally:
        # Where it cannot be removed (a read-only disk: it was never made), the error that
        # ended the block says more than this one would.
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def temporaries_of(path: Path) -> str:
    """The names of `written_into_place`'s temporary files for `path`, for `remove_leftovers`."""
    return rf"\.{re.escape(path.name)}\.(\d+)\.tmp"


def remove_leftovers(folder: Path, pattern: str) -> None:
    """Remove the files and folders in `folder` whose whole name matches `pattern`, a regular
    expression whose group 1 is the id of the process that made them, where that process is
    gone. A writer killed outright (SIGKILL, the OOM killer, Android ending Termux) cleans up
    nothing, and its temporary files, hidden and as large as a model, would stay for good."""
    for entry in leftovers(folder, pattern):
        with contextlib.suppress(OSError):
            if not _untouched_for(entry, LEFTOVER_AGE_S):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def leftovers(folder: Path, pattern: str) -> list[Path]:
    """The files and folders of `remove_leftovers`'s `pattern` in `folder` whose process is gone
    (or, see LEFTOVER_AGE_S, runs where this one cannot see it)."""
    name = re.compile(pattern)
    try:  # no such folder, or one this process cannot list: none
        entries = list(folder.iterdir())
    except OSError:
        return []
    return [
        entry
        for entry in entries
        if (match := name.fullmatch(entry.name)) and not _running(int(match[1]))
    ]


def size_of(entry: Path) -> int:
    """Bytes a file, or a folder's files, take (0 for what cannot be read)."""
    paths = entry.rglob("*") if entry.is_dir() and not entry.is_symlink() else [entry]
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += path.lstat().st_size
    return total


# A process id says nothing of a writer in another PID namespace (a container sharing the
# folder) or on another host (NFS): it looks dead. A writer alive writes, though: what nobody
# wrote for this long is left over.
LEFTOVER_AGE_S = 600.0


def _untouched_for(entry: Path, seconds: float) -> bool:
    """Whether nothing was written to `entry` (a file, or a folder and the files in it) for
    `seconds`."""
    paths = [entry, *entry.iterdir()] if entry.is_dir() and not entry.is_symlink() else [entry]
    newest = max(p.lstat().st_mtime for p in paths)
    return time.time() - newest > seconds


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): it is running
        return True
    return True


@contextlib.contextmanager
def exclusive(lock: Path, on_wait: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Holds `lock` (a file, made if missing) against every other process asking for it, calling
    `on_wait` first if one holds it; the kernel lets go when the holder exits, however it ends.
    Where no lock file can be made (a read-only folder), holds nothing."""
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                on_wait()
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)
