"""Several engines for one squad: routing calls over them, and taking out an engine that dies.

:class:`EngineGroup` opens one :class:`~squad.engine.session.EngineSession` (own client, own
admission) per engine; :class:`Router` is the one :class:`~squad.chat.ChatEngine` the runtime
calls: a conversation stays on its engine, a new one goes to the engine with the most free
room. A dead engine is taken out (``engine.lost``); its queued calls fail with
:class:`~squad.errors.EngineLost` and move, a cut stream reruns from its start elsewhere; no
engine left is :class:`~squad.errors.EngineGone`. ``Router.engine``: slots and pool summed,
``n_ctx`` the smallest per-slot context. One engine given twice is refused (:func:`check_distinct`).

Design: docs/design/routing.md
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import AsyncResource

from squad.chat import ChatEngine, ChatRequest, ChatResult
from squad.engine.info import EngineInfo
from squad.engine.session import EngineSession, EngineSpec
from squad.engine.urls import engine_key
from squad.errors import EngineGone, EngineLost, TruncatedStream, UserError
from squad.events import CallMoved, EngineWarning, Event, EventSink, emit_to
from squad.events import EngineLost as EngineLostEvent
from squad.sched.plan import EnginePlan
from squad.sched.workload import Call, Node

__all__ = ["EngineGroup", "Router", "combined", "engine_key", "check_distinct"]  # engine_key: squad.engine.urls

EngineGiven = EngineSpec | EngineInfo | ChatEngine

def check_distinct(urls: Sequence[str | None], *, what: str = "engine URL") -> None:
    """Raise :class:`UserError` ``"engine URL given twice: ..."`` when two of ``urls`` are one
    engine (:func:`engine_key`); None items (engines squad launches) are skipped. ``what`` names
    how they were given (``"engine URL"``, ``"--url"``)."""
    seen: dict[str, str] = {}
    for url in urls:
        if url is None:
            continue
        key = engine_key(url)
        if key in seen:
            raise UserError(duplicate_message(seen[key], url, what=what))
        seen[key] = url


def duplicate_message(first: str, second: str, *, what: str = "engine URL", where: str = "") -> str:
    """``engine URL given twice: A`` (or ``A and B are one engine``), ``where`` the first was
    given (e.g. ``" (first on line 4)"``), then what to do."""
    same = first if first == second else f"{first} and {second} are one engine ({engine_key(first)})"
    return (f"{what} given twice: {same}{where}; give each engine once (squad would count its slots and KV pool "
            "twice and admit more than it holds)")


@dataclass(eq=False)
class _Member:
    """One engine of the group, as the router sees it."""

    session: EngineSession
    lost: str | None = None
    """Why it was taken out; None while it serves."""
    active: int = 0
    """Calls routed here that have not returned (waiting in its queue or running)."""

    @property
    def url(self) -> str:
        return self.session.info.base_url

    @property
    def slots(self) -> int:
        admission = self.session.admission
        return admission.slots if admission is not None else self.session.info.slots

    @property
    def limit(self) -> int:
        """Most tokens one request may use here."""
        admission = self.session.admission
        return admission.limit if admission is not None else self.session.info.n_ctx

    def room(self) -> tuple[int, int, int]:
        """Free slots, free pool tokens, minus calls routed here: larger is emptier."""
        admission = self.session.admission
        if admission is None:
            return (self.slots - self.active, 0, -self.active)
        free_tokens = admission.pool - admission.reserved - admission.queued_tokens
        return (self.slots - self.active, free_tokens, -self.active)

    def exited(self) -> str | None:
        """``"engine exited (signal 9 SIGKILL), log: PATH"`` once a launched engine's process ended."""
        return self.session.exited()


