"""Where squad keeps things on disk (via platformdirs).

- cache: built engines and pulled models (``~/.cache/squad`` on Linux); override with
  ``SQUAD_CACHE_DIR``.
- state: engine logs, traces, pid files (``~/.local/state/squad``); override with
  ``SQUAD_STATE_DIR``.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

__all__ = ["cache_dir", "state_dir"]


def cache_dir() -> Path:
    """Directory for built engines (``engine/``) and models (``models/``); created on demand."""
    root = os.environ.get("SQUAD_CACHE_DIR")
    path = Path(root) if root else Path(platformdirs.user_cache_dir("squad", appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_dir() -> Path:
    """Directory for engine logs (``logs/``), traces (``traces/``) and pid files; created on demand."""
    root = os.environ.get("SQUAD_STATE_DIR")
    path = Path(root) if root else Path(platformdirs.user_state_dir("squad", appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path
