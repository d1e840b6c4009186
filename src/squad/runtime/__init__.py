"""The runtime: a main agent and its sub-agents as concurrent tasks on one engine.

- ``squad``: :class:`~squad.runtime.squad.Squad`, the run; ``agent``: who an agent is;
- ``turn``: one model call and its tool loop; ``blocks``: parallel blocks and their failure policy;
- ``mention``: @mention parsing; ``handback``: sub-agent answers handed back to the main agent;
- ``toolroom``: the room tool results get (the tools themselves: :mod:`squad.tools`);
- ``outcome`` / ``results``: what a conversation and a run produced; ``chatloop``: ``squad chat``.
"""

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    """``from squad.runtime import Squad`` (the flat layout's path) for one release."""
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("squad.runtime.squad"), name)
