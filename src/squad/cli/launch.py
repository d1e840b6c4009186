"""``squad verify`` and ``squad engine start|stop|status``.

``engine start`` leaves a llama-server running after the command ends (a *detached* engine,
recorded in ``state_dir()/engine.json``); every other launch in squad stops its engine when
squad exits.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import anyio
import psutil
import typer
from rich.table import Table

from squad.cli import options
from squad.cli._app import app, console, err_console
from squad.cli.engine import engine_app, progress_status
from squad.engine.control import attach, control_client, pool_warning, read_engine
from squad.engine.info import EngineInfo
from squad.engine.llama import DEFAULT_SLOTS
from squad.engine.process import alive, stop_pid
from squad.engine.saved import SavedEngine, SavedPlan, load_saved_engine, save_engine, saved_engine_path
from squad.errors import EngineGone, UserError
from squad.sched.plan import EnginePlan

__all__ = ["verify", "engine_start", "engine_stop", "engine_status"]


@app.command("verify")
def verify(
    model: Annotated[str | None, options.model("smollm2-135m")] = None,
    slots: Annotated[int | None, options.slots()] = 4,
    ctx: Annotated[int | None, options.ctx()] = 8192,
    llama_server: Annotated[Path | None, options.llama_server()] = None,
    threads: Annotated[int | None, options.threads()] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Tokens each request generates.")] = 48,
    as_json: Annotated[bool, options.as_json("Print a JSON report instead of tables.")] = False,
    load_timeout: Annotated[float | None, options.load_timeout()] = None,
) -> None:
    """Check that the engine serves parallel slots with one shared context (the product page's test).

    Loads the model with --slots unified slots sharing --ctx tokens, checks /props, sends one
    streaming request per slot at once while polling /slots, and requires all slots busy at
    once and every first token before any request finishes. Exits 1 if a check fails.
    """
    from squad.dirs import ENGINE_STATE, check_state_dirs
    from squad.engine.verify import run_verify

    check_state_dirs(*ENGINE_STATE)
    slots, ctx = slots or 4, ctx or 8192  # auto: the product page's test
    model, threads, llama_server = _with_config(model, threads, llama_server)
    report = anyio.run(
        lambda: run_verify(
            model=model, ctx=ctx, parallel=slots, binary=llama_server, threads=threads, max_tokens=max_tokens,
            load_timeout=load_timeout,
        )
    )
    if as_json:
        console.print_json(json.dumps(report.to_dict()))
    else:
        console.print(f"engine {report.base_url}  model {report.model}  build {report.build_info}")
        timings = Table("request", "first token (s)", "finished (s)", "tokens", "error", title="requests")
        for r in report.requests:
            timings.add_row(
                str(r.index),
                "-" if r.first_token is None else f"{r.first_token:.2f}",
                "-" if r.finished is None else f"{r.finished:.2f}",
                str(r.tokens),
                r.error or "",
            )
        console.print(timings)
        checks = Table("check", "measured", "expected", "result", title="checks")
        for c in report.checks:
            checks.add_row(c.name, c.measured, c.expected, "[green]pass[/]" if c.ok else "[red]FAIL[/]")
        console.print(checks)
        console.print("[green]verify passed[/]" if report.passed else "[red]verify FAILED[/]")
    if not report.passed:
        raise typer.Exit(1)


@engine_app.command("start")
def engine_start(
    model: Annotated[str | None, options.model("smollm2-135m")] = None,
    slots: Annotated[int | None, options.slots()] = DEFAULT_SLOTS,
    ctx: Annotated[int | None, options.ctx()] = 8192,
    port: Annotated[int | None, options.port("Port on 127.0.0.1 (default: a free one).")] = None,
    llama_server: Annotated[Path | None, options.llama_server()] = None,
    threads: Annotated[int | None, options.threads()] = None,
    load_timeout: Annotated[float | None, options.load_timeout()] = None,
) -> None:
    """Start an engine that keeps running after this command (stop it with `squad engine stop`).

    It runs behind `squad serve` in the background, so every client of it (several `squad run --url`,
    any OpenAI-compatible tool) shares one admission: requests running together never exceed its
    slots or its pool.
    """
    from squad.dirs import ENGINE_STATE, check_state_dirs
    from squad.engine.registry import resolve_model
    from squad.serve.background import start_background

    check_state_dirs(*ENGINE_STATE)
    slots, ctx = slots or DEFAULT_SLOTS, ctx or 8192  # auto: the defaults
    model, threads, llama_server = _with_config(model, threads, llama_server)

    saved = load_saved_engine()
    if saved is not None and alive(saved.pid, saved.create_time):
        raise UserError(f"an engine already runs at {saved.url} (pid {saved.pid}); stop it first with "
                        "`squad engine stop`")
    from squad.engine.facts import read_model_facts
    from squad.engine.session import with_chat_template

    model_path = resolve_model(model)
    facts = read_model_facts(model_path)
    plan = with_chat_template(EnginePlan.simple(model_path, slots=slots, n_ctx=ctx), facts.chat_template,
                              has_tool_use_template=facts.has_tool_use_template)

    loading = f"loading {plan.model.name} ({plan.slots} slots, {plan.n_ctx} tokens)"
    started = time.monotonic()
    with progress_status(loading) as say:
        served = anyio.run(lambda: start_background(
            plan.model, slots=plan.slots, ctx=plan.n_ctx, port=port, binary=llama_server, threads=threads,
            load_timeout=load_timeout, progress=lambda elapsed, limit: say(f"{loading}: {elapsed:.0f} s of at most "
                                                                           f"{limit:.0f} s")))
        info = anyio.run(attach, served.url, served.api_key)
    record = SavedEngine(
        url=served.url,
        api_key=served.api_key,
        pid=served.pid,
        create_time=psutil.Process(served.pid).create_time(),
        log_path=str(served.log_path),
        plan=SavedPlan(
            model=str(plan.model),
            slots=plan.slots,
            n_ctx=plan.n_ctx,
            kv_unified=plan.kv_unified,
            cache_type_k=plan.cache_type_k,
            cache_type_v=plan.cache_type_v,
        ),
    )
    path = save_engine(record)
    console.print(
        f"engine up at [bold]{served.url}[/] in {time.monotonic() - started:.1f} s: {info.slots} slots, "
        f"n_ctx {info.n_ctx} per request, pool {info.pool} tokens, squad serve pid {served.pid}"
    )
    console.print(f"chat template {info.template_name}", highlight=False, markup=False)
    console.print(f"every client shares its admission: OpenAI base URL {served.url}/v1 with the key in {path}; "
                  f"log {served.log_path}", highlight=False)
    console.print("check it with `squad engine status`; stop it with `squad engine stop`")


@engine_app.command("stop")
def engine_stop() -> None:
    """Stop the engine `squad engine start` left running (SIGTERM, then SIGKILL after 5 s)."""
    saved = load_saved_engine()
    if saved is None:
        raise UserError(f"no engine to stop: {saved_engine_path()} does not exist (start one with "
                        "`squad engine start`)")
    stopped = stop_pid(saved.pid, create_time=saved.create_time)
    saved_engine_path().unlink(missing_ok=True)
    console.print(f"stopped engine at {saved.url} (pid {saved.pid})" if stopped
                  else f"engine at {saved.url} was not running")


@engine_app.command("status")
def engine_status(
    url: Annotated[str | None,
                   options.url("The engine's root URL (default: the one `squad engine start` left running).")] = None,
    api_key: Annotated[str | None, options.api_key()] = None,
    as_json: Annotated[bool, options.as_json()] = False,
) -> None:
    """Show what a running engine applied: slots, n_ctx, busy slots, model, build, unified KV or not."""
    saved = load_saved_engine() if url is None else None
    if url is None:
        if saved is None:
            raise UserError("no engine given: pass --url URL, or start one with `squad engine start`")
        if not alive(saved.pid, saved.create_time):
            raise EngineGone(f"the engine `squad engine start` left at {saved.url} (pid {saved.pid}) is not "
                             "running; start it again")
        url, api_key = saved.url, saved.api_key
    else:
        from squad.config import api_key_for

        api_key = api_key_for(url, api_key)
    info, busy = anyio.run(lambda: _status(url, api_key))
    info = _own_build(info, saved.pid if saved else None)
    warning = pool_warning(info)
    if as_json:
        out = {**asdict(info), "api_key": None, "chat_template": info.template_name, "busy_slots": busy,
               "pid": saved.pid if saved else None, "version": info.version or None,
               "warnings": [*info.warnings, *([warning] if warning else [])]}
        console.print_json(json.dumps(out))
        return
    unified = {True: "yes (one shared pool)", False: "no", None: "unknown"}[info.kv_unified]
    console.print(f"url          {info.base_url}" + (f" (pid {saved.pid})" if saved else ""))
    console.print(f"kind         {info.kind}" + (f" {info.version}" if info.version else ""))
    console.print(f"model        {info.model_path or info.model_alias or '(not reported)'}")
    if info.build_info and info.build_info != info.version:
        console.print(f"build        {info.build_info}")
    console.print(f"slots        {info.slots} ({'?' if busy is None else busy} busy)")
    trained = f" (n_ctx_train {info.n_ctx_train})" if info.n_ctx_train else ""
    console.print(f"n_ctx        {info.n_ctx} tokens per request{trained}")
    if info.kind == "llama.cpp":
        console.print(f"unified KV   {unified}; pool {info.pool} tokens")
    else:  # what the kind reported, and from where (`squad engine info --url` shows every source)
        source = info.sources.get("pool") if info.sources else None
        console.print(f"pool         {info.pool} tokens held together" + (f"  <- {source}" if source else ""))
    if info.admits:
        console.print("admission    squad serve: shared by every client of this URL")
    console.print(f"template     {info.template_name}")
    if warning:
        err_console.print(f"[yellow]warning:[/] {warning}")


def _own_build(info: EngineInfo, pid: int | None) -> EngineInfo:
    """``info`` with the build squad knows for an engine it built: llama-server built from the
    source package reports ``b0-unknown``; the binary's ``squad-build.json`` says ``b11434``.
    The binary is found from the engine's pid (the one ``squad engine start`` saved, else the
    process listening on the URL's port on this machine)."""
    import dataclasses

    from squad.engine.binary import engine_binary_of, known_build

    if not info.engine_kind.llama_server or known_build(info.build_info, None) != info.build_info \
            or not info.build_info:
        return info  # a build it names itself (or a kind that reports none)
    if pid is None:
        pid = _listening_pid(info.base_url)
    binary = engine_binary_of(pid) if pid is not None else None
    build = known_build(info.build_info, binary)
    if build == info.build_info:
        return info
    version = build if info.version == info.build_info else info.version
    return dataclasses.replace(info, build_info=build, version=version)


def _listening_pid(url: str) -> int | None:
    """The pid of the local process listening on ``url``'s port, when ``url`` is on this machine
    and the system tells (psutil); else None."""
    from urllib.parse import urlsplit

    import psutil

    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1") or parts.port is None:
        return None
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    return next((c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == parts.port
                 and c.pid), None)


async def _status(url: str, api_key: str | None) -> tuple[EngineInfo, int | None]:
    """``(info, busy slots)``; busy is read from llama-server's ``/slots`` (also through squad
    serve), None for the other kinds, which do not report it per slot."""
    info = await attach(url, api_key)
    if not info.engine_kind.llama_server:
        return info, None
    async with control_client(info.base_url, info.api_key) as client:
        state = await read_engine(client)
    return info, state.busy_slots()


def _with_config(model: str | None, threads: int | None, llama_server: Path | None) -> tuple[Any, Any, Any]:
    """``(model, threads, binary)``: the command line's, else the config file's
    (:func:`squad.config.with_config`, the rule every command that starts an engine follows)."""
    from squad.config import with_config
    from squad.engine.session import EngineSpec

    spec = with_config(EngineSpec(model=model, threads=threads, binary=llama_server))
    return spec.model, spec.threads, spec.binary
