"""The APIs ``squad serve`` admits, one module each (:class:`~squad.serve.apis.base.Api`): chat
(:mod:`.chat`), text completions (:mod:`.completion`), OpenAI Responses (:mod:`.responses`),
Anthropic Messages (:mod:`.messages`), embeddings (:mod:`.embeddings`), code infill (:mod:`.infill`)
and reranking (:mod:`.rerank`). :data:`APIS` names them; :data:`ROUTES` maps each path to its API.

llama-server b11434 converts a Responses or Messages body to a chat body itself
(``tools/server/server-chat.cpp``) and answers in that API's own shape. squad serve forwards the
body after :mod:`squad.serve.forcing` and after writing the generation limit it reserved
(:meth:`~squad.serve.apis.base.Api.write_limit`), and counts its prompt with the engine's own
counting endpoint for that API (``{"input_tokens": N}``, the exact prompt the request would use).
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx

from squad.engine.template_profile import fit_call_id, fit_call_ids
from squad.errors import EngineError, EngineGone
from squad.serve.apis.base import MAX_TOKEN_CHARS, Api, Counting, prompt_floor
from squad.serve.apis.chat import Chat
from squad.serve.apis.completion import Completion
from squad.serve.apis.embeddings import Embeddings
from squad.serve.apis.infill import Infill
from squad.serve.apis.messages import Messages
from squad.serve.apis.rerank import Rerank
from squad.serve.apis.responses import Responses
from squad.serve.demand import Demand, Kind, Refused, demand_for
from squad.serve.forcing import force_chat, force_messages, force_responses, repair_history

__all__ = ["Api", "APIS", "BY_NAME", "ROUTES", "PASS_POST", "Counting", "prepare", "demand", "engine_count",
           "client_field"]

APIS: tuple[Api, ...] = (Chat(), Completion(), Responses(), Messages(), Embeddings(), Infill(), Rerank())
"""Every API squad serve admits."""
BY_NAME: dict[str, Api] = {api.name: api for api in APIS}
ROUTES: dict[str, Api] = {path: api for api in APIS for path in api.paths}
"""Admitted routes (llama-server b11434's paths) and their API."""


PASS_POST = ("/v1/responses/input_tokens", "/responses/input_tokens", "/v1/messages/count_tokens",
             "/chat/completions/input_tokens")
"""Counting endpoints passed through to the engine."""


def prepare(body: dict[str, Any], kind: Kind, prefix: str | None, call_ids: int | None = None) -> dict[str, Any]:
    """``body`` as it is sent for ``kind`` (tool choice, schemas and the history's tool calls,
    :mod:`squad.serve.forcing`); ``call_ids``: the length the engine's template demands of the
    history's tool call ids (chat ``tool_calls[].id``/``tool_call_id``, Responses ``call_id``,
    Messages ``tool_use.id``/``tool_result.tool_use_id``) (:attr:`squad.engine.info.EngineInfo.call_id_length`), fitted
    as squad's own client does."""
    force = {"chat": force_chat, "responses": force_responses, "messages": force_messages}.get(kind)
    out = repair_history(body, kind)
    if call_ids and kind == "chat" and isinstance(out.get("messages"), list):
        fitted = fit_call_ids(out["messages"], call_ids)
        out = out if fitted is out["messages"] else {**out, "messages": fitted}
    elif call_ids and kind == "responses" and isinstance(out.get("input"), list):
        items = [_fit_fields(i, ("call_id",), call_ids) if isinstance(i, dict)
                 and i.get("type") in ("function_call", "function_call_output") else i for i in out["input"]]
        out = out if all(a is b for a, b in zip(items, out["input"])) else {**out, "input": items}
    elif call_ids and kind == "messages" and isinstance(out.get("messages"), list):
        messages = [_fit_blocks(m, call_ids) for m in out["messages"]]
        out = out if all(a is b for a, b in zip(messages, out["messages"])) else {**out, "messages": messages}
    out = force(out, prefix) if force is not None else out
    return body if out == body else out


def _fit_fields(item: dict[str, Any], fields: tuple[str, ...], length: int) -> dict[str, Any]:
    fitted = {f: fit_call_id(item[f], length) for f in fields if isinstance(item.get(f), str)}
    return item if all(item[f] == v for f, v in fitted.items()) else {**item, **fitted}


def _fit_blocks(message: Any, length: int) -> Any:
    """A Messages ``message`` with its ``tool_use.id`` / ``tool_result.tool_use_id`` fitted (b11434
    converts them to the chat history's call ids, which the template checks)."""
    blocks = message.get("content") if isinstance(message, dict) else None
    if not isinstance(blocks, list):
        return message
    fields = {"tool_use": ("id",), "tool_result": ("tool_use_id",)}
    fixed = [_fit_fields(b, fields[b["type"]], length) if isinstance(b, dict) and b.get("type") in fields else b
             for b in blocks]
    return message if all(a is b for a, b in zip(fixed, blocks)) else {**message, "content": fixed}


async def engine_count(upstream: httpx.AsyncClient, base_url: str, path: str, body: dict[str, Any]) -> int:
    """The engine's count of ``body`` at its counting endpoint ``path`` (``{"input_tokens": N}``).
    Raises :class:`Refused`: 400 with the engine's message for a body it cannot read (its 4xx, and
    its 500: b11434 answers an exception of its request conversion with 500), 503 while it loads;
    :class:`~squad.errors.EngineGone` when it does not answer; :class:`~squad.errors.EngineError`
    for an answer that is not a count."""
    try:
        r = await upstream.post(path, json=body)
    except httpx.TransportError as exc:
        raise EngineGone(f"engine at {base_url} is not answering ({exc!r})") from exc
    if r.status_code == 503:
        raise Refused(503, "Loading model", "unavailable_error")
    message = _engine_message(r)
    if message is not None and r.status_code not in (200, 401, 404):
        raise Refused(400, f"the engine cannot read this request: {message}")
    if r.status_code != 200:
        raise EngineError(f"{path} answered HTTP {r.status_code}: {r.text[:200]}")
    try:
        return int(r.json()["input_tokens"])
    except (ValueError, KeyError, TypeError) as exc:
        raise EngineError(f"{path} answered {r.text[:200]!r}, not a count") from exc


def _engine_message(r: httpx.Response) -> str | None:
    """The message of the engine's JSON error body, None for anything else."""
    try:
        error = r.json().get("error")
    except (ValueError, AttributeError):
        return None
    return str(error.get("message", ""))[:500] if isinstance(error, dict) else None


async def demand(body: dict[str, Any], api: Api, gateway: Counting, *, big: bool = False) -> Demand:
    """What ``body`` reserves (:func:`squad.serve.demand.demand_for`; an API that generates nothing:
    its input). ``big``: count it off the event loop."""
    limit = gateway.admission.limit
    floor = (await anyio.to_thread.run_sync(prompt_floor, body, api.prompt_fields) if big
             else prompt_floor(body, api.prompt_fields))
    if floor > limit:  # refused before it is tokenized: counting megabytes takes seconds of CPU
        raise Refused(400, f"this request's prompt is at least {floor:,} tokens ({floor * MAX_TOKEN_CHARS:,} "
                           f"characters or more), but one request may hold at most {limit:,} tokens on this engine: "
                           "shorten it", "exceed_context_size_error", n_prompt_tokens=floor, n_ctx=limit)

    async def count(b: dict[str, Any], kind: Kind) -> int:
        return await gateway.count(b, kind, big)

    if not api.generates:
        prompt = await count(body, api.name)  # type: ignore[arg-type]
        if prompt > limit:
            raise Refused(400, f"this {api.name} input is {prompt:,} tokens, but one request may hold at most "
                               f"{limit:,} tokens on this engine: split the input", "exceed_context_size_error",
                          n_prompt_tokens=prompt, n_ctx=limit)
        return Demand(prompt, 0)
    return await demand_for(body, api.name, count, limit=limit,  # type: ignore[arg-type]
                            default_max_tokens=gateway.default_max_tokens, fields=api.limit_fields)


def client_field(body: dict[str, Any]) -> str | None:
    """The client name a body carries: OpenAI ``user`` (Responses also ``safety_identifier``),
    Anthropic ``metadata.user_id``; not a JSON blob (Claude Code's ``user_id`` is one: its client
    is then named by its key or its address)."""
    for value in (body.get("user"), body.get("safety_identifier"),
                  (body.get("metadata") or {}).get("user_id") if isinstance(body.get("metadata"), dict) else None):
        if isinstance(value, str) and value and not value.lstrip().startswith(("{", "[")):
            return value
    return None
