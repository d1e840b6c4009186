"""The chat seam: the one narrow interface between the runtime and an engine.

The runtime never talks HTTP. It builds a :class:`ChatRequest`, hands it to a
:class:`ChatEngine`, and gets a :class:`ChatResult` (or an error from :mod:`squad.errors`).
Implementations:

- :class:`squad.chat.client.EngineClient`: llama-server over HTTP (openai SDK), with squad's
  admission, retries and stream rules, built as layers (:class:`squad.chat.wrapper.WrapperChatEngine`);
- :class:`squad.chat.routing.Router`: several engines as one;
- :class:`squad.testing.ScriptedEngine`: an in-process fake with scripted replies, for tests of
  policies, cancellation and hand-back that need no HTTP;
- later: other engine kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from squad.events import Origin

if TYPE_CHECKING:
    from squad.engine.info import EngineInfo
    from squad.sched.share import ShareGroup

__all__ = ["ChatEngine", "ChatRequest", "ChatResult", "Usage", "ToolCall", "CallTimings"]


@dataclass(frozen=True)
class ChatRequest:
    """One model call.

    - ``origin``: who calls (agent, conversation id, parent conversation id), for events.
    - ``messages``: OpenAI-style chat messages.
    - ``max_tokens``: tokens this call may generate; ``budget``: the most tokens (prompt +
      max_tokens) the agent's conversation may hold, or None for no limit of its own.
    - ``tools``: OpenAI tool specs, or None; ``sampling``: request fields (temperature, ...).
    - ``tool_choice``: ``"auto"`` (None: the same) or ``"required"`` (the model must call one of
      ``tools``; a named choice is sent as ``"required"`` with only that tool in ``tools``);
      ``parallel_tool_calls``: whether one reply may hold several calls (None: the engine's default).
    - ``response_format``: the request's ``response_format`` (a JSON schema the answer must
      match, :meth:`squad.chat.structured.OutputSchema.response_format`), or None.
    - ``priority``: admission order (lower first; main agent 0, sub-agents their depth).
    - ``on_delta``: receives answer text as it streams.
    - ``thinking_budget``: the most of ``max_tokens`` the model may spend thinking (``0``: no
      thinking; None: as the model and engine please), sent as the engine's kind reads it
      (:func:`squad.engine.kinds.thinking_fields`); it never raises the reservation, which
      ``max_tokens`` already bounds.
    - ``call``: the call id its events carry; the client sets a fresh one for each call
      (:func:`squad.chat.call.with_call_id`); None: the layer that needs one makes it.
    - ``share``: the fan-out share group whose member's conversation this call is
      (:mod:`squad.sched.share`: the admitted layer restores the common prefix into its slot once),
      or None.
    """

    origin: Origin
    messages: list[dict[str, Any]]
    max_tokens: int
    budget: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    sampling: dict[str, Any] | None = None
    priority: int = 0
    on_delta: Callable[[str], None] | None = None
    thinking_budget: int | None = None
    call: str | None = None
    share: ShareGroup | None = None

    @property
    def agent(self) -> str:
        return self.origin.agent


@dataclass(frozen=True)
class Usage:
    """Tokens the engine reported for one call."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model asked for; ``arguments`` is the JSON text as generated."""

    id: str
    name: str
    arguments: str


@dataclass
class CallTimings:
    """Seconds: ``queued_s`` waiting in admission (last attempt), ``ttft_s`` from send to the
    first token, ``total_s`` from the first attempt's start to the end; ``tokens_per_s``
    completion tokens over generation time; ``engine``: llama-server's ``timings`` object."""

    queued_s: float = 0.0
    ttft_s: float | None = None
    total_s: float = 0.0
    tokens_per_s: float | None = None
    engine: dict[str, Any] | None = None


@dataclass
class ChatResult:
    """A finished call: the answer (never partial), reasoning kept apart, tool calls, usage.

    ``call`` is the call id its events carry; ``reserved_tokens`` what admission held;
    ``slot`` squad's slot number (-1 when the engine admits on its own); ``shared_tokens``: tokens of a
    fan-out's common prefix restored into its slot (0: none). ``engine``: the base URL
    of the engine that served it (set by :class:`squad.chat.routing.Router`, None on one engine);
    ``rerun_from``: the engine whose stream died under this call, after which it was re-run from
    its start on ``engine`` (the cut text was dropped: this answer is whole), else None.
    :attr:`cut_while_thinking`: stopped at ``max_tokens`` inside the thinking (field case F07), a
    truncated answer like any other cut one.
    """

    content: str
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: Usage | None = None
    timings: CallTimings = field(default_factory=CallTimings)
    reserved_tokens: int = 0
    attempts: int = 1
    slot: int = -1
    shared_tokens: int = 0
    call: str | None = None
    engine: str | None = None
    rerun_from: str | None = None

    @property
    def cut_while_thinking(self) -> bool:
        """Stopped at ``max_tokens`` (``finish_reason == "length"``) with thinking and no answer
        text or tool call: the whole generation went to the thinking."""
        return (self.finish_reason == "length" and bool(self.reasoning) and not self.content.strip()
                and not self.tool_calls)


@runtime_checkable
class ChatEngine(Protocol):
    """What the runtime needs from an engine.

    - ``engine``: the read-back :class:`~squad.engine.info.EngineInfo` (read-only here; a client
      that follows reloads sets its own, :attr:`squad.chat.client.EngineClient.engine`);
    - :meth:`count`: exact prompt tokens of ``messages`` (+ ``tools``);
    - :meth:`complete`: one call; raises the errors of :mod:`squad.errors`
      (:class:`~squad.errors.AgentRunError` and its kinds, :class:`~squad.errors.EngineError`);
    - :meth:`engine_up`: whether the engine still answers (asked after a stream was cut, to tell a
      dead engine from a call that failed on its own);
    - :meth:`aclose`: release connections.

    Admission is not part of the seam: the session that built the engine holds it
    (:attr:`squad.engine.session.EngineSession.admission`). Layers around a ``ChatEngine``
    subclass :class:`squad.chat.wrapper.WrapperChatEngine`.
    """

    @property
    def engine(self) -> EngineInfo: ...

    async def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int: ...

    async def complete(self, request: ChatRequest) -> ChatResult: ...

    async def engine_up(self) -> bool: ...

    async def aclose(self) -> None: ...
