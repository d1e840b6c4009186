"""A running llama-server's control endpoints: wait for health, read what it applied, attach.

The launcher uses :func:`wait_healthy` and :func:`read_engine` for engines it starts;
:func:`attach` uses them for an engine at a URL the user gave.

What an engine says about itself (llama.cpp b11434, ``tools/server/server-context.cpp``):

- ``/health`` is public (no API key) and answers 503 ``Loading model`` until the model is
  loaded, then 200 ``{"status": "ok"}``. Every other endpoint also answers 503 while loading.
- ``/props`` ``default_generation_settings.n_ctx`` and each ``/slots`` entry's ``n_ctx`` are
  the *per-slot* context: ``min(n_ctx_seq, --kv-unified-per-slot, n_ctx_train)`` where
  ``n_ctx_seq`` is the whole pool with ``--kv-unified`` and ``pad256(n_ctx / slots)``
  without it. No endpoint reports the pool size or whether KV is unified, so for an
  attached engine with two or more slots ``kv_unified`` is unknown (None) and squad assumes
  the conservative pool = ``n_ctx`` (safe in both cases: requests running together never
  exceed one slot's context). :func:`pool_warning` says so in words.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random,
    wait_random_exponential,
)

from squad.engine.chat_templates import handles_tools
from squad.engine.info import EngineInfo
from squad.engine.kinds import probe, served_model
from squad.engine.llama import pool_cells
from squad.engine.saved import saved_engine_at
from squad.errors import EngineError, EngineGone, EngineLoadTimeout, UserError

__all__ = [
    "attach",
    "pool_warning",
    "wait_healthy",
    "read_engine",
    "EngineState",
    "control_client",
    "squad_serve_status",
]

NO_PUBLIC_HEALTH = (401, 404, 405)
"""``/health`` answers that still mean a server is up: it has no public /health (a kind without
one, e.g. Ollama, or one behind a key)."""

POLL_INTERVAL = 0.1
"""Seconds between ``/health`` polls while an engine loads, on average (each wait is drawn
from half to one and a half times it: jitter)."""

CONTROL_TIMEOUT = 10.0
"""Seconds for one control request (``/props``, ``/slots``, ...)."""

CONTROL_ATTEMPTS = 4
"""Attempts for one control request that hit a transport error (field case F22)."""

CONNECT_GRACE = 5.0
"""Seconds :func:`attach` waits for anything to answer at the URL before giving up."""


class _NotReady(Exception):
    """``/health`` answered 503 or nothing yet; poll again."""


def control_client(base_url: str, api_key: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for an engine's control endpoints, with the bearer key set."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=CONTROL_TIMEOUT, **kwargs)


async def wait_healthy(
    client: httpx.AsyncClient,
    *,
    timeout: float,
    check_alive: Callable[[], None] | None = None,
    connect_grace: float | None = None,
    progress: Callable[[float], None] | None = None,
    missing_ok: bool = False,
) -> int:
    """Poll ``GET /health`` until it answers 200; return how many 503 answers were seen.

    ``missing_ok`` (attach, any kind of server): an answer of 401, 404 or 405 also counts as up:
    the server has no public ``/health`` (Ollama, LM Studio), yet it answers.

    503 ``Loading model`` and refused connections (not bound yet) are waited out until
    ``timeout`` seconds have passed. ``check_alive`` runs before each poll and raises if the
    engine process died. ``connect_grace`` (seconds, for attach): give up early with
    :class:`EngineGone` if nothing ever answered within it. ``progress(elapsed_seconds)`` is
    called about once a second while it waits.

    Raises :class:`EngineLoadTimeout` ("still loading after N s"), :class:`EngineGone`,
    or whatever ``check_alive`` raises.
    """
    seen_503 = 0
    answered = False
    start = reported = anyio.current_time()

    async def probe() -> None:
        nonlocal seen_503, answered, reported
        if check_alive is not None:
            check_alive()
        if progress is not None and anyio.current_time() - reported >= 1.0:
            reported = anyio.current_time()
            progress(reported - start)
        try:
            response = await client.get("/health")
        except httpx.TransportError as exc:
            if not answered and connect_grace is not None and anyio.current_time() - start > connect_grace:
                raise EngineGone(
                    f"nothing answers at {client.base_url} ({type(exc).__name__}): "
                    "check the URL, or start an engine with `squad engine start`"
                ) from exc
            raise _NotReady from exc
        answered = True
        if response.status_code == 503:
            seen_503 += 1
            raise _NotReady
        if missing_ok and response.status_code in NO_PUBLIC_HEALTH:
            return
        if response.status_code != 200:
            raise EngineError(
                f"engine at {client.base_url} answered /health with HTTP {response.status_code}: "
                f"{response.text[:200]}; is this a llama-server?"
            )

    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_delay(timeout),
            wait=wait_random(POLL_INTERVAL / 2, POLL_INTERVAL * 1.5),  # jittered: pollers never march in step
            retry=retry_if_exception_type(_NotReady),
            sleep=anyio.sleep,
            reraise=True,
        ):
            with attempt:
                await probe()
    except _NotReady:
        state = "still loading" if answered else "not answering"
        raise EngineLoadTimeout(
            f"engine at {client.base_url} {state} after {timeout:.0f} s (503 'Loading model' "
            f"{seen_503} times); a large model on a slow disk can take minutes: raise the load "
            "timeout (--load-timeout SECONDS), or check the engine log"
        ) from None
    return seen_503


@dataclass(frozen=True)
class EngineState:
    """The raw JSON answers of ``/props``, ``/v1/models`` and ``/slots`` (``slots`` is None
    when the engine runs with ``--no-slots`` or it was not asked for)."""

    props: dict[str, Any]
    models: dict[str, Any]
    slots: list[dict[str, Any]] | None = None

    @property
    def n_ctx(self) -> int:
        """Per-slot context in tokens, ``/props`` ``default_generation_settings.n_ctx``."""
        return int(self.props["default_generation_settings"]["n_ctx"])

    def info(self, base_url: str, api_key: str | None, *, kv_unified: bool | None, launched: bool,
             requested_ctx: int | None = None) -> EngineInfo:
        """The :class:`EngineInfo` these answers describe. The caller knows the KV layout
        (``kv_unified``, None = unknown) and the ``-c`` it asked for, if any; the pool follows
        :func:`squad.engine.llama.pool_cells`."""
        pool = pool_cells(self.n_ctx, self.total_slots, kv_unified, requested_ctx)
        return EngineInfo(
            base_url=base_url,
            api_key=api_key,
            slots=self.total_slots,
            n_ctx=self.n_ctx,
            kv_unified=kv_unified,
            pool=pool,
            n_ctx_train=self.n_ctx_train,
            model_path=str(self.props.get("model_path", "")),
            model_alias=str(self.props.get("model_alias", "")),
            build_info=str(self.props.get("build_info", "")),
            launched=launched,
            template_has_tools=handles_tools(self.chat_template),
            chat_template=self.chat_template,
        )

    @property
    def chat_template(self) -> str | None:
        """``/props`` ``chat_template``: the template the engine applies (None when not reported)."""
        template = self.props.get("chat_template")
        return template if isinstance(template, str) and template else None

    @property
    def total_slots(self) -> int:
        """``/props`` ``total_slots``."""
        return int(self.props["total_slots"])

    @property
    def n_ctx_train(self) -> int | None:
        """The model's training context, ``/v1/models`` ``data[0].meta.n_ctx_train``, or None."""
        try:
            return int(self.models["data"][0]["meta"]["n_ctx_train"])
        except (KeyError, IndexError, TypeError, ValueError):
            return None

    def busy_slots(self) -> int | None:
        """How many ``/slots`` entries have ``is_processing`` true, or None without ``/slots``."""
        if self.slots is None:
            return None
        return sum(1 for slot in self.slots if slot.get("is_processing"))


