"""A :class:`~squad.chat.ChatEngine` that delegates every member to an inner one.

Cross-cutting concerns are layers around the seam, each a subclass overriding what it changes
(:mod:`squad.chat.admitted`, :mod:`squad.chat.retrying`, :class:`squad.chat.client.EngineClient`)::

    class Recorded(WrapperChatEngine):
        async def complete(self, request: ChatRequest) -> ChatResult:
            self.seen.append(request)
            return await super().complete(request)

``engine`` reads through to the innermost engine; a stack that adopts a reloaded engine sets it
where it is kept (:attr:`squad.chat.client.EngineClient.engine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from squad.chat import ChatEngine, ChatRequest, ChatResult

if TYPE_CHECKING:
    from squad.engine.info import EngineInfo

__all__ = ["WrapperChatEngine"]


class WrapperChatEngine:
    """Delegates ``engine``, :meth:`count`, :meth:`complete`, :meth:`engine_up` and
    :meth:`aclose` to ``inner``; an async context manager that closes it."""

    def __init__(self, inner: ChatEngine) -> None:
        self.inner = inner

    @property
    def engine(self) -> EngineInfo:
        return self.inner.engine

    async def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        return await self.inner.count(messages, tools)

    async def complete(self, request: ChatRequest) -> ChatResult:
        return await self.inner.complete(request)

    async def engine_up(self) -> bool:
        return await self.inner.engine_up()

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> WrapperChatEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
