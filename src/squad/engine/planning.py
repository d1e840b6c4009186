"""From an engine spec and a workload to a plan: :func:`plan_engine` (model → GGUF facts →
memory → :func:`squad.sched.planner.plan`), and the chat template the engine gets
(:func:`with_chat_template`). ``Squad``, ``squad run`` and ``squad plan`` all call
:func:`plan_engine`, so they cannot disagree about the argv.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import cast

from squad.engine.chat_templates import describe, tool_template_for
from squad.engine.facts import read_model_facts
from squad.engine.registry import resolve_model
from squad.engine.spec import EngineSpec
from squad.engine.template_profile import profile
from squad.errors import SquadError
from squad.sched.memory import GpuLayers, kv_memory
from squad.sched.plan import EnginePlan
from squad.sched.planner import plan
from squad.sched.workload import Node

__all__ = ["plan_engine", "with_chat_template"]


def plan_engine(spec: EngineSpec, workload: Node | None, *, pull: bool = True, share: float = 1.0) -> EnginePlan:
    """The plan for ``workload`` on the engine ``spec`` describes. Blocking (reads the GGUF
    file; run it in a worker thread from async code).

    ``pull``: fetch a known model that is not in the cache yet (False: raise instead).
    ``share``: the fraction (0 < share <= 1) of the memory for KV this engine may plan for, when
    several engines launched on this machine divide it (:mod:`squad.chat.routing`: 1/N each).
    Raises :class:`~squad.errors.ModelError` (no such model) or
    :class:`~squad.errors.PlanError` (the workload cannot be planned).
    """
    model_path = resolve_model(spec.model, pull=pull)
    facts = read_model_facts(model_path)
    ctk, ctv = spec.kv_types
    memory = kv_memory(model_path, n_layer=facts.n_layer, gpu_layers=cast("GpuLayers | None", spec.gpu_layers))
    if share < 1.0:
        memory = dataclasses.replace(memory, bytes=int(memory.bytes * share),
                                     source=f"{share:.0%} of {memory.source}, shared with other engines")
    planned = plan(
        workload,
        model=model_path,
        n_ctx_train=facts.n_ctx_train,
        kv_bytes_per_token=facts.kv_bytes_per_token(ctk, ctv),
        kv_bytes_per_token_q8_0=facts.kv_bytes_per_token("q8_0", "q8_0"),
        kv_bytes_at=(lambda n_ctx,
                     slots: facts.kv_bytes(n_ctx, ctk, ctv, slots=slots)) if facts.sliding_window else None,
        memory_for_kv=memory.bytes,
        memory_source=memory.source,
        backend=spec.backend,
        pin_slots=spec.slots,
        pin_ctx=spec.ctx,
        cache_type_k=ctk,
        cache_type_v=ctv,
        mlx_max_batch=spec.mlx_max_batch,
    )
    if spec.backend == "llama-server" and memory.gpu_layers is not None:
        planned = dataclasses.replace(planned, gpu_layers=memory.gpu_layers)
    return with_chat_template(planned, facts.chat_template, has_tool_use_template=facts.has_tool_use_template)


def _with_profile(planned: EnginePlan, source: str | None) -> EnginePlan:
    """``planned`` with a reason naming the template's family, tool-call style, reasoning and how
    prompts are counted, and a warning for a template that is not the model's family's
    (:func:`squad.engine.template_profile.profile`)."""
    try:
        found = profile(source, planned.model if Path(str(planned.model)).is_file() else None)
    except SquadError:
        return planned
    return dataclasses.replace(planned, reasons=(*planned.reasons, "template profile: " + found.summary()),
                               warnings=(*planned.warnings, *found.warnings))


def with_chat_template(planned: EnginePlan, source: str | None, *, has_tool_use_template: bool = False) -> EnginePlan:
    """``planned`` with the chat template the engine gets for a model whose own template is
    ``source`` (:func:`squad.engine.chat_templates.tool_template_for`), and a reason saying which."""
    if planned.backend != "llama-server":
        return planned
    chosen = tool_template_for(source, has_tool_use_template=has_tool_use_template)
    planned = _with_profile(planned, chosen.text if chosen is not None else source)
    if chosen is not None and source is None:
        why = (f"chat template: {chosen.name}, because the model file has none: llama-server would fall back to "
               "ChatML without a tools section (tool definitions dropped); squad's ChatML template carries them")
        return dataclasses.replace(planned, chat_template=chosen.path, template_name=chosen.name,
                                   reasons=(*planned.reasons, why))
    if chosen is None:
        return dataclasses.replace(planned, template_name=describe(source),
                                   reasons=(*planned.reasons, f"chat template: {describe(source)}"))
    lacks = ("lists tools but renders no tool call (llama-server then parses no call: every call stays text)"
             if source and "tool" in source.lower()
             else "has no tools section (llama-server would drop tool definitions)")
    why = (f"chat template: {chosen.name}, because the model's own {chosen.chat_format} template {lacks}; it renders "
           "the same conversation format and lets the engine parse tool calls itself")
    return dataclasses.replace(planned, chat_template=chosen.path, template_name=chosen.name,
                               reasons=(*planned.reasons, why))


