"""The engine ``squad engine start`` left running: its record in ``state_dir()/engine.json``.

Every other launch stops its engine when squad exits; a detached one is found again through
this record (its URL, API key, pid + start time, log and the plan it was started with), by
``squad engine status|stop`` and by :func:`squad.engine.control.attach`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from squad.dirs import open_private, state_dir
from squad.errors import UserError

__all__ = [
    "SavedEngine",
    "SavedPlan",
    "saved_engine_path",
    "load_saved_engine",
    "save_engine",
    "saved_engine_at",
]


class SavedPlan(BaseModel):
    """The plan a detached engine was started with (as stored in ``engine.json``)."""

    model_config = ConfigDict(extra="forbid")
    model: str
    slots: int
    n_ctx: int
    kv_unified: bool
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"


class SavedEngine(BaseModel):
    """``state_dir()/engine.json``: the engine ``squad engine start`` left running.

    ``url`` (no ``/v1``), ``api_key`` (the file is written mode 0600), ``pid`` and
    ``create_time`` (to tell a reused pid apart), ``log_path``, ``plan``.
    """

    model_config = ConfigDict(extra="forbid")
    url: str
    api_key: str | None
    pid: int
    create_time: float
    log_path: str
    plan: SavedPlan


def saved_engine_path() -> Path:
    """``state_dir()/engine.json``."""
    return state_dir() / "engine.json"


def load_saved_engine() -> SavedEngine | None:
    """The record of the engine ``squad engine start`` left running, or None if there is none.

    Raises :class:`UserError` naming the file when it exists but is not valid.
    """
    path = saved_engine_path()
    if not path.is_file():
        return None
    try:
        return SavedEngine.model_validate_json(path.read_text())
    except (OSError, ValidationError) as exc:
        raise UserError(f"{path}: not a valid engine record ({exc}); delete it and start the engine again") from exc


def save_engine(record: SavedEngine) -> Path:
    """Write ``engine.json`` readable by the owner only (it holds the API key)."""
    path = saved_engine_path()
    with open_private(path, "w") as out:  # an existing file made 0644 elsewhere is set to 0600 too
        out.write(record.model_dump_json(indent=2))
    return path


def saved_engine_at(base_url: str) -> SavedEngine | None:
    """The ``squad engine start`` record when it describes the engine at ``base_url``."""
    try:
        saved = load_saved_engine()
    except UserError:
        return None
    if saved is None or saved.url.rstrip("/").removesuffix("/v1") != base_url:
        return None
    return saved
