"""squad: agents that share one local llama-server.

The public API is ``__all__``; everything else is private. Names are imported on first use
(PEP 562), so ``import squad`` and the ``squad`` command start quickly.

- Agents and runs: :class:`Agent`, :class:`Squad`, :func:`run_sync`, :class:`AgentResult`,
  :class:`RunResult`, :class:`Tool`, :func:`tool`.
- Engine: :func:`plan` -> :class:`EnginePlan`; :class:`Launcher` (starts llama-server and reads
  back :class:`EngineInfo`); :func:`attach` (an engine already running).
- Recipes and mentions: :func:`load_recipe`, :func:`parse_mentions`.
- Errors: the tree in :mod:`squad.errors`, all importable from here.
"""

from __future__ import annotations

import importlib
from typing import Any

from squad.errors import *  # noqa: F403
from squad.errors import __all__ as _error_names

__version__ = "0.1.0"

_LAZY = {
    "Agent": "squad.agent",
    "Sampling": "squad.agent",
    "Squad": "squad.runtime",
    "run_sync": "squad.runtime",
    "AgentResult": "squad.results",
    "RunResult": "squad.results",
    "Tool": "squad.tools",
    "tool": "squad.tools",
    "EnginePlan": "squad.planner",
    "plan": "squad.planner",
    "EngineInfo": "squad.engine.info",
    "Launcher": "squad.engine.launcher",
    "attach": "squad.engine.remote",
    "load_recipe": "squad.recipe",
    "parse_mentions": "squad.mention",
    "Event": "squad.events",
    "EngineSpec": "squad.session",
    "EngineSession": "squad.session",
    "ChatEngine": "squad.chat",
}

__all__ = ["__version__", *_LAZY, *_error_names]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'squad' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
