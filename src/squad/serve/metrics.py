"""squad serve's own Prometheus metrics, on ``GET /squad/metrics`` (behind the serve key, as every ``/squad``
route; ``/metrics`` stays the engine's own, passed through).

Counted as requests move through serve's :class:`~squad.serve.status.Ledger` (this module listens to it), each by
``api`` (``chat``, ``completion``, ``responses``, ``messages``, ...) and ``client`` (as ``/squad/status`` names it;
past :data:`~squad.serve.status.MAX_CLIENTS` names, ``(other)``):

- ``squad_serve_requests_total``: received (body read and parsed);
- ``squad_serve_admitted_total``: given a slot and pool room by admission;
- ``squad_serve_refused_total``: answered by squad serve itself with an error (it can never fit, a bad body);
- ``squad_serve_left_total{state}``: the client disconnected first, while ``counting``, ``queued`` or ``running``;
- ``squad_serve_completed_total`` / ``squad_serve_failed_total``: the engine's answer relayed to its end / an
  engine error or a broken connection;
- ``squad_serve_queue_wait_seconds``: a histogram of the seconds each admitted request waited in the queue.

Read at each scrape: ``squad_serve_slots`` and ``squad_serve_slots_busy``; ``squad_serve_queued`` and
``squad_serve_running``; the pool in KV cells: ``squad_serve_pool_tokens`` (the engine's whole pool),
``squad_serve_pool_reserved_tokens`` (what admission reserved for the requests it holds) and
``squad_serve_pool_engine_used_tokens`` (what the engine's busy slots hold now: each one's prompt plus the tokens it
generated so far, from llama-server's ``/slots``; absent when the engine has no ``/slots``); ``squad_serve_engine_up``
and ``squad_serve_engine_restarts_total`` (deaths of a launched engine that squad serve restarted or tried to,
:mod:`squad.serve.keeper`); ``squad_serve_info{version, engine, model}``.

Each gateway has its own :class:`prometheus_client.CollectorRegistry` (not the process-wide default one): two squad
serves in one process, as in the tests, count apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from squad.serve.status import MAX_CLIENTS, OTHER_CLIENTS, Live, Outcome, State

if TYPE_CHECKING:
    from squad.engine.info import EngineInfo
    from squad.sched.admission import Admission
    from squad.serve.http import Send
    from squad.serve.keeper import EngineKeeper
    from squad.serve.status import Ledger

__all__ = ["ServeMetrics", "METRICS_PATH", "QUEUE_WAIT_BUCKETS", "Metered", "engine_used"]

METRICS_PATH = "/squad/metrics"
QUEUE_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Seconds: from a request that found a free slot at once to one that waited out a client's 10-minute timeout."""
SLOTS_TIMEOUT_S = 2.0
"""Seconds a scrape waits for the engine's ``/slots`` (then the engine-used gauge is left out)."""
_LABELS = ("api", "client")


class Metered(Protocol):
    """What the metrics read of squad serve's gateway (:class:`squad.serve.gateway.Gateway` is one)."""

    ledger: Ledger
    keeper: EngineKeeper | None

    @property
    def admission(self) -> Admission: ...

    @property
    def engine(self) -> EngineInfo: ...

    @property
    def upstream(self) -> httpx.AsyncClient: ...

    def engine_state(self) -> tuple[str, str]: ...


