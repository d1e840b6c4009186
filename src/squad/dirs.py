"""Where squad keeps things on disk (via platformdirs), and the checks that a path squad will
write is writable before any work starts (field case F14).

- cache: built engines and pulled models (``~/.cache/squad`` on Linux); override with
  ``SQUAD_CACHE_DIR``.
- state: engine logs (``logs/``), traces (``traces/``), pid files (``engines/``) and the
  record of a detached engine (``engine.json``) (``~/.local/state/squad``); override with
  ``SQUAD_STATE_DIR``.

Logs and state can hold keys and prompts, so they are the owner's only: every folder squad makes for them is
0700 (:func:`private_dir`; a folder of squad's own that exists is set to 0700), every file 0600
(:func:`open_private`); the cache's root is made 0700 too.

:func:`check_output_file` and :func:`check_state_dirs` probe by creating a file (and
removing it again), so they give the same answer as the real write, also for root (who
ignores permission bits) and on read-only or virtual file systems.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Any

import platformdirs

from squad.errors import UserError

__all__ = ["cache_dir", "state_dir", "check_output_file", "check_state_dirs", "ENGINE_STATE", "private_dir",
           "open_private", "PRIVATE_DIR", "PRIVATE_FILE"]

PRIVATE_DIR = 0o700
"""The mode of the folders squad keeps logs and state in."""
PRIVATE_FILE = 0o600
"""The mode of squad's log and state files."""

ENGINE_STATE = ("logs", "engines")
"""State subdirectories a launched engine writes: its log (engine/launcher.py) and its pid
file (engine/process.py)."""


def cache_dir() -> Path:
    """Directory for built engines (``engine/``) and models (``models/``); created on demand.
    Raises :class:`UserError` when it cannot be created."""
    return _made("SQUAD_CACHE_DIR", platformdirs.user_cache_dir("squad", appauthor=False), "cache")


def state_dir() -> Path:
    """Directory for engine logs (``logs/``), traces (``traces/``) and pid files; created on demand.
    Raises :class:`UserError` when it cannot be created."""
    return _made("SQUAD_STATE_DIR", platformdirs.user_state_dir("squad", appauthor=False), "state")


def check_state_dirs(*subdirs: str) -> Path:
    """Check that squad can write its state directory and each ``subdirs`` of it (created if
    missing), e.g. ``check_state_dirs(*ENGINE_STATE, "traces")`` before a launch that writes a
    trace. Returns the state directory. Raises :class:`UserError` naming the directory, the
    reason and ``SQUAD_STATE_DIR`` as the fix."""
    root = state_dir()
    for folder in (root, *(root / s for s in subdirs)):
        try:
            if folder != root:
                private_dir(folder)
            with tempfile.TemporaryFile(dir=folder, prefix=".squad-probe-"):
                pass
        except OSError as exc:
            raise UserError(f"squad's state directory {folder} is not writable ({_reason(exc)}); "
                            "set SQUAD_STATE_DIR to a writable directory") from None
    return root


def check_output_file(path: Path, option: str) -> Path:
    """Check that ``path`` (given as ``option``, e.g. ``--out``) can be written: its directory
    exists and squad may create or append to the file there; nothing is left behind. Returns
    ``path``. Raises :class:`UserError` (a missing or non-directory parent, ``path`` a
    directory, no permission, a read-only file system) saying what to change."""
    where = f"{option} {path}"
    if path.is_dir():
        raise UserError(f"{where} is a directory; give a file path, e.g. {path / 'result.txt'}")
    parent = path.parent
    if not parent.is_dir():
        blocker = next((p for p in (parent, *parent.parents) if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise UserError(f"{where}: {blocker} is a file, not a directory; choose another path")
        raise UserError(f"{where}: the directory {parent} does not exist; create it first "
                        "(squad does not create directories you name)")
    existed = path.exists()
    flags = os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | (0 if existed else os.O_CREAT | os.O_EXCL)
    try:
        os.close(os.open(path, flags, 0o644))
    except OSError as exc:
        raise UserError(f"{where}: cannot create or write the file there ({_reason(exc)}); "
                        "choose another path") from None
    if not existed:
        with contextlib.suppress(OSError):
            path.unlink()
    return path


def private_dir(path: Path) -> Path:
    """``path`` as a folder of squad's own, 0700: created (with its parents) if missing, set to 0700 if it exists.
    Raises :class:`OSError`."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != PRIVATE_DIR:
        path.chmod(PRIVATE_DIR)
    return path


def open_private(path: Path, mode: str = "a", *, tighten: bool = True, **kwargs: Any) -> IO[Any]:
    """Open ``path`` (``mode`` ``"a"``, ``"ab"``, ``"w"`` or ``"wb"``) as a file only its owner may read: created
    0600, an existing one set to 0600 first (``tighten=False``: an existing file keeps its mode, for a path the user
    named). Raises :class:`OSError`."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    fd = os.open(path, flags, PRIVATE_FILE)
    try:
        if tighten and os.fstat(fd).st_mode & 0o777 != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def _made(variable: str, default: str, what: str) -> Path:
    root = os.environ.get(variable)
    path = Path(root) if root else Path(default)
    try:
        existed = path.is_dir()
        path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        if not root and existed and path.stat().st_mode & 0o777 != PRIVATE_DIR:
            path.chmod(PRIVATE_DIR)  # squad's own folder (not one the user named), made 0755 by an older squad
    except OSError as exc:
        source = f" (from {variable})" if root else ""
        raise UserError(f"squad's {what} directory {path}{source} cannot be created ({_reason(exc)}); "
                        f"set {variable} to a writable directory") from None
    return path


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)