class Router:
    """The :class:`~squad.chat.ChatEngine` over several open engine sessions (module docstring).

    ``sessions``: open :class:`~squad.engine.session.EngineSession` objects (at least one);
    ``on_event``: receives ``engine.lost``, ``call.moved`` and ``engine.warning``. Each engine
    admits its own calls (``sessions[i].admission``). :meth:`complete` raises what the engine that
    served the call raised, or :class:`~squad.errors.EngineGone` when every engine is lost.
    """

    def __init__(self, sessions: Sequence[EngineSession], *, on_event: EventSink | None = None) -> None:
        if not sessions:
            raise UserError("a router needs at least one engine")
        self._members = [_Member(s) for s in sessions]
        self._sinks: list[EventSink] = [on_event] if on_event is not None else []
        self._homes: dict[str, _Member] = {}  # conversation id -> the engine that served it
        models = {Path(m.session.info.model_path).name for m in self._members if m.session.info.model_path}
        if len(models) > 1:
            self._emit(EngineWarning(warning=(
                f"the engines serve different models ({', '.join(sorted(models))}): a conversation stays on one "
                "engine, but which model answers a new one depends on free room; give every engine one model")))

    # -- what the runtime reads --------------------------------------------------------------

    @property
    def engines(self) -> list[EngineInfo]:
        """What each engine in service reported, in the order given."""
        return [m.session.info for m in self._members if m.lost is None]

    @property
    def lost(self) -> dict[str, str]:
        """Engines taken out: base URL -> why."""
        return {m.url: m.lost for m in self._members if m.lost is not None}

    @property
    def engine(self) -> EngineInfo:
        """The engines in service together (:func:`combined`); all of them once none is left."""
        return combined(self.engines or [m.session.info for m in self._members])

    # -- the seam -----------------------------------------------------------------------------

    async def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        """Prompt tokens as the first engine in service counts them (engines serve one model)."""
        while True:
            member = self._serving()[0]
            try:
                return await member.session.chat.count(messages, tools)
            except EngineGone as exc:
                self._lose(member, member.exited() or str(exc))

    async def complete(self, request: ChatRequest) -> ChatResult:
        """Route ``request`` (module docstring) and return the answer of the engine that served it,
        with ``engine`` and, after a re-run, ``rerun_from`` set."""
        need = await self._need(request)
        rerun_from: str | None = None
        moved: CallMoved | None = None
        while True:
            member = self._pick(request, need)
            if moved is not None:
                self._emit(dataclasses.replace(moved, to_engine=member.url))
            member.active += 1
            try:
                result = await member.session.chat.complete(request)
            except EngineLost as exc:  # waited in a lost engine's queue: never sent
                moved = self._moved(request, member, exc, rerun=False)
                continue
            except (EngineGone, TruncatedStream) as exc:
                why = await self._death(member, exc)
                if why is None:  # the engine answers: the call failed for its own reason
                    raise
                self._lose(member, why)
                rerun = isinstance(exc, TruncatedStream)  # it had streamed: run again from the start
                rerun_from = member.url if rerun else rerun_from
                moved = self._moved(request, member, exc, rerun=rerun)
                continue
            finally:
                member.active -= 1
            if request.origin.conversation:
                self._homes[request.origin.conversation] = member
            result.engine, result.rerun_from = member.url, rerun_from
            return result

    async def engine_up(self) -> bool:
        """True while an engine in service answers ``/health``."""
        for member in self._members:
            if member.lost is None and await member.session.chat.engine_up():
                return True
        return False

    async def aclose(self) -> None:
        """Nothing of its own: the :class:`EngineGroup` closes the sessions."""

    # -- routing ------------------------------------------------------------------------------

    async def _need(self, request: ChatRequest) -> int | None:
        """Prompt + max_tokens when the engines' per-request limits differ and the call's budget
        does not already fit the smallest (else None: every engine holds it)."""
        limits = {m.limit for m in self._serving()}
        if len(limits) == 1 or (request.budget is not None and request.budget <= min(limits)):
            return None
        return await self.count(request.messages, request.tools) + request.max_tokens

    def _pick(self, request: ChatRequest, need: int | None) -> _Member:
        serving = self._serving()
        fits = [m for m in serving if need is None or need <= m.limit]
        if not fits:  # fits nowhere: the largest engine's admission says so, with the fix
            return max(serving, key=lambda m: m.limit)
        home = self._homes.get(request.origin.conversation or "")
        if home is not None and home in fits:
            return home
        return max(fits, key=_Member.room)

    def _serving(self) -> list[_Member]:
        """Engines in service (a launched engine whose process ended is taken out first);
        raises :class:`EngineGone` when none is left."""
        for m in self._members:
            if m.lost is None and (why := m.exited()) is not None:
                self._lose(m, why)
        serving = [m for m in self._members if m.lost is None]
        if not serving:
            lost = "; ".join(f"{m.url}: {m.lost}" for m in self._members)
            raise EngineGone(f"all {len(self._members)} engines are lost ({lost}): restart them, or run on "
                             "engines that answer")
        return serving

    async def _death(self, member: _Member, exc: Exception) -> str | None:
        """Why ``member`` is dead after ``exc``, or None when it still serves (the call's own failure):
        :meth:`squad.engine.session.EngineSession.death`."""
        return member.lost if member.lost is not None else await member.session.death(exc)

    def _lose(self, member: _Member, why: str) -> None:
        """Take ``member`` out: close its admission (its queued calls move), forget its conversations."""
        if member.lost is not None:
            return
        member.lost = why
        admission = member.session.admission
        if admission is not None:
            admission.close(EngineLost(f"engine at {member.url} was lost ({why}); the call moves to another engine",
                                       engine=member.url, reason=why))
        self._homes = {c: m for c, m in self._homes.items() if m is not member}
        self._emit(EngineLostEvent(engine=member.url, reason=why,
                                   remaining=sum(m.lost is None for m in self._members)))

    def _moved(self, request: ChatRequest, member: _Member, exc: Exception, *, rerun: bool) -> CallMoved:
        origin = request.origin
        return CallMoved(agent=origin.agent, conversation=origin.conversation, parent=origin.parent,
                         call=getattr(exc, "call_id", None), engine=member.url, to_engine="", rerun=rerun,
                         reason=member.lost or str(exc))

    def _emit(self, event: Event) -> None:
        emit_to(self._sinks, event)