async def _get_json(client: httpx.AsyncClient, path: str, *, optional: bool = False) -> Any:
    """GET ``path`` (idempotent: a transport error is retried with jittered backoff, field
    case F22, before :class:`EngineGone`)."""
    retrying = AsyncRetrying(stop=stop_after_attempt(CONTROL_ATTEMPTS), wait=wait_random_exponential(0.05, max=1.0),
                             retry=retry_if_exception_type(httpx.TransportError), sleep=anyio.sleep, reraise=True)
    try:
        response: httpx.Response = await retrying(client.get, path)
    except httpx.TransportError as exc:
        raise EngineGone(f"engine at {client.base_url} stopped answering ({type(exc).__name__} on {path}, "
                         f"{CONTROL_ATTEMPTS} attempts)") from exc
    if response.status_code == 401:
        raise UserError(
            f"engine at {client.base_url} rejected the API key on {path} (HTTP 401): pass the key "
            "it was started with (--api-key, or LLAMA_API_KEY of that engine)"
        )
    if optional and response.status_code in (404, 501):
        return None
    if response.status_code != 200:
        raise EngineError(
            f"engine at {client.base_url} answered {path} with HTTP {response.status_code}: {response.text[:200]}"
        )
    return response.json()


async def read_engine(client: httpx.AsyncClient, *, with_slots: bool = True) -> EngineState:
    """GET ``/props``, ``/v1/models`` and (optionally) ``/slots``.

    Raises :class:`UserError` on HTTP 401 (wrong key), :class:`EngineGone` when the engine
    stops answering, :class:`EngineError` on any other unexpected answer.
    """
    state = EngineState(
        props=await _get_json(client, "/props"),
        models=await _get_json(client, "/v1/models"),
        slots=await _get_json(client, "/slots", optional=True) if with_slots else None,
    )
    try:
        state.n_ctx, state.total_slots  # noqa: B018  (validate the shape once)
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"engine at {client.base_url} sent /props without n_ctx/total_slots; is it "
                          "a llama-server?") from exc
    return state


