"""The kinds of server squad talks to, one module each, and :func:`probe`, which tells them apart.

Each module holds one :class:`~squad.engine.kinds.base.EngineKind` (``KIND``): how to detect it and
read its capacity, how squad admits within it, how its prompts are counted (a
:class:`~squad.engine.kinds.counting.PromptCounting` object) and how it takes a thinking budget.
The client (:mod:`squad.chat.transport`), ``squad serve`` and the CLI use a server's kind only
through that record (:attr:`squad.engine.info.EngineInfo.engine_kind`), never by switching on its
name. A new kind is a new module here named in :data:`_MODULES` (and its fake in
:mod:`squad.testing.fake_kinds`); ``tests/engine/test_toy_kind.py`` adds one.

:func:`probe` returns a :class:`Capacity`: the kind (``vllm``, ``sglang``, ``ollama``,
``lmstudio``, ``openai-compatible``), ``slots`` (requests at once), ``n_ctx`` (tokens of one
request), ``pool`` (tokens the running requests hold together), and where each number came
from (:attr:`Capacity.sources`). llama-server and ``squad serve`` are read by
:func:`squad.engine.control.attach`. What no endpoint tells comes from the pins, else
:data:`DEFAULT_SLOTS` / :data:`DEFAULT_CTX`; a pin only lowers a reported limit.

Design (each kind's endpoints, overflow behaviour and sources): docs/design/engine-kinds.md
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx

from squad.engine.kinds import llama_cpp, lmstudio, ollama, openai_compatible, sglang, squad_serve, vllm
from squad.engine.kinds.base import DEFAULT_CTX, DEFAULT_SLOTS, Capacity, EngineKind, Pins, first_model, get_json
from squad.engine.kinds.vllm import parse_cache_config

__all__ = ["EngineKind", "ENGINE_KINDS", "kind_of", "Capacity", "probe", "served_model", "KINDS", "DEFAULT_SLOTS",
           "DEFAULT_CTX", "parse_cache_config", "POLICIES", "thinking_fields", "THINKING"]

_MODULES = (llama_cpp, squad_serve, sglang, vllm, ollama, lmstudio, openai_compatible)
"""The kinds squad ships: each module's ``KIND``."""

ENGINE_KINDS: dict[str, EngineKind] = {m.KIND.name: m.KIND for m in _MODULES}
"""Every kind by name; :func:`probe` tries those with a probe, lowest ``probe_order`` first. A kind
made at run time may be added here (``ENGINE_KINDS[kind.name] = kind``)."""

FALLBACK = openai_compatible.KIND
"""The kind of a server squad does not know (and of a name not in :data:`ENGINE_KINDS`)."""


def kind_of(name: str) -> EngineKind:
    """The :class:`EngineKind` named ``name``; :data:`FALLBACK` for a name squad does not know."""
    return ENGINE_KINDS.get(name, FALLBACK)


async def probe(client: httpx.AsyncClient, *, slots: int | None = None, ctx: int | None = None,
                kinds: Iterable[EngineKind] | None = None) -> Capacity:
    """Detect the kind of server at ``client`` (not a llama-server: see the module docstring)
    and read its capacity; ``slots``/``ctx`` are the user's pins; ``kinds``: the kinds to try
    (default: :data:`ENGINE_KINDS`). An unknown server is ``openai-compatible`` with the pins or
    the defaults, if it answers ``GET /v1/models`` with a model list; raises
    :class:`~squad.errors.UserError` when it does not (not an engine, or the key refused)."""
    pins = Pins(slots, ctx)
    for kind in sorted((k for k in (ENGINE_KINDS.values() if kinds is None else kinds) if k is not FALLBACK),
                       key=lambda k: k.probe_order):
        capacity = await kind.probe(client, pins) if kind.probe is not None else None
        if capacity is not None:
            return capacity
    return await openai_compatible.probe(client, pins)


async def served_model(client: httpx.AsyncClient) -> str:
    """``/v1/models`` ``data[0].id``, the model name requests must carry, or ""."""
    card = first_model(await get_json(client, "/v1/models"))
    return str(card.get("id", "")) if card else ""


def thinking_fields(kind: str, budget: int | None) -> dict[str, Any] | None:
    """:meth:`EngineKind.thinking_fields` of the kind named ``kind``."""
    return kind_of(kind).thinking_fields(budget)


# Views of the records by name, for code written against the flat module (read-only snapshots).
KINDS = tuple(ENGINE_KINDS)
"""Every kind :func:`squad.engine.control.attach` can report."""
POLICIES = {k.name: k.policy for k in ENGINE_KINDS.values()}
"""Admission per kind, in words (shown by ``squad engine info --url``)."""
THINKING = {k.name: k.thinking for k in ENGINE_KINDS.values() if k.thinking is not None}
"""How each kind takes an agent's ``thinking_budget``, in words; a kind not listed takes none."""
