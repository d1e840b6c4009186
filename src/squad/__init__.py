"""squad: agents that share one local llama-server.

The public API is ``__all__``; everything else is private. Names are imported on first use
(PEP 562), so ``import squad`` and the ``squad`` command start quickly.

- Agents and runs: :class:`Agent`, :class:`Squad`, :func:`run_sync`, :class:`AgentResult`,
  :class:`RunResult` (with its :class:`Outcome`: ok, truncated, empty, failed, cancelled),
  :class:`Tool`, :func:`tool`, :class:`MCPServer` (tools from an MCP server).
- Workloads (what the engine is planned for, ``Squad(workload=...)``): :class:`Call` (one
  conversation and its budget), :class:`Map` (a node run over many inputs, ``limit`` at once).
- Engine: :class:`EngineSpec` (which engine: model and pins, or a URL) -> :func:`plan_engine`
  -> :class:`EnginePlan` (:func:`plan` is the pure planner); :class:`EngineSession` (launches
  or attaches, owns admission and the client); :class:`Launcher` (starts llama-server and
  reads back :class:`EngineInfo`); :func:`attach` (an engine already running).
- The chat seam: :class:`ChatEngine`, :class:`ChatRequest`, :class:`ChatResult`.
- Recipes and mentions: :func:`load_recipe`, :func:`parse_mentions`.
- Errors: the tree in :mod:`squad.errors`, all importable from here.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from squad._moved import FINDER as _MOVED_FINDER
from squad._version import __version__
from squad.errors import *
from squad.errors import __all__ as _error_names

if _MOVED_FINDER not in sys.meta_path:  # the flat layout's import paths, for one release (squad._moved)
    sys.meta_path.append(_MOVED_FINDER)

_LAZY = {
    "Agent": "squad.runtime.agent",
    "Sampling": "squad.runtime.agent",
    "Squad": "squad.runtime.squad",
    "run_sync": "squad.runtime.squad",
    "AgentResult": "squad.runtime.results",
    "RunResult": "squad.runtime.results",
    "Outcome": "squad.runtime.outcome",
    "Tool": "squad.tools",
    "MCPServer": "squad.mcp",
    "tool": "squad.tools",
    "Call": "squad.sched.workload",
    "Map": "squad.sched.workload",
    "EnginePlan": "squad.sched.plan",
    "plan": "squad.sched.planner",
    "EngineInfo": "squad.engine.info",
    "Launcher": "squad.engine.launcher",
    "attach": "squad.engine.control",
    "load_recipe": "squad.recipes",
    "parse_mentions": "squad.runtime.mention",
    "Event": "squad.events",
    "EngineSpec": "squad.engine.session",
    "EngineSession": "squad.engine.session",
    "plan_engine": "squad.engine.session",
    "ChatEngine": "squad.chat",
    "ChatRequest": "squad.chat",
    "ChatResult": "squad.chat",
}

__all__ = ["__version__", *_LAZY, *_error_names]

if TYPE_CHECKING:  # precise names for type checkers; imported lazily at run time
    from squad.chat import ChatEngine, ChatRequest, ChatResult
    from squad.engine.control import attach
    from squad.engine.info import EngineInfo
    from squad.engine.launcher import Launcher
    from squad.engine.session import EngineSession, EngineSpec, plan_engine
    from squad.events import Event
    from squad.mcp import MCPServer
    from squad.recipes import load_recipe
    from squad.runtime.agent import Agent, Sampling
    from squad.runtime.mention import parse_mentions
    from squad.runtime.outcome import Outcome
    from squad.runtime.results import AgentResult, RunResult
    from squad.runtime.squad import Squad, run_sync
    from squad.sched.plan import EnginePlan
    from squad.sched.planner import plan
    from squad.sched.workload import Call, Map
    from squad.tools import Tool, tool


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'squad' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