async def attach(url: str, api_key: str | None = None, *, load_timeout: float = 120.0,
                 slots: int | None = None, ctx: int | None = None) -> EngineInfo:
    """Read a server squad did not launch; returns :class:`EngineInfo` with ``launched=False``.

    ``url`` is the server root (``http://127.0.0.1:8080``; a trailing ``/v1`` is dropped).
    The key is ``api_key``, else ``LLAMA_API_KEY`` from the environment, else the key
    recorded by ``squad engine start`` when ``url`` is that engine (``engine.json``).
    A server still loading (503 on ``/health``) is waited out for up to ``load_timeout`` seconds.

    The kind is detected from what the server answers: ``/props`` in llama-server's shape is
    ``llama.cpp`` (``/squad/status`` too: ``squad-serve``); anything else is probed by
    :func:`squad.engine.kinds.probe` (vLLM, SGLang, Ollama, LM Studio, else openai-compatible).
    ``slots``/``ctx`` are the user's pins: used where the server reports nothing, and they may
    lower (never raise) what it reports. ``info.sources`` says where each number came from.

    llama.cpp: ``kv_unified`` is False for one slot and None (unknown) for two or more: see the
    module docstring and :func:`pool_warning`; ``pool`` is then ``n_ctx``. For the engine
    ``squad engine start`` recorded, its saved plan tells. A ``squad serve`` endpoint gives
    ``admits=True`` and its own pool.

    Raises :class:`EngineGone` (nothing answers), :class:`EngineLoadTimeout`,
    :class:`UserError` (HTTP 401: wrong or missing key), :class:`EngineError`.
    """
    base_url = url.rstrip("/").removesuffix("/v1")
    saved = saved_engine_at(base_url)
    if api_key is None:
        api_key = os.environ.get("LLAMA_API_KEY") or (saved.api_key if saved else None)
    async with control_client(base_url, api_key) as client:
        await wait_healthy(client, timeout=load_timeout, connect_grace=CONNECT_GRACE, missing_ok=True)
        if not await _answers_props(client):
            return await _attach_other(client, base_url, api_key, slots=slots, ctx=ctx)
        state = await read_engine(client)
        served = await squad_serve_status(client)
    info = _llama_info(state, base_url, api_key, saved, served)
    return _pinned(info, slots, ctx)


async def _answers_props(client: httpx.AsyncClient) -> bool:
    """True when ``GET /props`` answers in llama-server's shape (HTTP 401 too: a llama-server
    with a key; :func:`read_engine` then says so)."""
    try:
        response = await client.get("/props")
    except httpx.TransportError:
        return False
    if response.status_code == 401:
        return True
    try:
        body = response.json() if response.status_code == 200 else None
    except ValueError:
        return False
    return isinstance(body, dict) and "total_slots" in body and "default_generation_settings" in body


