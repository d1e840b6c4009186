"""``squad run``, ``squad chat`` and ``squad recipes validate``.

- ``squad recipes validate FILE...``: every recipe check, no engine started (budgets are
  checked against the model file when it is on disk); exit 2 on errors.
- ``squad run RECIPE -p k=v ...``: validate -> plan -> launch (or ``--url`` attach) -> run the
  flow -> print the final output (stdout) and a per-agent summary (stderr).
- ``squad chat``: a main agent in a REPL; lines may @mention sub-agents.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, Sequence

import anyio
import typer
from rich.table import Table

from squad.cli import options
from squad.cli._app import (app, collect_params, config_model, console, engine_spec, err_console,
                            recipe_engine_specs)
from squad.errors import RecipeError, SquadError, UserError

if TYPE_CHECKING:
    from squad.engine.info import EngineInfo
    from squad.recipes import RecipeRun

__all__ = ["run_command", "chat_command", "validate_command"]

recipes_app = typer.Typer(help="Work with recipe files.", no_args_is_help=True)
app.add_typer(recipes_app, name="recipes")


@recipes_app.command("validate")
def validate_command(
    files: Annotated[list[Path], typer.Argument(help="Recipe YAML files.", show_default=False)],
    check_mcp: Annotated[bool, options.check_mcp("check the tools its agents name and the tools' schemas")] = False,
) -> None:
    """Check recipes without an engine: YAML, keys, types, agents, @mentions, parameters, every
    template rendered with stand-in values, MCP server declarations; when the model file is on
    disk, budgets against it (fixed prompts counted with its tokenizer), else says what it could
    not check. Prints OK, warnings or the error for each file; exit 2 if any has errors (1 if an
    MCP server did not start)."""
    from squad.errors import MCPServerError
    from squad.recipes import load_recipe

    failed, broken = 0, 0
    for path in files:
        try:
            loaded = load_recipe(path, require_params=False, default_model=config_model())
            servers = _check_mcp(loaded) if check_mcp else []
        except (RecipeError, MCPServerError) as exc:
            failed += 1
            broken += isinstance(exc, MCPServerError)
            err_console.print(f"[red]error[/] {_esc(str(exc))}", soft_wrap=True)  # one line per error
            continue
        warnings = loaded.warnings
        for line in servers:
            console.print(f"  {_esc(line)}", soft_wrap=True)
        for warning in warnings:
            err_console.print(f"[yellow]warning[/] {_esc(str(warning))}")
        for note in loaded.unchecked:
            err_console.print(f"[cyan]not checked[/] {_esc(str(note))}")
        console.print(f"[green]OK[/] {_esc(str(path))}" + (f" ({len(warnings)} warnings)" if warnings else ""))
    if failed:
        err_console.print(f"{failed} of {len(files)} recipe(s) have errors")
        raise typer.Exit(2 if failed > broken else 1)


def _check_mcp(loaded: Any) -> list[str]:
    """Start the recipe's MCP servers, check the tools its agents name (and their schemas),
    stop them; one line per server: its tools and which agent uses which."""
    from squad.recipes import recipe_mcp

    async def check() -> list[str]:
        lines = []
        async with recipe_mcp(loaded) as servers:
            for name, tools in servers.tools.items():
                used = {a.name: servers.tools_for(a, server=name) for a in loaded.agents.values()}
                users = [f"{agent}: {', '.join(names)}" for agent, names in used.items() if names]
                lines.append(f"mcp {name}: {len(tools)} tool(s) ({', '.join(tools) or 'none'}); "
                             f"used by {'; '.join(users) or 'no agent'}")
            lines += [f"warning: {w.warning}" for w in servers.warnings]
        return lines

    return anyio.run(check)


def _json_errors(command: Any) -> Any:
    """``squad run --json``: a run that fails still prints one JSON document on stdout,
    ``{"ok": false, "error": {"message", "type", "exit_code", and file/line/column/field for a
    recipe error}, "recipe", "output": null, "finished": {step: record}, "errors", "warnings"}``,
    then fails as without ``--json`` (the error line on stderr, the same exit code)."""
    import functools

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (typer.Exit, SystemExit):
            raise  # what the command decided itself (its output is printed)
        except BaseException as exc:
            if kwargs.get("as_json"):
                typer.echo(json.dumps(_error_json(exc, kwargs.get("recipe")), indent=2, default=str))
            raise

    return wrapper


def _error_json(exc: BaseException, recipe: Path | None) -> dict[str, Any]:
    """The ``--json`` document of a run that failed with ``exc`` (:func:`_json_errors`)."""
    from squad.errors import leaf_errors

    kept = getattr(exc, "squad_kept", None) or {}
    error = exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = leaf_errors(exc)
        error = next((e for e in leaves if isinstance(e, SquadError)), leaves[0] if leaves else exc)
    if isinstance(error, KeyboardInterrupt):
        code, message = 130, "interrupted"
    else:
        code, message = (2 if isinstance(error, UserError) else 1), (str(error) or type(error).__name__)
    detail: dict[str, Any] = {"message": message, "type": type(error).__name__, "exit_code": code}
    if isinstance(error, RecipeError):
        detail.update({k: getattr(error, k, None) for k in ("file", "line", "column", "field")})
        detail["problem"] = error.problem
    return {"ok": False, "recipe": kept.get("recipe"), "file": str(recipe) if recipe is not None else None,
            "error": detail, "failed": message, "output": None, "finished": kept.get("finished", {}),
            "errors": kept.get("errors", []), "warnings": kept.get("warnings", [])}


@app.command("run")
@_json_errors
def run_command(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)],
    param: Annotated[list[str], options.param("Parameter")] = [],  # noqa: B006
    model: Annotated[Optional[str], options.model("the recipe's model")] = None,
    slots: Annotated[Optional[int], options.slots("planned from the recipe's flow")] = None,
    ctx: Annotated[Optional[int], options.ctx("planned from the recipe's budgets")] = None,
    ctk: Annotated[Optional[str], options.ctk()] = None,
    ctv: Annotated[Optional[str], options.ctv()] = None,
    llama_server: Annotated[Optional[Path], options.llama_server()] = None,
    url: Annotated[list[str], options.url("Attach to the engine at this URL instead of launching one; repeat it "
                                          "to spread the agents over several engines.")] = [],  # noqa: B006
    api_key: Annotated[Optional[str], options.api_key()] = None,
    threads: Annotated[Optional[int], options.threads()] = None,
    gpu_layers: Annotated[Optional[str], options.gpu_layers()] = None,
    as_json: Annotated[bool, options.as_json("Print output, steps and per-agent stats as JSON.")] = False,
    out: Annotated[Optional[Path], options.out("Also write the final output to this file (checked before the engine starts).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live view, no summary: only the output.")] = False,
    trace: Annotated[Optional[Path], typer.Option("--trace", show_default=False, help="Write the run trace (JSONL) to this file (default: a new file in the traces folder of squad's state directory, $SQUAD_STATE_DIR).")] = None,
    load_timeout: Annotated[Optional[float], options.load_timeout()] = None,
    request_timeout: Annotated[Optional[float], options.request_timeout()] = None,
    queue: Annotated[Optional[str], options.queue()] = None,
    otel: Annotated[bool, typer.Option("--otel", help="Also export the run as OpenTelemetry spans (GenAI conventions; needs squad\\[otel]). The exporter is OTEL_TRACES_EXPORTER (otlp, console, ...), configured by the standard OTEL_* variables.")] = False,
    ray: Annotated[Optional[str], typer.Option("--ray", metavar="[ADDRESS]", show_default=False, help="Run the recipe's map steps over a Ray cluster (needs squad\\[ray]): ADDRESS of a cluster (auto, HOST:PORT, ray://HOST:10001) or 'local' for a one-machine cluster on 127.0.0.1; a bare --ray uses $RAY_ADDRESS if set, else 'local'. Each node runs --ray-workers workers, each with its own llama-server planned for its share of the node's memory; items go to workers as their engine slots free up, results come back in input order, an item whose worker dies is run once more on another. Other steps (calls, parallel blocks, maps of the main agent) run here on a local engine, launched only if the recipe has one.")] = None,
    ray_workers: Annotated[Optional[int], typer.Option("--ray-workers", min=1, show_default=False, help="With --ray: workers per node (default 1), each planning for 1/N of the node's memory.")] = None,
) -> None:
    """Run a recipe: validate, plan the engine, launch it, run the flow, print the output.

    Every path the run writes (--out, --trace, squad's state directory) is checked before the
    engine starts. The output is printed before it is written to --out, and when a step fails
    the outputs of the steps that finished are printed (and written to --out) with the failure.
    A step with a `schema` (and the last step, with the recipe's `output.schema`) asks the
    engine for JSON of that schema; an answer that misses it twice is printed and kept as well.
    Every run writes a JSONL trace; see `squad trace show`.

    Several engines: repeat --url (one per engine; --slots/--ctx then pin each of them), or give
    the recipe an engines: list. With an engines: list, the options an item sets for itself
    (--slots, --ctx, --ctk/--ctv, --threads, --gpu-layers) are refused: set them per engine in
    the list; --model replaces the recipe's model: (the launched items that name no model run
    it); --llama-server and --load-timeout apply to every launched item. One engine given twice
    (two URLs of one engine, e.g. http://localhost:8080 and http://127.0.0.1:8080/v1) is refused.

    With --ray ADDRESS (or --ray local), each map step of a sub-agent runs over Ray workers,
    each with its own engine on its node; every other step runs here, on a local engine
    launched only when the recipe has such a step. The summary and --json name the worker and
    engine that served each item, and the items retried after their worker was lost.

    Exit codes: 0 done; 1 a step failed or an answer missed its schema (what finished is
    kept); 2 bad input (recipe, parameters, options: nothing was run); 130 interrupted
    (Ctrl-C); 143 terminated (SIGTERM)."""
    from squad.dirs import ENGINE_STATE, check_state_dirs
    from squad.recipes import RecipeRun, load_recipe, run_recipe, step_table
    from squad.events.jsonl import JsonlTrace, default_trace_path
    from squad.events.view import live_view

    from squad.chat.routing import check_distinct

    _check_outputs(recipe, out, trace)
    check_distinct(url)
    fanout = _ray_fanout(ray, ray_workers, url or None)
    loaded = load_recipe(recipe, collect_params(param), model=model, default_model=config_model(), ctx=ctx)
    overrides = dict(model=model, slots=slots, ctx=ctx, binary=llama_server, threads=threads, cache_type_k=ctk,
                     cache_type_v=ctv or ctk, load_timeout=load_timeout, gpu_layers=options.parse_gpu_layers(gpu_layers))
    # --url (repeatable) replaces the recipe's engine(s); else the recipe's engine, or its engines: list
    specs = ([engine_spec(None, url=u, api_key=api_key, **overrides) for u in url] if url else
             recipe_engine_specs(loaded, **overrides))
    if request_timeout is not None or queue is not None:
        specs = [s.but(request_timeout=request_timeout, queue=queue) for s in specs]
    spec = specs[0]
    launching = any(s.url is None for s in specs)
    check_state_dirs(*(ENGINE_STATE if launching else ()), *(("traces",) if trace is None else ()))
    for warning in loaded.warnings:
        err_console.print(f"[yellow]warning[/] {_esc(str(warning))}")

    trace_path = trace or default_trace_path()
    record = RecipeRun(output="")  # filled as steps finish: kept when a later step fails
    lost: list[dict[str, Any]] = []  # engines taken out mid-run (several engines), for the summary
    mcp_warnings: list[str] = []  # an MCP server's stdout noise or exit mid-run, for the summary
    start: list[float] = []  # the first event's time: seconds counted as the live view and the trace count them

    def note_lost(event: Any) -> None:
        start[:] = start or [event.t]
        if event.kind == "engine.lost":
            lost.append({"engine": event.engine, "t": round(event.t - start[0], 2), "reason": event.reason})
        elif event.kind == "mcp.warning":
            mcp_warnings.append(event.warning)

    exporting = _otel_export(otel, loaded.name, spec)

    async def main() -> Any:
        with JsonlTrace(trace_path) as tracer, live_view(on=not quiet and not as_json, console=err_console) as sink, \
                exporting as spans:
            return await run_recipe(loaded, engine=spec if len(specs) == 1 else specs,
                                    on_event=[tracer, sink, note_lost, *([spans] if spans else [])],
                                    record=record, ray=fanout)

    try:
        result = anyio.run(main)
    except BaseException as exc:  # noqa: BLE001 - re-raised: only keeps what finished
        kept = _keep_finished(loaded, record, exc, out=out, as_json=as_json)
        if kept is not None:  # --json: printed with the error (_json_errors), one document on stdout
            try:
                exc.squad_kept = kept  # type: ignore[attr-defined]
            except AttributeError:
                pass
        raise
    rows = step_table(result)
    for note in fanout.notes if fanout is not None else ():  # a Ray worker that did not start
        err_console.print(f"[yellow]warning[/] {_esc(note)}", soft_wrap=True)
    if as_json:
        text = json.dumps({
            "ok": not result.errors, "recipe": loaded.name, "output": result.output, "value": result.value,
            "steps": result.steps, "agents": rows, "errors": result.errors, "notes": result.notes,
            "warnings": [{"step": sid, "warning": text} for sid, text in result.warnings],
            "engine": _engine_json(result.info), "engines_lost": lost, "mcp_warnings": mcp_warnings,
            **({"workers": result.workers} if fanout is not None else {}),
        }, indent=2, default=str)
        typer.echo(text)
        _write_out(out, result.output)
        if result.errors:
            raise typer.Exit(1)
        return
    typer.echo(result.output)
    _write_out(out, result.output)
    if not quiet:
        _summary(rows, result, lost)
        for warning in mcp_warnings:  # said live too; again below the table, where a long run ends
            err_console.print(f"[yellow]warning[/] {_esc(warning)}", soft_wrap=True)
        err_console.print(f"trace: {_esc(str(trace_path))}  (squad trace show / squad trace plot)")
    if result.errors:
        err_console.print(f"[red]{len(result.errors)} step(s) failed[/] (policy collect let the run finish): "
                          + _esc("; ".join(f"{sid}: {msg}" for sid, msg in result.errors)))
        raise typer.Exit(1)


def _ray_fanout(address: str | None, workers: int | None, url: list[str] | None) -> Any:
    """``--ray ADDRESS`` / ``--ray-workers N`` as a :class:`squad.cluster.ray.RayFanout` (None without
    --ray), checked before anything starts. Raises :class:`UserError`: Ray not installed,
    --ray-workers without --ray, --ray with --url, an address of no form Ray takes
    (:func:`squad.cluster.local.check_address`)."""
    if address is None:
        if workers is not None:
            raise UserError("--ray-workers sets the workers per node of a --ray run: add --ray ADDRESS (or 'local')")
        return None
    if url is not None:
        raise UserError("--ray launches an engine on each node: drop --url (or drop --ray to use that engine)")
    from squad.cluster.ray import RayFanout, require_ray
    from squad.cluster.local import check_address

    require_ray()
    if address == "default":  # a bare --ray: Ray's own rule, $RAY_ADDRESS if set, else a cluster on this machine
        address = os.environ.get("RAY_ADDRESS") or "local"
    check_address(address)
    return RayFanout(address=None if address == "local" else address, workers_per_node=workers or 1)


def _otel_export(on: bool, name: str, spec: Any) -> Any:
    """``--otel``: :func:`squad.events.otel.export_run` (it sets its exporter up when called, so a
    missing extra fails before the engine starts); otherwise a context that yields None."""
    from contextlib import nullcontext

    if not on:
        return nullcontext(None)
    from squad.events.otel import export_run, model_label

    return export_run(name, model=model_label(spec.model) if spec.url is None else None)


def _check_outputs(recipe: Path, out: Path | None, trace: Path | None) -> None:
    """Before anything starts: ``--out`` and ``--trace`` can be written, neither overwrites
    the recipe or the other, and ``--trace`` appends only to a squad trace."""
    from squad.dirs import check_output_file
    from squad.events.jsonl import load_trace

    given = [(p, o) for p, o in ((out, "--out"), (trace, "--trace")) if p is not None]
    for path, option in given:
        check_output_file(path, option)
        if path.resolve() == recipe.resolve():
            raise UserError(f"{option} {path} is the recipe itself; write to another file")
    if out is not None and trace is not None and out.resolve() == trace.resolve():
        raise UserError(f"--out and --trace both name {out}; give them different files")
    if trace is not None and trace.is_file() and trace.stat().st_size > 0:
        try:
            load_trace(trace)
        except UserError:
            raise UserError(f"--trace {trace} exists and is not a squad trace; squad appends only to its own "
                            "traces: give a new file") from None


def _write_out(out: Path | None, text: str) -> None:
    """Write ``text`` to ``--out`` (after it was printed); a failure names the path and says the
    text is on stdout. Raises :class:`SquadError` (exit 1: the path was fine when the run began)."""
    if out is None:
        return
    try:
        out.write_text(text + ("" if text.endswith("\n") else "\n"), encoding="utf-8")
    except OSError as exc:
        raise SquadError(f"could not write the output to --out {out} ({exc.strerror or exc}); it is printed "
                             "above on stdout") from None


def _keep_finished(loaded: Any, record: "RecipeRun", exc: BaseException, *, out: Path | None,
                   as_json: bool) -> dict[str, Any] | None:
    """A run that failed or was interrupted: print the outputs of the steps that finished
    (stdout) and write them to ``--out`` headed by the failure, so no finished work is lost.
    With ``as_json``, nothing is printed here: the returned record (recipe, finished steps,
    errors, warnings) goes into the one JSON document :func:`_json_errors` prints."""
    done = [(s.id, record.steps[s.id]) for s in loaded.flow
            if s.id in record.steps and not record.steps[s.id].get("error")]
    cut = _cut_answer(exc)
    if cut and not (done and done[-1][1].get("output") == cut[1]):  # a non-answer the recipe made a
        step = next((sid for sid, r in record.results if r.error is cut[3]), None)  # failure, an invalid one
        done.append((f"{step or cut[0]} ({cut[2]}, the failing step)", {"output": cut[1]}))
    kept = {"recipe": loaded.name, "finished": {sid: step for sid, step in done}, "errors": record.errors,
            "warnings": [{"step": sid, "warning": text} for sid, text in record.warnings]}
    if not done:
        return kept if as_json else None
    why = "interrupted" if isinstance(exc, KeyboardInterrupt) else _first_error(exc)
    if as_json:
        text = json.dumps({**kept, "ok": False, "output": None, "failed": why}, indent=2, default=str)
    else:
        body = "\n\n".join(f"## step {sid}\n{step['output']}" for sid, step in done)
        text = (f"# the run did not finish: {why}\n# the {len(done)} step(s) that finished, "
                f"with their outputs:\n\n{body}")
        typer.echo(text)
    err_console.print(f"[yellow]kept[/] the output of {len(done)} finished step(s) on stdout"
                      + (f" and in {_esc(str(out))}" if out is not None else ""), soft_wrap=True)
    try:
        _write_out(out, text)
    except SquadError as error:
        err_console.print(f"[red]error:[/] {_esc(str(error))}", soft_wrap=True)
    return kept if as_json else None


def _cut_answer(exc: BaseException) -> tuple[str, str, str, BaseException] | None:
    """(agent, text, what, error) of the answer that ended the run: the cut text of an
    :class:`~squad.errors.IncompleteAnswer` (``"cut"``), the raw text of an
    :class:`~squad.errors.InvalidOutput` (``"invalid"``)."""
    from squad.errors import IncompleteAnswer, InvalidOutput, leaf_errors

    leaves = leaf_errors(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    for leaf in leaves:
        seen: BaseException | None = leaf
        while seen is not None:  # the recipe runner may wrap it (raise ... from)
            if isinstance(seen, IncompleteAnswer) and seen.partial.strip():
                return (seen.agent or "agent", seen.partial, "cut", seen)
            if isinstance(seen, InvalidOutput) and seen.raw.strip():
                return (seen.agent or "output", seen.raw, "invalid", seen)
            seen = seen.__cause__
    return None


def _first_error(exc: BaseException) -> str:
    from squad.errors import SquadError, leaf_errors

    if isinstance(exc, BaseExceptionGroup):
        leaves = leaf_errors(exc)
        exc = next((e for e in leaves if isinstance(e, SquadError)), leaves[0] if leaves else exc)
    return str(exc) or type(exc).__name__


def _engine_json(info: "EngineInfo | None") -> dict[str, Any] | None:
    if info is None:
        return None
    return {"slots": info.slots, "n_ctx": info.n_ctx, "pool": info.pool, "base_url": info.base_url}


def _summary(rows: list[Any], result: "RecipeRun", lost: "Sequence[dict[str, Any]]" = ()) -> None:
    """The per-agent table and the engine lines; with several engines an ``engine`` column
    (:func:`~squad.events.summary.engine_labels`) and a line per engine lost mid-run."""
    from squad.events.summary import engine_labels, engine_legend

    table = Table(title="agents", title_justify="left", show_edge=False)
    on_ray = bool(result.workers)
    labels = engine_labels([*(r.get("engine") for r in rows), *(e["engine"] for e in lost)]) if not on_ray else {}
    several = len(labels) > 1
    for col in ("step", "agent", "state", "queued s", "first token s", "tokens", "tok/s", "slot",
                *(("engine",) if several else ()), *(("worker",) if on_ray else ())):
        table.add_column(col, justify="right" if col not in ("step", "agent", "state", "worker", "engine") else "left",
                         min_width=max(map(len, labels.values())) if col == "engine" else None)  # never cut
    style = {"ok": "green", "truncated": "yellow", "empty": "yellow"}
    for r in rows:
        color = style.get(r["outcome"], "red") if r["state"] == r["outcome"] else "red"
        table.add_row(
            r["step"], r["agent"], f"[{color}]{_esc(str(r['state'])[:60])}[/]", f"{r['queued_s']:.2f}",
            "-" if r["first_token_s"] is None else f"{r['first_token_s']:.2f}",
            f"{r['prompt_tokens']}+{r['completion_tokens']}",
            "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.1f}",
            "-" if r["slot"] is None else str(r["slot"]),
            *((labels.get(r.get("engine") or "", "-"),) if several else ()),
            *((_esc(str(r.get("worker") or "-")) + (" (retried)" if r.get("retried") else ""),) if on_ray else ()),
        )
    err_console.print(table)
    for w in result.workers:
        err_console.print(f"worker {_esc(w['id'])}: {w['items']} item(s), engine {_esc(w['engine'])} on its node "
                          f"({w['slots']} slots, {w['n_ctx']:,} tokens per request; planned for "
                          f"{w['share']:.2g} of the node's KV memory, {w['memory'] / 2**30:.2f} GiB)")
    for r in rows:
        if r.get("retried"):
            err_console.print(f"[yellow]{_esc(r['agent'])} retried on {_esc(str(r.get('worker')))}:[/] "
                              f"{_esc(r['retried'])}")
    if several and (legend := engine_legend(labels)):
        err_console.print(_esc(legend), soft_wrap=True)
    if result.info is not None and "engines" in result.info.sources:  # several engines (squad.chat.routing)
        err_console.print(_esc(result.info.sources["engines"]))
    elif result.info is not None:
        which = f" {result.info.base_url} (the one left)" if lost else ""
        err_console.print(f"engine{_esc(which)}: {result.info.slots} slots sharing a pool of {result.info.pool:,} "
                          f"tokens, {result.info.n_ctx:,} per request (" + (
                              "read back from /props)" if result.info.kind in ("llama.cpp", "squad-serve")
                              else f"as the {result.info.kind} server reported them or squad assumed: "
                                   "squad engine info --url shows where each came from)"))
    for e in lost:
        err_console.print(f"[yellow]engine {_esc(e['engine'])} lost at {e['t']:.1f}s:[/] {_esc(e['reason'])}",
                          soft_wrap=True)
    for sid, message in result.errors:
        err_console.print(f"[yellow]step {sid} failed (policy collect):[/] {_esc(message)}")
    for sid, note in result.notes:
        err_console.print(f"[yellow]step {sid}:[/] {_esc(note)}")


@app.command("chat")
def chat_command(
    recipe: Annotated[Optional[Path], typer.Option("--recipe", show_default=False, help="Take the agents and the main agent from this recipe.")] = None,
    agent_file: Annotated[Optional[Path], typer.Option("--agent-file", show_default=False, help="A YAML file with agents: (the first is the main agent unless --main).")] = None,
    main: Annotated[Optional[str], typer.Option("--main", show_default=False, help="The main agent's name (default: the recipe's main, or the first agent of --agent-file).")] = None,
    param: Annotated[list[str], options.param("With --recipe: a recipe parameter")] = [],  # noqa: B006
    model: Annotated[Optional[str], options.model("the recipe's model, else smollm2-135m")] = None,
    slots: Annotated[Optional[int], options.slots("planned from the agents")] = None,
    ctx: Annotated[Optional[int], options.ctx("planned from the agents' budgets")] = None,
    ctk: Annotated[Optional[str], options.ctk()] = None,
    ctv: Annotated[Optional[str], options.ctv()] = None,
    llama_server: Annotated[Optional[Path], options.llama_server()] = None,
    url: Annotated[Optional[str], options.url("Attach to the llama-server at this URL instead of launching one.")] = None,
    api_key: Annotated[Optional[str], options.api_key()] = None,
    threads: Annotated[Optional[int], options.threads()] = None,
    replan: Annotated[bool, typer.Option("--replan", help="When a line @mentions more agents than the engine has slots, "
                                         "reload the engine with more slots (after in-flight calls drain) instead of queueing.")] = False,
    load_timeout: Annotated[Optional[float], options.load_timeout()] = None,
    request_timeout: Annotated[Optional[float], options.request_timeout()] = None,
    queue: Annotated[Optional[str], options.queue()] = None,
) -> None:
    """Chat with a main agent; @mention sub-agents in a line to run them at once. /quit ends."""
    from squad.runtime.chatloop import chat_loop
    from squad.runtime.squad import Squad
    from squad.events.view import LiveView

    from squad.dirs import ENGINE_STATE, check_state_dirs

    agents, main_name, variables, base, servers = _chat_agents(recipe, agent_file, main, param, model, ctx)
    spec = engine_spec(base, url=url, api_key=api_key, model=model, slots=slots, ctx=ctx, binary=llama_server,
                       threads=threads, cache_type_k=ctk, cache_type_v=ctv or ctk, load_timeout=load_timeout)
    if request_timeout is not None or queue is not None:
        spec = spec.but(request_timeout=request_timeout, queue=queue)
    if url is None:
        check_state_dirs(*ENGINE_STATE)
    view = LiveView(console=err_console, live=False)

    def say(kind: str, text: str) -> None:
        style = {"answer": f"[bold]{main_name}>[/] ", "warning": "[yellow]warning[/] ", "error": "[red]error[/] "}
        (console if kind == "answer" else err_console).print(style.get(kind, "") + _esc(text))

    async def run() -> None:
        async with Squad(agents, main=main_name, engine=spec, on_event=view, variables=variables,
                         replan=replan, mcp_servers=servers) as sq:
            await chat_loop(sq, _read_prompt, say)

    anyio.run(run)


def _read_prompt() -> str:
    """One line typed at the ``you>`` prompt (EOFError at the end of input). A terminal gets
    ``input()`` with line editing; a pipe is read from the raw file, which no lock guards, so a
    thread left blocked in it by Ctrl-C or SIGTERM never aborts the interpreter's exit (one
    blocked in ``sys.stdin.readline()`` does: "could not acquire lock ... at interpreter shutdown")."""
    import sys

    if sys.stdin.isatty():
        return input("you> ")
    sys.stdout.write("you> ")
    sys.stdout.flush()
    line = sys.stdin.buffer.raw.readline()
    if not line:
        raise EOFError
    return line.decode("utf-8", "surrogateescape").rstrip("\r\n")


def _chat_agents(recipe: Path | None, agent_file: Path | None, main: str | None,
                 param: list[str], model: str | None = None,
                 ctx: int | None = None) -> tuple[list[Any], str, dict[str, Any], Any, tuple]:
    """The chat's agents, main agent, template variables, engine spec and MCP servers (a recipe's)."""
    from squad.runtime.agent import Agent
    from squad.recipes import load_agents, load_recipe

    if recipe is not None and agent_file is not None:
        raise UserError("give --recipe or --agent-file, not both")
    if param and recipe is None:
        raise UserError("-p/--param sets a recipe's parameters: use it with --recipe")
    base, servers = None, ()
    if recipe is not None:
        loaded = load_recipe(recipe, collect_params(param), model=model, default_model=config_model(), ctx=ctx)
        # a chat has no flow prompts to count: budgets the recipe left auto stay auto (the planner shares the context)
        counted = {r.agent for r in loaded.budgets if not r.fixed}
        agents = {n: a.model_copy(update={"budget": "auto"}) if n in counted else a for n, a in loaded.agents.items()}
        lead, variables, base = main or loaded.main, {"params": loaded.params}, loaded.engine_spec()
        servers = loaded.mcp_servers
    elif agent_file is not None:
        agents, variables = load_agents(agent_file), {}
        lead = main or next(iter(agents), "")
    else:
        agents = {"assistant": Agent(name="assistant", instructions="You are a helpful assistant. Be brief.",
                                     max_tokens=256)}  # budget auto: the model's context
        lead, variables = "assistant", {}
    if lead not in agents:
        raise UserError(f"main agent {lead!r} is not defined (agents: {', '.join(agents)})")
    return list(agents.values()), lead, variables, base, servers


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)
