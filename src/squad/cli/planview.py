"""Show an :class:`~squad.sched.planner.EnginePlan` to people (rich) and to programs (JSON).

Both views carry the same facts: the concurrency timeline (which agents run together at
each stage, and the sum of their budgets), slots, context, unified KV, per-slot share, KV
memory against the memory available for it, reasons, warnings and the exact
``llama-server`` command line the launcher would run (port and API key as placeholders).
"""

from __future__ import annotations

import shlex
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from squad.engine.llama import round_ctx
from squad.sched.plan import EnginePlan

__all__ = ["command_line", "plan_json", "render_plan"]

PORT_PLACEHOLDER = "<PORT>"
KEY_PLACEHOLDER = "<KEY>"


def command_line(plan: EnginePlan, binary: str = "llama-server") -> str | None:
    """The shell command that starts the planned engine, or None for MLX and attached
    engines (squad starts neither). The API key goes in the environment, as the launcher
    passes it (``LLAMA_API_KEY``)."""
    if plan.backend != "llama-server":
        return None
    from squad.engine.launcher import build_args

    args = build_args(plan, port=0)
    args = [PORT_PLACEHOLDER if a == "0" and prev == "--port" else a for prev, a in zip(["", *args], args)]
    return f"LLAMA_API_KEY={KEY_PLACEHOLDER} " + shlex.join([binary, *args]).replace(
        shlex.quote(PORT_PLACEHOLDER), PORT_PLACEHOLDER)


def plan_json(plan: EnginePlan, binary: str = "llama-server") -> dict[str, Any]:
    """The plan as a JSON-ready dict. Sizes in tokens and bytes; ``peak`` -1 = unbounded."""
    return {
        "model": str(plan.model),
        "backend": plan.backend,
        "slots": plan.slots,
        "n_ctx": plan.n_ctx,
        "requested_ctx": plan.requested_ctx,
        "kv_unified": plan.kv_unified,
        "per_slot_ctx": plan.per_slot_ctx,
        "n_ctx_train": plan.n_ctx_train,
        "cache_type_k": plan.cache_type_k,
        "cache_type_v": plan.cache_type_v,
        "chat_template": plan.template_name,
        "chat_template_file": str(plan.chat_template) if plan.chat_template else None,
        "kv_bytes": plan.kv_bytes,
        "kv_bytes_full": plan.kv_bytes_full,
        "cache_ram_mib": plan.cache_ram_mib,
        "memory_for_kv": plan.memory_for_kv,
        "memory_source": plan.memory_source,
        "peak": plan.peak,
        "timeline": [
            {
                "label": s.label,
                "agents": [{"agent": c.agent, "budget": c.budget} for c in s.calls],
                "unbounded": [{"agent": c.agent, "budget": c.budget} for c in s.unbounded],
                "budget": s.budget,
            }
            for s in plan.timeline
        ],
        "reasons": list(plan.reasons),
        "warnings": list(plan.warnings),
        "server_args": plan.server_args(),
        "command": command_line(plan, binary),
    }


def render_plan(plan: EnginePlan, console: Console, binary: str = "llama-server") -> None:
    """Print the plan: timeline table, engine settings, reasons, warnings, command line."""
    if plan.timeline:
        table = Table(title="concurrency timeline", title_justify="left", show_edge=False)
        table.add_column("#", justify="right")
        table.add_column("stage")
        table.add_column("agents running together")
        table.add_column("at once", justify="right")
        table.add_column("budgets (tokens)", justify="right")
        for i, s in enumerate(plan.timeline, 1):
            at_once = "∞" if s.unbounded else str(len(s.calls))
            budget = f"{s.budget:,}" + (" + ∞" if s.unbounded else "")
            table.add_row(str(i), s.label, ", ".join(s.agents), at_once, budget)
        console.print(table)
    else:
        console.print("[dim]nothing to plan: no agents in the workload[/]")
    console.print()

    rows = Table.grid(padding=(0, 2))
    rows.add_column(style="bold")
    rows.add_column()
    rows.add_row("model", str(plan.model))
    rows.add_row("backend", plan.backend + (" (what the workload needs)" if plan.backend == "attached" else ""))
    rows.add_row("slots", str(plan.slots))
    ctx = f"{plan.n_ctx:,} tokens"
    if plan.requested_ctx is not None and plan.requested_ctx < plan.n_ctx == round_ctx(plan.requested_ctx):
        ctx += f" (requested {plan.requested_ctx:,}, rounded up to a multiple of 256)"
    elif plan.requested_ctx is not None and plan.requested_ctx > plan.n_ctx:
        ctx += f" (the workload wanted {plan.requested_ctx:,}; see warnings)"
    rows.add_row("context", ctx)
    rows.add_row("unified KV", "yes: one pool shared by all slots" if plan.kv_unified else "no")
    if plan.per_slot_ctx is not None:
        rows.add_row("per request", f"up to {plan.per_slot_ctx:,} tokens"
                     + (f" (training context {plan.n_ctx_train:,})" if plan.n_ctx_train else ""))
    rows.add_row("KV cache", _memory(plan))
    if plan.backend == "llama-server":
        rows.add_row("template", plan.template_name)
    console.print(rows)

    if plan.reasons:
        console.print("\n[bold]why[/]")
        for r in plan.reasons:
            console.print(Text("  • " + r))
    if plan.warnings:
        console.print("\n[bold yellow]warnings[/]")
        for w in plan.warnings:
            console.print(Text("  ! " + w, style="yellow"))
    cmd = command_line(plan, binary)
    if cmd:
        console.print("\n[bold]engine command[/]")
        console.print(Text("  " + cmd), soft_wrap=True)


def _memory(plan: EnginePlan) -> str:
    if plan.kv_bytes is None:
        return f"{plan.cache_type_k}/{plan.cache_type_v}, size unknown"
    text = f"{_mib(plan.kv_bytes)} at {plan.cache_type_k}/{plan.cache_type_v}"
    if plan.memory_for_kv is not None:
        share = plan.kv_bytes / plan.memory_for_kv if plan.memory_for_kv else float("inf")
        text += f" of {_mib(plan.memory_for_kv)} available ({share:.0%})"
        if plan.memory_source:
            text += f" in {plan.memory_source}"
    if plan.kv_bytes_full and plan.kv_bytes_full > plan.kv_bytes:
        text += (f"; sliding window saves {_mib(plan.kv_bytes_full - plan.kv_bytes)} "
                 f"(every layer holding all cells: {_mib(plan.kv_bytes_full)})")
    if plan.cache_ram_mib is not None:
        text += f"; host prompt cache (--cache-ram) {plan.cache_ram_mib:,} MiB more"
    return text


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"
