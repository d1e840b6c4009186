"""The engine session: which engine a squad uses, planned, launched (or attached) and admitted.

Data flows one way through here::

    EngineSpec + workload --plan_engine()--> EnginePlan --Launcher--> EngineInfo (read back)
        --> Admission.for_engine(info) --> EngineClient (the ChatEngine the runtime calls)

- :class:`EngineSpec` says what engine to use: a model and the pins the user set (slots,
  context, KV cache types), the binary and threads, or the URL of a running engine.
- :func:`plan_engine` is the ONE way from a spec and a workload to a plan (model → GGUF facts
  → memory → :func:`squad.sched.planner.plan`). ``Squad``, ``squad run`` and ``squad plan`` all call
  it, so they cannot disagree about the argv.
- :class:`EngineSession` owns the rest: launching or attaching, the admission and the client
  built from what the engine reported, reload and replan. A squad holds one session per engine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import anyio
from anyio.abc import AsyncResource

from squad.sched.admission import Admission
from squad.chat import ChatEngine
from squad.engine.info import EngineInfo
from squad.engine.launcher import Launcher
from squad.engine.llama import check_cache_type
from squad.sched.plan import Backend, EnginePlan
from squad.engine.process import free_port
from squad.errors import SquadError, UserError
from squad.events import (
    EngineExited,
    EngineLoaded,
    EngineLoading,
    EnginePlanned,
    EngineReplanning,
    Event,
    EventSink,
    emit_to,
)
from squad.sched.planner import plan, plan_for_replan
from squad.sched.policy import DEFAULT_QUEUE
from squad.sched.workload import Call, Node

__all__ = ["EngineSpec", "EngineSession", "plan_engine", "with_chat_template"]


@dataclass(frozen=True)
class EngineSpec:
    """What engine to use.

    Launch one (``url`` None):

    - ``model``: a known model name or a ``.gguf`` path (None: the built-in default);
    - ``slots``/``ctx``: pins the planner keeps (None: planned from the workload);
    - ``cache_type_k``/``cache_type_v``: KV cache types (``-ctk``/``-ctv``; ``cache_type_v``
      None = same as K), one of :data:`squad.engine.llama.CACHE_TYPES`;
    - ``binary``: the ``llama-server`` to run (None: found or built by squad); ``threads``: ``-t``;
    - ``gpu_layers``: ``-ngl``, model layers in GPU memory (a count or ``"all"``; None: all when
      NVML finds a GPU, else none); KV is then planned against GPU memory (:func:`squad.sched.memory.kv_memory`);
    - ``backend``/``mlx_max_batch``: for ``squad plan`` of other backends.

    Or attach: ``url`` (+ ``api_key``) of a running server of any kind (:mod:`squad.engine.kinds`);
    ``slots``/``ctx`` are then capacity pins: used where the server reports nothing, and they may
    lower (never raise) what it reports; the other launch settings are an error. ``admits``:
    the engine at ``url`` admits on its own (a proxy in front of llama-server that queues by
    slots and KV pool itself), so squad sends without reserving.

    ``queue``: the order of calls waiting for admission (:mod:`squad.sched.policy`: ``program``
    default, ``fifo``, ``backfill``).

    ``request_timeout`` (seconds) fixes one deadline for every call; None (default) derives each
    call's from its prompt, ``max_tokens`` and the engine's measured speed, and stops a call only
    when it stops making progress or passes that estimate (:mod:`squad.chat.deadline`). The engine's
    own ``-to`` is set above either. ``load_timeout`` (seconds): how long a launched engine may take to load the
    model (None: 60 s + 60 s per GiB of model file). Raises :class:`UserError` for a bad
    combination or cache type.
    """

    model: str | Path | None = None
    slots: int | None = None
    ctx: int | None = None
    cache_type_k: str = "f16"
    cache_type_v: str | None = None
    binary: str | Path | None = None
    threads: int | None = None
    url: str | None = None
    api_key: str | None = None
    admits: bool = False
    request_timeout: float | None = None
    load_timeout: float | None = None
    backend: Backend = "llama-server"
    mlx_max_batch: int | None = None
    gpu_layers: int | str | None = None
    queue: str = DEFAULT_QUEUE

    def __post_init__(self) -> None:
        from squad.sched.policy import QUEUE_POLICIES

        if self.queue not in QUEUE_POLICIES:
            raise UserError(f"queue must be one of {', '.join(QUEUE_POLICIES)}, got {self.queue!r}")
        for name in ("slots", "ctx", "threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise UserError(f"{name} must be a whole number of at least 1, got {value!r}")
        if self.gpu_layers is not None and self.gpu_layers != "all" and (
                isinstance(self.gpu_layers, bool) or not isinstance(self.gpu_layers, int) or self.gpu_layers < 0):
            raise UserError(f"gpu_layers must be a number of layers (0 = none) or 'all', got {self.gpu_layers!r}")
        if self.request_timeout is not None and (isinstance(self.request_timeout, bool) or not isinstance(
                self.request_timeout, (int, float)) or not self.request_timeout > 0):
            raise UserError(f"request_timeout must be a positive number of seconds, got {self.request_timeout!r}")
        if self.load_timeout is not None and (isinstance(self.load_timeout, bool) or not isinstance(
                self.load_timeout, (int, float)) or not self.load_timeout > 0):
            raise UserError(f"load_timeout must be a positive number of seconds, got {self.load_timeout!r}")
        for name in ("cache_type_k", "cache_type_v"):
            value = getattr(self, name)
            if value is not None:
                try:
                    check_cache_type(value)
                except UserError as exc:
                    raise UserError(f"{name}: {exc}") from None
        if self.url is not None:
            self._check_attach()
        elif self.admits:
            raise UserError("admits=True describes an engine at a URL that admits on its own: give its url")

    def _check_attach(self) -> None:
        from squad.engine.urls import check_engine_url

        try:
            check_engine_url(self.url)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        launch_only = {"model": self.model, "binary": self.binary,
                       "threads": self.threads, "load_timeout": self.load_timeout, "mlx_max_batch": self.mlx_max_batch,
                       "gpu_layers": self.gpu_layers,
                       "cache_type_k": None if self.cache_type_k == "f16" else self.cache_type_k,
                       "cache_type_v": self.cache_type_v}
        given = [k for k, v in launch_only.items() if v is not None]
        if given:
            raise UserError(f"{', '.join(given)} size or start an engine squad launches; an engine at a URL "
                            "runs as it was started: drop them, or drop url to let squad launch one")

    @property
    def kv_types(self) -> tuple[str, str]:
        """``(type_k, type_v)`` as the engine will be started."""
        return self.cache_type_k, self.cache_type_v or self.cache_type_k

    def but(self, **given: object) -> "EngineSpec":
        """A copy with the given fields replaced, ignoring those given as None (command-line
        overrides on top of a recipe's settings)."""
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})  # type: ignore[arg-type]