def combined(infos: Sequence[EngineInfo]) -> EngineInfo:
    """One :class:`EngineInfo` for several engines (module docstring): the first's model and
    kind; ``slots``/``pool`` summed; ``n_ctx`` and ``n_ctx_train`` the smallest; ``template_has_tools``
    False if any engine's is False, None if any is unknown; ``base_url`` the URLs joined by ``", "``
    (never connected to); ``sources["engines"]`` one line per engine."""
    if len(infos) == 1:
        return infos[0]
    first = infos[0]
    tools = [i.template_has_tools for i in infos]
    trains = [i.n_ctx_train for i in infos if i.n_ctx_train]
    kinds = {i.kind for i in infos}
    unified = {i.kv_unified for i in infos}
    each = "; ".join(f"{i.base_url}: {i.slots} slots, {i.n_ctx:,} tokens per request, pool {i.pool:,}" for i in infos)
    return dataclasses.replace(
        first, base_url=", ".join(i.base_url for i in infos), api_key=None,
        slots=sum(i.slots for i in infos), n_ctx=min(i.n_ctx for i in infos), pool=sum(i.pool for i in infos),
        kv_unified=unified.pop() if len(unified) == 1 else None, n_ctx_train=min(trains) if trains else None,
        launched=any(i.launched for i in infos),
        template_has_tools=False if False in tools else None if None in tools else True,
        chat_template=first.chat_template if len({i.chat_template for i in infos}) == 1 else None,
        kind=kinds.pop() if len(kinds) == 1 else "openai-compatible",
        sources={"engines": f"{len(infos)} engines: {each}"},
        warnings=tuple(w for i in infos for w in i.warnings))