def _llama_info(state: EngineState, base_url: str, api_key: str | None, saved: Any,
                served: dict[str, Any] | None) -> EngineInfo:
    slots = state.total_slots
    where = {"slots": "/props total_slots", "ctx": "/props default_generation_settings.n_ctx (per slot)"}
    if served is not None:  # squad serve knows its engine's pool: no guessing, and it admits
        admission = served.get("admission", {})
        return replace(state.info(base_url, api_key, kv_unified=True, launched=False), admits=True,
                       pool=int(admission.get("pool", state.n_ctx)), kind="squad-serve",
                       sources={**where, "pool": "/squad/status admission.pool"})
    plan = saved.plan if saved is not None and saved.plan.slots == slots else None  # what `engine start` recorded
    unified = plan.kv_unified if plan is not None else None
    info = state.info(base_url, api_key, kv_unified=False if slots == 1 else unified, launched=False,
                      requested_ctx=plan.n_ctx if plan is not None else None)
    pool = ("the plan `squad engine start` recorded" if plan is not None else
            "one slot's context: whether the slots share one KV pool is not reported" if slots > 1
            else "n_ctx (one slot)")
    return replace(info, sources={**where, "pool": pool})


def _pinned(info: EngineInfo, slots: int | None, ctx: int | None) -> EngineInfo:
    """``info`` with the user's pins applied: a pin may lower what the engine reported, never raise it."""
    sources, warnings = dict(info.sources), list(info.warnings)
    if slots is not None and slots < info.slots:
        sources["slots"] = f"pin slots={slots} (the engine has {info.slots})"
        info = replace(info, slots=slots)
    elif slots is not None and slots > info.slots:
        warnings.append(f"slots={slots} is above the engine's {info.slots} ({sources.get('slots')}): squad "
                        f"uses {info.slots}")
    if ctx is not None and ctx < info.pool:
        sources["pool"] = f"pin ctx={ctx} (the engine has {info.pool})"
        info = replace(info, pool=ctx, n_ctx=min(info.n_ctx, ctx))
    elif ctx is not None and ctx > info.pool:
        warnings.append(f"ctx={ctx} is above the engine's pool of {info.pool} tokens: squad uses {info.pool}")
    return replace(info, sources=sources, warnings=tuple(warnings))


async def _attach_other(client: httpx.AsyncClient, base_url: str, api_key: str | None, *,
                        slots: int | None, ctx: int | None) -> EngineInfo:
    """Attach to a server that is not a llama-server (:func:`squad.engine.kinds.probe`)."""
    capacity = await probe(client, slots=slots, ctx=ctx)
    model = capacity.model or await served_model(client)
    return EngineInfo(
        base_url=base_url, api_key=api_key, slots=capacity.slots, n_ctx=capacity.n_ctx, kv_unified=None,
        pool=capacity.pool, model_alias=model, build_info=capacity.version, launched=False, kind=capacity.kind,
        sources=capacity.sources,
        version=capacity.version, warnings=capacity.warnings,
    )


async def squad_serve_status(client: httpx.AsyncClient) -> dict[str, Any] | None:
    """``/squad/status`` when the server at ``client`` is ``squad serve`` (it admits every request
    itself, field case F20), else None (a llama-server answers 404)."""
    try:
        response = await client.get("/squad/status")
    except httpx.TransportError:
        return None
    if response.status_code != 200 or not response.headers.get("x-squad-serve"):
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) and "squad_serve" in body else None


def pool_warning(info: EngineInfo) -> str | None:
    """The warning to show for an engine whose KV layout is unknown, else None."""
    if info.kind != "llama.cpp" or info.kv_unified is not None or info.slots < 2:
        return None
    return (
        f"engine at {info.base_url} does not say whether its {info.slots} slots share one KV pool; "
        f"if it was started with -np {info.slots} without --kv-unified each request gets only "
        f"n_ctx/{info.slots}. squad assumes requests running together fit in {info.n_ctx} tokens."
    )
