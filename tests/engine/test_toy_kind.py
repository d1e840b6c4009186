"""A new engine kind is one new module with its fake: a toy kind like Hugging Face's TGI (its
``/info`` reports concurrency and context; its ``/chat_tokenize`` counts a chat prompt), written
here as one :class:`~squad.engine.kinds.EngineKind` and added to :data:`squad.engine.kinds.ENGINE_KINDS`
(a module in ``squad/engine/kinds/`` is named in ``_MODULES`` instead). Attaching detects it, reads
its capacity, and a squad run counts every prompt with its counter object and admits within it:
nothing in the client, serve or the CLI names it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from squad import Agent, Squad
from squad.engine import kinds
from squad.engine.control import attach
from squad.engine.kinds import Capacity, EngineKind
from squad.engine.kinds.base import Pins, get_json, positive
from squad.engine.kinds.counting import Post
from squad.testing import FakeEngine
from squad.testing.counting import count_tokens

pytestmark = pytest.mark.anyio


class ChatTokenize:
    """The toy kind's counter: ``POST /chat_tokenize`` with the chat, one entry per token."""

    name, describe, exact = "chat_tokenize", "POST /chat_tokenize (exact)", True

    async def chat(self, post: Post, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   model: str) -> int:
        body: dict[str, Any] = {"messages": messages, **({"tools": tools} if tools else {})}
        return len((await post("/chat_tokenize", body))["tokenize_response"])

    async def text(self, post: Post, prompt: str, model: str) -> int:
        return len((await post("/tokenize", {"inputs": prompt}))["tokens"])


async def probe_tgi(client: httpx.AsyncClient, pins: Pins) -> Capacity | None:
    info = await get_json(client, "/info")
    if not (isinstance(info, dict) and "max_concurrent_requests" in info):
        return None
    slots = pins.take("slots", positive(info.get("max_concurrent_requests")), "/info max_concurrent_requests",
                      default=1, default_why="not reported")
    n_ctx = pins.take("ctx", positive(info.get("max_total_tokens")), "/info max_total_tokens",
                      default=kinds.DEFAULT_CTX, default_why="not reported")
    pins.sources["pool"] = "slots × context"
    return pins.capacity("tgi", slots, n_ctx, slots * n_ctx, model=str(info.get("model_id", "")),
                         version=str(info.get("version", "")))


TGI = EngineKind(name="tgi", policy="keep each request under max_total_tokens", counting=ChatTokenize(),
                 probe=probe_tgi, probe_order=5)


class FakeTGI(FakeEngine):
    """The toy kind's fake: chat, ``/v1/models``, ``/info`` and ``/chat_tokenize``; nothing of llama-server's."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chat_counts = 0

    def _routes(self) -> list[Route]:
        chat = [r for r in super()._routes() if r.path in ("/v1/chat/completions", "/v1/models")]
        return [Route("/info", self._info), Route("/chat_tokenize", self._chat_tokenize, methods=["POST"]), *chat]

    async def _info(self, request: Request) -> Response:
        return JSONResponse({"model_id": "toy/tgi", "max_concurrent_requests": self.slots,
                             "max_total_tokens": self.n_ctx, "version": "3.3.6"})

    async def _chat_tokenize(self, request: Request) -> Response:
        body = await request.json()
        self.chat_counts += 1
        n = count_tokens(body.get("messages", []), body.get("tools"))
        return JSONResponse({"tokenize_response": [{"id": i} for i in range(n)], "templated_text": ""})


@pytest.fixture
def tgi(monkeypatch: pytest.MonkeyPatch) -> EngineKind:
    monkeypatch.setitem(kinds.ENGINE_KINDS, TGI.name, TGI)
    return TGI


async def test_a_toy_kind_is_detected_and_its_capacity_read(tgi: EngineKind) -> None:
    async with FakeTGI(slots=3, n_ctx=1024) as fe:
        info = await attach(fe.base_url)
        pinned = await attach(fe.base_url, slots=2)
    assert (info.kind, info.slots, info.n_ctx, info.pool, info.version) == ("tgi", 3, 1024, 3072, "3.3.6")
    assert info.engine_kind is tgi and info.counting is tgi.counting and info.policy == tgi.policy
    assert info.sources["slots"] == "/info max_concurrent_requests" and pinned.slots == 2


async def test_without_the_kind_the_same_server_is_an_unknown_one() -> None:
    async with FakeTGI(slots=3, n_ctx=1024) as fe:
        info = await attach(fe.base_url)
    assert info.kind == "openai-compatible" and info.counting.name == "estimate"


async def test_a_squad_on_a_toy_kind_counts_with_its_counter_and_admits_within_it(tgi: EngineKind) -> None:
    agent = Agent(name="w", instructions="Answer.", max_tokens=32)
    async with FakeTGI(slots=2, n_ctx=1024) as fe:
        async with Squad([agent], url=fe.base_url) as sq:
            results = await sq.map("w", [f"item {i}" for i in range(5)])
            assert sq.session.admission is not None and sq.session.admission.slots == 2
        assert all(r.ok for r in results)
        assert fe.chat_counts >= 5 and fe.count_requests == 0  # its counter, never llama-server's endpoint
        assert fe.max_processing <= 2
