"""``squad run``, ``squad chat`` and ``squad recipes validate``.

- ``squad recipes validate FILE...``: every recipe check, no engine started (budgets are
  checked against the model file when it is on disk); exit 2 on errors.
- ``squad run RECIPE -p k=v ...``: validate -> plan -> launch (or ``--url`` attach) -> run the
  flow -> print the final output (stdout) and a per-agent summary (stderr).
- ``squad chat``: a main agent in a REPL; lines may @mention sub-agents.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import anyio
import typer
from rich.table import Table

from squad.cli._app import app, collect_params, console, engine_spec, err_console
from squad.errors import RecipeError, UserError

if TYPE_CHECKING:
    from squad.engine.info import EngineInfo
    from squad.recipes import RecipeRun

__all__ = ["run_command", "chat_command", "validate_command"]

recipes_app = typer.Typer(help="Work with recipe files.", no_args_is_help=True)
app.add_typer(recipes_app, name="recipes")


@recipes_app.command("validate")
def validate_command(
    files: Annotated[list[Path], typer.Argument(help="Recipe YAML files.", show_default=False)],
) -> None:
    """Check recipes without an engine: YAML, keys, types, agents, @mentions, parameters, every
    template rendered with stand-in values; when the model file is on disk, budgets against it
    (fixed prompts counted with its tokenizer), else says what it could not check. Prints OK,
    warnings or the error for each file; exit 2 if any has errors."""
    from squad.recipes import load_recipe

    failed = 0
    for path in files:
        try:
            loaded = load_recipe(path, require_params=False)
        except RecipeError as exc:
            failed += 1
            err_console.print(f"[red]error[/] {_esc(str(exc))}")
            continue
        warnings = loaded.warnings
        for warning in warnings:
            err_console.print(f"[yellow]warning[/] {_esc(str(warning))}")
        for note in loaded.unchecked:
            err_console.print(f"[cyan]not checked[/] {_esc(str(note))}")
        console.print(f"[green]OK[/] {_esc(str(path))}" + (f" ({len(warnings)} warnings)" if warnings else ""))
    if failed:
        err_console.print(f"{failed} of {len(files)} recipe(s) have errors")
        raise typer.Exit(2)


@app.command("run")
def run_command(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)],
    param: Annotated[list[str], typer.Option("--param", "-p", help="Parameter NAME=VALUE (repeat for lists); NAME=@FILE reads the file's text, @@ escapes a literal @.")] = [],  # noqa: B006
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model name or .gguf path (overrides the recipe).")] = None,
    slots: Annotated[Optional[int], typer.Option("--slots", help="Pin the slot count (1..8).")] = None,
    ctx: Annotated[Optional[int], typer.Option("--ctx", help="Pin the context in tokens.")] = None,
    ctk: Annotated[Optional[str], typer.Option("--ctk", help="KV cache type for K (f16, q8_0, q4_0, ...; overrides the recipe's cache_type).")] = None,
    ctv: Annotated[Optional[str], typer.Option("--ctv", help="KV cache type for V (default: same as --ctk).")] = None,
    llama_server: Annotated[Optional[str], typer.Option("--llama-server", help="Path to llama-server.")] = None,
    url: Annotated[Optional[str], typer.Option("--url", help="Attach to a running llama-server instead of launching one.")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="LLAMA_API_KEY", help="Bearer key of the engine at --url (default: the key `squad engine start` recorded for that URL).")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", "-t", min=1, help="Engine threads (-t).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print output, steps and per-agent stats as JSON.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Also write the final output to this file.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live view, no summary: only the output.")] = False,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Write the run trace (JSONL) here instead of the state dir.")] = None,
) -> None:
    """Run a recipe: validate, plan the engine, launch it, run the flow, print the output.

    Every run writes a JSONL trace (default: the newest file in ~/.local/state/squad/traces;
    see `squad trace show`)."""
    from squad.recipes import load_recipe, run_recipe, step_table
    from squad.trace import JsonlTrace, default_trace_path
    from squad.view import live_view

    loaded = load_recipe(recipe, collect_params(param))
    spec = engine_spec(loaded.engine_spec(), url=url, api_key=api_key, model=model, slots=slots, ctx=ctx,
                       binary=llama_server, threads=threads, cache_type_k=ctk, cache_type_v=ctv or ctk)
    for warning in loaded.warnings:
        err_console.print(f"[yellow]warning[/] {_esc(str(warning))}")

    trace_path = trace or default_trace_path()

    async def main() -> Any:
        with JsonlTrace(trace_path) as tracer, live_view(on=not quiet and not as_json, console=err_console) as sink:
            return await run_recipe(loaded, engine=spec, on_event=[tracer, sink])

    result = anyio.run(main)
    rows = step_table(result)
    if out is not None:
        out.write_text(result.output + ("\n" if not result.output.endswith("\n") else ""), encoding="utf-8")
    if as_json:
        typer.echo(json.dumps({
            "recipe": loaded.name, "output": result.output, "value": result.value,
            "steps": result.steps, "agents": rows, "errors": result.errors,
            "engine": _engine_json(result.info),
        }, indent=2, default=str))
        if result.errors:
            raise typer.Exit(1)
        return
    typer.echo(result.output)
    if not quiet:
        _summary(rows, result)
        err_console.print(f"trace: {_esc(str(trace_path))}  (squad trace show / squad trace plot)")
    if result.errors:
        err_console.print(f"[red]{len(result.errors)} step(s) failed[/] (policy collect let the run finish): "
                          + _esc("; ".join(f"{sid}: {msg}" for sid, msg in result.errors)))
        raise typer.Exit(1)


def _engine_json(info: "EngineInfo | None") -> dict[str, Any] | None:
    if info is None:
        return None
    return {"slots": info.slots, "n_ctx": info.n_ctx, "pool": info.pool, "base_url": info.base_url}


def _summary(rows: list[Any], result: "RecipeRun") -> None:
    table = Table(title="agents", title_justify="left", show_edge=False)
    for col in ("step", "agent", "state", "queued s", "first token s", "tokens", "tok/s", "slot"):
        table.add_column(col, justify="right" if col not in ("step", "agent", "state") else "left")
    for r in rows:
        table.add_row(
            r["step"], r["agent"], _esc(str(r["state"]))[:60], f"{r['queued_s']:.2f}",
            "-" if r["first_token_s"] is None else f"{r['first_token_s']:.2f}",
            f"{r['prompt_tokens']}+{r['completion_tokens']}",
            "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.1f}",
            "-" if r["slot"] is None else str(r["slot"]),
        )
    err_console.print(table)
    if result.info is not None:
        err_console.print(f"engine: {result.info.slots} slots, context {result.info.n_ctx} tokens (read back from /props)")
    for sid, message in result.errors:
        err_console.print(f"[yellow]step {sid} failed (policy collect):[/] {_esc(message)}")


@app.command("chat")
def chat_command(
    recipe: Annotated[Optional[Path], typer.Option("--recipe", help="Take agents and main agent from a recipe.")] = None,
    agent_file: Annotated[Optional[Path], typer.Option("--agent-file", help="A file with agents: (first is main unless --main).")] = None,
    main: Annotated[Optional[str], typer.Option("--main", help="The main agent's name.")] = None,
    param: Annotated[list[str], typer.Option("--param", "-p", help="Recipe parameter NAME=VALUE; NAME=@FILE reads the file's text, @@ escapes a literal @.")] = [],  # noqa: B006
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model name or .gguf path.")] = None,
    slots: Annotated[Optional[int], typer.Option("--slots", help="Pin the slot count (1..8).")] = None,
    ctx: Annotated[Optional[int], typer.Option("--ctx", help="Pin the context in tokens.")] = None,
    ctk: Annotated[Optional[str], typer.Option("--ctk", help="KV cache type for K (f16, q8_0, q4_0, ...; overrides the recipe's cache_type).")] = None,
    ctv: Annotated[Optional[str], typer.Option("--ctv", help="KV cache type for V (default: same as --ctk).")] = None,
    llama_server: Annotated[Optional[str], typer.Option("--llama-server", help="Path to llama-server.")] = None,
    url: Annotated[Optional[str], typer.Option("--url", help="Attach to a running llama-server.")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="LLAMA_API_KEY", help="Bearer key of the engine at --url (default: the key `squad engine start` recorded for that URL).")] = None,
    replan: Annotated[bool, typer.Option("--replan", help="When a line @mentions more agents than the engine has slots, "
                                         "reload the engine with more slots (after in-flight calls drain) instead of queueing.")] = False,
) -> None:
    """Chat with a main agent; @mention sub-agents in a line to run them at once. /quit ends."""
    from squad.chatloop import chat_loop
    from squad.runtime import Squad
    from squad.view import LiveView

    agents, main_name, variables, base = _chat_agents(recipe, agent_file, main, param)
    spec = engine_spec(base, url=url, api_key=api_key, model=model, slots=slots, ctx=ctx, binary=llama_server,
                       cache_type_k=ctk, cache_type_v=ctv or ctk)
    view = LiveView(console=err_console, live=False)

    def say(kind: str, text: str) -> None:
        style = {"answer": f"[bold]{main_name}>[/] ", "warning": "[yellow]warning[/] ", "error": "[red]error[/] "}
        (console if kind == "answer" else err_console).print(style.get(kind, "") + _esc(text))

    async def run() -> None:
        async with Squad(agents, main=main_name, engine=spec, on_event=view, variables=variables,
                         replan=replan) as sq:
            await chat_loop(sq, lambda: input("you> "), say)

    anyio.run(run)


def _chat_agents(recipe: Path | None, agent_file: Path | None, main: str | None,
                 param: list[str]) -> tuple[list[Any], str, dict[str, Any], Any]:
    from squad.agent import Agent
    from squad.recipes import load_agents, load_recipe

    if recipe is not None and agent_file is not None:
        raise UserError("give --recipe or --agent-file, not both")
    base = None
    if recipe is not None:
        loaded = load_recipe(recipe, collect_params(param))
        # a chat has no flow prompts to count: budgets the recipe left auto stay auto (the planner shares the context)
        counted = {r.agent for r in loaded.budgets if not r.fixed}
        agents = {n: a.model_copy(update={"budget": "auto"}) if n in counted else a for n, a in loaded.agents.items()}
        lead, variables, base = main or loaded.main, {"params": loaded.params}, loaded.engine_spec()
    elif agent_file is not None:
        agents, variables = load_agents(agent_file), {}
        lead = main or next(iter(agents), "")
    else:
        agents = {"assistant": Agent(name="assistant", instructions="You are a helpful assistant. Be brief.",
                                     max_tokens=256)}  # budget auto: the model's context
        lead, variables = "assistant", {}
    if lead not in agents:
        raise UserError(f"main agent {lead!r} is not defined (agents: {', '.join(agents)})")
    return list(agents.values()), lead, variables, base


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)
