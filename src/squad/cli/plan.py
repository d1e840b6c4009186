"""``squad plan``: show the engine plan for a recipe (or a quick list of agents) without
starting anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from squad.cli import options
from squad.cli._app import app, collect_params, config_model, console, engine_spec, recipe_engine_specs
from squad.errors import UserError
from squad.sched.workload import Call, Node, Parallel, Sequence

if TYPE_CHECKING:
    from squad.sched.plan import EnginePlan

__all__ = ["plan_command", "parse_agents"]


@app.command("plan")
def plan_command(
    recipe: Annotated[Path | None, typer.Argument(help="Recipe YAML file.", show_default=False)] = None,
    param: Annotated[list[str], options.param()] = [],  # noqa: B006
    model: Annotated[str | None, options.model("the recipe's model, else smollm2-135m")] = None,
    slots: Annotated[int | None, options.slots("planned from the workload")] = None,
    ctx: Annotated[int | None, options.ctx("planned from the budgets")] = None,
    ctk: Annotated[str | None, options.ctk()] = None,
    ctv: Annotated[str | None, options.ctv()] = None,
    gpu_layers: Annotated[str | None, options.gpu_layers()] = None,
    backend: Annotated[str, typer.Option("--backend", help="llama-server, mlx or attached.")] = "llama-server",
    mlx_batch: Annotated[int | None,
                         typer.Option("--mlx-batch", show_default=False, help="MLX max batch size (MLX only).")] = None,
    url: Annotated[str | None,
                   options.url("With --backend attached: the running engine to check the plan against.")] = None,
    api_key: Annotated[str | None, options.api_key()] = None,
    agents: Annotated[str | None,
                      typer.Option("--agents", show_default=False,
                                   help="Quick workload instead of a recipe: NAME:BUDGET,NAME:BUDGET,... (BUDGET in "
                                        "tokens or auto).")] = None,
    parallel: Annotated[bool, typer.Option("--parallel",
                                           help="With --agents: all at once (default: one after another).")] = False,
    as_json: Annotated[bool, options.as_json("Print the plan as JSON.")] = False,
    check_mcp: Annotated[bool, options.check_mcp("check the tools its agents name and count their schemas in "
                                                 "the auto budgets")] = False,
) -> None:
    """Plan slots and context for a recipe and show why: the concurrency timeline, KV memory
    against the memory available, warnings and the exact llama-server command line."""
    from squad.cli.planview import plan_json, render_plan
    from squad.engine.session import plan_engine

    if backend not in ("llama-server", "mlx", "attached"):
        raise UserError(f"--backend {backend!r}: use llama-server, mlx or attached")
    if (recipe is None) == (agents is None):
        raise UserError("give a recipe file, or --agents NAME:BUDGET,... for a quick workload (not both)")
    workload: Node | None
    base, rows, reads, warned = None, (), (), []
    if recipe is not None:
        from squad.recipes import load_recipe

        loaded = load_recipe(recipe, collect_params(param), model=model, default_model=config_model(), ctx=ctx)
        if loaded.mcp_servers:
            _mcp(loaded, check_mcp)
        workload, base, rows, reads = loaded.workload(), loaded.engine_spec(), loaded.budgets, loaded.reads
        warned = [str(w) for w in loaded.warnings]
    else:
        calls = parse_agents(agents or "")
        workload = Parallel(calls) if parallel else Sequence(calls)
    overrides = dict(model=model, slots=slots, ctx=ctx, cache_type_k=ctk, cache_type_v=ctv or ctk, backend=backend,
                     mlx_max_batch=mlx_batch, gpu_layers=options.parse_gpu_layers(gpu_layers))
    if recipe is not None and loaded.engines and url is None:  # several engines (squad.chat.routing)
        _several(recipe_engine_specs(loaded, **overrides), workload, as_json=as_json, reads=reads, rows=rows)
        return
    spec = engine_spec(base, **overrides)
    the_plan = plan_engine(spec, workload, pull=False)
    if url is not None:
        if backend != "attached":
            raise UserError("--url is for an attached engine: add --backend attached")
        the_plan = _check_engine(the_plan, url, api_key)
    the_plan = _never_fit(the_plan, rows, loaded.warnings if recipe is not None else ())
    binary = _binary(spec.binary)
    if as_json:
        sharing = (sharing_lines(loaded, attached=url is not None or backend != "llama-server")
                   if recipe is not None else [])
        typer.echo(json.dumps({"steps": step_budgets_json(rows), "reads": [{"path": p, "why": why} for p, why in reads],
                               "recipe_warnings": warned, **plan_json(the_plan, binary), "shared_input": sharing,
                               "tool_choice": tool_choice_lines(loaded) if recipe is not None else []},
                              indent=2))
    else:
        if reads:
            _render_reads(reads)
        if rows:
            _render_steps(rows)
        _render_warnings(warned)
        render_plan(the_plan, console, binary)
        if recipe is not None:
            _render_sharing(loaded, attached=url is not None or backend != "llama-server")
            for line in tool_choice_lines(loaded):
                console.print("[bold]tool_choice[/] " + escape_text(line), soft_wrap=True)


def sharing_lines(recipe: Any, *, attached: bool = False) -> list[str]:
    """What ``squad plan`` says about shared input (:mod:`squad.sched.share`): per fan-out step, the
    layout the author declared (``shared:`` put first in each system message, or the prompts as
    written) and what the engine is asked to prefill once."""
    from squad.sched.share import SEPARATOR, share_mode

    mode = share_mode(getattr(recipe, "shared_input", "prefix"))
    lines: list[str] = []
    for step in recipe.flow:
        children = list(step.steps) if step.kind == "parallel" else [step] if step.kind == "map" else []
        if not children:
            continue
        agents = ", ".join(c.agent for c in children)
        declared = [c.id for c in children if c.shared]
        if declared:
            lines.append(f"step '{step.id}' ({agents}): shared: of {', '.join(declared)} goes first in each agent's "
                         f"system message: system = [shared context]{SEPARATOR!r}[its instructions], user = its "
                         "prompt as written (the layout the recipe asks for)")
        else:
            lines.append(f"step '{step.id}' ({agents}): prompts sent as written (no shared: context); only a "
                         "prefix the agents' messages already begin with is shared")
        if mode == "off":
            lines.append("  shared_input: off: each slot prefills its own prompt")
        elif attached:
            lines.append("  note: an attached engine was not started with --slot-save-path by squad, so each slot "
                         "prefills its own copy of a common prefix")
        else:
            lines.append("  a common prefix of 64 tokens or more is prefilled once in the first slot admitted, saved "
                         "and restored into the others (a copy per slot: the pool still counts it per slot); "
                         "call.finished reports what the engine reused")
    return lines


def tool_choice_lines(recipe: Any) -> list[str]:
    """What ``squad plan`` says about a named ``tool_choice`` (the one place squad offers other tool definitions
    than the agent's in a round, invariant I2): per agent, that its first round offers only that tool."""
    lines = []
    for name, agent in recipe.agents.items():
        choice = getattr(agent, "tool_choice", "auto")
        if choice not in ("auto", "required", None):
            lines.append(f"agent '{name}' (tool_choice: {choice}): the first round of each turn offers only the tool "
                         f"{choice} with tool_choice required (llama-server reads tool_choice only as a string); "
                         "later rounds offer all its tools, so the engine reads the prompt again after that round")
    return lines


def escape_text(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _render_sharing(recipe: Any, *, attached: bool) -> None:
    from rich.markup import escape

    lines = sharing_lines(recipe, attached=attached)
    if lines:
        console.print("[bold]shared input[/] (shared_input: " + escape(str(recipe.shared_input)) + "; squad "
                      "changes no prompt for it):")
        for line in lines:
            console.print("  " + escape(line), soft_wrap=True)


def _never_fit(the_plan: EnginePlan, rows: Any, recipe_warnings: Any = ()) -> EnginePlan:
    """``the_plan`` with a warning for each step whose counted prompt + max_tokens is more than
    one request may hold (that call can never fit, whatever waits: say what to change), and
    for each map step known to have no items (:class:`~squad.recipes.model.EmptyMapWarning`)."""
    import dataclasses

    from squad.recipes.model import EmptyMapWarning

    room = the_plan.per_slot_ctx or the_plan.n_ctx
    found = []
    for r in rows:
        need = r.prompt + r.max_tokens
        if need > room and not r.estimated:
            found.append(f"step {r.step!r} (agent {r.agent!r}) needs {need:,} tokens in one call (prompt {r.prompt:,} "
                         f"+ max_tokens {r.max_tokens:,}), more than the {room:,} one request may hold: it can never "
                         f"fit, squad would refuse it; raise the context to {need:,} or more (--ctx, or engine: ctx: "
                         f"in the recipe), or lower max_tokens of agent {r.agent!r} to {max(1, room - r.prompt):,} "
                         "or shorten its prompt")
    found += [str(w) for w in recipe_warnings if isinstance(w, EmptyMapWarning)]
    if not found:
        return the_plan
    return dataclasses.replace(the_plan, warnings=tuple(found) + the_plan.warnings)


def _several(specs: list[Any], workload: Node | None, *, as_json: bool, reads: Any, rows: Any) -> None:
    """The plan of a recipe with an ``engines:`` list: each launched engine planned for the whole
    workload with 1/N of the KV memory (N launched, the rule of :mod:`squad.chat.routing`); an engine
    at a URL is listed, its capacity read when a run attaches."""
    from squad.cli.planview import plan_json, render_plan
    from squad.engine.session import plan_engine

    launched = [s for s in specs if s.url is None]
    share = 1.0 / len(launched) if launched else 1.0
    shown: list[dict[str, Any]] = []
    for i, spec in enumerate(specs, start=1):
        if spec.url is not None:
            shown.append({"engine": i, "url": spec.url, "note": "attached: its capacity is read when the run attaches"})
            continue
        shown.append({"engine": i, "share": round(share, 4),
                      "plan": plan_engine(spec, workload, pull=False, share=share),
                      "binary": _binary(spec.binary)})
    if as_json:
        typer.echo(json.dumps({"steps": step_budgets_json(rows), "reads": [{"path": p, "why": why} for p, why in reads],
                               "engines": [{**{k: v for k, v in e.items() if k not in ("plan", "binary")},
                                            **(plan_json(e["plan"], e["binary"]) if "plan" in e else {})}
                                           for e in shown]}, indent=2))
        return
    if reads:
        _render_reads(reads)
    if rows:
        _render_steps(rows)
    for e in shown:
        if "plan" not in e:
            console.print(f"[bold]engine {e['engine']} of {len(specs)}[/]: at {e['url']} ({e['note']})")
            continue
        console.print(f"[bold]engine {e['engine']} of {len(specs)}[/]: launched, planned for the whole workload with "
                      f"{e['share']:.0%} of the KV memory ({len(launched)} launched engines share it)")
        render_plan(e["plan"], console, e["binary"])


def _mcp(loaded: Any, start: bool) -> None:
    """With ``start``: start the recipe's MCP servers, check its agents' tools, count their
    schemas into the auto budgets, stop them. Without: say the schemas are not counted."""
    from squad.cli._app import err_console

    names = ", ".join(s.name for s in loaded.mcp_servers)
    if not start:
        err_console.print(f"note: MCP server(s) {names} not started, so their tool schemas are not counted in the "
                          "auto budgets (squad run counts them); pass --check-mcp to start them and count",
                          soft_wrap=True)
        return
    import anyio

    from squad.recipes import recipe_mcp

    async def count() -> None:
        async with recipe_mcp(loaded) as servers:
            for w in servers.warnings:  # a server's stdout noise
                err_console.print(f"warning: {w.warning}", markup=False, highlight=False, soft_wrap=True)

    anyio.run(count)


def step_budgets_json(rows: Any) -> list[dict[str, Any]]:
    """Per step and agent: counted prompt tokens, whether estimated, max_tokens, the tool rounds
    planned and their tokens, budget, and the thinking budget inside max_tokens (None: not set)."""
    return [{"step": r.step, "agent": r.agent, "prompt_tokens": r.prompt, "estimated": r.estimated,
             "max_tokens": r.max_tokens, "tool_rounds": r.tool_rounds, "tool_tokens": r.tool_tokens,
             "budget": r.budget, "budget_kind": "fixed" if r.fixed else "auto",
             "thinking_budget": getattr(r, "thinking_budget", None)}
            for r in rows]


def _render_warnings(warnings: list[str]) -> None:
    """The recipe's warnings (e.g. a budget that cannot hold its tool rounds)."""
    from rich.markup import escape

    from squad.cli._app import err_console

    for warning in warnings:
        err_console.print(f"[yellow]warning[/] {escape(warning)}", soft_wrap=True)


def _render_reads(reads: Any) -> None:
    """The files loading the recipe read (recipes are trusted like scripts: a ``type: file``
    parameter reads any file the user can read, and its text goes to the model)."""
    from rich.markup import escape

    console.print("[bold]files this recipe reads[/] (their text may be sent to the model):")
    for path, why in reads:
        console.print(f"  {escape(path)}  [dim]{escape(why)}[/]")


def _render_steps(rows: Any) -> None:
    from rich.table import Table

    tools = any(r.tool_rounds for r in rows)
    thinks = any(getattr(r, "thinking_budget", None) is not None for r in rows)
    table = Table(title="budgets per step (prompt counted with the model's tokenizer; ~ = estimated with "
                        "earlier outputs at their max_tokens" + ("; tool rounds: rounds x (max_tokens for a call + "
                                                                  "results)" if tools else "")
                        + ("; thinking: the most of max_tokens a call may spend thinking" if thinks else "") + ")")
    for name in ("step", "agent", "prompt", "max_tokens", *(("thinking",) if thinks else ()),
                 *(("tool rounds",) if tools else ()), "budget"):
        table.add_column(name, justify="left" if name in ("step", "agent") else "right")
    for r in rows:
        rounds = ((f"{r.tool_rounds} x {r.tool_tokens // r.tool_rounds:,} = {r.tool_tokens:,}" if r.tool_rounds
                   else "-"),) if tools else ()
        thinking = (_thinking_cell(r.thinking_budget),) if thinks else ()
        table.add_row(r.step, r.agent, ("~" if r.estimated else "") + f"{r.prompt:,}", str(r.max_tokens), *thinking,
                      *rounds, f"{r.budget:,}" + (" (fixed)" if r.fixed else " (auto)"))
    console.print(table)


def _thinking_cell(budget: int | None) -> str:
    """A step's thinking budget in the plan's table: ``-`` (not set), ``off`` (0), ``<= N``."""
    return "-" if budget is None else "off" if budget == 0 else f"<= {budget:,}"


def parse_agents(text: str) -> tuple[Call, ...]:
    """``"lead:4096,sec:auto"`` → Calls (``auto`` = None, shared by the planner); raises
    UserError naming the bad entry."""
    calls = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, sep, budget = entry.partition(":")
        if not sep or not name or not (budget.strip().isdigit() or budget.strip() == "auto"):
            raise UserError(f"--agents entry {entry!r}: write NAME:BUDGET with the budget in tokens or auto, "
                            f"e.g. lead:4096")
        calls.append(Call(name.strip(), None if budget.strip() == "auto" else int(budget)))
    if not calls:
        raise UserError("--agents is empty: write NAME:BUDGET,..., e.g. lead:4096,security:4096")
    return tuple(calls)


def _check_engine(the_plan: EnginePlan, url: str, api_key: str | None) -> EnginePlan:
    """Read the attached engine's /props and add a warning for each way it is too small."""
    import dataclasses

    import anyio

    from squad.config import api_key_for
    from squad.engine.control import attach
    from squad.sched.planner import check_attached

    info = anyio.run(attach, url, api_key_for(url, api_key))
    found = check_attached(the_plan, info.slots, info.n_ctx, kv_unified=info.kv_unified)
    reason = f"attached engine at {url}: {info.slots} slot(s), context {info.n_ctx:,} per slot"
    return dataclasses.replace(the_plan, reasons=the_plan.reasons + (reason,),
                               warnings=the_plan.warnings + tuple(found))


def _binary(given: str | Path | None) -> str:
    """The llama-server a run would use: ``given`` (the spec's, from the config file), else the search."""
    try:
        from squad.engine.binary import resolve_llama_server

        return str(resolve_llama_server(given).path)
    except Exception:  # noqa: BLE001 - only for display; any failure shows the plain name
        return "llama-server"
