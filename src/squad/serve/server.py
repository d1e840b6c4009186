"""Run the gateway: an engine session (launched or attached) and uvicorn on one event loop.

``async with serving(spec, port=8090) as served:`` starts or attaches the engine
(:class:`~squad.engine.session.EngineSession`), binds ``host:port`` (127.0.0.1 by default), and serves
the :class:`~squad.serve.gateway.Gateway` until the block ends (``await served.wait()``: until
:meth:`Served.stop`, e.g. on a signal); then every open request ends with a 503 or a stream error event in its
API's shape (:mod:`squad.serve.ending`), uvicorn stops, and a launched engine is stopped. A launched engine that
dies meanwhile is restarted (:mod:`squad.serve.keeper`); one that cannot be kept up stops squad serve, and the block
raises :class:`~squad.errors.EngineError`.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from squad.engine.session import EngineSession
from squad.errors import EngineError, UserError
from squad.events import EventSink
from squad.serve.early import EARLY_AFTER
from squad.serve.gateway import DEFAULT_MAX_TOKENS, Gateway
from squad.serve.http import BODY_TIMEOUT, MAX_BODY
from squad.serve.keeper import HUNG_AFTER_S, MAX_RESTARTS, PROBE_S, RESTART_WINDOW_S, EngineKeeper
from squad.serve.replan import Replanner
from squad.serve.shares import ClientLimit

if TYPE_CHECKING:
    from squad.engine.session import EngineSpec

__all__ = ["Served", "serving", "bind", "HOST", "PORT", "SHUTDOWN_GRACE"]

HOST = "127.0.0.1"
"""squad serve binds here unless told otherwise: only this machine can reach it."""
PORT = 8090
"""The default port (llama-server's own default is 8080)."""
SHUTDOWN_GRACE = 2
"""Seconds open requests get when squad serve stops."""


@dataclass
class Served:
    """A running squad serve: ``url`` (``http://HOST:PORT``, clients add ``/v1``), ``api_key``,
    ``gateway``, ``session``, and ``replanner`` when it re-plans (``--slots auto``)."""

    url: str
    api_key: str
    gateway: Gateway
    session: EngineSession
    replanner: Replanner | None = None
    stop_reason: str | None = None
    """Why it stops (set by :meth:`stop`), None while it serves."""
    failure: EngineError | None = None
    """Set when the engine could not be kept up (then ``stop_reason`` is its message)."""
    _stopped: anyio.Event = field(default_factory=anyio.Event)

    def stop(self, reason: str = "squad serve is stopping", *, failure: EngineError | None = None) -> None:
        """Ask squad serve to stop (the first reason given wins); :meth:`wait` returns."""
        if self.stop_reason is None:
            self.stop_reason, self.failure = reason, failure
        self._stopped.set()

    async def wait(self) -> None:
        """Wait until :meth:`stop` was called (a signal, or the engine could not be kept up)."""
        await self._stopped.wait()

    @property
    def base_url(self) -> str:
        """The OpenAI base URL: ``url + "/v1"``."""
        return self.url + "/v1"


def bind(host: str = HOST, port: int = PORT) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one). Raises :class:`UserError`
    when the port is taken or the address is not this machine's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # streamed chunks leave at once
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"squad serve cannot listen on {host}:{port}: port {port} on {host} is in use by another "
                            "program; pass another --port") from None
        raise UserError(f"squad serve cannot listen on {host}:{port}: {exc.strerror or exc}; pass another --host "
                        "or --port") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


