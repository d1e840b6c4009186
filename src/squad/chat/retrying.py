"""The retrying layer: squad's one retry policy, for calls and for token counts.

:class:`RetryingChatEngine` resends a call when, and only when, that is safe and useful:

- 503 loading/restarting (:class:`~squad.chat.stream.Loading`) is waited out until
  ``load_deadline`` (F03), then :class:`~squad.errors.EngineLoadTimeout`;
- a connection refused or dropped before the first token (:class:`~squad.errors.EngineGone`: the
  request never reached the engine) is resent once almost at once (a stale keep-alive
  connection), then once more after ``restart`` (if given, and only when ``/health`` does not
  answer); it stays :class:`EngineGone` only when ``/health`` confirms the engine is down (F22);
- ``Context size has been exceeded.`` while squad's own reservations fit the engine's pool
  (:class:`~squad.chat.stream.InnocentOverflow`: another client filled it) is retried up to
  ``max_attempts``; the final :class:`~squad.errors.ContextExceeded` states this process's own
  reservation, never the pool's size (F20).

Nothing else is retried: not a prompt too long, a budget, reasoning that ran out, another 4xx, or
a call that timed out (:class:`~squad.errors.CallTimeout`, F04: never resent unchanged). A token
count (idempotent) that hits a transport error is retried by :func:`retry_idempotent` (F22).
Every wait is jittered (:data:`WAITS`), so processes sharing an engine never retry in step.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_random,
    wait_random_exponential,
)
from tenacity.wait import wait_base

from squad.chat import ChatEngine, ChatRequest, ChatResult
from squad.chat.call import Call, emit, with_call_id
from squad.chat.stream import InnocentOverflow, Loading
from squad.chat.wrapper import WrapperChatEngine
from squad.engine.info import EngineInfo
from squad.engine.llama import CONTEXT_EXCEEDED
from squad.errors import AgentRunError, ContextExceeded, EngineGone, EngineLoadTimeout, SquadError
from squad.events import CallRetried, EventSink

__all__ = ["RetryingChatEngine", "WAITS", "COUNT_ATTEMPTS", "retry_idempotent"]

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

COUNT_ATTEMPTS = 4
"""Attempts for an idempotent request (a token count) that hit a transport error (F22)."""

WAITS: dict[str, wait_base] = {
    "loading": wait_random(0.25, 0.75),             # 503: poll about every 0.5 s
    "gone": wait_random(0.05, 0.2),                 # resend on a fresh connection (or after a restart)
    "overflow": wait_random_exponential(0.25, max=4.0),  # full jitter, doubling per overflow (F20)
    "count": wait_random_exponential(0.05, max=1.0),     # an idempotent token count (F22)
    "health": wait_random(0.2, 0.4),                # probing /health before declaring the engine gone
}
"""Waits between attempts (seconds), each by its kind, all with jitter (tenacity), so processes
sharing one engine never retry in step (field case F20). An exponential wait grows with the
attempts of its own kind."""

_RETRIED = (Loading, EngineGone, InnocentOverflow)
_REASONS = {Loading: "engine loading (503)", EngineGone: "connection failed before the first token (resent)",
            InnocentOverflow: "pool overflowed by another client"}


async def retry_idempotent(send: Callable[[], Awaitable[T]], attempts: int = COUNT_ATTEMPTS,
                           wait: wait_base = WAITS["count"]) -> T:
    """``await send()``, resent up to ``attempts`` times in all on an ``httpx.TransportError`` other
    than a timeout (jittered ``wait``); the last error is raised."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(httpx.TransportError) & retry_if_not_exception_type(httpx.TimeoutException),
        stop=stop_after_attempt(attempts), wait=wait, sleep=anyio.sleep, reraise=True,
    ):
        with attempt:
            return await send()
    raise AssertionError("unreachable")  # pragma: no cover


