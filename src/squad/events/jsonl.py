"""Run traces: events written as JSON Lines, read back, and summarized per agent and call.

- :class:`JsonlTrace` is an :data:`~squad.events.EventSink` that appends each event as one
  JSON line (the record format is in :mod:`squad.events`); :func:`load_trace` reads it back
  as typed events.
- :func:`squad.events.summary.summarize` digests the events.

``t`` in a trace file is seconds since the trace's first event; ``wall`` is Unix time.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from squad.dirs import open_private, private_dir, state_dir
from squad.errors import UserError
from squad.events import (
    Event,
    event_from_record,
)

__all__ = ["JsonlTrace", "default_trace_path", "default_trace_dir", "load_trace", "jsonable"]


# --------------------------------------------------------------------------- writing


def jsonable(value: Any) -> Any:
    """``value`` made JSON-safe: dataclasses and pydantic models become dicts, exceptions
    become ``"TypeName: message"``, paths and enums become strings, anything else unknown
    becomes its ``str()``. Non-finite floats become None."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    dump = getattr(value, "model_dump", None)  # pydantic models
    if callable(dump):
        try:
            return jsonable(dump())
        except Exception:  # noqa: BLE001
            pass
    return str(value)


def default_trace_path() -> Path:
    """A fresh trace path: ``state_dir()/traces/run-YYYYmmdd-HHMMSS-ffffff.jsonl``
    (the directory is created; the file is not)."""
    folder = private_dir(state_dir() / "traces")
    return folder / f"run-{datetime.now():%Y%m%d-%H%M%S-%f}.jsonl"


class JsonlTrace:
    """An :data:`EventSink` that appends each event as one JSON line to ``path``.

    Use as a context manager (``with JsonlTrace(p) as sink: squad(on_event=sink)``) or call
    :meth:`close` yourself. The file is opened on entry (or on the first event), parent
    directories are created, and every line is flushed as it is written, so a crash leaves
    a readable trace. ``t`` in the file is seconds since the first event written.
    Events arriving after :meth:`close` are dropped.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None
        self._t0: float | None = None
        self._closed = False
        self.count = 0
        """Events written so far."""

    def __enter__(self) -> JsonlTrace:
        self._open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open(self) -> IO[str]:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # prompts and answers: a new trace is the owner's only; a file the user named keeps its mode
            self._file = open_private(self.path, "a", tighten=False, encoding="utf-8")
        return self._file

    def __call__(self, event: Event) -> None:
        if self._closed:
            return
        if self._t0 is None:
            self._t0 = event.t
        record = {"kind": event.kind, "t": round(event.t - self._t0, 6), "wall": event.wall,
                  **event.ids(), "data": jsonable(event.data)}
        out = self._open()
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        out.flush()
        self.count += 1

    def flush(self) -> None:
        """Push the file's buffer to the OS (each line is flushed as written already)."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Close the file; later events are dropped."""
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None


# --------------------------------------------------------------------------- reading


def load_trace(path: Path | str) -> list[Event]:
    """Read a JSONL trace written by :class:`JsonlTrace` as typed events; ``t`` stays relative
    to its start. Lines of kinds this version does not know are skipped. A torn last line (the run crashed mid-write) is
    skipped. Raises :class:`UserError` when the file is missing or a line is not a trace event.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"{path}: no such trace file; traces are written to {default_trace_dir()}") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a squad trace (JSON Lines) file: {exc}") from None
    events: list[Event] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = event_from_record(json.loads(line))
            if event is not None:  # a kind from another version: skipped
                events.append(event)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if number == len(lines) and events:  # torn last line after a crash
                break
            raise UserError(
                f"{path}:{number}: not a squad trace event ({exc}); expected one JSON object per line "
                'with "kind" and "t"'
            ) from None
    return events


def default_trace_dir() -> Path:
    """Where :func:`default_trace_path` puts traces."""
    return state_dir() / "traces"
