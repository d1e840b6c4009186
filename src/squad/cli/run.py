"""``squad run`` and ``squad recipes validate``.

- ``squad recipes validate FILE...``: every recipe check, no engine started (budgets are
  checked against the model file when it is on disk); exit 2 on errors.
- ``squad run RECIPE -p k=v ...``: validate -> plan -> launch (or ``--url`` attach) -> run the
  flow -> print the final output (stdout) and a per-agent summary (stderr).
- ``squad chat`` is :mod:`squad.cli.chat`; what ``squad run`` prints is :mod:`squad.cli.run_report`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer

from squad.cli import options
from squad.cli._app import app, collect_params, config_model, console, engine_spec, err_console, recipe_engine_specs
from squad.cli.run_report import esc, json_errors, keep_finished, print_result
from squad.errors import RecipeError, UserError

__all__ = ["run_command", "validate_command"]

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
            err_console.print(f"[red]error[/] {esc(str(exc))}", soft_wrap=True)  # one line per error
            continue
        warnings = loaded.warnings
        for line in servers:
            console.print(f"  {esc(line)}", soft_wrap=True)
        for warning in warnings:
            err_console.print(f"[yellow]warning[/] {esc(str(warning))}")
        for note in loaded.unchecked:
            err_console.print(f"[cyan]not checked[/] {esc(str(note))}")
        console.print(f"[green]OK[/] {esc(str(path))}" + (f" ({len(warnings)} warnings)" if warnings else ""))
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


@app.command("run")
@json_errors
def run_command(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)],
    param: Annotated[list[str], options.param("Parameter")] = [],  # noqa: B006
    model: Annotated[str | None, options.model("the recipe's model")] = None,
    slots: Annotated[int | None, options.slots("planned from the recipe's flow")] = None,
    ctx: Annotated[int | None, options.ctx("planned from the recipe's budgets")] = None,
    ctk: Annotated[str | None, options.ctk()] = None,
    ctv: Annotated[str | None, options.ctv()] = None,
    llama_server: Annotated[Path | None, options.llama_server()] = None,
    url: Annotated[list[str], options.url("Attach to the engine at this URL instead of launching one; repeat it "
                                          "to spread the agents over several engines.")] = [],  # noqa: B006
    api_key: Annotated[str | None, options.api_key()] = None,
    threads: Annotated[int | None, options.threads()] = None,
    gpu_layers: Annotated[str | None, options.gpu_layers()] = None,
    as_json: Annotated[bool, options.as_json("Print output, steps and per-agent stats as JSON.")] = False,
    out: Annotated[Path | None,
                   options.out("Also write the final output to this file (checked before the engine starts).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live view, no summary: only the output.")] = False,
    trace: Annotated[Path | None,
                     typer.Option("--trace", show_default=False,
                                  help="Write the run trace (JSONL) to this file (default: a new file in the traces "
                                       "folder of squad's state directory, $SQUAD_STATE_DIR).")] = None,
    load_timeout: Annotated[float | None, options.load_timeout()] = None,
    request_timeout: Annotated[float | None, options.request_timeout()] = None,
    queue: Annotated[str | None, options.queue()] = None,
    otel: Annotated[bool,
                    typer.Option("--otel",
                                 help="Also export the run as OpenTelemetry spans (GenAI conventions; needs "
                                      "squad\\[otel]). The exporter is OTEL_TRACES_EXPORTER (otlp, console, ...), "
                                      "configured by the standard OTEL_* variables.")] = False,
    ray: Annotated[str | None,
                   typer.Option("--ray", metavar="[ADDRESS]", show_default=False,
                                help="Run the recipe's map steps over a Ray cluster (needs squad\\[ray]): ADDRESS of a "
                                     "cluster (auto, HOST:PORT, ray://HOST:10001) or 'local' for a one-machine cluster "
                                     "on 127.0.0.1; a bare --ray uses $RAY_ADDRESS if set, else 'local'. Each node "
                                     "runs --ray-workers workers, each with its own llama-server planned for its share "
                                     "of the node's memory; items go to workers as their engine slots free up, results "
                                     "come back in input order, an item whose worker dies is run once more on another. "
                                     "Other steps (calls, parallel blocks, maps of the main agent) run here on a local "
                                     "engine, launched only if the recipe has one.")] = None,
    resume: Annotated[str | None,
                      typer.Option("--resume", metavar="[RUN]", show_default=False,
                                   help="Resume a run that did not finish (Ctrl-C, SIGTERM, a crash, a lost engine): "
                                        "every call it finished is answered from its journal, only the others are "
                                        "sent. RUN: a run id (the stopped run names it) or a journal file; a bare "
                                        "--resume takes the recipe's last run. Refused when the recipe, a parameter "
                                        "or the model changed since.")] = None,
    ray_workers: Annotated[int | None,
                           typer.Option("--ray-workers", min=1, show_default=False,
                                        help="With --ray: workers per node (default 1), each planning for 1/N of "
                                             "the node's memory.")] = None,
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
    (Ctrl-C); 143 terminated (SIGTERM).

    Every run keeps a journal of the calls it finished (runs/RECIPE/ in squad's state directory):
    a run that did not finish is resumed with --resume [RUN], which sends only the calls that
    did not finish; the summary and --json name the calls answered from the journal."""
    from squad.chat.routing import check_distinct
    from squad.dirs import ENGINE_STATE, check_state_dirs
    from squad.events.jsonl import JsonlTrace, default_trace_path
    from squad.events.view import live_view
    from squad.recipes import RecipeRun, load_recipe, run_recipe, step_table
    from squad.recipes.resume import recipe_journal

    _check_outputs(recipe, out, trace)
    check_distinct(url)
    fanout = _ray_fanout(ray, ray_workers, url or None)
    if fanout is not None and resume is not None:
        raise UserError("--resume: a run over Ray (--ray) keeps no journal; resume runs on this machine (drop --ray)")
    loaded = load_recipe(recipe, collect_params(param), model=model, default_model=config_model(), ctx=ctx)
    overrides = dict(model=model, slots=slots, ctx=ctx, binary=llama_server, threads=threads, cache_type_k=ctk,
                     cache_type_v=ctv or ctk, load_timeout=load_timeout,
                     gpu_layers=options.parse_gpu_layers(gpu_layers))
    # --url (repeatable) replaces the recipe's engine(s); else the recipe's engine, or its engines: list
    specs = ([engine_spec(None, url=u, api_key=api_key, **overrides) for u in url] if url else
             recipe_engine_specs(loaded, **overrides))
    if request_timeout is not None or queue is not None:
        specs = [s.but(request_timeout=request_timeout, queue=queue) for s in specs]
    spec = specs[0]
    launching = any(s.url is None for s in specs)
    check_state_dirs(*(ENGINE_STATE if launching else ()), *(("traces",) if trace is None else ()))
    for warning in loaded.warnings:
        err_console.print(f"[yellow]warning[/] {esc(str(warning))}")

    trace_path = trace or default_trace_path()
    record = RecipeRun(output="")  # filled as steps finish: kept when a later step fails
    # every finished call recorded (squad.runtime.journal); a resume checked before the engine starts
    journal = recipe_journal(loaded, resume) if fanout is None else None
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

    def json_progress(event: Any) -> None:
        """--json: a map's progress events as JSON lines on stderr (stdout keeps its one document)."""
        if event.kind == "map.progress" and not quiet:
            err_console.print(json.dumps({"kind": event.kind, "agent": event.agent, **event.data}), markup=False,
                              highlight=False, soft_wrap=True)

    async def main() -> Any:
        with JsonlTrace(trace_path) as tracer, live_view(on=not quiet and not as_json, console=err_console) as sink, \
                exporting as spans:
            return await run_recipe(loaded, engine=spec if len(specs) == 1 else specs,
                                    on_event=[tracer, sink, note_lost, *([json_progress] if as_json else []),
                                              *([spans] if spans else [])],
                                    record=record, ray=fanout, journal=journal)

    try:
        result = anyio.run(main)
    except BaseException as exc:
        kept = keep_finished(loaded, record, exc, out=out, as_json=as_json)
        if kept is not None:  # --json: printed with the error (json_errors), one document on stdout
            try:
                exc.squad_kept = kept  # type: ignore[attr-defined]
            except AttributeError:
                pass
        raise
    rows = step_table(result)
    for note in fanout.notes if fanout is not None else ():  # a Ray worker that did not start
        err_console.print(f"[yellow]warning[/] {esc(note)}", soft_wrap=True)
    print_result(result, rows, name=loaded.name, as_json=as_json, quiet=quiet, out=out, lost=lost,
                 mcp_warnings=mcp_warnings, trace_path=trace_path, on_ray=fanout is not None)


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
    from squad.cluster.local import check_address
    from squad.cluster.ray import RayFanout, require_ray

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