def _check_given(engines: Sequence[EngineGiven]) -> None:
    """Refuse one engine given twice: the same URL (:func:`check_distinct`) or the same object
    (an EngineInfo or ChatEngine; one EngineSpec without a URL given twice launches two engines)."""
    for i, engine in enumerate(engines):
        first = next((j for j in range(i) if engines[j] is engine), None)
        if first is not None and not isinstance(engine, EngineSpec):
            raise UserError(f"engines=[...] gives one {type(engine).__name__} twice (items {first} and {i}); give "
                            "each engine once (squad would count its slots and KV pool twice and admit more than "
                            "it holds)")
    check_distinct([_url_of(e) for e in engines])


def _url_of(engine: EngineGiven) -> str | None:
    """Where ``engine`` answers, for comparing: an http(s) URL, or None (a launched engine, a fake)."""
    url = engine.url if isinstance(engine, EngineSpec) else engine.base_url if isinstance(engine, EngineInfo) \
        else getattr(getattr(engine, "engine", None), "base_url", None)
    return url if isinstance(url, str) and url.lower().startswith(("http://", "https://")) else None


class EngineGroup(AsyncResource):
    """Several engines for one squad: ``async with EngineGroup([spec_a, spec_b], workload) as group``.

    Each item of ``engines`` is what one :class:`~squad.engine.session.EngineSession` takes: an
    :class:`~squad.engine.session.EngineSpec` (launch, or attach with ``url``), an
    :class:`~squad.engine.info.EngineInfo`, or a :class:`~squad.chat.ChatEngine`. Launched engines
    are planned with ``share = 1/N`` of the KV memory (N launched) and never restarted; all open at
    once, and if one fails to open, those that opened are stopped and its error is raised.

    After entry it answers like a session: ``chat`` (the :class:`Router`), ``info``
    (:attr:`Router.engine`), ``plan`` (the launched plan with the smallest per-slot context, whose
    budgets hold on every launched engine; None when none was launched), ``plans`` (each launched
    engine's), ``admission`` None (each engine has its own: ``sessions[i].admission``).
    Reloading and replanning are not done for a group (:meth:`replan` returns False).
    """

    launcher = None
    spec = None
    reloadable = False

    def __init__(self, engines: Sequence[EngineGiven], workload: Node | None = None, *,
                 on_event: EventSink | None = None) -> None:
        if not engines:
            raise UserError("engines=[] holds no engine: give at least one EngineSpec, EngineInfo or URL")
        _check_given(engines)
        launched = sum(isinstance(e, EngineSpec) and e.url is None for e in engines)
        share = 1.0 / launched if launched else 1.0
        self.workload = workload
        self._on_event = on_event
        self.sessions = [EngineSession(e, workload, on_event=on_event, restart=False,
                                       share=share if isinstance(e, EngineSpec) and e.url is None else 1.0)
                         for e in engines]
        self._router: Router | None = None

    @property
    def chat(self) -> Router:
        if self._router is None:
            raise UserError("the engines are not open yet: use `async with Squad(...) as sq:`")
        return self._router

    @property
    def info(self) -> EngineInfo:
        return self.chat.engine

    @property
    def admission(self) -> None:
        return None

    @property
    def plans(self) -> list[EnginePlan]:
        return [s.plan for s in self.sessions if s.plan is not None]

    @property
    def plan(self) -> EnginePlan | None:
        return min(self.plans, key=lambda p: p.n_ctx, default=None)

    async def replan(self, concurrent: Iterable[Call], *, why: str = "") -> bool:
        return False

    async def __aenter__(self) -> EngineGroup:
        failed: list[BaseException] = []

        async def open_one(session: EngineSession) -> None:
            try:
                await session.__aenter__()
            except Exception as exc:  # noqa: BLE001 - raised below, after the others are stopped
                failed.append(exc)

        try:
            async with anyio.create_task_group() as tg:
                for session in self.sessions:
                    tg.start_soon(open_one, session)
            if failed:
                raise failed[0]
            self._router = Router(self.sessions, on_event=self._on_event)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def aclose(self) -> None:
        """Close every session (stopping the engines squad launched); shielded, safe twice."""
        with anyio.CancelScope(shield=True):
            for session in self.sessions:
                await session.aclose()