class RetryingChatEngine(WrapperChatEngine):
    """Resends ``inner``'s failed calls by the policy of the module docstring.

    - ``load_deadline``: seconds to wait out 503 before :class:`EngineLoadTimeout`;
    - ``max_attempts``: attempts for an innocent overflow;
    - ``restart``: called once per call when the engine is gone (e.g. ``Launcher.restart``); its
      :class:`EngineInfo` is given to ``adopt`` (the stack takes the new engine);
    - ``on_event``: receives ``call.retried``.
    """

    def __init__(self, inner: ChatEngine, *, load_deadline: float = 120.0, max_attempts: int = 3,
                 restart: Callable[[], Awaitable[EngineInfo]] | None = None,
                 adopt: Callable[[EngineInfo], None] | None = None, on_event: EventSink | None = None) -> None:
        super().__init__(inner)
        self.load_deadline, self.max_attempts = load_deadline, max_attempts
        self.restart, self.adopt, self.on_event = restart, adopt, on_event

    async def complete(self, request: ChatRequest) -> ChatResult:
        """``inner.complete(request)``, resent by the policy; raises what it raises, the retried kinds
        turned into :class:`EngineLoadTimeout`, :class:`AgentRunError` (the engine answers
        ``/health``) and :class:`ContextExceeded` once the policy gives up."""
        request = with_call_id(request)
        call = Call(request, request.call or "")
        call.attempts += 1
        try:
            try:  # the common path: one attempt, no retry machinery
                result = await self.inner.complete(request)
            except _RETRIED as exc:
                self._overflowed(call, exc)
                result = await self._resend(call, exc)
        except Loading as exc:
            raise _tallied(EngineLoadTimeout(
                f"engine at {self.engine.base_url} still answered 503 ({exc}) after {self.load_deadline:.0f} s "
                f"while agent '{call.agent}' waited: wait for the model to load or raise load_deadline"
            ), call) from exc
        except EngineGone as exc:
            if await self.inner.engine_up():  # not gone: the connection failed, the engine did not
                raise _tallied(AgentRunError(
                    f"agent '{call.agent}': the connection to the engine failed {call.gone} times before the "
                    f"first token although the engine answers /health ({exc}); try again",
                    agent=call.agent), call) from exc
            _tallied(exc, call)
            raise
        except InnocentOverflow as exc:
            raise _tallied(ContextExceeded(
                f"agent '{call.agent}': the engine kept failing with '{CONTEXT_EXCEEDED}' over {call.overflows} "
                f"attempts although this process had at most {call.held} of the engine's {self.engine.pool} "
                f"tokens reserved (this call {call.need}: prompt + max_tokens): another client is using this "
                "engine's pool; give squad its own engine or raise the context", agent=call.agent), call) from exc
        except SquadError as exc:
            _tallied(exc, call)
            raise
        result.attempts = call.attempts
        return result

    @staticmethod
    def _overflowed(call: Call, exc: BaseException) -> None:
        """Note an overflow's reservations on ``call`` (read from the error the admitted layer raised)."""
        if isinstance(exc, InnocentOverflow):
            call.held, call.need = max(call.held, exc.reserved), exc.need or call.need

    async def _resend(self, call: Call, first: BaseException) -> ChatResult:
        pending: BaseException | None = first
        async for attempt in self.policy(call):
            with attempt:
                if pending is not None:  # the policy judges the first failure as attempt 1
                    failed, pending = pending, None
                    raise failed
                call.attempts += 1
                try:
                    return await self.inner.complete(call.request)
                except _RETRIED as exc:
                    self._overflowed(call, exc)
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def policy(self, call: Call) -> AsyncRetrying:
        """The one retry policy for ``call`` (module docstring), as a tenacity ``AsyncRetrying``."""

        def stop(state: RetryCallState) -> bool:
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, Loading):
                return time.monotonic() - (call.first_loading or call.started) >= self.load_deadline
            if isinstance(exc, EngineGone):
                # The request never reached the engine, so resending is safe: once at once
                # (a pooled keep-alive connection the engine had closed), then once more after
                # a restart when one is possible.
                call.gone += 1
                return call.gone > 1 and (self.restart is None or call.restarted)
            call.overflows += 1
            return call.overflows >= self.max_attempts

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            kind = "loading" if isinstance(exc, Loading) else "gone" if isinstance(exc, EngineGone) else "overflow"
            # an exponential wait counts the attempts of its own kind, not the loading polls before
            counted = {"gone": call.gone, "overflow": call.overflows}.get(kind, 1)
            return WAITS[kind](_attempt_no(state, counted))

        async def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            reason = _REASONS.get(type(exc), type(exc).__name__)
            emit(self.on_event, CallRetried, call, self.engine.base_url, reason=reason, attempt=state.attempt_number,
                 error=str(exc))
            if isinstance(exc, Loading) and call.first_loading is None:
                call.first_loading = time.monotonic()
            if isinstance(exc, EngineGone) and call.gone > 1 and self.restart is not None and not call.restarted:
                call.restarted = True
                if await self.inner.engine_up():  # the connection failed, not the engine: resend, never restart
                    return
                info = await self.restart()
                if self.adopt is not None:
                    self.adopt(info)

        return AsyncRetrying(retry=retry_if_exception(lambda e: isinstance(e, _RETRIED)),
                             stop=stop, wait=wait, before_sleep=before_sleep, sleep=anyio.sleep, reraise=True)


def _tallied(exc: E, call: Call) -> E:
    """``exc`` carrying the attempts ``call`` made (``attempts``: the client's ``call.failed`` reads it)."""
    exc.attempts = call.attempts  # type: ignore[attr-defined]
    return exc


def _attempt_no(state: RetryCallState, n: int) -> RetryCallState:
    """``state`` as a wait sees it when ``n`` attempts of its own kind have failed."""
    clone = copy.copy(state)
    clone.attempt_number = max(1, n)
    return clone
