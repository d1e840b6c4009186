"""Fakes for fast, honest tests of code built on squad (never the only proof of a feature:
squad's own tests also run against the real llama-server).

- :class:`ScriptedEngine` (:mod:`squad.testing.scripted`): an in-process
  :class:`~squad.chat.ChatEngine` with scripted replies and squad's real admission. For
  policies, cancellation, hand-back and events: no HTTP, no threads.
- :class:`FakeEngine` (:mod:`squad.testing.fake_engine`): a fake llama-server over real HTTP
  on 127.0.0.1 with llama-server's API shapes (slots, one shared pool, error frames), for wire
  behaviour. Needs the ``testing`` extra (starlette, uvicorn); imported on first use.
- :class:`FakeVLLM`, :class:`FakeSGLang`, :class:`FakeOllama`, :class:`FakeLMStudio`
  (:mod:`squad.testing.fake_kinds`): the other servers squad attaches to, answering their
  documented capacity endpoints and behaving as each does past its capacity (preempt, truncate).
- :func:`count_tokens`: the fakes' token count (words + overheads), to compute by hand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from squad.engine.llama import CONTEXT_EXCEEDED
from squad.testing.counting import MESSAGE_OVERHEAD, PROMPT_OVERHEAD, count_tokens
from squad.testing.generation import Reply
from squad.testing.scripted import ScriptedEngine

if TYPE_CHECKING:
    from squad.testing.fake_engine import FakeEngine
    from squad.testing.fake_kinds import FakeLMStudio, FakeOllama, FakeSGLang, FakeVLLM

_KINDS = ("FakeVLLM", "FakeSGLang", "FakeOllama", "FakeLMStudio")

__all__ = ["ScriptedEngine", "FakeEngine", "FakeVLLM", "FakeSGLang", "FakeOllama", "FakeLMStudio", "Reply",
           "count_tokens", "MESSAGE_OVERHEAD", "PROMPT_OVERHEAD",
           "CONTEXT_EXCEEDED"]


def __getattr__(name: str) -> Any:
    if name == "FakeEngine":
        from squad.testing import fake_engine

        return getattr(fake_engine, name)
    if name in _KINDS:
        from squad.testing import fake_kinds

        return getattr(fake_kinds, name)
    raise AttributeError(f"module 'squad.testing' has no attribute {name!r}")
