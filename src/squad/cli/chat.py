"""``squad chat``: a main agent in a REPL; lines may @mention sub-agents."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, cast

import anyio
import typer

from squad.cli import options
from squad.cli._app import app, collect_params, config_model, console, engine_spec, err_console
from squad.cli.run_report import esc
from squad.errors import UserError

__all__ = ["chat_command"]


@app.command("chat")
def chat_command(
    recipe: Annotated[Path | None, typer.Option("--recipe", show_default=False,
                                                help="Take the agents and the main agent from this recipe.")] = None,
    agent_file: Annotated[Path | None,
                          typer.Option("--agent-file", show_default=False,
                                       help="A YAML file with agents: (the first is the main agent "
                                            "unless --main).")] = None,
    main: Annotated[str | None,
                    typer.Option("--main", show_default=False,
                                 help="The main agent's name (default: the recipe's main, or the first agent "
                                      "of --agent-file).")] = None,
    param: Annotated[list[str], options.param("With --recipe: a recipe parameter")] = [],  # noqa: B006
    model: Annotated[str | None, options.model("the recipe's model, else smollm2-135m")] = None,
    slots: Annotated[int | None, options.slots("planned from the agents")] = None,
    ctx: Annotated[int | None, options.ctx("planned from the agents' budgets")] = None,
    ctk: Annotated[str | None, options.ctk()] = None,
    ctv: Annotated[str | None, options.ctv()] = None,
    llama_server: Annotated[Path | None, options.llama_server()] = None,
    url: Annotated[str | None, options.url("Attach to the llama-server at this URL instead of launching one.")] = None,
    api_key: Annotated[str | None, options.api_key()] = None,
    threads: Annotated[int | None, options.threads()] = None,
    replan: Annotated[bool,
                      typer.Option("--replan", help="When a line @mentions more agents than the engine has slots, "
                                         "reload the engine with more slots (after in-flight calls drain) "
                                         "instead of queueing.")] = False,
    load_timeout: Annotated[float | None, options.load_timeout()] = None,
    request_timeout: Annotated[float | None, options.request_timeout()] = None,
    queue: Annotated[str | None, options.queue()] = None,
) -> None:
    """Chat with a main agent; @mention sub-agents in a line to run them at once. /quit ends."""
    from squad.dirs import ENGINE_STATE, check_state_dirs
    from squad.events.view import LiveView
    from squad.runtime.chatloop import chat_loop
    from squad.runtime.squad import Squad

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
        (console if kind == "answer" else err_console).print(style.get(kind, "") + esc(text))

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
    if sys.stdin.isatty():
        return input("you> ")
    sys.stdout.write("you> ")
    sys.stdout.flush()
    line = cast(Any, sys.stdin.buffer).raw.readline()
    if not line:
        raise EOFError
    return line.decode("utf-8", "surrogateescape").rstrip("\r\n")


def _chat_agents(recipe: Path | None, agent_file: Path | None, main: str | None,
                 param: list[str], model: str | None = None,
                 ctx: int | None = None) -> tuple[list[Any], str, dict[str, Any], Any, tuple]:
    """The chat's agents, main agent, template variables, engine spec and MCP servers (a recipe's)."""
    from squad.recipes import load_agents, load_recipe
    from squad.runtime.agent import Agent

    if recipe is not None and agent_file is not None:
        raise UserError("give --recipe or --agent-file, not both")
    if param and recipe is None:
        raise UserError("-p/--param sets a recipe's parameters: use it with --recipe")
    base: Any = None
    servers: tuple[Any, ...] = ()
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
