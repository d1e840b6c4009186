"""``squad serve``: squad's admission as an OpenAI-compatible endpoint (:mod:`squad.serve`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import anyio
import typer

from squad.cli import options
from squad.cli._app import app, console, engine_spec, err_console
from squad.errors import UserError

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
) -> None:
    """Serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/responses, /v1/models),
    the Anthropic Messages API (/v1/messages) and /v1/embeddings in front of llama-server, admitting every request
    through squad: counted, reserved (prompt + max_tokens), queued by priority (header X-Squad-Priority, lower first),
    released when it ends or the client leaves. Requests running together never exceed the engine's slots or its KV
    pool, whichever tools send them. /squad/status shows slots, reservations, the queue and per-client counts.

    Point any OpenAI-compatible client at http://127.0.0.1:8090/v1 with the printed key.
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
    if host not in LOOPBACK:
        err_console.print(f"[yellow]warning:[/] listening on {host}: other machines can reach squad serve "
                          "(they still need the key)")

    def say(line: str) -> None:
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)

    async def run() -> None:
        from squad.serve.watch import ServeWatch

        sock = bind(host, port)
        where = f"engine at {url}" if url else "loading the engine"
        say(f"squad serve: {where} ...")
        loading = LiveView(on=watch, console=err_console)  # the engine's load; then ServeWatch
        with loading:
            async with serving(spec, sock=sock, api_key=api_key, default_max_tokens=default_max_tokens,
                               replan_interval=replan_interval, on_event=loading if watch else None, log=say,
                               cors_origins=tuple(cors_origin or ()), client_keys=keys,
                               max_body=round(max_body * 2**20)) as served:
                loading.__exit__(None, None, None)
                loading.on = False  # its events go on arriving; the view is ServeWatch's now
                info = served.session.info
                auto = [n for n, v in (("slots", slots), ("context", ctx)) if v is None] if url is None else []
                console.print(f"squad serve on [bold]{served.base_url}[/]  key [bold]{served.api_key}[/]",
                              soft_wrap=True, highlight=False)
                lines = [f"squad serve on {served.base_url}  key {served.api_key}",
                         f"engine {info.base_url}: {info.slots} slots, pool {info.pool:,} tokens, one request at "
                         f"most {served.gateway.admission.limit:,} tokens; a request without max_tokens reserves "
                         f"{default_max_tokens:,}" + (f"; re-planning {' and '.join(auto)} (at most every "
                                                       f"{replan_interval:.0f} s)" if auto else ""),
                         "status: GET /squad/status; stop with Ctrl-C"]
                if not watch:
                    for line in lines[1:]:
                        say(line)
                    await anyio.sleep_forever()
                with ServeWatch(served.gateway, lines, console=err_console) as view:
                    while True:
                        view.tick()
                        await anyio.sleep(1.0)

    anyio.run(run)
