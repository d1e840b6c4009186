"""The per-model-file disk cache: data derived from one model file (its KV facts, its vocabulary),
kept as JSON in ``cache_dir()/<kind>/`` keyed by the file's resolved path, size and mtime."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from squad.dirs import cache_dir

__all__ = ["cache_entry", "read_entry", "write_entry"]


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


def write_entry(entry: Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``entry`` atomically (a concurrent reader sees the old or the new file).
    A cache that cannot be written is not an error: it only costs a rebuild next time."""
    tmp: Path | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
        tmp = Path(name)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(record) + "\n")
        os.replace(tmp, entry)
    except OSError:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
