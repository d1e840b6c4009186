"""``squad serve``: squad's admission as an OpenAI-compatible endpoint (:mod:`squad.serve`)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import anyio
import anyio.abc
import typer

from squad.cli import options
from squad.cli._app import Stopped, app, console, engine_spec, err_console
from squad.errors import UserError

if TYPE_CHECKING:
    from squad.events.view import LiveView
    from squad.serve.server import Served

__all__ = ["serve_command"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@app.command("serve")
def serve_command(
    model: Annotated[str | None, options.model("smollm2-135m")] = None,
    slots: Annotated[int | None, options.slots("auto: planned, then re-planned from what clients ask")] = None,
    ctx: Annotated[int | None, options.ctx("auto: planned, then re-planned from what clients ask")] = None,
    ctk: Annotated[str | None, options.ctk("f16")] = None,
    ctv: Annotated[str | None, options.ctv()] = None,
    llama_server: Annotated[Path | None, options.llama_server()] = None,
    threads: Annotated[int | None, options.threads()] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on; 127.0.0.1 keeps it to this machine.")]
    = "127.0.0.1",
    port: Annotated[int, options.port("Port to listen on (default: 8090).")] = 8090,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="SQUAD_SERVE_API_KEY", show_default=False,
        help="The key clients must send (Authorization: Bearer KEY); default: a random one, printed.")] = None,
    url: Annotated[str | None, options.url("Serve an engine already running at this URL instead of starting "
                                              "one (no re-planning then).")] = None,
    engine_api_key: Annotated[str | None, typer.Option(
        "--engine-api-key", envvar="LLAMA_API_KEY", show_default=False,
        help="Bearer key of the engine at --url (default: the key `squad engine start` recorded for it).")] = None,
    default_max_tokens: Annotated[int, typer.Option(
        "--default-max-tokens", min=1,
        help="Tokens reserved for, and generated at most by, a request that sets no max_tokens.")] = 1024,
    replan_interval: Annotated[float, typer.Option(
        "--replan-interval", min=1,
        help="Seconds between two reloads of the engine for a bigger plan (with --slots or --ctx left auto).")]
    = 300.0,
    watch: Annotated[bool, typer.Option("--watch", help="Show the live view: slots, pool, queue, one row per client.")]
    = False,
    cors_origin: Annotated[list[str] | None, typer.Option(
        "--cors-origin", show_default=False,
        help="A web origin (https://app.example:3000, or *) whose pages may call squad serve from a browser; "
             "repeat for more. Default: none beyond its own.")] = None,
    client_key: Annotated[list[str] | None, typer.Option(
        "--client-key", show_default=False,
        help="NAME=KEY: another key clients may send; requests with it are counted and shown as NAME. Repeatable.")]
    = None,
    max_body: Annotated[float, typer.Option(
        "--max-body", min=0.001,
        help="MiB a request body may have; a larger one gets 413 before it is read.")] = 32.0,
    load_timeout: Annotated[float | None, options.load_timeout()] = None,
    request_timeout: Annotated[float | None, options.request_timeout()] = None,
    queue: Annotated[str | None, options.queue()] = None,
    client_limit: Annotated[list[str] | None, typer.Option(
        "--client-limit", show_default=False,
        help="NAME=slots:N,pool:P%: at most N requests of client NAME (its --client-key name, or the name it sends) "
             "at once, reserving at most P% of the pool; * for every client not named. Repeatable.")] = None,
    max_queue_wait: Annotated[float | None, typer.Option(
        "--max-queue-wait", min=0.1, show_default=False,
        help="Seconds a request may wait in the queue; then it gets 503 with Retry-After (default: no limit).")]
    = None,
    keepalive: Annotated[float, typer.Option(
        "--keepalive", min=0.05,
        help="Seconds between two keep-alives (SSE comments; ping events for /v1/messages) a streamed request gets "
             "while it waits for its first token: counted, queued, or while the engine reads its prompt.")] = 10.0,
    max_restarts: Annotated[int, typer.Option(
        "--max-restarts", min=0,
        help="Restarts of a launched engine that died, within 10 minutes, before squad serve gives up and exits 1 "
             "(0: never restart).")] = 3,
    hung_after: Annotated[float, typer.Option(
        "--hung-after", min=1.0,
        help="Seconds a launched engine whose process lives may go without answering /health (stopped, hung) "
             "before squad serve kills and restarts it.")] = 60.0,
) -> None:
    """Serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/responses, /v1/models),
    the Anthropic Messages API (/v1/messages) and /v1/embeddings in front of llama-server, admitting every request
    through squad: counted, reserved (prompt + max_tokens), queued by priority (header X-Squad-Priority, lower first),
    released when it ends or the client leaves. Requests running together never exceed the engine's slots or its KV
    pool, whichever tools send them. /squad/status shows slots, reservations, the queue and per-client counts.

    Point any OpenAI-compatible client at http://127.0.0.1:8090/v1 with the printed key (printed only when squad
    made it up: a key given with --api-key or SQUAD_SERVE_API_KEY is never printed).

    SIGTERM and SIGINT (Ctrl-C) stop it whatever their inherited disposition: open requests end with a 503 or a
    stream error event in their API's shape, then the engine is stopped (exit 143 or 130). A launched engine that
    dies is restarted with the same plan (queued requests wait for it; /health answers 503 meanwhile); past
    --max-restarts deaths within 10 minutes squad serve gives up and exits 1.
    """
    from squad.dirs import ENGINE_STATE, check_state_dirs
    from squad.events.view import LiveView
    from squad.serve.server import bind, serving

    if url is None:
        check_state_dirs(*ENGINE_STATE)
    spec = engine_spec(url=url, api_key=engine_api_key, model=model, slots=slots, ctx=ctx, cache_type_k=ctk,
                       cache_type_v=ctv, binary=llama_server, threads=threads, load_timeout=load_timeout)
    if request_timeout is not None or queue is not None:
        spec = spec.but(request_timeout=request_timeout, queue=queue)
    keys: dict[str, str] = {}
    for item in client_key or ():
        name, _, key = item.partition("=")
        if not name.strip() or len(key.strip()) < 8:
            raise UserError(f"--client-key {item!r}: write NAME=KEY, with a key of at least 8 characters "
                            "(e.g. --client-key editor=$(openssl rand -hex 16))")
        keys[name.strip()] = key.strip()
    from squad.serve.shares import client_limits

    limits = client_limits(client_limit)
    if host not in LOOPBACK:
        err_console.print(f"[yellow]warning:[/] listening on {host}: other machines can reach squad serve "
                          "(they still need the key)")

    def say(line: str) -> None:
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)

    async def run(signals: list[int]) -> None:
        sock = bind(host, port)
        loading = LiveView(on=watch, console=err_console)  # the engine's load; then ServeWatch
        running: list[Served] = []  # the squad serve, once it listens

        async with anyio.create_task_group() as tg:
            await tg.start(_stop_on_signals, signals, running, tg.cancel_scope)
            say(f"squad serve: {f'engine at {url}' if url else 'loading the engine'} ...")  # signals are handled now
            with loading:
                async with serving(spec, sock=sock, api_key=api_key, default_max_tokens=default_max_tokens,
                                   replan_interval=replan_interval, on_event=loading if watch else None, log=say,
                                   cors_origins=tuple(cors_origin or ()), client_keys=keys,
                                   max_restarts=max_restarts, max_body=round(max_body * 2**20),
                                   hung_after=hung_after, client_limits=limits, max_queue_wait=max_queue_wait,
                                   keepalive=keepalive) as served:
                    running.append(served)
                    await show(served, loading)
            tg.cancel_scope.cancel()

    async def show(served: Served, loading: LiveView) -> None:
        """Say where squad serve listens, then wait until it stops (watching it with --watch)."""
        from squad.serve.watch import ServeWatch

        loading.__exit__(None, None, None)
        loading.on = False  # its events go on arriving; the view is ServeWatch's now
        info = served.session.info
        auto = [n for n, v in (("slots", slots), ("context", ctx)) if v is None] if url is None else []
        # a key squad made up is printed (the client needs it); a given one never (it would reach a log
        # file: `squad engine start` writes serve's output to one, and records the key in engine.json 0600)
        shown = served.api_key if api_key is None else "(the one given: --api-key / SQUAD_SERVE_API_KEY)"
        console.print(f"squad serve on [bold]{served.base_url}[/]  key [bold]{shown}[/]",
                      soft_wrap=True, highlight=False)
        lines = [f"squad serve on {served.base_url}  key {shown}",
                 f"engine {info.base_url}: {info.slots} slots, pool {info.pool:,} tokens, one request at "
                 f"most {served.gateway.admission.limit:,} tokens; a request without max_tokens reserves "
                 f"{default_max_tokens:,}" + (f"; re-planning {' and '.join(auto)} (at most every "
                                               f"{replan_interval:.0f} s)" if auto else ""),
                 "status: GET /squad/status; stop with Ctrl-C"]
        if not watch:
            for line in lines[1:]:
                say(line)
            await served.wait()
            return
        with ServeWatch(served.gateway, lines, console=err_console) as view:
            while served.stop_reason is None:
                view.tick()
                with anyio.move_on_after(1.0):
                    await served.wait()

    signals: list[int] = []
    anyio.run(run, signals)
    if signals:
        raise Stopped(signals[0], ": requests ended, engine stopped")


async def _stop_on_signals(signals: list[int], running: list[Served], scope: anyio.CancelScope, *,
                           task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """squad serve's own SIGINT and SIGTERM handlers, whatever the inherited disposition (SIGINT is ignored in a job
    a script starts with ``&``): the first signal stops the serve in ``running`` in order (its requests end, then
    the engine stops), a second one, or one while the engine still loads, cancels ``scope`` at once. Each signal is
    appended to ``signals``."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        task_status.started()
        async for signum in received:
            signals.append(signum)
            if not running or len(signals) > 1:
                scope.cancel()
            else:
                running[0].stop(f"squad serve is stopping ({signal.Signals(signum).name})")
