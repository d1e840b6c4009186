"""What every engine kind is made of: the :class:`EngineKind` record, the :class:`Capacity` a
probe reads, the user's pins (:class:`Pins`) and the HTTP reads the probes share.

A kind is one module beside this one (``llama_cpp``, ``vllm``, ``sglang``, ``ollama``,
``lmstudio``, ``openai_compatible``, ``squad_serve``) holding one :class:`EngineKind`: how to
detect it and read its capacity (``probe``), how squad admits within it (``policy``,
``truncates``), how its prompts are counted (``counting``, a
:class:`~squad.engine.kinds.counting.PromptCounting`), and how it takes a thinking budget.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from squad.engine.kinds.counting import PromptCounting
from squad.errors import UserError

__all__ = ["EngineKind", "Capacity", "Pins", "Probe", "DEFAULT_SLOTS", "DEFAULT_CTX", "get_json", "get_text",
           "openai_models", "positive", "first_model", "derived_slots"]

DEFAULT_SLOTS = 1
"""Requests at once for a server that reports no concurrency and was given no ``slots=`` pin."""

DEFAULT_CTX = 2048
"""Tokens per request for a server that reports no context and was given no ``ctx=`` pin:
small enough that any model served today holds it."""


@dataclass(frozen=True)
class Capacity:
    """What a server reported (or what squad assumed, said in ``sources``).

    - ``kind``: the name of its :class:`EngineKind`.
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


class Pins:
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

    def capacity(self, kind: str, slots: int, n_ctx: int, pool: int, **extra: Any) -> Capacity:
        """The :class:`Capacity` of ``kind`` with the sources and warnings gathered so far."""
        return Capacity(kind=kind, slots=slots, n_ctx=n_ctx, pool=pool, sources=dict(self.sources),
                        warnings=tuple(self.warnings), **extra)


Probe = Callable[[httpx.AsyncClient, Pins], Awaitable["Capacity | None"]]
"""Detect a kind at a client's URL and read its capacity: its :class:`Capacity`, or None (not this kind)."""


@dataclass(frozen=True)
class EngineKind:
    """One kind of server squad talks to, all it needs to know about it in one record.

    - ``name``: what :attr:`squad.engine.info.EngineInfo.kind` says (``"vllm"``).
    - ``policy``: how squad admits within it, in words (``squad engine info --url``).
    - ``counting``: how its prompts are counted without the model file
      (:class:`~squad.engine.kinds.counting.PromptCounting`: an object the client and serve call).
    - ``probe``: detects it and reads its capacity (:data:`Probe`); None for a kind
      :func:`squad.engine.control.attach` reads itself (llama.cpp, squad serve).
    - ``probe_order``: probes run lowest first (the catch-all ``openai-compatible`` last).
    - ``truncates``: it cuts a too-long prompt silently instead of failing it (squad refuses one itself).
    - ``progress``: it streams prompt-processing progress when asked (``return_progress``).
    - ``llama_server``: it is llama-server, or squad serve in front of one: its capacity is read back
      from ``/props``, its busy slots from ``/slots``, its build from the binary.
    - ``thinking``: how it takes an agent's ``thinking_budget``, in words (None: it takes none);
      ``thinking_request``: the request fields for a budget (None: not this budget).
    """

    name: str
    policy: str
    counting: PromptCounting
    probe: Probe | None = None
    probe_order: int = 50
    truncates: bool = False
    progress: bool = False
    llama_server: bool = False
    thinking: str | None = None
    thinking_request: Callable[[int], dict[str, Any] | None] | None = None

    def thinking_fields(self, budget: int | None) -> dict[str, Any] | None:
        """The request fields that give one call a thinking budget of ``budget`` tokens (``0``: no
        thinking); ``{}`` for no budget (None); None when this kind cannot take it (the caller warns:
        the call then thinks as the model and server please, still within ``max_tokens``)."""
        if budget is None:
            return {}
        return self.thinking_request(budget) if self.thinking_request is not None else None


async def get_json(client: httpx.AsyncClient, path: str) -> Any:
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


async def get_text(client: httpx.AsyncClient, path: str) -> str | None:
    """The text of ``GET path`` when it answers 200, else None."""
    try:
        response = await client.get(path)
    except httpx.TransportError:
        return None
    return response.text if response.status_code == 200 else None


async def openai_models(client: httpx.AsyncClient) -> Any:
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


def positive(value: Any) -> int | None:
    """``value`` as a positive int, else None."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def first_model(models: Any) -> dict[str, Any] | None:
    """``data[0]`` of a ``/v1/models`` answer, or None."""
    data = models.get("data") if isinstance(models, dict) else None
    return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else None


def derived_slots(pins: Pins, reported: int | None, where: str, pool: int, n_ctx: int, why: str) -> int:
    """Running requests for an engine that reports its KV capacity: what it reports, else the pin,
    else capacity / context (every request could use a full context and still fit)."""
    if reported is not None or pins.slots is not None:
        return pins.take("slots", reported, where, default=1, default_why=why)
    pins.sources["slots"] = (f"KV capacity {pool} / context {n_ctx} ({why}; pin --slots N, slots=N in code, to run "
                             "more requests at once)")
    return max(1, pool // n_ctx)