class ServeMetrics:
    """The metrics of one gateway: listens to its ledger from construction on; :meth:`answer` serves a scrape."""

    def __init__(self, gateway: Metered, *, version: str = "") -> None:
        self.gateway, self.version = gateway, version
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("squad_serve_requests", "Generation requests received", _LABELS, registry=r)
        self.admitted = Counter("squad_serve_admitted", "Requests admitted (a slot and pool room)", _LABELS,
                                registry=r)
        self.refused = Counter("squad_serve_refused", "Requests squad serve answered with an error itself "
                               "(can never fit, a bad body)", _LABELS, registry=r)
        self.left = Counter("squad_serve_left", "Requests whose client disconnected first, by where they were",
                            (*_LABELS, "state"), registry=r)
        self.completed = Counter("squad_serve_completed", "Requests whose answer was relayed to its end", _LABELS,
                                 registry=r)
        self.failed = Counter("squad_serve_failed", "Requests the engine answered with an error or broke off",
                              _LABELS, registry=r)
        self.queue_wait = Histogram("squad_serve_queue_wait_seconds", "Seconds an admitted request waited in the "
                                    "queue", _LABELS, buckets=QUEUE_WAIT_BUCKETS, registry=r)
        self.engine_used_tokens: int | None = None
        """The engine's busy slots' tokens at the last scrape (None: not read)."""
        self._clients: set[str] = set()
        r.register(_Now(self))
        gateway.ledger.listeners.append(self)

    def _labels(self, live: Live) -> tuple[str, str]:
        client = live.client
        if client not in self._clients:  # a client names itself: the label set must not grow without bound
            if len(self._clients) >= MAX_CLIENTS:
                client = OTHER_CLIENTS
            else:
                self._clients.add(client)
        return live.api or "-", client

    # -- the ledger's listener (squad.serve.status.LedgerListener) ----------------------------------

    def opened(self, live: Live) -> None:
        self.requests.labels(*self._labels(live)).inc()

    def moved(self, live: Live, before: State) -> None:
        if live.state == "running" and before == "queued":
            labels = self._labels(live)
            self.admitted.labels(*labels).inc()
            if live.queued_s is not None:
                self.queue_wait.labels(*labels).observe(live.queued_s)

    def closed(self, live: Live, before: State, outcome: Outcome) -> None:
        labels = self._labels(live)
        if outcome == "disconnected":
            self.left.labels(*labels, before).inc()
        else:
            {"completed": self.completed, "refused": self.refused, "failed": self.failed}[outcome].labels(
                *labels).inc()

    # -- a scrape -------------------------------------------------------------------------------------

    async def answer(self, send: Send) -> None:
        """Serve one scrape: the engine's ``/slots`` read (at most :data:`SLOTS_TIMEOUT_S`), then every metric in
        Prometheus' text format."""
        self.engine_used_tokens = await engine_used(self.gateway.upstream) if self._engine_up() else None
        data = generate_latest(self.registry)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode()),
                                (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    def _engine_up(self) -> bool:
        return self.gateway.engine_state()[0] == "up"


async def engine_used(client: httpx.AsyncClient) -> int | None:
    """KV cells the engine's busy slots hold now: per slot ``is_processing``, its ``n_prompt_tokens`` plus
    ``next_token[0].n_decoded`` (llama-server's ``/slots``); None when the engine has no ``/slots``, refuses it,
    or does not answer within :data:`SLOTS_TIMEOUT_S`."""
    try:
        r = await client.get("/slots", timeout=SLOTS_TIMEOUT_S)
        slots = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(slots, list):
        return None
    used = 0
    for slot in slots:
        if not isinstance(slot, dict) or not slot.get("is_processing"):
            continue
        used += _whole(slot.get("n_prompt_tokens"))
        nexts = slot.get("next_token")
        if isinstance(nexts, list) and nexts and isinstance(nexts[0], dict):
            used += _whole(nexts[0].get("n_decoded"))
    return used


def _whole(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class _Now(Collector):
    """The gauges read at each scrape from admission, the ledger and the keeper."""

    def __init__(self, metrics: ServeMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        g = m.gateway
        admission, info = g.admission, g.engine
        rows = list(g.ledger.live.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=value)

        yield gauge("squad_serve_slots", "Slots admission gives out (the engine's parallel slots)", admission.slots)
        yield gauge("squad_serve_slots_busy", "Slots held by admitted requests", admission.in_flight)
        yield gauge("squad_serve_queued", "Requests waiting in admission's queue",
                    sum(1 for r in rows if r.state == "queued"))
        yield gauge("squad_serve_running", "Requests admitted and running",
                    sum(1 for r in rows if r.state == "running"))
        yield gauge("squad_serve_pool_tokens", "The engine's KV pool, in tokens", admission.pool)
        yield gauge("squad_serve_pool_reserved_tokens", "KV tokens admission reserved for the requests it holds",
                    admission.reserved)
        if m.engine_used_tokens is not None:
            yield gauge("squad_serve_pool_engine_used_tokens", "KV tokens the engine's busy slots hold (prompt + "
                        "generated, from its /slots)", m.engine_used_tokens)
        yield gauge("squad_serve_engine_up", "1 while the engine is up, 0 while it restarts or is down",
                    1 if g.engine_state()[0] == "up" else 0)
        restarts = CounterMetricFamily("squad_serve_engine_restarts", "Deaths of the launched engine that squad "
                                       "serve restarted (or tried to)")
        restarts.add_metric([], len(g.keeper.restarts) if g.keeper is not None else 0)
        yield restarts
        about = InfoMetricFamily("squad_serve", "squad serve and its engine")
        about.add_metric([], {"version": m.version, "engine": info.kind,
                              "model": info.model_alias or (info.model_path or "").rsplit("/", 1)[-1]})
        yield about
