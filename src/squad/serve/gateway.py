"""The ASGI app of ``squad serve``: an OpenAI-compatible endpoint in front of one llama-server
that admits every generation request through squad's :class:`~squad.sched.admission.Admission`.

Routes (all but ``/health`` need ``Authorization: Bearer <key>``, or ``X-Api-Key: <key>``):

- generation, admitted: ``POST /v1/chat/completions``, ``/v1/completions`` (and the
  unprefixed ``/chat/completions``, ``/completions``, llama-server's ``/completion``),
  ``/v1/responses``, ``/v1/messages``, ``/v1/embeddings``, ``/infill`` and ``/v1/rerank`` (and
  ``/rerank``, ``/reranking``, ``/v1/reranking``): one module per API in :mod:`squad.serve.apis`
  (its paths, its shape check, its count, its generation limit, its error shape); tool
  choice and schemas rewritten as the engine honours them, :mod:`squad.serve.forcing`; a list of
  prompts or ``n`` > 1 is one reservation per completion (:mod:`squad.serve.fanout`);
- ``OPTIONS`` (CORS, :mod:`squad.serve.cors`); passed through as they are: ``GET /health`` (no key), ``/props``,
  ``/slots``, ``/metrics``, ``/v1/models``; ``POST /tokenize``, ``/detokenize``, ``/apply-template``,
  ``/v1/chat/completions/input_tokens``, ``/v1/responses/input_tokens``, ``/v1/messages/count_tokens``;
- ``GET /squad/status`` (JSON: slots, pool, queue, clients, recent requests), ``/squad/metrics`` (Prometheus,
  :mod:`squad.serve.metrics`), ``/squad/`` (the live page, :mod:`squad.serve.page`).

One generation request: its body read (at most ``max_body`` bytes, 413; within ``body_timeout``
seconds, 408) and parsed (off the event loop when large, :mod:`squad.serve.http`), its shape checked
(400 in the API's own error shape), count the prompt (:mod:`squad.serve.demand`), reserve
``prompt + max_tokens`` and write exactly that limit into the body sent (queue order: the policy,
``X-Squad-Priority`` first, lower first, default 0), send it to the engine, relay the answer chunk
by chunk as it arrives, release when it ends. A client that disconnects, queued or streaming, is
noticed at once (the ASGI ``receive`` is watched): it leaves the queue, or its upstream connection is
closed so llama-server stops the task, and its reservation is released once the engine's ``/slots``
shows the slot free (:func:`squad.chat.settle.until_engine_free`: the engine notices a closed
connection of a request it does not stream only at its next look, every 1 s). Every response carries
``X-Squad-Serve: <version>`` so squad's own client knows not to admit again. The request itself is
:class:`squad.serve.relay.Relay`; ASGI plumbing is :mod:`squad.serve.http`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import secrets
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio
import httpx

from squad._version import __version__
from squad.chat.client import KEEPALIVE_S  # below cpp-httplib's 5 s keep-alive
from squad.chat.settle import Ending, EngineSlots, until_engine_free
from squad.chat.stream import Loading
from squad.errors import EngineError, EngineGone, UserError
from squad.events import Event, EventSink, emit_to
from squad.sched.admission import Admission, Reservation
from squad.sched.policy import DEFAULT_QUEUE, QUEUE_POLICIES, QueuePolicy
from squad.serve import apis, page
from squad.serve.apis import Api
from squad.serve.cors import Cors
from squad.serve.demand import Kind, Refused, error_body
from squad.serve.ending import end_request, refusal
from squad.serve.http import (
    BODY_TIMEOUT,
    CLIENT_HEADER,
    MAX_BODY,
    OFF_LOOP_BYTES,
    PRIORITY_HEADER,
    SERVE_HEADER,
    Receive,
    Send,
    client_name,
    drain,
    header,
    parse_body,
    priority_of,
    read_body,
    relayed,
    send_json,
    shaped,
)
from squad.serve.keeper import EngineKeeper
from squad.serve.metrics import METRICS_PATH, ServeMetrics
from squad.serve.programs import Programs, program_of
from squad.serve.relay import Relay
from squad.serve.shares import ClientLimit, ClientQueue
from squad.serve.status import Ledger, Live
from squad.serve.watch import waits_for

if TYPE_CHECKING:
    from squad.chat.counting import PromptCounter
    from squad.engine.info import EngineInfo
    from squad.engine.session import EngineSession

__all__ = ["Gateway", "SERVE_HEADER", "PRIORITY_HEADER", "CLIENT_HEADER", "DEFAULT_MAX_TOKENS", "STATUS_PATH"]

STATUS_PATH = "/squad/status"
DEFAULT_MAX_TOKENS = 1024
"""Tokens reserved for (and generated at most by) a request that gives no max_tokens."""
HEALTH_TIMEOUT_S = 10.0
"""Seconds ``/health`` waits for the engine's: an engine that does not answer (stopped with SIGSTOP, hung; its
process alive, so nothing restarts it) is reported 503 ``unresponsive`` instead of holding the probe for the
request timeout."""
UPSTREAM_SHARDS = 8
"""HTTP clients to the engine that generation requests take in turn. httpcore's pool looks at
every connection it holds each time a request starts or ends (quadratic in the streams): 640
streams 64 at a time made 2.7 million such checks on one pool, 0.2 million over 8 (cProfile)."""

GENERATION: dict[str, Api] = apis.ROUTES
_log = logging.getLogger("squad.serve")
PASS_GET = ("/health", "/props", "/slots", "/metrics", "/v1/models", "/models")
PASS_POST = ("/tokenize", "/detokenize", "/apply-template", "/v1/chat/completions/input_tokens", *apis.PASS_POST)


class Gateway:
    """The ASGI app (``await gateway(scope, receive, send)``) for one engine session.

    - ``session``: an open :class:`~squad.engine.session.EngineSession` whose admission admits here;
    - ``api_key``: the key clients must send (``secrets.token_urlsafe(24)`` when None: read it
      back from :attr:`api_key`);
    - ``default_max_tokens``: what a request without max_tokens reserves and may generate;
    - ``request_timeout``: seconds one upstream request may take;
    - ``on_event``: receives ``call.first_token``/``call.finished``/``call.failed`` (admission's
      own events reach the session's sinks);
    - ``max_body``: bytes a request body may have (413 beyond); ``body_timeout``: seconds it may take
      to arrive (408 after);
    - ``client_limits``: caps per client (``--client-limit``, :mod:`squad.serve.shares`);
      ``max_queue_wait``: seconds a request may wait in the queue before it gets 503 with ``Retry-After``
      (``--max-queue-wait``; None: no limit).

    Raises :class:`~squad.errors.UserError` for a session without admission (its engine admits
    on its own: another squad serve).
    """

    def __init__(self, session: EngineSession, *, api_key: str | None = None,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS, request_timeout: float = 600.0,
                 on_event: EventSink | None = None, version: str = "", cors_origins: tuple[str, ...] = (),
                 client_keys: dict[str, str] | None = None, max_body: int = MAX_BODY,
                 body_timeout: float = BODY_TIMEOUT, client_limits: dict[str, ClientLimit] | None = None,
                 max_queue_wait: float | None = None) -> None:
        if session.admission is None:
            raise UserError(f"the engine at {session.info.base_url} admits on its own (it is a squad serve "
                            "endpoint already): point clients at it directly")
        self.session = session
        self.api_key = api_key or secrets.token_urlsafe(24)
        self.default_max_tokens = default_max_tokens
        self.request_timeout = request_timeout
        self.max_body, self.body_timeout = max_body, body_timeout
        self.ledger = Ledger()
        self.replans: list[dict[str, Any]] = []
        """Each reload :mod:`squad.serve.replan` made: when, from/to slots and context, the reason."""
        self.reloading = False
        self._sinks = [on_event] if on_event is not None else []
        self._ids = itertools.count(1)
        self._version = (version or __version__).encode()
        self._pools: list[httpx.AsyncClient] = []
        self._pools_for: tuple[str, str | None] | None = None
        self._retired: list[httpx.AsyncClient] = []
        self._turn = itertools.count()
        self._key = self.api_key.encode()
        self.slots = EngineSlots(lambda: self.upstream)
        """The engine's ``/slots``, read to release a request that ended on squad's side only once the
        engine's slot is free (:func:`squad.chat.settle.until_engine_free`)."""
        self._labels = [(label, key.encode()) for label, key in (client_keys or {}).items()]
        """More keys, each naming its client (``--client-key NAME=KEY``)."""
        self.cors = Cors(cors_origins)
        self.keeper: EngineKeeper | None = None
        """Restarts a launched engine that dies (:mod:`squad.serve.keeper`); None: an engine squad serve does not
        own (attached), or one whose death is not its to mend."""
        self.stopping: str | None = None
        """Why squad serve stops (set by :meth:`end_requests`): requests from then on get 503 with it."""
        self._requests: dict[str, anyio.CancelScope] = {}
        self.metrics = ServeMetrics(self, version=self._version.decode())
        """squad serve's own Prometheus metrics, on ``/squad/metrics`` (:mod:`squad.serve.metrics`)."""
        self.programs = Programs()
        """The programs seen lately (:mod:`squad.serve.programs`)."""
        self.max_queue_wait = max_queue_wait
        self.early_after: float | None = None
        """Seconds a stream waits before its answer starts early (None: :data:`squad.serve.early.EARLY_AFTER`)."""
        self.keepalive_every: float | None = None
        """Seconds between two keep-alives (None: :data:`squad.serve.early.KEEPALIVE_EVERY`)."""
        inner = self.admission.queue.name
        self.shares = ClientQueue(
            lambda: QUEUE_POLICIES[inner if inner in QUEUE_POLICIES else DEFAULT_QUEUE](), limits=client_limits)
        """The queue between clients (:mod:`squad.serve.shares`), each client's own ordered by squad's policy."""
        self._share_queue()

    def _share_queue(self) -> None:
        """Put :attr:`shares` in as the admission's queue (again after the engine was opened anew), while empty."""
        admission = self.admission
        if admission.queue is not self.shares and not len(admission.queue):  # type: ignore[arg-type]
            admission.queue = cast("QueuePolicy", self.shares)

    @property
    def pins(self) -> bool:
        """Whether requests are pinned (``id_slot``) to the slot admission granted: a llama-server squad serve
        launched (no one else sends it requests)."""
        return self.session.launcher is not None and self.engine.kind == "llama.cpp"

    # -- the engine ---------------------------------------------------------------------------

    @property
    def admission(self) -> Admission:
        admission = self.session.admission
        assert admission is not None
        return admission

    @property
    def engine(self) -> EngineInfo:
        return self.session.info

    @property
    def counter(self) -> PromptCounter:
        return self.session.chat.counter  # type: ignore[attr-defined]  # an EngineClient

    @property
    def upstream(self) -> httpx.AsyncClient:
        """The HTTP client to the engine (a new one after a reload moved it to a new URL or key)."""
        return self._shards()[0]

    def generation_upstream(self) -> httpx.AsyncClient:
        """The HTTP client one generation request goes through: the :data:`UPSTREAM_SHARDS`
        clients in turn."""
        shards = self._shards()
        return shards[next(self._turn) % len(shards)]

    def _shards(self) -> list[httpx.AsyncClient]:
        info = self.engine
        if not self._pools or self._pools_for != (info.base_url, info.api_key):
            self._retired.extend(self._pools)
            headers = {"Authorization": f"Bearer {info.api_key}"} if info.api_key else {}
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_S)
            self._pools = [httpx.AsyncClient(base_url=info.base_url, headers=headers, limits=limits,
                                             timeout=httpx.Timeout(self.request_timeout, connect=10.0))
                           for _ in range(UPSTREAM_SHARDS)]
            self._pools_for = (info.base_url, info.api_key)
        return self._pools

    async def aclose(self) -> None:
        """Close the connections to the engine (the engine stops what they asked)."""
        self.slots.close()
        with anyio.CancelScope(shield=True):
            for client in [*self._retired, *self._pools]:
                await client.aclose()
        self._pools, self._retired = [], []

    async def count(self, body: dict[str, Any], kind: Kind, big: bool = False, *, again: bool = True) -> int:
        """Prompt tokens of a request of ``kind`` as the engine counts them (each API's own count,
        :mod:`squad.serve.apis`; ``big``: counted off the event loop). While a dead engine restarts it waits for
        it, and counts ``again`` once when the engine died under the count. Raises :class:`Refused`: 400 for
        a prompt it cannot read (the model's template fails on it, or the engine says so), 503 while the
        engine loads, 502 when the engine does not answer."""
        if self.keeper is not None and not self.keeper.up:  # a request that arrives while the engine restarts
            await self.keeper.wait_up()
        try:
            return await apis.BY_NAME[kind].count(self, body, big)
        except Loading as exc:
            raise Refused(503, str(exc) or "Loading model", "unavailable_error") from exc
        except (EngineGone, EngineError) as exc:
            if again and isinstance(exc, EngineGone) and await self.engine_back():  # it died: restarted now
                return await self.count(body, kind, big, again=False)
            raise Refused(502, f"squad serve could not count the prompt: {exc}", "server_error") from exc
        except Refused:
            raise
        except Exception as exc:  # the model's own template (jinja2) raising on these messages
            raise Refused(400, f"the model's chat template cannot render this request: {type(exc).__name__}: "
                               f"{str(exc)[:300]}") from exc

    async def count_chat(self, messages: list[Any], tools: list[Any] | None, big: bool = False) -> int:
        """Prompt tokens of chat ``messages`` and ``tools`` (:mod:`squad.chat.counting`)."""
        return (await self.counter(messages, tools, in_thread=big))[0]

    async def engine_count(self, path: str, body: dict[str, Any]) -> int:
        """The engine's own count of ``body`` at its counting endpoint ``path``."""
        return await apis.engine_count(self.upstream, self.engine.base_url, path, body)

    async def count_text(self, prompt: Any, big: bool = False) -> int:
        """Prompt tokens of a text prompt or a list of token ids (a single-item list is its item; ``big``:
        counted off the event loop). Raises :class:`Refused` (400: neither; 503: the engine loads),
        :class:`EngineGone`, :class:`EngineError`."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return len(prompt)
        if not isinstance(prompt, str):
            raise Refused(400, f"prompt must be a text, a list of token ids, or a list of those, got "
                               f"{type(prompt).__name__}", param="prompt")
        await self.counter.prepare()
        local = self.counter.local
        if local is not None:  # + a BOS the engine may add: never reserve less than it uses
            if big or len(prompt) >= OFF_LOOP_BYTES:
                return await anyio.to_thread.run_sync(local.count_text, prompt) + 1
            return local.count_text(prompt) + 1
        return await self.engine.counting.text(self._post_tokenize, prompt, self.engine.model_alias)

    async def _post_tokenize(self, path: str, body: dict[str, Any]) -> Any:
        """POST a count request of the engine kind's counter (:attr:`EngineInfo.counting`): its JSON answer."""
        try:
            r = await self.upstream.post(path, json=body)
        except httpx.TransportError as exc:
            raise EngineGone(f"engine at {self.engine.base_url} is not answering ({exc!r})") from exc
        if r.status_code == 503:
            raise Refused(503, "Loading model", "unavailable_error")
        if r.status_code != 200:
            raise EngineError(f"{path} answered HTTP {r.status_code}: {r.text[:200]}")
        return r.json()

    @property
    def observed(self) -> bool:
        """Whether an event sink listens (else a relay builds no events)."""
        return bool(self._sinks)

    def emit(self, event: Event) -> None:
        emit_to(self._sinks, event)

    async def engine_back(self) -> bool:
        """After a request's connection to the engine failed: True when the engine had died and squad serve
        restarted it (the request may be sent again), False otherwise (:meth:`EngineKeeper.gone`)."""
        return self.keeper is not None and await self.keeper.gone()

    async def engine_answers(self) -> bool:
        """Whether the engine answers ``GET /health`` at all (any status, ``Loading model`` included) within
        :data:`HEALTH_TIMEOUT_S`: the keeper's probe for an engine that is stopped or hung
        (:class:`~squad.serve.keeper.EngineKeeper`). A refused connection counts as an answer: the process watch
        handles an engine that exited."""
        try:
            await self.upstream.get("/health", timeout=HEALTH_TIMEOUT_S)
        except httpx.TimeoutException:
            return False
        except httpx.HTTPError:
            return True
        return True

    async def engine_exited(self, settle: float = 0.5) -> bool:
        """Whether the engine squad serve launched has exited (its process ended within ``settle`` seconds of a
        broken answer; a process whose socket closed first takes a moment to end), or restarts already. False for
        an engine squad serve attached to (it cannot tell)."""
        return self.keeper is not None and await self.keeper.exited(settle)

    def engine_state(self) -> tuple[str, str]:
        """``(state, detail)``: ``up``, ``restarting`` or ``down`` (:mod:`squad.serve.keeper`), ``stopping``."""
        if self.stopping is not None:
            return "stopping", self.stopping
        if self.keeper is not None:
            return self.keeper.state, self.keeper.detail
        return "up", ""

    async def end_requests(self, why: str, *, grace: float = 2.0) -> None:
        """End every request squad serve holds, for ``why`` (squad serve stops): a queued or counting one gets 503,
        a running stream an error event, each in its API's shape (:mod:`squad.serve.ending`); new ones get 503.
        Waits up to ``grace`` seconds for their handlers to send that."""
        self.stopping = why
        self.slots.close()  # a reservation that settles waits for nothing: the engine stops with squad serve
        for scope in list(self._requests.values()):
            scope.cancel()
        with anyio.move_on_after(grace):
            while self._requests:
                await anyio.sleep(0.01)

    def until_engine_free(self, held: Reservation) -> AbstractAsyncContextManager[Ending]:
        """Wrap the engine round trip of an admitted request (``held``) with this:
        :func:`squad.chat.settle.until_engine_free` on this gateway's engine. A request that ends on
        squad's side before the engine's answer was read to its end (client gone, timeout, broken
        connection) stays reserved until the engine's ``/slots`` shows its slot free."""
        return until_engine_free(self.admission, held, self.slots, on_event=self.emit if self._sinks else None)

    # -- ASGI ------------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # no lifespan: the server closes the gateway itself
            return
        version, cors = self._version, self.cors.headers(scope)

        async def headed(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (SERVE_HEADER.encode(), version), *cors]
            await send(message)

        path, method = scope["path"], scope["method"]
        tagged = shaped(headed, GENERATION.get(path))  # every error in its API's own shape, never a raw 500
        if method == "OPTIONS":  # a CORS preflight carries no key (squad.serve.cors)
            status, headers, data = self.cors.preflight(scope)
            await send({"type": "http.response.start", "status": status,
                        "headers": [*headers, (b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data})
            return
        if path == "/health" and method == "GET":
            state, detail = self.engine_state()
            if state != "up":  # the engine restarts, is down, or squad serve stops (squad.serve.keeper)
                what = "Loading model: " if state == "restarting" else ""
                detail = re.sub(r",? log: \S+", "", detail)  # /health takes no key: no file paths (the log has them)
                await send_json(tagged, 503, {"status": state, **error_body(503, what + detail,
                                                                            "unavailable_error")})
                return
            await self._pass(scope, receive, tagged, timeout=HEALTH_TIMEOUT_S)
            return
        if path in page.PAGE_PATHS:  # the live page checks the key its own ways (squad.serve.page)
            await page.answer(scope, receive, tagged, keys=self.keys(), authorized=self._authorized(scope))
            return
        if not self._authorized(scope) and not page.cookie_authorizes(scope, self.keys()):
            await send_json(tagged, 401, error_body(401, "Invalid API Key: send the key squad serve printed, as "
                                                     "'Authorization: Bearer KEY'", "authentication_error"))
            return
        if path in GENERATION and method == "POST":
            try:
                await self._generate(scope, receive, tagged, GENERATION[path])
            except Exception as exc:  # noqa: BLE001  # a bug: logged; the client gets an error in its API's shape
                _log.exception("squad serve failed on %s", path)
                with contextlib.suppress(Exception):  # the answer may have started already
                    await send_json(tagged, 500, error_body(500, f"squad serve failed on this request "
                                                                 f"({type(exc).__name__}): please report it",
                                                            "server_error"))
        elif path == STATUS_PATH and method == "GET":
            await send_json(tagged, 200, self.status())
        elif path == METRICS_PATH and method == "GET":
            await self.metrics.answer(tagged)
        elif (path in PASS_GET and method == "GET") or (path in PASS_POST and method == "POST"):
            await self._pass(scope, receive, tagged)
        else:
            await send_json(tagged, 404, error_body(404, f"squad serve has no {method} {path}", "not_found_error"))

    def _authorized(self, scope: dict[str, Any]) -> bool:
        """Whether the request carries a key; a labelled key's name goes to ``scope["squad.key_label"]``."""
        for name, value in scope["headers"]:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                value = value[7:]
            elif name != b"x-api-key":
                continue
            value = value.strip()
            for label, key in self._labels:
                if secrets.compare_digest(value, key):
                    scope["squad.key_label"] = label
                    return True
            return secrets.compare_digest(value, self._key)
        return False

    def keys(self) -> list[bytes]:
        """Every key squad serve takes: its own and the labelled ones (``--client-key``)."""
        return [self._key, *(key for _, key in self._labels)]

    # -- /squad/status -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """``/squad/status``: the engine, admission's slots/pool/queue, the ledger (running and
        queued requests, per-client counts, peaks) and re-plans. Tokens are KV cells."""
        info, admission = self.engine, self.admission
        plan = self.session.plan
        ledger = self.ledger.view()
        for row in ledger["queued"]:  # what each waits for: a slot, pool room, its turn, a replan
            row["waits_for"] = waits_for(self, self.ledger.live[row["id"]])
        return {
            "squad_serve": self._version.decode(),
            "engine": {"url": info.base_url, "kind": info.kind,
                       "model": Path(info.model_path).name if info.model_path else info.model_alias or None,
                       "slots": info.slots, "n_ctx": info.n_ctx, "pool": info.pool,
                       "launched": self.session.launcher is not None,
                       "state": self.engine_state()[0], "state_detail": self.engine_state()[1],
                       "restarts": list(self.keeper.restarts) if self.keeper is not None else [],
                       "reasons": list(plan.reasons) if plan is not None else []},
            "admission": {"slots": admission.slots, "busy": admission.in_flight, "pool": admission.pool,
                          "reserved": admission.reserved, "settling": admission.settling, "limit": admission.limit,
                          "queued": len(admission.queued), "queue": admission.queue.name,
                          "max_queue_wait": self.max_queue_wait},
            "shares": self.shares.view(admission.pool),
            "programs": self.programs.view(),
            "default_max_tokens": self.default_max_tokens,
            "reloading": self.reloading,
            **ledger,
            "replans": self.replans,
        }

    # -- passthrough ------------------------------------------------------------------------------

    async def _pass(self, scope: dict[str, Any], receive: Receive, send: Send, *,
                    timeout: float | None = None) -> None:
        """Pass the request to the engine as it is (``timeout``: seconds, instead of the request timeout)."""
        try:
            body = await self._read(scope, receive) if scope["method"] == "POST" else b""
        except Refused as exc:
            await self._refuse_body(exc, receive, send)
            return
        headers = {"content-type": "application/json"} if body else {}
        params = scope.get("query_string", b"").decode() or None
        limit = httpx.USE_CLIENT_DEFAULT if timeout is None else httpx.Timeout(timeout)
        try:
            try:
                r = await self.upstream.request(scope["method"], scope["path"], content=body or None, headers=headers,
                                                params=params, timeout=limit)
            except httpx.TransportError as exc:  # once more: a pooled connection the engine had just closed
                if timeout is not None and isinstance(exc, httpx.TimeoutException):
                    raise
                r = await self.upstream.request(scope["method"], scope["path"], content=body or None, headers=headers,
                                                params=params, timeout=limit)
        except httpx.TransportError as exc:
            if timeout is not None and isinstance(exc, httpx.TimeoutException):
                # alive (else the keeper restarts it) but not answering: a probe learns it now, not in 600 s
                await send_json(send, 503, {"status": "unresponsive", **error_body(
                    503, f"the engine at {self.engine.base_url} did not answer {scope['path']} within {timeout:g} s "
                    "(its process is alive: stopped or hung?)", "unavailable_error")})
            elif self.reloading or self.session.launcher is not None and self.session.launcher.running is False:
                await send_json(send, 503, error_body(503, "Loading model", "unavailable_error"))
            else:
                await send_json(send, 502, error_body(502, f"the engine at {self.engine.base_url} is not answering",
                                                  "server_error"))
            return
        if r.status_code == 404 and scope["path"] == "/health":  # a kind with no /health (Ollama, LM Studio)
            await send_json(send, 200, {"status": "ok", "engine": self.engine.kind,
                                    "note": "the engine has no /health: squad serve answers for it"})
            return
        await send({"type": "http.response.start", "status": r.status_code, "headers": relayed(r.headers.raw)})
        await send({"type": "http.response.body", "body": r.content})

    # -- generation --------------------------------------------------------------------------------

    async def _read(self, scope: dict[str, Any], receive: Receive) -> bytes:
        """The request body, at most :attr:`max_body` bytes, within :attr:`body_timeout` seconds."""
        return await read_body(receive, limit=self.max_body, timeout=self.body_timeout,
                               declared=header(scope, b"content-length"))

    async def _refuse_body(self, exc: Refused, receive: Receive, send: Send) -> None:
        await send_json(send, exc.status, exc.body)
        if exc.status == 413:  # the client may still be sending: let it read the answer
            await drain(receive, self.body_timeout)

    async def _generate(self, scope: dict[str, Any], receive: Receive, send: Send, api: Api) -> None:
        state, detail = self.engine_state()
        if state in ("stopping", "down") and (self.stopping or self.keeper is None or self.keeper.gave_up):
            await send_json(send, 503, refusal(api.name, 503, detail))  # squad serve stops, or gave up on the engine
            return
        try:
            raw = await self._read(scope, receive)
        except Refused as exc:
            await self._refuse_body(exc, receive, send)
            return
        try:
            body = await parse_body(raw)  # off the event loop when large
            priority = priority_of(scope)
        except Refused as exc:
            await send_json(send, exc.status, exc.body)
            return
        if self.stopping is not None:  # it stopped while the body arrived
            await send_json(send, 503, refusal(api.name, 503, self.stopping))
            return
        live = Live(id=f"r{next(self._ids)}", client=client_name(scope, body), priority=priority,
                    stream=bool(body.get("stream")), api=api.name)
        self.ledger.open(live)
        relay = Relay(self, live, scope, body, raw, api)
        relay.program = program = program_of(scope, body, scope.get("squad.key_label") or live.client, live.id)
        if program.sub and header(scope, PRIORITY_HEADER.encode()) is None:
            live.priority = 1  # a sub-agent's request after its program's main thread
        self._share_queue()
        outcome = "failed"
        started = False

        async def ending(message: dict[str, Any]) -> None:  # a disconnect after the last byte is no disconnect
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                relay.finished = True
            await send(message)

        stopper = self._requests[live.id] = anyio.CancelScope()  # squad serve stops: end_requests()
        try:
            with stopper:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(relay.watch, receive, tg.cancel_scope)
                    outcome = await relay.run(ending)
                    tg.cancel_scope.cancel()
            if stopper.cancelled_caught and not relay.finished and not relay.disconnected:
                await end_request(send, api.name, stream=live.stream, started=started,
                                  message=self.stopping or "squad serve is stopping")
        finally:
            self._requests.pop(live.id, None)
            self.ledger.close(live, "disconnected" if relay.disconnected else outcome)  # type: ignore[arg-type]

