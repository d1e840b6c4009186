"""``squad serve``'s admission against an adversarial client, on a fake engine that answers every API
llama-server serves (:class:`AllApis`): whatever the body, the engine is never asked to generate or
hold more than squad reserved (I1, a hypothesis property over the fields llama-server reads, plus
random keys); malformed bodies get a 4xx in their API's own shape and leave the books as they were
(I4, a hypothesis fuzz); bodies are bounded in size and time and a large one holds up no one; /infill
and /rerank are admitted. The real engine: tests/serve/test_serve_admission_real.py."""

from __future__ import annotations

import contextlib
import json
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from squad.engine.session import EngineSpec
from squad.serve import apis, serving
from squad.serve.http import MAX_DEPTH
from squad.testing import FakeEngine, count_tokens

pytestmark = pytest.mark.anyio

INF = math.inf
KEY = "admission-test-key-0123456789"


def _words(value: Any) -> int:
    return len(json.dumps(value).split()) if not isinstance(value, str) else len(value.split())


class AllApis(FakeEngine):
    """The fake llama-server, answering every generation API squad serve admits (chat through the
    fake's own generation; the others at once, in their API's shape, streamed or not) and the
    counting endpoints; ``seen`` records ``(path, body)`` of every generation request."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.seen: list[tuple[str, dict]] = []

    def _routes(self) -> list[Route]:
        gen = [p for api in apis.APIS if api.name != "chat" for p in api.paths]
        return [*super()._routes()[:4],
                Route("/v1/chat/completions/input_tokens", self._input_tokens, methods=["POST"]),
                Route("/v1/chat/completions", self._chat_seen, methods=["POST"]),
                Route("/chat/completions", self._chat_seen, methods=["POST"]),
                Route("/tokenize", self._tokenize, methods=["POST"]),
                Route("/v1/responses/input_tokens", self._count, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count, methods=["POST"]),
                *[Route(p, self._other, methods=["POST"]) for p in gen]]

    async def _chat_seen(self, request: Request) -> Response:
        self.seen.append((request.url.path, await request.json()))
        return await self._chat(request)

    async def _tokenize(self, request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"tokens": [1] * _words(body.get("content", ""))})

    async def _count(self, request: Request) -> Response:
        return JSONResponse({"input_tokens": fake_prompt(request.url.path, await request.json())})

    async def _other(self, request: Request) -> Response:
        path, body = request.url.path, await request.json()
        self.seen.append((path, body))
        api = apis.ROUTES[path]
        if api.name in ("embeddings", "rerank"):
            return JSONResponse({"data": [{"index": 0, "embedding": [0.5]}], "results": [{"index": 0, "score": 1}]})
        if not body.get("stream"):
            if api.name == "messages":
                return JSONResponse({"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                                     "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}})
            if api.name == "responses":
                return JSONResponse({"id": "resp_1", "object": "response", "status": "completed", "output": []})
            return JSONResponse({"content": "ok", "stop": True, "choices": [{"index": 0, "text": "ok",
                                                                             "finish_reason": "stop"}]})
        events: list[Any]
        if api.name == "messages":
            events = [{"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                             "content": [], "usage": {"input_tokens": 1}}},
                      {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
                      {"type": "message_stop"}]
        elif api.name == "responses":
            events = [{"type": "response.completed", "response": {"id": "resp_1", "object": "response",
                                                                  "status": "completed", "output": []}}]
        else:
            events = [{"id": "c1", "object": "text_completion", "content": "ok", "stop": True,
                       "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]}, "[DONE]"]
        data = "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events)
        return Response(data.encode(), media_type="text/event-stream")


def fake_prompt(path: str, body: dict) -> int:
    """The prompt tokens the fake engine holds for ``body`` (what squad serve counts on it, or less)."""
    api = apis.ROUTES.get(path)
    name = api.name if api else {"/v1/responses/input_tokens": "responses"}.get(path, "messages")
    if name == "chat":
        return count_tokens(body["messages"], body.get("tools"))
    if name == "completion":
        prompt = body.get("prompt", "")
        return len(prompt) if isinstance(prompt, list) else _words(prompt)
    if name == "embeddings":
        texts = body.get("input")
        return sum(_words(t) for t in (texts if isinstance(texts, list) else [texts]))
    if name == "rerank":
        return sum(_words(body["query"]) + _words(d) for d in body["documents"])
    if name == "infill":
        return sum(_words(body.get(k) or "") for k in ("input_prefix", "input_suffix", "prompt")) + sum(
            _words(c["text"]) for c in body.get("input_extra") or [])
    return _words({k: v for k, v in body.items() if k in ("input", "instructions", "messages", "system", "tools")})


def engine_reads(path: str, body: dict) -> tuple[float, Any, int]:
    """``(generation limit, completions per prompt, prompts)`` as llama-server b11434 reads ``body``
    at ``path`` (``server-schema.cpp``, ``server-chat.cpp``): the oracle the property checks against."""
    name = apis.ROUTES[path].name
    if name in ("embeddings", "rerank"):
        return 0, 1, 1
    if name == "messages":  # server_chat_convert_anthropic_to_oai: only max_tokens, 4096 when absent
        read = {"max_tokens": body["max_tokens"] if "max_tokens" in body else 4096}
    elif name == "responses":  # the whole body, max_output_tokens -> max_tokens
        read = dict(body)
        if "max_output_tokens" in body:
            read["max_tokens"] = body["max_output_tokens"]
    else:
        read = body
    limit: float = INF  # no field, or -1: the server's -n, -1: until the context is full
    for name_ in ("n_predict", "max_completion_tokens", "max_tokens"):
        if read.get(name_) is not None:
            limit = INF if read[name_] == -1 else read[name_]
            break
    n = 1
    if name != "messages":
        for name_ in ("n_cmpl", "n"):
            if read.get(name_) is not None:
                n = read[name_]
                break
    prompt = body.get("prompt")
    prompts = len(prompt) if name == "completion" and isinstance(prompt, list) and prompt and not all(
        isinstance(t, int) for t in prompt) else 1
    return limit, n, prompts


@dataclass
class Harness:
    """squad serve's gateway on the fake (:class:`AllApis`), called in-process (no HTTP) from sync tests
    through a portal; ``reserved``: the tokens of every reservation made."""

    portal: BlockingPortal
    gateway: Any
    fe: AllApis
    client: httpx.AsyncClient
    reserved: list[int] = field(default_factory=list)

    def post(self, path: str, body: Any = None, *, content: bytes | None = None,
             headers: dict[str, str] | None = None) -> httpx.Response:
        async def go() -> httpx.Response:
            if content is not None:
                return await self.client.post(path, content=content, headers=headers)
            return await self.client.post(path, json=body, headers=headers)
        return self.portal.call(go)

    def idle(self) -> bool:
        """Nothing reserved, in flight or queued once the request ended (waits for a release in progress)."""
        async def settled() -> bool:
            adm = self.gateway.admission
            with anyio.move_on_after(5):
                while adm.reserved or adm.in_flight or adm.queued:
                    await anyio.sleep(0.005)
            return not (adm.reserved or adm.in_flight or adm.queued)
        return self.portal.call(settled)


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(AllApis(slots=2, n_ctx=4096)) as fe:
        spec = EngineSpec(url=fe.base_url, api_key=fe.api_key)
        # a small default, so that the fake generates little for bodies without a limit
        with portal.wrap_async_context_manager(serving(spec, port=0, api_key=KEY, default_max_tokens=24)) as served:
            client = httpx.AsyncClient(transport=httpx.ASGITransport(app=served.gateway), base_url="http://serve",
                                       timeout=30, headers={"Authorization": f"Bearer {KEY}"})
            h = Harness(portal, served.gateway, fe, client)
            admission = served.gateway.admission
            reserve = admission.reserve

            def recorded(tokens: int, **kw: Any) -> Any:
                h.reserved.append(tokens)
                return reserve(tokens, **kw)

            admission.reserve = recorded
            yield h
            portal.call(client.aclose)


# -- I1: the engine is never asked for more than was reserved ----------------------------------------

LIMIT_VALUES = st.one_of(st.none(), st.sampled_from([-1, 0, 1, 8, 64, 5000, 2**31 - 1, 2**40]),
                         st.integers(-3, 40), st.sampled_from(["8", 8.5, True, [], {}]))
COUNT_VALUES = st.one_of(st.none(), st.integers(-1, 4), st.sampled_from(["2", 2.0, True]))
ENGINE_FIELDS = {  # every field llama-server b11434 reads that changes how much it generates or holds
    "n_predict": LIMIT_VALUES, "max_tokens": LIMIT_VALUES, "max_completion_tokens": LIMIT_VALUES,
    "max_output_tokens": LIMIT_VALUES, "n": COUNT_VALUES, "n_cmpl": COUNT_VALUES,
    "ignore_eos": st.booleans(), "id_slot": st.integers(-1, 5), "n_keep": st.integers(-1, 100),
    "n_discard": st.integers(0, 100), "t_max_predict_ms": st.integers(-1, 10), "n_indent": st.integers(0, 4),
    "cache_prompt": st.booleans(), "n_probs": st.integers(0, 30), "stream": st.booleans(),
    "logit_bias": st.just({"2": False}), "samplers": st.just(["top_k"]), "reasoning_budget_tokens": st.integers(-1, 9),
    "thinking": st.just({"type": "enabled", "budget_tokens": 5000}), "stop": st.just(["zz"]),
}
BASES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "say one two three"}]},
    "/chat/completions": {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "x y"}]},
    "/v1/completions": {"prompt": "one two three"},
    "/completion": {"prompt": "one two"},
    "/completions": {"prompt": [1, 2, 3]},
    "/v1/responses": {"input": "say something"},
    "/v1/messages": {"messages": [{"role": "user", "content": "hello there"}]},
    "/infill": {"input_prefix": "def f(", "input_suffix": "):", "prompt": "x"},
    "/v1/embeddings": {"input": "embed me"},
    "/v1/rerank": {"query": "q", "documents": ["a b", "c"]},
}
EXTRA = st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in ENGINE_FIELDS and k not in
                                                                         ("messages", "prompt", "input", "model")),
                        st.one_of(st.none(), st.integers(), st.text(max_size=5), st.booleans()), max_size=3)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, dict]:
    path = draw(st.sampled_from(sorted(BASES)))
    chosen = draw(st.lists(st.sampled_from(sorted(ENGINE_FIELDS)), unique=True, max_size=7))
    body = {**BASES[path], **{k: draw(ENGINE_FIELDS[k]) for k in chosen}}
    if path == "/v1/completions" and draw(st.booleans()):
        body["prompt"] = ["a b", "c d e"]
    return path, {**draw(EXTRA), **body}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(case=bodies())
def test_no_body_gets_the_engine_to_generate_or_hold_more_than_squad_reserved(harness: Harness, case):
    path, body = case
    harness.fe.seen.clear()
    harness.reserved.clear()
    got = harness.post(path, body)
    assert got.status_code < 500, got.text
    forwarded = list(harness.fe.seen)
    if got.status_code >= 400:
        assert forwarded == []  # refused before the engine
    held = 0
    for sent_to, sent in forwarded:
        limit, n, prompts = engine_reads(sent_to, sent)
        assert limit != INF and n == 1 and prompts == 1, (sent_to, sent)
        assert "id_slot" not in sent
        held += fake_prompt(sent_to, sent) + limit
    assert held <= sum(harness.reserved), (body, forwarded, harness.reserved)
    assert harness.idle()


def test_the_field_case_n_predict_minus_one_beside_max_tokens_is_sent_as_the_reserved_limit(harness: Harness):
    harness.fe.seen.clear()
    harness.reserved.clear()
    body = {**BASES["/v1/chat/completions"], "max_tokens": 8, "n_predict": -1, "ignore_eos": True, "n_cmpl": 1,
            "id_slot": 1, "max_completion_tokens": None}
    assert harness.post("/v1/chat/completions", body).status_code == 200
    [(_, sent)] = harness.fe.seen
    assert sent["n_predict"] == sent["max_tokens"] == sent["max_completion_tokens"] == 8
    assert "n_cmpl" not in sent and "id_slot" not in sent
    assert harness.reserved == [count_tokens(body["messages"]) + 8]
    harness.fe.seen.clear()
    many = harness.post("/v1/chat/completions", {**BASES["/v1/chat/completions"], "max_tokens": 4, "n_cmpl": 3})
    assert many.status_code == 200 and len(many.json()["choices"]) == 3  # n_cmpl is n: one reservation each
    assert len(harness.fe.seen) == 3 and all("n_cmpl" not in b and "n" not in b for _, b in harness.fe.seen)


# -- I4: every bad request gets a 4xx in its API's own shape, and the books stay as they were -------------

JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                                 st.text(max_size=6)),
                       lambda inner: st.one_of(st.lists(inner, max_size=3),
                                               st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                       max_leaves=8)
FIELDS = ["messages", "prompt", "input", "tools", "tool_choice", "content", "role", "stream", "max_tokens",
          "n_predict", "n", "stop", "system", "instructions", "input_prefix", "input_suffix", "input_extra",
          "query", "documents", "response_format", "logprobs", "top_logprobs", "stop_sequences"]


@st.composite
def malformed(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(sorted(BASES)))
    how = draw(st.sampled_from(["field", "message", "raw", "type"]))
    body: Any = dict(BASES[path])
    if how == "field":
        body[draw(st.sampled_from(FIELDS))] = draw(JSONISH)
    elif how == "message":
        key = "messages" if "messages" in body else "input" if "input" in body else "prompt"
        body[key] = [draw(JSONISH), *draw(st.lists(st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "tool", "x", 3]), "content": JSONISH}), max_size=2))]
    elif how == "type":
        body = draw(JSONISH)
    else:
        return path, draw(st.sampled_from([b"", b"{", b"nul", b"[1,2]", b'{"a":NaN}', b"\xff\xfe{}", b"{} x",
                                           b'{"messages": "\\ud800"}'])) + draw(st.binary(max_size=4))
    return path, json.dumps(body).encode()


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(case=malformed())
def test_malformed_bodies_get_a_4xx_in_their_apis_shape_and_leave_the_books_unchanged(harness: Harness, case):
    path, content = case
    got = harness.post(path, content=content, headers={"content-type": "application/json"})
    assert got.status_code < 500, (path, content, got.text)
    if got.status_code >= 400:
        error = got.json()
        if path == "/v1/messages":
            assert error["type"] == "error" and isinstance(error["error"]["message"], str), error
        else:
            assert isinstance(error["error"]["message"], str), error
    assert harness.idle()


def test_the_issues_bad_bodies_each_get_a_400_naming_the_field(harness: Harness):
    deep = b"[" * 100_000 + b"]" * 100_000
    cases = [("/v1/chat/completions", b'{"messages": ' + deep + b"}", "nested deeper"),
             ("/v1/chat/completions", json.dumps({"messages": [42]}).encode(), "messages[0]"),
             ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": "f"})
              .encode(), "'tools'"),
             ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [
                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}).encode(), "--mmproj"),
             ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [
                 {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]}).encode(), "text only"),
             ("/v1/messages", json.dumps({"messages": [{"role": "user", "content": [
                 {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}],
                 "max_tokens": 5}).encode(), "--mmproj"),
             ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}],
                                                  "n_probs": 49152}).encode(), "at most 20")]
    for path, content, words in cases:
        got = harness.post(path, content=content)
        assert got.status_code == 400, (path, got.text)
        message = got.json()["error"]["message"]
        assert words in message, message
        if path == "/v1/messages":
            assert got.json()["type"] == "error" and got.json()["error"]["type"] == "invalid_request_error"
    assert harness.idle()
    assert MAX_DEPTH < 1000  # deeper than this is refused before any walk over the body recurses


# -- bodies bounded in size and time; a large body holds up no one -------------------------------------

async def test_a_body_over_the_limit_is_413_in_the_apis_shape_before_it_is_read_and_a_slow_one_408():
    async with AllApis(slots=1) as fe:
        async with serving(EngineSpec(url=fe.base_url), port=0, api_key=KEY, max_body=1000,
                           body_timeout=0.5) as served:
            headers = {"Authorization": f"Bearer {KEY}"}
            async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=30) as client:
                big = {"messages": [{"role": "user", "content": "x " * 1000}]}
                got = await client.post("/v1/chat/completions", json=big)
                assert got.status_code == 413 and "1,000 bytes" in got.json()["error"]["message"]
                got = await client.post("/v1/messages", json={**big, "max_tokens": 5})
                assert got.status_code == 413 and got.json()["error"]["type"] == "request_too_large"
                huge = json.dumps({"messages": [{"role": "user", "content": "x " * 4_000_000}]}).encode()
                got = await client.post("/v1/chat/completions", content=huge)  # still sending when refused:
                assert got.status_code == 413  # the rest is read and dropped, so the client reads its answer

                async def chunked():  # no Content-Length: counted as it streams
                    for _ in range(20):
                        yield b"x" * 100

                got = await client.post("/v1/chat/completions", content=chunked())
                assert got.status_code == 413

                async def slow():
                    yield b'{"messages": '
                    await anyio.sleep(1.5)
                    yield b"[]}"

                got = await client.post("/v1/chat/completions", content=slow())
                assert got.status_code == 408 and "0.5 s" in got.json()["error"]["message"]
            assert fe.seen == []


async def test_a_large_body_being_read_and_counted_holds_up_no_other_client(monkeypatch):
    """The large body's count is held (a blocking wait in the counting thread) until the small request
    is answered: were it counted on the event loop, the small one could never be answered."""
    import squad.chat.counting as counting

    release = threading.Event()
    counted_big = threading.Event()
    original = counting.PromptCounter._keyed

    def keyed(self, messages, tools):
        if len(json.dumps(messages)) > 100_000:
            counted_big.set()
            assert release.wait(30), "the small request was never answered"
        return original(self, messages, tools)

    monkeypatch.setattr(counting.PromptCounter, "_keyed", keyed)
    order: list[str] = []
    async with AllApis(slots=2) as fe:
        async with serving(EngineSpec(url=fe.base_url), port=0, api_key=KEY) as served:
            headers = {"Authorization": f"Bearer {KEY}"}
            async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=60) as client:
                large = {"messages": [{"role": "user", "content": "word " * 40_000}], "max_tokens": 4}

                async def big() -> None:
                    got = await client.post("/v1/chat/completions", json=large)
                    order.append(f"big {got.status_code}")

                async def small() -> None:
                    await anyio.to_thread.run_sync(counted_big.wait, 30)
                    got = await client.post("/v1/chat/completions", json={**BASES["/v1/chat/completions"],
                                                                          "max_tokens": 3})
                    order.append(f"small {got.status_code}")
                    release.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(big)
                    tg.start_soon(small)
    assert order[0] == "small 200" and order[1].startswith("big ")


async def test_a_prompt_that_cannot_fit_by_its_length_alone_is_refused_before_it_is_tokenized(monkeypatch):
    import squad.chat.counting as counting

    def keyed(self, messages, tools):
        raise AssertionError("counted")

    monkeypatch.setattr(counting.PromptCounter, "_keyed", keyed)
    async with AllApis(slots=2, n_ctx=4096) as fe:
        async with serving(EngineSpec(url=fe.base_url), port=0, api_key=KEY) as served:
            async with httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {KEY}"},
                                         timeout=60) as client:
                body = {"messages": [{"role": "user", "content": "x" * (4097 * 256)}]}  # >= 4,097 tokens
                got = await client.post("/v1/chat/completions", json=body)
                assert got.status_code == 400 and "at least 4,097 tokens" in got.json()["error"]["message"]
                got = await client.post("/v1/messages", json={**body, "max_tokens": 3})
                assert got.status_code == 400 and got.json()["type"] == "error"
    assert fe.seen == [] and fe.count_requests == 0


# -- /infill and /rerank are admitted -------------------------------------------------------------------

def test_infill_and_rerank_are_counted_reserved_and_rewritten(harness: Harness):
    harness.fe.seen.clear()
    harness.reserved.clear()
    infill = {"input_prefix": "def add(a, b):", "input_suffix": "return c", "n_predict": -1,
              "input_extra": [{"filename": "x.py", "text": "import os"}], "ignore_eos": True}
    assert harness.post("/infill", infill).status_code == 200
    [(path, sent)] = harness.fe.seen
    assert path == "/infill" and sent["n_predict"] == sent["max_tokens"] == harness.gateway.default_max_tokens
    assert harness.reserved[0] >= fake_prompt("/infill", infill) + harness.gateway.default_max_tokens
    harness.fe.seen.clear()
    for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        assert harness.post(path, {"query": "q", "documents": ["a", "b c"], "n_predict": 99}).status_code == 200
    assert [p for p, _ in harness.fe.seen] == ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"]
    assert all("n_predict" not in b for _, b in harness.fe.seen)
    for bad in ({"documents": ["a"]}, {"query": "q", "documents": []}, {"query": "q", "documents": [1]}):
        assert harness.post("/v1/rerank", bad).status_code == 400
    assert harness.post("/infill", {"input_prefix": "x"}).status_code == 400
    assert harness.idle()


def test_every_admitted_path_has_one_api_module():
    assert {api.name for api in apis.APIS} == {"chat", "completion", "responses", "messages", "embeddings",
                                                 "infill", "rerank"}
    paths = [p for api in apis.APIS for p in api.paths]
    assert len(paths) == len(set(paths)) and set(paths) == set(apis.ROUTES)
    with contextlib.suppress(ImportError):
        import squad.serve.gateway as gateway
        assert gateway.GENERATION is apis.ROUTES
