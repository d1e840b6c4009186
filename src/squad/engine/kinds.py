"""Which kind of OpenAI-compatible server answers at a URL, and what it reports about its capacity.

:func:`probe` returns a :class:`Capacity`: the kind (``vllm``, ``sglang``, ``ollama``,
``lmstudio``, ``openai-compatible``), ``slots`` (requests at once), ``n_ctx`` (tokens of one
request), ``pool`` (tokens the running requests hold together), and where each number came
from (:attr:`Capacity.sources`). llama-server and ``squad serve`` are read by
:func:`squad.engine.control.attach`. What no endpoint tells comes from the pins, else
:data:`DEFAULT_SLOTS` / :data:`DEFAULT_CTX`; a pin only lowers a reported limit.

Design (each kind's endpoints, overflow behaviour and sources): docs/design/engine-kinds.md
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import httpx

from squad.engine.llama import THINKING_BUDGET_FIELD
from squad.errors import UserError

__all__ = ["Capacity", "probe", "KINDS", "DEFAULT_SLOTS", "DEFAULT_CTX", "parse_cache_config", "POLICIES",
           "thinking_fields", "THINKING"]

KINDS = ("llama.cpp", "vllm", "sglang", "ollama", "lmstudio", "openai-compatible", "squad-serve")
"""Every kind :func:`squad.engine.control.attach` can report."""

DEFAULT_SLOTS = 1
"""Requests at once for a server that reports no concurrency and was given no ``slots=`` pin."""

DEFAULT_CTX = 2048
"""Tokens per request for a server that reports no context and was given no ``ctx=`` pin:
small enough that any model served today holds it."""

POLICIES = {
    "llama.cpp": "reserve by pool: llama-server fails every running request when its KV pool overflows",
    "squad-serve": "the squad serve endpoint admits every request itself; squad sends without reserving",
    "vllm": "keep running requests within the reported KV capacity and running-request cap: vLLM preempts "
            "and recomputes past them (thrash)",
    "sglang": "keep running requests within the reported KV capacity and running-request cap: SGLang retracts "
              "and recomputes past them (thrash)",
    "ollama": "keep every request under the loaded context: Ollama silently truncates a longer prompt, so squad "
              "refuses it",
    "lmstudio": "keep every request under the loaded context: LM Studio's overflow policy cuts a longer prompt, "
                "so squad refuses it",
    "openai-compatible": "nothing reported: squad keeps to the pins or its conservative defaults",
}
"""Admission per kind, in words (shown by ``squad engine info --url``)."""

TRUNCATING = {"ollama", "lmstudio"}
"""Kinds that cut a too-long prompt silently instead of failing it."""

COUNT_WITH = {"llama.cpp": "input_tokens", "squad-serve": "input_tokens", "vllm": "tokenize"}
"""How each kind's prompts are counted without the model file (other kinds: ``"estimate"``;
:attr:`squad.engine.info.EngineInfo.count_with`)."""


THINKING = {
    "llama.cpp": "a hard cap per request: thinking_budget_tokens (the end tag is forced at the budget)",
    "squad-serve": "passed on to its llama-server: thinking_budget_tokens",
    "vllm": "a hard cap per request: thinking_token_budget (needs the server's --reasoning-config)",
    "ollama": "on or off only: reasoning_effort none turns thinking off; no budget of N tokens",
}
"""How each kind takes an agent's ``thinking_budget`` (:func:`thinking_fields`), in words; a kind not
listed takes none (SGLang's per-request cap needs ``--enable-strict-thinking`` and a name squad does
not send; LM Studio has none)."""


def thinking_fields(kind: str, budget: int | None) -> dict[str, Any] | None:
    """The request fields that give one call of ``kind`` a thinking budget of ``budget`` tokens
    (``0``: no thinking); ``{}`` for no budget (None); None when ``kind`` cannot take it (the caller
    warns: the call then thinks as the model and server please, still within ``max_tokens``).

    - ``llama.cpp`` / ``squad-serve``: :data:`squad.engine.llama.THINKING_BUDGET_FIELD`;
    - ``vllm``: ``thinking_token_budget`` (vLLM's ``vllm/v1/sample/thinking_budget_state.py``: the
      end token is forced at the budget; the server needs ``--reasoning-config``);
    - ``ollama``: only ``0``, as ``reasoning_effort: "none"`` (Ollama's OpenAI endpoint turns
      thinking off for it, ollama/ollama#14820); it has no budget in tokens.
    """
    if budget is None:
        return {}
    if kind in ("llama.cpp", "squad-serve"):
        return {THINKING_BUDGET_FIELD: budget}
    if kind == "vllm":
        return {"thinking_token_budget": budget}
    if kind == "ollama" and budget == 0:
        return {"reasoning_effort": "none"}
    return None


@dataclass(frozen=True)
class Capacity:
    """What a server reported (or what squad assumed, said in ``sources``).

    - ``kind``: one of :data:`KINDS`.
    - ``slots``: requests run at once; ``n_ctx``: most tokens (prompt + output) one request may
      use; ``pool``: tokens the running requests may hold together (KV capacity).
    - ``sources``: for ``"slots"``, ``"n_ctx"``, ``"pool"``: where the number came from.
    - ``model``: the served model's name; ``version``: the server's version, if reported.
    - ``warnings``: things to tell the user (a pin above a reported limit, a default used).
    """

    kind: str
    slots: int
    n_ctx: int
    pool: int
    sources: dict[str, str] = field(default_factory=dict)
    model: str = ""
    version: str = ""
    warnings: tuple[str, ...] = ()


async def _json(client: httpx.AsyncClient, path: str) -> Any:
    """The JSON answer of ``GET path``, or None (not 200, not JSON, nothing answered)."""
    try:
        response = await client.get(path)
    except httpx.TransportError:
        return None
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


async def _text(client: httpx.AsyncClient, path: str) -> str | None:
    try:
        response = await client.get(path)
    except httpx.TransportError:
        return None
    return response.text if response.status_code == 200 else None


async def _openai_models(client: httpx.AsyncClient) -> Any:
    """``GET /v1/models``, the one endpoint every OpenAI-compatible server answers: its JSON.
    Raises :class:`~squad.errors.UserError` when the server refuses the key (401/403) or answers
    something else (a web server, a wrong path): squad would otherwise send every call to it."""
    base = str(client.base_url).rstrip("/")
    try:
        response = await client.get("/v1/models")
    except httpx.TransportError as exc:
        raise UserError(f"{base} stopped answering while squad probed it ({exc!r})") from None
    if response.status_code in (401, 403):
        raise UserError(f"the server at {base} refused squad's key (GET /v1/models: HTTP {response.status_code}): "
                        "give its key with --api-key (api_key=, $LLAMA_API_KEY, or the config file's api_key)")
    try:
        body = response.json() if response.status_code == 200 else None
    except ValueError:
        body = None
    if not (isinstance(body, dict) and isinstance(body.get("data"), list)):
        what = f"HTTP {response.status_code}" if response.status_code != 200 else "no model list"
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        raise UserError(f"{base} is not an OpenAI-compatible engine: GET /v1/models answered {what} ({kind}); "
                        "give the engine's root URL, e.g. http://127.0.0.1:8080")
    return body


def _int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_cache_config(metrics: str) -> dict[str, str] | None:
    """The labels of vLLM's ``vllm:cache_config_info`` line in Prometheus text, or None."""
    for line in metrics.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            return dict(_LABEL.findall(line[line.index("{") + 1:line.rindex("}")]))
    return None


class _Pins:
    """The user's ``slots=``/``ctx=`` applied to what a server reported, with the reasons."""

    def __init__(self, slots: int | None, ctx: int | None) -> None:
        self.slots, self.ctx = slots, ctx
        self.sources: dict[str, str] = {}
        self.warnings: list[str] = []

    def take(self, name: str, reported: int | None, where: str, *, default: int, default_why: str,
             warn: bool = True) -> int:
        """``reported`` lowered by the pin, or the pin, or ``default`` (with a warning unless
        ``warn`` is False: a default that is the server's own, not a guess)."""
        pin = self.slots if name == "slots" else self.ctx
        if reported is None:
            if pin is not None:
                self.sources[name] = f"pin {name}={pin} (the server does not report it)"
                return pin
            self.sources[name] = (f"default {default}: {default_why}; pin it with --{name} N ({name}=N in code) "
                                  "to change it")
            if warn:
                self.warnings.append("the server does not report its "
                                     f"{'concurrency' if name == 'slots' else 'context'}: "
                                     f"squad assumes {name}={default}; pass --{name} N ({name}=N in code) "
                                     "if it serves more")
            return default
        if pin is not None and pin < reported:
            self.sources[name] = f"pin {name}={pin} (the server reports {reported}, {where})"
            return pin
        if pin is not None and pin > reported:
            self.warnings.append(f"{name}={pin} is above what the server reports ({reported}, {where}): squad "
                                 f"uses {reported}")
        self.sources[name] = where
        return reported


async def probe(client: httpx.AsyncClient, *, slots: int | None = None, ctx: int | None = None) -> Capacity:
    """Detect the kind of server at ``client`` (not a llama-server: see the module docstring)
    and read its capacity; ``slots``/``ctx`` are the user's pins. An unknown server is
    ``openai-compatible`` with the pins or the defaults, if it answers ``GET /v1/models`` with a
    model list; raises :class:`~squad.errors.UserError` when it does not (not an engine, or the
    key refused)."""
    pins = _Pins(slots, ctx)
    for reader in (_sglang, _vllm, _ollama, _lmstudio):
        capacity = await reader(client, pins)
        if capacity is not None:
            return capacity
    return await _generic(client, pins)


def _done(kind: str, pins: _Pins, slots: int, n_ctx: int, pool: int, **extra: Any) -> Capacity:
    return Capacity(kind=kind, slots=slots, n_ctx=n_ctx, pool=pool, sources=dict(pins.sources),
                    warnings=tuple(pins.warnings), **extra)


async def _sglang(client: httpx.AsyncClient, pins: _Pins) -> Capacity | None:
    info, path = await _json(client, "/server_info"), "/server_info"
    if not (isinstance(info, dict) and "max_total_num_tokens" in info):
        info, path = await _json(client, "/get_server_info"), "/get_server_info"
    if not (isinstance(info, dict) and "max_total_num_tokens" in info):
        return None
    states = info.get("internal_states") or [{}]
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    running = _int(state.get("effective_max_running_requests_per_dp"))
    running_where = f"{path} internal_states[0].effective_max_running_requests_per_dp"
    if running is None:
        running, running_where = _int(info.get("max_running_requests")), f"{path} max_running_requests"
    context, context_where = _int(info.get("context_length")), f"{path} context_length"
    if context is None and _int(info.get("max_req_input_len")) is not None:
        context, context_where = int(info["max_req_input_len"]) + 1, f"{path} max_req_input_len + 1"
    capacity = _int(info.get("max_total_num_tokens"))
    n_ctx = pins.take("ctx", context, context_where, default=DEFAULT_CTX,
                      default_why="SGLang reported no context length")
    pool = capacity or n_ctx
    pins.sources["pool"] = f"{path} max_total_num_tokens" if capacity else "one context (no KV capacity reported)"
    n_slots = _derived_slots(pins, running, running_where, pool, n_ctx, "SGLang reported no max_running_requests")
    return _done("sglang", pins, n_slots, min(n_ctx, pool), pool, model=str(info.get("model_path") or ""),
                 version=str(info.get("version") or ""))


async def _vllm(client: httpx.AsyncClient, pins: _Pins) -> Capacity | None:
    metrics = await _text(client, "/metrics")
    cache = parse_cache_config(metrics) if metrics else None
    version = await _json(client, "/version")
    models = await _json(client, "/v1/models")
    card = _first(models)
    owned = str(card.get("owned_by", "")) if card else ""
    if cache is None and not (isinstance(version, dict) and "version" in version and owned == "vllm"):
        return None
    context = _int(card.get("max_model_len")) if card else None
    n_ctx = pins.take("ctx", context, "/v1/models data[0].max_model_len", default=DEFAULT_CTX,
                      default_why="vLLM reported no max_model_len")
    blocks, size = (_int(cache.get("num_gpu_blocks")), _int(cache.get("block_size"))) if cache else (None, None)
    if blocks and size:
        pool = blocks * size
        pins.sources["pool"] = f"/metrics vllm:cache_config_info num_gpu_blocks {blocks} × block_size {size}"
    else:
        pool = n_ctx
        pins.sources["pool"] = "one context: /metrics has no vllm:cache_config_info (started without metrics?)"
    n_slots = _derived_slots(pins, None, "", pool, n_ctx, "vLLM does not report --max-num-seqs")
    return _done("vllm", pins, n_slots, min(n_ctx, pool), pool, model=str(card.get("id", "")) if card else "",
                 version=str(version.get("version", "")) if isinstance(version, dict) else "")


def _derived_slots(pins: _Pins, reported: int | None, where: str, pool: int, n_ctx: int, why: str) -> int:
    """Running requests for an engine that reports its KV capacity: what it reports, else the pin,
    else capacity / context (every request could use a full context and still fit)."""
    if reported is not None or pins.slots is not None:
        return pins.take("slots", reported, where, default=1, default_why=why)
    pins.sources["slots"] = (f"KV capacity {pool} / context {n_ctx} ({why}; pin --slots N, slots=N in code, to run "
                             "more requests at once)")
    return max(1, pool // n_ctx)


async def served_model(client: httpx.AsyncClient) -> str:
    """``/v1/models`` ``data[0].id``, the model name requests must carry, or ""."""
    card = _first(await _json(client, "/v1/models"))
    return str(card.get("id", "")) if card else ""


def _first(models: Any) -> dict[str, Any] | None:
    data = models.get("data") if isinstance(models, dict) else None
    return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else None


async def _ollama(client: httpx.AsyncClient, pins: _Pins) -> Capacity | None:
    version = await _json(client, "/api/version")
    if not (isinstance(version, dict) and "version" in version):
        return None
    ps = await _json(client, "/api/ps")
    loaded = [m for m in (ps.get("models") or []) if isinstance(m, dict)] if isinstance(ps, dict) else []
    context = _int(loaded[0].get("context_length")) if loaded else None
    n_ctx = pins.take("ctx", context, f"/api/ps models[0].context_length ({loaded[0].get('name')})" if loaded else "",
                      default=DEFAULT_CTX, default_why="no model is loaded, so /api/ps reports no context_length")
    n_slots = pins.take("slots", None, "", default=1,
                        default_why="Ollama does not report OLLAMA_NUM_PARALLEL; its own default is 1",
                        warn=False)  # 1 is Ollama's own default, not a guess
    pins.sources["pool"] = f"slots × context ({n_slots} × {n_ctx}): Ollama gives each parallel request its own num_ctx"
    return _done("ollama", pins, n_slots, n_ctx, n_slots * n_ctx,
                 model=str(loaded[0].get("name", "")) if loaded else "",
                 version=str(version["version"]))


async def _lmstudio(client: httpx.AsyncClient, pins: _Pins) -> Capacity | None:
    v1 = await _json(client, "/api/v1/models")
    if isinstance(v1, dict) and isinstance(v1.get("models"), list):
        for model in v1["models"]:
            instances = model.get("loaded_instances") if isinstance(model, dict) else None
            if instances and model.get("type") == "llm":
                config = instances[0].get("config") or {}
                key = model.get("key", "")
                n_ctx = pins.take("ctx", _int(config.get("context_length")),
                                  f"/api/v1/models {key} loaded_instances[0].config.context_length",
                                  default=DEFAULT_CTX, default_why="not reported")
                n_slots = pins.take("slots", _int(config.get("parallel")),
                                    f"/api/v1/models {key} loaded_instances[0].config.parallel",
                                    default=1, default_why="LM Studio reports no parallel for this model")
                return _lmstudio_capacity(pins, n_slots, n_ctx, str(key))
        return _lmstudio_capacity(pins, pins.take("slots", None, "", default=1, default_why="no model is loaded"),
                                  pins.take("ctx", None, "", default=DEFAULT_CTX, default_why="no model is loaded"), "")
    v0 = await _json(client, "/api/v0/models")
    data = v0.get("data") if isinstance(v0, dict) else None
    if not (isinstance(data, list) and any(isinstance(m, dict) and "state" in m for m in data)):
        return None
    loaded = [m for m in data if isinstance(m, dict) and m.get("state") == "loaded" and m.get("type") in ("llm", "vlm")]
    model = loaded[0] if loaded else {}
    context = _int(model.get("loaded_context_length")) or _int(model.get("max_context_length"))
    n_ctx = pins.take("ctx", context, f"/api/v0/models {model.get('id')} max_context_length" if loaded else "",
                      default=DEFAULT_CTX, default_why="no model is loaded")
    n_slots = pins.take("slots", None, "", default=1, default_why="/api/v0 does not report parallel predictions")
    return _lmstudio_capacity(pins, n_slots, n_ctx, str(model.get("id", "")))


def _lmstudio_capacity(pins: _Pins, n_slots: int, n_ctx: int, model: str) -> Capacity:
    pins.sources["pool"] = "one context (LM Studio does not say whether parallel predictions share it)"
    return _done("lmstudio", pins, n_slots, n_ctx, n_ctx, model=model)


async def _generic(client: httpx.AsyncClient, pins: _Pins) -> Capacity:
    card = _first(await _openai_models(client))
    context, where = None, ""
    for key in ("max_model_len", "context_length", "context_window"):
        if card and _int(card.get(key)) is not None:
            context, where = _int(card.get(key)), f"/v1/models data[0].{key}"
            break
    n_ctx = pins.take("ctx", context, where, default=DEFAULT_CTX, default_why="the server reports no context")
    n_slots = pins.take("slots", None, "", default=DEFAULT_SLOTS, default_why="the server reports no concurrency")
    pins.sources["pool"] = "slots × context: nothing reported, each request is kept under its own context"
    return _done("openai-compatible", pins, n_slots, n_ctx, n_slots * n_ctx,
                 model=str(card.get("id", "")) if card else "")