def plan_engine(spec: EngineSpec, workload: Node | None, *, pull: bool = True, share: float = 1.0) -> EnginePlan:
    """The plan for ``workload`` on the engine ``spec`` describes. Blocking (reads the GGUF
    file; run it in a worker thread from async code).

    ``pull``: fetch a known model that is not in the cache yet (False: raise instead).
    ``share``: the fraction (0 < share <= 1) of the memory for KV this engine may plan for, when
    several engines launched on this machine divide it (:mod:`squad.chat.routing`: 1/N each).
    Raises :class:`~squad.errors.ModelError` (no such model) or
    :class:`~squad.errors.PlanError` (the workload cannot be planned).
    """
    from squad.engine.facts import read_model_facts
    from squad.engine.registry import resolve_model
    from squad.sched.memory import kv_memory

    model_path = resolve_model(spec.model, pull=pull)
    facts = read_model_facts(model_path)
    ctk, ctv = spec.kv_types
    memory = kv_memory(model_path, n_layer=facts.n_layer, gpu_layers=spec.gpu_layers)
    if share < 1.0:
        memory = dataclasses.replace(memory, bytes=int(memory.bytes * share),
                                     source=f"{share:.0%} of {memory.source}, shared with other engines")
    planned = plan(
        workload,
        model=model_path,
        n_ctx_train=facts.n_ctx_train,
        kv_bytes_per_token=facts.kv_bytes_per_token(ctk, ctv),
        kv_bytes_per_token_q8_0=facts.kv_bytes_per_token("q8_0", "q8_0"),
        kv_bytes_at=(lambda n_ctx, slots: facts.kv_bytes(n_ctx, ctk, ctv, slots=slots)) if facts.sliding_window else None,
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
    from squad.engine.template_profile import profile

    try:
        found = profile(source, planned.model if Path(str(planned.model)).is_file() else None)
    except SquadError:
        return planned
    return dataclasses.replace(planned, reasons=(*planned.reasons, "template profile: " + found.summary()),
                               warnings=(*planned.warnings, *found.warnings))


def with_chat_template(planned: EnginePlan, source: str | None, *, has_tool_use_template: bool = False) -> EnginePlan:
    """``planned`` with the chat template the engine gets for a model whose own template is
    ``source`` (:func:`squad.engine.chat_templates.tool_template_for`), and a reason saying which."""
    from squad.engine.chat_templates import describe, tool_template_for

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


class EngineSession(AsyncResource):
    """One engine for a squad: ``async with EngineSession(spec, workload) as session``.

    ``engine`` is one of:

    - an :class:`EngineSpec`: launch (planned for ``workload``) or attach (``url``);
    - an :class:`EngineInfo`: an engine that is already running, used as it reported itself;
    - a :class:`~squad.chat.ChatEngine`: used as is (``squad.testing.ScriptedEngine``, a proxy).

    After entry: ``info`` (what the engine reported), ``chat`` (the :class:`ChatEngine` to
    call), ``admission`` (None when the chat engine admits on its own), and for a launched
    engine ``plan`` and ``launcher``. Events: ``engine.planned``, ``engine.loaded`` (each load,
    with its reason), ``engine.replanning``. Leaving stops a launched engine.

    ``share``: the fraction of this machine's KV memory a launched engine plans for
    (:func:`plan_engine`); ``restart=False``: a launched engine that dies is not restarted (its
    calls fail with :class:`~squad.errors.EngineGone`; :mod:`squad.chat.routing` takes it out instead).
    """

    def __init__(self, engine: EngineSpec | EngineInfo | ChatEngine, workload: Node | None = None, *,
                 on_event: EventSink | None = None, share: float = 1.0, restart: bool = True) -> None:
        self.spec = engine if isinstance(engine, EngineSpec) else None
        self._given = None if isinstance(engine, EngineSpec) else engine
        self.workload = workload
        self._sinks: list[EventSink] = [on_event] if on_event is not None else []
        self.plan: EnginePlan | None = None
        self.launcher: Launcher | None = None
        self._chat: ChatEngine | None = None
        self._owns_chat = False
        self._reload_lock = anyio.Lock()
        self._exit_reported: int | None = None  # pid of the engine process whose death was reported
        self._restarted_pid: int | None = None  # pid of the engine the last restart started
        self.share = share
        self.restart_on_death = restart
        """Restart a launched engine that dies (False: whoever holds the session takes it out); read on entry."""

    # -- what the runtime uses ---------------------------------------------------------------

    @property
    def chat(self) -> ChatEngine:
        if self._chat is None:
            raise UserError("the engine is not open yet: use `async with Squad(...) as sq:` "
                            "(or `async with EngineSession(...)`)")
        return self._chat

    @property
    def info(self) -> EngineInfo:
        return self.chat.engine

    @property
    def admission(self) -> Admission | None:
        return self.chat.admission

    @property
    def reloadable(self) -> bool:
        """True when squad launched this engine and may reload it with another plan."""
        return self.launcher is not None and self.plan is not None

    # -- open and close ----------------------------------------------------------------------

    async def __aenter__(self) -> "EngineSession":
        try:
            await self._open()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def _open(self) -> None:
        if self._given is not None and not isinstance(self._given, EngineInfo):
            self._chat = self._given
            self._loaded("given")
            return
        spec = self.spec or EngineSpec()
        if isinstance(self._given, EngineInfo):
            info, reason = self._given, "given"
        elif spec.url is not None:
            from squad.engine.control import attach

            info, reason = await attach(spec.url, spec.api_key, slots=spec.slots, ctx=spec.ctx), "attached"
        else:
            self.plan = await anyio.to_thread.run_sync(lambda: plan_engine(spec, self.workload, share=self.share))
            self._emit(EnginePlanned(slots=self.plan.slots, n_ctx=self.plan.n_ctx, reasons=list(self.plan.reasons),
                                     warnings=list(self.plan.warnings)))
            self.launcher = Launcher(self.plan, binary=spec.binary, threads=spec.threads,
                                     request_timeout=spec.request_timeout, load_timeout=spec.load_timeout,
                                     port=free_port(),  # one port across reloads
                                     on_progress=self._loading if self._sinks else None)
            info, reason = await self.launcher.start(), "launched"
        from squad.chat.client import EngineClient

        restart = self._restart if self.launcher is not None and self.restart_on_death else None
        sink = self._emit if self._sinks else None  # nobody listens: events are not even built
        # an engine that admits on its own (a squad serve endpoint says so, F20) gets no second admission
        admission = None if spec.admits or info.admits else Admission.for_engine(info, on_event=sink,
                                                                                      queue=spec.queue)
        client = EngineClient(info, admission=admission, request_timeout=spec.request_timeout, on_event=sink,
                              restart=restart, gone_reason=self._exited if self.launcher is not None else None)
        self._chat, self._owns_chat = client, True
        await client.prepare()  # the model's tokenizer, so calls count prompts without a round trip
        self._loaded(reason)

    async def aclose(self) -> None:
        """Close the client, then stop a launched engine (shielded; safe to call twice)."""
        with anyio.CancelScope(shield=True):
            if self._chat is not None and self._owns_chat:
                await self._chat.aclose()
            if self.launcher is not None:
                self._report_exit()  # an engine that died unnoticed (no call after it) is still reported
                await self.launcher.aclose()

    # -- reload ------------------------------------------------------------------------------

    async def reload(self, new: EnginePlan, *, drain_timeout: float = 30.0) -> bool:
        """Reload a launched engine with ``new``: admitted calls finish first (new ones wait),
        then the engine restarts and admission and client adopt what it reports. Returns False
        when ``new`` equals the current plan. Raises :class:`UserError` for an engine squad did
        not launch, and the launcher's errors."""
        if self.launcher is None or self.plan is None:
            raise UserError("only an engine squad launched can be reloaded")
        admission = self.admission
        drain = (lambda: admission.drain(drain_timeout, hold=True)) if admission is not None else None
        try:
            changed = await self.launcher.reload(new, drain=drain, drain_timeout=drain_timeout)
        finally:
            self.plan = self.launcher.plan
            if self.launcher.info is not None:
                self._adopt(self.launcher.info)
            elif admission is not None:
                admission.resume()
        if changed:
            self._loaded("reloaded")
        return changed

    async def replan(self, concurrent: Iterable[Call], *, why: str = "") -> bool:
        """Reload with more slots/context when ``concurrent`` agents will run at once and the
        current plan cannot hold them (:func:`squad.sched.planner.plan_for_replan`). Returns True
        when the engine was reloaded; False when it already holds them, cannot be reloaded, or
        the bigger plan would not fit in memory."""
        if not self.reloadable:
            return False
        from squad.sched.memory import kv_memory, memory_for_kv

        async with self._reload_lock:
            assert self.plan is not None
            group = list(concurrent)
            if self.plan.gpu_layers in (None, 0):  # the engine runs on the CPU: RAM, as planned
                room = memory_for_kv(self.plan.model)
            else:
                from squad.engine.facts import read_model_facts

                layers = read_model_facts(self.plan.model).n_layer
                room = kv_memory(self.plan.model, n_layer=layers, gpu_layers=self.plan.gpu_layers).bytes
            new = plan_for_replan(self.plan, group, memory_for_kv=room)
            if new is None or new == self.plan:
                return False
            self._emit(EngineReplanning(from_slots=self.info.slots, to_slots=new.slots, n_ctx=new.n_ctx,
                                        agents=len(group)))
            return await self.reload(new)

    async def _restart(self) -> EngineInfo:
        """The client's restart hook after the engine died: same plan, new process."""
        assert self.launcher is not None
        await self._exited()
        info = await self.launcher.restart()
        if self.launcher.pid != self._restarted_pid:  # calls that overlapped share one restart: one event
            self._restarted_pid = self.launcher.pid
            self._loaded("restarted", info)
        return info

    async def _exited(self, settle: float = 0.5) -> str | None:
        """The client's hook when the engine stopped answering or cut a stream: ``"engine exited
        (signal 9 SIGKILL), log: PATH"`` if the launched engine's process has ended (reported as
        ``engine.exited`` once per process), else None. Waits up to ``settle`` seconds for a
        process whose socket closed but that has not finished exiting yet."""
        assert self.launcher is not None
        with anyio.move_on_after(settle):
            while self.launcher.running:
                await anyio.sleep(0.05)
        return self._report_exit()

    def exited(self) -> str | None:
        """``"engine exited (signal 9 SIGKILL), log: PATH"`` once the engine squad launched has
        ended by itself (reported as ``engine.exited``, once), else None."""
        return self._report_exit()

    async def death(self, error: BaseException, *, settle: float = 0.5) -> str | None:
        """Why this engine is dead after a call failed with ``error``, or None when it still
        serves (the call failed for its own reason). Dead: the launched engine's process ended
        (waiting up to ``settle`` seconds for one whose socket closed first); or ``error`` is
        :class:`~squad.errors.EngineGone` (the client raises it only once ``/health`` is down) or a
        cut stream (:class:`~squad.errors.TruncatedStream`) and ``/health`` no longer answers.
        The one rule for several engines (:mod:`squad.chat.routing`) and Ray workers (:mod:`squad.cluster.ray`)."""
        from squad.errors import EngineGone, TruncatedStream

        if self.launcher is not None and (why := await self._exited(settle)) is not None:
            return why
        if isinstance(error, EngineGone):
            return str(error)
        if isinstance(error, TruncatedStream):
            up = getattr(self._chat, "engine_up", None)
            if up is not None and not await up():
                return f"not answering after a stream it served was cut ({error})"
        return None

    def _report_exit(self) -> str | None:
        launcher = self.launcher
        status = launcher.exit_status() if launcher is not None else None
        if launcher is None or status is None:
            return None
        message = f"engine exited ({status}), log: {launcher.log_path}"
        if self._exit_reported != launcher.pid:
            self._exit_reported = launcher.pid
            self._emit(EngineExited(status=status, log_path=str(launcher.log_path), message=message,
                                    engine=launcher.base_url))
        return message

    def _loading(self, elapsed: float, timeout: float) -> None:
        assert self.plan is not None
        self._emit(EngineLoading(model=Path(self.plan.model).name, elapsed_s=round(elapsed, 1),
                                 timeout_s=round(timeout, 1)))

    def _adopt(self, info: EngineInfo) -> None:
        chat = self.chat
        chat.engine = info
        if chat.admission is not None:
            chat.admission.adopt(info)

    def _loaded(self, reason: str, info: EngineInfo | None = None) -> None:
        info = info or self.info
        self._emit(EngineLoaded(slots=info.slots, n_ctx=info.n_ctx, pool=info.pool, base_url=info.base_url,
                                reason=reason, engine=info.base_url))

    def _emit(self, event: Event) -> None:
        emit_to(self._sinks, event)
