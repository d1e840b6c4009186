"""The per-model-file disk cache: data derived from one model file (its KV facts, its vocabulary),
kept as JSON in ``cache_dir()/<kind>/`` keyed by the file's resolved path, size and mtime; one process
builds a missing record while others wait for it (:func:`fill_entry`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from squad.dirs import cache_dir
from squad.engine.cache_fill import fill_once, write_atomic

__all__ = ["cache_entry", "fill_entry", "read_entry", "write_entry"]


def cache_entry(kind: str, key: dict[str, object]) -> Path:
    """``cache_dir()/<kind>/<hash of key>.json``: where data derived from one model file is kept.
    ``key`` names the file's version: ``{"path": resolved, "size": bytes, "mtime_ns": ns}``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir() / kind / f"{digest}.json"


def read_entry(entry: Path, key: dict[str, object], version: int) -> dict[str, Any] | None:
    """The JSON object in ``entry`` if it is readable and for ``key`` and format ``version``,
    else None (the caller rebuilds and rewrites it)."""
    try:
        record = json.loads(entry.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != version or record.get("key") != key:
        return None
    return record


def fill_entry(
    entry: Path,
    build: Callable[[], dict[str, Any]],
    *,
    whole: Callable[[], bool],
    doing: str,
    force: bool = False,
) -> dict[str, Any] | None:
    """Build the record at ``entry`` once, however many processes miss it at once
    (:func:`squad.engine.cache_fill.fill_once`: ``whole()`` says it is there and usable, ``doing`` what the
    builder does, for a waiter's note; ``force`` builds it again). Returns the record this call built, or None
    when ``entry`` was whole (read it). A cache that cannot be written is not an error: the record is built
    here and returned; what ``build`` raises propagates."""
    built: dict[str, Any] | None = None

    def make(tmp: Path) -> None:
        nonlocal built
        built = build()
        tmp.write_text(json.dumps(built) + "\n")

    try:
        fill_once(entry, make, whole=whole, doing=doing, force=force)
    except OSError:
        if built is None:
            built = build()
    return built


def write_entry(entry: Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``entry`` atomically (a concurrent reader sees the old or the new file).
    A cache that cannot be written is not an error: it only costs a rebuild next time."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(entry, json.dumps(record) + "\n")
    except OSError:
        pass
