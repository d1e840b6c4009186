"""The APIs ``squad serve`` admits besides chat and text completions: OpenAI Responses
(``/v1/responses``), Anthropic Messages (``/v1/messages``) and embeddings (``/v1/embeddings``).

llama-server b11434 converts a Responses or Messages body to a chat body itself
(``tools/server/server-chat.cpp``) and answers in that API's own shape (Responses
``output`` items with ``function_call``, Messages ``content`` blocks with ``tool_use``, and each
one's own SSE events). squad serve forwards the body as it is, after :mod:`squad.serve.forcing`,
and counts its prompt with the engine's own counting endpoint for that API
(:data:`COUNT_PATHS`: ``{"input_tokens": N}``, the exact prompt the request would use), since
squad's local counter renders chat messages only.

An embeddings request occupies a slot for its input's tokens and generates none: it reserves
its input (each text counted with ``/tokenize``) and no ``max_tokens``. b11434 serves embeddings
only when started with ``--embeddings`` (else 501 ``This server does not support embeddings``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import httpx

from squad.engine.template_profile import fit_call_id, fit_call_ids
from squad.errors import EngineError, EngineGone
from squad.serve.demand import Demand, Kind, Refused, demand_for
from squad.serve.forcing import force_chat, force_messages, force_responses, repair_history

if TYPE_CHECKING:
    from squad.engine.info import EngineInfo
    from squad.sched.admission import Admission

__all__ = ["ROUTES", "COUNT_PATHS", "Counting", "prepare", "count", "demand", "client_field"]


class Counting(Protocol):
    """What the API adapters need of squad serve's gateway (:class:`squad.serve.gateway.Gateway` is one): a
    protocol, so that this module does not import the gateway, which imports it."""

    default_max_tokens: int
    """Tokens a request without ``max_tokens`` reserves and may generate."""

    @property
    def admission(self) -> Admission: ...

    @property
    def engine(self) -> EngineInfo: ...

    @property
    def upstream(self) -> httpx.AsyncClient: ...

    async def count(self, body: dict[str, Any], kind: Kind) -> int:
        """Prompt tokens of a request of ``kind`` (raises :class:`Refused`)."""
        ...

    async def count_text(self, prompt: Any) -> int:
        """Prompt tokens of a text prompt or a list of token ids (raises :class:`Refused`)."""
        ...

ROUTES: dict[str, Kind] = {"/v1/responses": "responses", "/responses": "responses",
                           "/v1/messages": "messages",
                           "/v1/embeddings": "embeddings", "/embeddings": "embeddings"}
"""Admitted routes of the APIs in this module (llama-server b11434's paths)."""

COUNT_PATHS: dict[str, str] = {"responses": "/v1/responses/input_tokens", "messages": "/v1/messages/count_tokens"}
"""The engine's prompt-token count for each API's body."""

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


async def count(gateway: Counting, body: dict[str, Any], kind: Kind) -> int:
    """Prompt tokens of a Responses/Messages body (the engine's count endpoint) or an embeddings
    input (the sum over its texts). Raises :class:`Refused`: the engine's own 4xx message for a
    body it cannot read, 503 while it loads; :class:`~squad.errors.EngineGone` when it does not answer."""
    if kind == "embeddings":
        texts = body.get("input", body.get("content"))
        texts = texts if isinstance(texts, list) and texts and not isinstance(texts[0], int) else [texts]
        return sum([await gateway.count_text(t) for t in texts])
    if kind == "messages" and not isinstance(body.get("messages"), list):
        raise Refused(400, "messages must be a list of Anthropic messages", param="messages")
    if kind == "responses" and "input" not in body:
        raise Refused(400, "'input' is required", param="input")
    try:
        r = await gateway.upstream.post(COUNT_PATHS[kind], json=body)
    except httpx.TransportError as exc:
        raise EngineGone(f"engine at {gateway.engine.base_url} is not answering ({exc!r})") from exc
    if r.status_code == 503:
        raise Refused(503, "Loading model", "unavailable_error")
    if 400 <= r.status_code < 500:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:300]
        raise Refused(400, f"the engine cannot read this request: {message}")
    if r.status_code != 200:
        raise EngineError(f"{COUNT_PATHS[kind]} answered HTTP {r.status_code}: {r.text[:200]}")
    return int(r.json()["input_tokens"])


async def demand(body: dict[str, Any], kind: Kind, gateway: Counting) -> Demand:
    """What ``body`` reserves (:func:`squad.serve.demand.demand_for`; an embeddings request: its
    input and no generation)."""
    limit = gateway.admission.limit
    if kind == "embeddings":
        prompt = await gateway.count(body, kind)
        if prompt > limit:
            raise Refused(400, f"this embeddings input is {prompt:,} tokens, but one request may hold at most "
                               f"{limit:,} tokens on this engine: split the input", "exceed_context_size_error",
                          n_prompt_tokens=prompt, n_ctx=limit)
        return Demand(prompt, 0)
    return await demand_for(body, kind, gateway.count, limit=limit, default_max_tokens=gateway.default_max_tokens)


def client_field(body: dict[str, Any]) -> str | None:
    """The client name a body carries: OpenAI ``user`` (Responses also ``safety_identifier``),
    Anthropic ``metadata.user_id``; not a JSON blob (Claude Code's ``user_id`` is one: its client
    is then named by its key or its address)."""
    for value in (body.get("user"), body.get("safety_identifier"),
                  (body.get("metadata") or {}).get("user_id") if isinstance(body.get("metadata"), dict) else None):
        if isinstance(value, str) and value and not value.lstrip().startswith(("{", "[")):
            return value
    return None