@asynccontextmanager
async def serving(engine: EngineSpec | EngineSession, *, host: str = HOST, port: int = PORT,
                  api_key: str | None = None, default_max_tokens: int = DEFAULT_MAX_TOKENS,
                  replan_interval: float | None = None, on_event: EventSink | None = None,
                  log: Callable[[str], None] | None = None, sock: socket.socket | None = None,
                  cors_origins: tuple[str, ...] = (), client_keys: dict[str, str] | None = None,
                  max_restarts: int = MAX_RESTARTS, restart_window: float = RESTART_WINDOW_S,
                  max_body: int = MAX_BODY, body_timeout: float = BODY_TIMEOUT,
                  hung_after: float = HUNG_AFTER_S, client_limits: dict[str, ClientLimit] | None = None,
                  max_queue_wait: float | None = None, keepalive: float | None = None) -> AsyncIterator[Served]:
    """Serve ``engine`` (a spec to launch or attach, or an open session) on ``host:port``.

    ``replan_interval``: seconds between re-plans when the spec leaves slots or context to
    squad (None: never re-plan; :mod:`squad.serve.replan`); ``log`` receives its lines. ``sock``: an already bound
    socket (:func:`bind`) instead of ``host:port``. ``cors_origins``: web origins allowed besides its own
    (:mod:`squad.serve.cors`). ``client_keys``: more keys by client name (a request with one is
    counted under that name). ``max_body``: bytes a request body may have (413 beyond);
    ``body_timeout``: seconds it may take to arrive (408 after). ``max_restarts`` deaths of a launched engine
    within ``restart_window`` seconds are restarted (:mod:`squad.serve.keeper`); one more stops squad serve. One
    that lives but has not answered ``/health`` for ``hung_after`` seconds is killed and restarted.
    ``client_limits`` and ``max_queue_wait``: see :class:`~squad.serve.gateway.Gateway`; ``keepalive``: seconds
    between two keep-alives of a waiting stream (None: :data:`squad.serve.early.KEEPALIVE_EVERY`). Raises
    :class:`UserError` (port taken, or the engine at the URL admits on its own), :class:`EngineError` (the engine
    could not be kept up) and the session's errors.
    """
    import uvicorn

    _Server = _server_class()
    ours = sock is None  # a socket squad bound here is closed here, also when the session cannot start
    sock = sock or bind(host, port)
    host, port = sock.getsockname()[:2]
    try:
        async with _session(engine, on_event) as session:
            spec = session.spec
            gateway = Gateway(session, api_key=api_key, default_max_tokens=default_max_tokens,
                              request_timeout=(spec.request_timeout if spec else None) or 600.0, on_event=on_event,
                              cors_origins=cors_origins, client_keys=client_keys, max_body=max_body,
                              body_timeout=body_timeout, client_limits=client_limits,
                              max_queue_wait=max_queue_wait)
            if keepalive is not None:
                gateway.keepalive_every, gateway.early_after = keepalive, min(keepalive, EARLY_AFTER)
            config = uvicorn.Config(gateway, log_level="warning", access_log=False, lifespan="off", http="h11",
                                    timeout_graceful_shutdown=SHUTDOWN_GRACE, timeout_keep_alive=30)
            server = _Server(config)
            url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
            replanner = None
            if replan_interval is not None and spec is not None and session.reloadable and None in (spec.slots,
                                                                                                    spec.ctx):
                replanner = Replanner(gateway, interval=replan_interval, log=log)
            served = Served(url=url, api_key=gateway.api_key, gateway=gateway, session=session, replanner=replanner)
            if session.launcher is not None and session.restart_on_death:
                gateway.keeper = EngineKeeper(session, max_restarts=max_restarts, window=restart_window, log=log,
                                              on_give_up=lambda error: served.stop(str(error), failure=error),
                                              probe=gateway.engine_answers, hung_after=hung_after,
                                              probe_every=min(PROBE_S, hung_after / 3))
            async with anyio.create_task_group() as tg:
                async def run_server() -> None:
                    await server.serve(sockets=[sock])
                    tg.cancel_scope.cancel()  # uvicorn stopped by itself: end the block too

                tg.start_soon(run_server)
                if replanner is not None:
                    tg.start_soon(replanner.run)
                if gateway.keeper is not None:
                    tg.start_soon(gateway.keeper.run)
                while not server.started:
                    if server.should_exit:
                        raise UserError(f"squad serve could not start on {url}")
                    await anyio.sleep(0.01)
                try:
                    yield served
                finally:
                    with anyio.CancelScope(shield=True):  # also when the block was cancelled
                        served.stop()
                        if replanner is not None:
                            replanner.stop()
                        await gateway.end_requests(served.stop_reason or "squad serve is stopping",
                                                   grace=SHUTDOWN_GRACE)
                        server.should_exit = True
                        await gateway.aclose()
            if served.failure is not None:
                raise served.failure

    finally:
        if ours:
            sock.close()


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn without its own signal handling: Ctrl-C and SIGTERM reach squad's (the CLI's
        error boundary), which cancels the event loop's main task, so the engine is stopped too."""

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server


@asynccontextmanager
async def _session(engine: EngineSpec | EngineSession, on_event: EventSink | None) -> AsyncIterator[EngineSession]:
    if isinstance(engine, EngineSession):
        yield engine
        return
    async with EngineSession(engine, None, on_event=on_event) as session:
        yield session
