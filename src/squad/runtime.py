"""The runtime: a :class:`Squad` owns one engine and runs a main agent and its sub-agents
as concurrent tasks on it.

Every model call goes through the squad's one :class:`~squad.client.EngineClient` and its
:class:`~squad.admission.Admission`, so no more requests are in flight than the engine has
slots, and never more tokens than its pool holds. The main agent calls with priority 0,
sub-agents with their depth (1, 2, ...), so a main agent is never starved by its own
sub-agents.

Parallel blocks (``run`` fan-out, ``parallel``, ``map``) have a policy:

- ``"collect"`` (default): every agent finishes; failures are recorded beside the results.
- ``"fail-fast"``: the first failure X cancels its siblings at once (their HTTP streams are
  closed by the cancellation); each sibling's result records ``"cancelled because 'X'
  failed"``, and X's error is the one reported.

``Squad.cancel(reason)`` cancels every running operation; each agent records that reason
and the operation raises :class:`~squad.errors.AgentCancelled`.

Sub-agent answers handed back to a main agent are cut by one visible rule when they would
overflow its budget (:func:`cut_answers`): the room left (budget - max_tokens - the prompt
without the answers, counted by the engine) is shared equally; an answer shorter than its
share keeps all of it and leaves the rest to the others; a longer one is cut to its share and
ends with ``[cut: N tokens omitted]``; an ``answer.cut`` event says so.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Sequence

import anyio

from squad import flow
from squad.agent import Agent, check_squad
from squad.engine.info import EngineInfo
from squad.errors import AgentCancelled, AgentRunError, MentionError, SquadError, UserError, leaf_errors
from squad.results import (
    AgentResult,
    AgentTimings,
    RunResult,
    cancelled_result,
    compose_hand_back,
    cut_answers,
    first_failure,
    slot_of,
    timings_of,
    usage_of,
)
from squad.tools import Tool, run_tool_calls
from squad.trace import Event, EventSink, emit_to

__all__ = ["Squad", "Policy", "run_sync", "default_workload"]

Policy = Literal["collect", "fail-fast"]
_OP_REASON: ContextVar[list[str | None]] = ContextVar("squad_cancel_reason")
"""The running operation's cancel reason holder (set by ``Squad.cancel``), seen by its tasks."""


@contextlib.contextmanager
def _single_errors() -> Iterator[None]:
    """Let a squad error raised inside a task group (e.g. EngineGone, which no agent result
    can hold) leave it as itself, not wrapped in an ExceptionGroup nobody downstream catches."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = leaf_errors(group)
        first = next((e for e in leaves if isinstance(e, SquadError)), None)
        if first is not None and all(isinstance(e, (SquadError, anyio.get_cancelled_exc_class())) for e in leaves):
            raise first from group
        raise


class Squad:
    """Agents that share one engine. ``async with Squad(agents, ...) as sq: await sq.run(text)``.

    Engine, one of:

    - ``engine=EngineInfo``: use that engine as is (tests with ``squad.testing.FakeEngine``);
    - ``url=`` (+ ``api_key=``): attach to a running llama-server (``squad.engine.remote.attach``);
    - otherwise launch one: the planner sizes it for ``workload`` (default
      :func:`default_workload`) from the model's GGUF facts (``model``: name or path, None =
      the default model) and the memory free for KV; ``slots``/``ctx`` pin those values.

    ``main`` names the main agent (default: the first). ``tools`` are the function tools
    agents may name. ``variables`` are passed to every agent's instructions template.
    ``replan=True`` lets a turn that @mentions more agents than the engine has slots reload
    a launched engine with more slots (otherwise they queue in squad, with an event).
    ``threads``/``binary`` go to the launcher (``-t``, llama-server path).
    ``max_tool_rounds`` bounds tool-calling rounds per agent turn; after that the model is
    asked once more without tools.

    Raises :class:`UserError` for an inconsistent squad (unknown sub-agent or tool, a
    cycle, duplicate names, ``slots``/``ctx`` with an engine squad does not launch).
    """

    def __init__(
        self,
        agents: Sequence[Agent],
        *,
        main: str | None = None,
        model: str | Path | None = None,
        slots: int | None = None,
        ctx: int | None = None,
        url: str | None = None,
        api_key: str | None = None,
        engine: EngineInfo | None = None,
        workload: flow.Node | None = None,
        replan: bool = False,
        on_event: EventSink | Sequence[EventSink] | None = None,
        tools: Sequence[Tool] = (),
        variables: Mapping[str, Any] | None = None,
        threads: int | None = None,
        binary: str | Path | None = None,
        max_tool_rounds: int = 4,
        request_timeout: float = 600.0,
    ) -> None:
        if not agents:
            raise UserError("a squad needs at least one agent")
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        self.agents: dict[str, Agent] = check_squad(agents, list(self.tools))
        if main is not None and main not in self.agents:
            raise UserError(f"main agent {main!r} is not in the squad (agents: {', '.join(self.agents)})")
        self.main: str = main or agents[0].name
        if (slots is not None or ctx is not None) and (engine is not None or url is not None):
            raise UserError("slots= and ctx= size an engine squad launches; drop them with url= or engine=")
        self.workload: flow.Node = workload or default_workload(self.agents, self.main)
        self.variables = dict(variables or {})
        self.replan = replan
        self.max_tool_rounds = max_tool_rounds
        self._tool_warned: set[str] = set()
        self._sinks: list[EventSink] = [] if on_event is None else (
            list(on_event) if isinstance(on_event, (list, tuple)) else [on_event]  # type: ignore[list-item]
        )
        self._engine_arg = engine
        self._url, self._api_key = url, api_key
        self._model, self._slots, self._ctx, self._threads, self._binary = model, slots, ctx, threads, binary
        self._request_timeout = request_timeout
        self._stack: contextlib.AsyncExitStack | None = None
        self._scopes: dict[anyio.CancelScope, list[str | None]] = {}
        self._empty_count: int | None = None
        self._replan_lock = anyio.Lock()
        self.info: EngineInfo | None = None
        self.plan: Any = None
        self.launcher: Any = None
        self.admission: Any = None
        self.client: Any = None

    # --- engine -------------------------------------------------------------------------

    async def __aenter__(self) -> "Squad":
        stack = contextlib.AsyncExitStack()
        try:
            self.info = await self._open_engine(stack)
            from squad.admission import Admission
            from squad.client import EngineClient

            self.admission = Admission(self.info.slots, self.info.pool, on_event=self._emit)
            restart = self.launcher.restart if self.launcher is not None else None
            client = EngineClient(
                self.info,
                admission=self.admission,
                request_timeout=self._request_timeout,
                on_event=self._emit,
                restart=restart,
            )
            if hasattr(client, "__aenter__"):
                client = await stack.enter_async_context(client)
            elif hasattr(client, "aclose"):
                stack.push_async_callback(client.aclose)
            self.client = client
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        self._emit(Event("squad.ready", data={"slots": self.info.slots, "pool": self.info.pool,
                                               "base_url": self.info.base_url, "main": self.main}))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel("the squad is closing")
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def _open_engine(self, stack: contextlib.AsyncExitStack) -> EngineInfo:
        if self._engine_arg is not None:
            return self._engine_arg
        if self._url is not None:
            from squad.engine.remote import attach

            return await attach(self._url, self._api_key)
        from squad.engine.launcher import Launcher, free_port
        from squad.engine.models import read_model_facts, resolve_model
        from squad.machine import memory_for_kv
        from squad.planner import plan

        model_path = await anyio.to_thread.run_sync(lambda: resolve_model(self._model))
        facts = await anyio.to_thread.run_sync(lambda: read_model_facts(model_path))
        self.plan = plan(
            self.workload,
            model=model_path,
            n_ctx_train=facts.n_ctx_train,
            kv_bytes_per_token=facts.kv_bytes_per_token("f16", "f16"),
            memory_for_kv=memory_for_kv(model_path),
            pin_slots=self._slots,
            pin_ctx=self._ctx,
        )
        self._emit(Event("engine.planned", data={"slots": self.plan.slots, "n_ctx": self.plan.n_ctx,
                                                  "reasons": list(self.plan.reasons),
                                                  "warnings": list(self.plan.warnings)}))
        launcher = Launcher(self.plan, binary=self._binary, threads=self._threads,
                            request_timeout=self._request_timeout, port=free_port())  # one port across reloads
        self.launcher = await stack.enter_async_context(launcher)
        return self.launcher.info

    def _emit(self, event: Event) -> None:
        emit_to(self._sinks, event)

    def _require_open(self) -> None:
        if self.client is None:
            raise UserError("the squad is not open: use `async with Squad(...) as sq:` (or run_sync)")

    # --- public operations --------------------------------------------------------------

    async def run(
        self,
        text: str,
        *,
        history: Sequence[Mapping[str, Any]] = (),
        policy: Policy = "collect",
        variables: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """One main-agent turn on ``text``.

        @mentions of the main agent's sub-agents are dispatched in parallel (each gets the
        part of the text addressed to it, see :mod:`squad.mention`); their answers go back
        to the main agent in ONE user message after ``text``, cut by the rule in the module
        docstring if they would overflow its budget; then the main agent answers.

        Raises :class:`MentionError` for an unknown @mention before any model call; the main
        agent's :class:`AgentRunError` if it fails; with ``policy="fail-fast"`` the first
        failing sub-agent's error; :class:`AgentCancelled` after ``cancel()``.
        """
        from squad.mention import parse_mentions

        self._require_open()
        main = self.agents[self.main]
        known = self._sub_names(main)
        parsed = parse_mentions(text, known)
        if parsed.unknown:
            hint = f" (known sub-agents of {main.name!r}: {', '.join(known) or 'none'})"
            raise MentionError("; ".join(u.message() for u in parsed.unknown) + hint)
        async with self._operation():
            subs: list[AgentResult] = []
            message = text
            if parsed.dispatches:
                self._emit(Event("mention.dispatched", main.name, {"agents": parsed.agents}))
                await self._fit_fanout(main, parsed.agents)
                subs = await self._parallel(
                    [(d.agent, d.text) for d in parsed.dispatches], policy=policy, priority=1, variables=variables
                )
                failed = first_failure(subs)
                if policy == "fail-fast" and failed is not None:
                    raise failed
                message = await self.hand_back(main, text, subs, history=history, variables=variables)
            result = await self._recorded(main, message, history=history, priority=0, variables=variables)
        if result.error is not None:
            raise result.error
        return RunResult(output=result.output, main=result, subs=subs + result.subs, history=result.history)

    async def run_agent(
        self,
        name: str,
        prompt: str,
        *,
        history: Sequence[Mapping[str, Any]] = (),
        priority: int = 0,
        variables: Mapping[str, Any] | None = None,
    ) -> AgentResult:
        """One turn of agent ``name`` on ``prompt`` (after ``history``, OpenAI-style messages).

        Runs the tool loop if it has tools or sub-agent tools. Raises its
        :class:`AgentRunError` on failure, :class:`UserError` for an unknown agent.
        """
        self._require_open()
        agent = self._agent(name)
        async with self._operation():
            result = await self._recorded(agent, prompt, history=history, priority=priority, variables=variables)
        if result.error is not None:
            raise result.error
        return result

    async def parallel(
        self,
        calls: Iterable[tuple[str, str]],
        *,
        policy: Policy = "collect",
        max_concurrency: int | None = None,
        priority: int = 0,
        check: bool = False,
        variables: Mapping[str, Any] | None = None,
    ) -> list[AgentResult]:
        """Run ``(agent, prompt)`` pairs at once; results in the same order.

        Failures are recorded in each result's ``error`` (see the policies in the module
        docstring). ``check=True`` raises the first failure's error instead of returning.
        ``max_concurrency`` bounds how many run at once in addition to the engine's slots.
        """
        self._require_open()
        pairs = [(self._agent(name).name, prompt) for name, prompt in calls]
        async with self._operation():
            results = await self._parallel(pairs, policy=policy, priority=priority,
                                           max_concurrency=max_concurrency, variables=variables)
        failed = first_failure(results)
        if check and failed is not None:
            raise failed
        return results

    async def map(
        self,
        name: str,
        inputs: Iterable[str],
        *,
        max_concurrency: int | None = None,
        policy: Policy = "collect",
        check: bool = False,
    ) -> list[AgentResult]:
        """Run agent ``name`` once per input, at most ``max_concurrency`` at a time (and never
        more than the engine's slots in flight); results in input order. See :meth:`parallel`."""
        return await self.parallel([(name, text) for text in inputs], policy=policy,
                                   max_concurrency=max_concurrency, check=check)

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Cancel every running operation; each agent records ``reason``. Safe to call from
        any task of the squad's event loop; operations started later run normally."""
        for scope, holder in list(self._scopes.items()):
            holder[0] = reason
            scope.cancel(reason)

    # --- internals ----------------------------------------------------------------------

    def _agent(self, name: str) -> Agent:
        try:
            return self.agents[name]
        except KeyError:
            raise UserError(f"no agent named {name!r} (agents: {', '.join(self.agents)})") from None

    def _sub_names(self, agent: Agent) -> list[str]:
        """Sub-agents ``agent`` may call: its ``agents``; for the main agent with none
        declared, every other agent."""
        if agent.agents:
            return list(agent.agents)
        if agent.name == self.main:
            return [n for n in self.agents if n != agent.name]
        return []

    @contextlib.asynccontextmanager
    async def _operation(self):  # type: ignore[no-untyped-def]
        """A cancel scope ``cancel()`` can reach; turns that cancellation into AgentCancelled."""
        holder: list[str | None] = [None]
        token = _OP_REASON.set(holder)
        try:
            with anyio.CancelScope() as scope:
                self._scopes[scope] = holder
                try:
                    yield
                finally:
                    del self._scopes[scope]
        finally:
            _OP_REASON.reset(token)
        if scope.cancelled_caught:
            raise AgentCancelled(holder[0] or "cancelled by the caller")

    async def _fit_fanout(self, main: Agent, subs: Sequence[str]) -> None:
        """More sub-agents than slots: replan a launched engine if allowed, else say they queue."""
        assert self.info is not None
        n = len(subs)
        if n <= self.info.slots:
            return
        if self.replan and self.launcher is not None and self.plan is not None:
            async with self._replan_lock:
                from squad.machine import memory_for_kv
                from squad.planner import plan_for_replan

                group = [flow.Call(main.name, main.budget)] + [flow.Call(s, self.agents[s].budget) for s in subs]
                new = plan_for_replan(self.plan, group, memory_for_kv=memory_for_kv(self.plan.model))
                if new is not None and new != self.plan:
                    self._emit(Event("engine.replanning", data={"from_slots": self.info.slots, "to_slots": new.slots,
                                                                "n_ctx": new.n_ctx, "agents": n}))
                    try:
                        await self.launcher.reload(new, drain=lambda: self.admission.drain(30.0, hold=True))
                    finally:
                        self.plan, self.info = self.launcher.plan, self.launcher.info or self.info
                        self.admission.resize(self.info.slots, self.info.pool)
                    if hasattr(self.client, "engine"):
                        self.client.engine = self.info
                    self._emit(Event("engine.replanned", data={"slots": self.info.slots, "pool": self.info.pool}))
            if n <= self.info.slots:
                return
        self._emit(Event("mention.queued", data={
            "agents": n, "slots": self.info.slots,
            "message": f"{n} sub-agents mentioned but the engine has slots={self.info.slots}: "
                       f"{n - self.info.slots} wait in squad's queue (pass replan=True or raise slots)",
        }))

    async def _parallel(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        policy: Policy,
        priority: int,
        max_concurrency: int | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> list[AgentResult]:
        if policy not in ("collect", "fail-fast"):
            raise UserError(f"policy {policy!r}: use 'collect' or 'fail-fast'")
        results: list[AgentResult | None] = [None] * len(pairs)
        limiter = anyio.CapacityLimiter(max_concurrency) if max_concurrency else None
        sibling_failed: list[str] = []

        with _single_errors():
            async with anyio.create_task_group() as tg:

                async def one(i: int, name: str, prompt: str) -> None:
                    def reason() -> str | None:
                        return f"cancelled because {sibling_failed[0]!r} failed" if sibling_failed else None

                    result = await self._recorded(self.agents[name], prompt, priority=priority, variables=variables,
                                                  limiter=limiter, cancel_reason=reason, into=(results, i))
                    if policy == "fail-fast" and result.error is not None and not sibling_failed:
                        sibling_failed.append(name)
                        tg.cancel_scope.cancel(f"sibling {name!r} failed")

                for i, (name, prompt) in enumerate(pairs):
                    tg.start_soon(one, i, name, prompt)
        return [r if r is not None else cancelled_result(pairs[i][0], "cancelled before it started")
                for i, r in enumerate(results)]

    async def _recorded(
        self,
        agent: Agent,
        prompt: str,
        *,
        history: Sequence[Mapping[str, Any]] = (),
        priority: int,
        variables: Mapping[str, Any] | None = None,
        limiter: anyio.CapacityLimiter | None = None,
        cancel_reason: Callable[[], str | None] = lambda: None,
        into: tuple[list[AgentResult | None], int] | None = None,
    ) -> AgentResult:
        """Run one conversation and always produce its AgentResult (stored in ``into`` too,
        so a cancelled one is recorded before the cancellation propagates)."""
        start = time.monotonic()
        self._emit(Event("agent.started", agent.name, {"priority": priority}))
        try:
            async with limiter if limiter is not None else contextlib.nullcontext():
                result = await self._converse(agent, prompt, history, priority, variables)
        except anyio.get_cancelled_exc_class():
            reason = cancel_reason() or _OP_REASON.get([None])[0] or "cancelled by the caller"
            result = cancelled_result(agent.name, reason, time.monotonic() - start)
            self._emit(Event("agent.cancelled", agent.name, {"reason": reason}))
            if into is not None:
                into[0][into[1]] = result
            raise
        except AgentRunError as exc:
            result = AgentResult(agent=agent.name, error=exc,
                                 timings=AgentTimings(total_s=time.monotonic() - start))
            self._emit(Event("agent.failed", agent.name, {"error": f"{type(exc).__name__}: {exc}"}))
        else:
            self._emit(Event("agent.finished", agent.name, {"summary": result.summary()}))
        if into is not None:
            into[0][into[1]] = result
        return result

    def _warn_no_tool_template(self, agent: str, tools: list[str]) -> None:
        """Say once per agent that the model's chat template will drop its tool definitions."""
        if agent in self._tool_warned:
            return
        self._tool_warned.add(agent)
        self._emit(Event("engine.warning", agent, {"warning": (
            f"agent '{agent}' has tools ({', '.join(tools)}) but the model's chat template has no tools "
            "section, so llama-server drops them: the model cannot call them. Use a model whose "
            "template supports tool calls, or @mentions instead of sub-agents as tools.")}))

    async def _converse(
        self,
        agent: Agent,
        prompt: str,
        history: Sequence[Mapping[str, Any]],
        priority: int,
        variables: Mapping[str, Any] | None,
    ) -> AgentResult:
        """The tool-calling loop for one agent turn; raises AgentRunError on failure."""
        start = time.monotonic()
        system = self._system(agent, variables)
        subs: list[AgentResult] = []
        tools = self._tools_for(agent, priority, subs, variables)
        specs = [t.spec() for t in tools.values()] or None
        if specs and self.info is not None and self.info.template_has_tools is False:
            self._warn_no_tool_template(agent.name, list(tools))
        convo: list[dict[str, Any]] = [*map(dict, history), {"role": "user", "content": prompt}]
        calls: list[Any] = []
        tool_log: list[tuple[str, str, str]] = []
        for round_no in range(self.max_tool_rounds + 1):
            offer = specs if round_no < self.max_tool_rounds else None
            messages = ([{"role": "system", "content": system}] if system else []) + convo
            reply = await self.client.complete(
                agent=agent.name, messages=messages, max_tokens=agent.max_tokens, budget=agent.budget,
                tools=offer, sampling=agent.sampling.as_params() or None, priority=priority,
            )
            calls.append(reply)
            if offer and reply.tool_calls:
                convo.append({"role": "assistant", "content": reply.content or None, "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in reply.tool_calls
                ]})
                outcomes = await run_tool_calls(tools, reply.tool_calls)
                for call, outcome in zip(reply.tool_calls, outcomes):
                    convo.append({"role": "tool", "tool_call_id": call.id, "content": outcome.text})
                    tool_log.append((call.name, call.arguments, outcome.text))
                    self._emit(Event("tool.called", agent.name, {"tool": call.name, "ok": outcome.ok}))
                continue
            if reply.content:
                convo.append({"role": "assistant", "content": reply.content})
            break
        result = AgentResult(
            agent=agent.name, output=reply.content or "", reasoning=reply.reasoning or "",
            usage=usage_of(calls), timings=timings_of(calls, time.monotonic() - start),
            slot=slot_of(reply), history=convo, tool_calls=tool_log,
        )
        result.subs = subs
        return result

    def _system(self, agent: Agent, variables: Mapping[str, Any] | None) -> str:
        subs = [self.agents[n] for n in self._sub_names(agent)]
        return agent.system_prompt(subs, {**self.variables, **(variables or {})})

    def _tools_for(
        self, agent: Agent, priority: int, subs: list[AgentResult], variables: Mapping[str, Any] | None
    ) -> dict[str, Tool]:
        tools = {name: self.tools[name] for name in agent.tools}
        if agent.sub_agent_tools:
            for name in agent.agents:
                tools[f"ask_{name}"] = self._ask_tool(self.agents[name], priority + 1, subs, variables)
        return tools

    def _ask_tool(
        self, sub: Agent, priority: int, subs: list[AgentResult], variables: Mapping[str, Any] | None
    ) -> Tool:
        async def ask(task: str) -> str:
            result = await self._recorded(sub, task, priority=priority, variables=variables)
            subs.append(result)
            if result.error is not None:
                raise result.error
            return result.output

        description = f"Ask the sub-agent {sub.name!r} to do a task and return its answer."
        if sub.description:
            description += f" It is for: {sub.description}"
        ask.__doc__ = f"{description}\n\nArgs:\n    task: what {sub.name} should do, self-contained"
        return Tool.from_function(ask, name=f"ask_{sub.name}", description=description)

    async def hand_back(
        self,
        main: Agent,
        text: str,
        subs: Sequence[AgentResult],
        *,
        history: Sequence[Mapping[str, Any]] = (),
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The ONE user message giving the main agent ``text`` and its sub-agents' answers,
        cut to fit its budget by the rule in the module docstring."""
        answers = [r.output if r.ok else f"(failed: {r.error})" for r in subs]
        frame = compose_hand_back(text, [r.agent for r in subs], [""] * len(subs))
        system = self._system(main, variables)
        base = ([{"role": "system", "content": system}] if system else []) + [*map(dict, history)]
        specs = [t.spec() for t in self._tools_for(main, 0, [], variables).values()] or None
        used = await self._count([*base, {"role": "user", "content": frame}], specs)
        room = main.budget - main.max_tokens - used - _CUT_RESERVE * len(subs)
        cut = await cut_answers(answers, room, self._count_text)
        for r, (kept, omitted) in zip(subs, cut):
            if omitted:
                self._emit(Event("answer.cut", r.agent, {
                    "omitted_tokens": omitted, "room_tokens": room, "main": main.name,
                    "rule": "equal share of the main agent's remaining budget",
                }))
        return compose_hand_back(text, [r.agent for r in subs], [kept for kept, _ in cut])

    async def _count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
        counted = self.client.count_prompt_tokens(messages, tools)
        return int(await counted if inspect.isawaitable(counted) else counted)

    async def _count_text(self, text: str) -> int:
        if self._empty_count is None:
            self._empty_count = await self._count([{"role": "user", "content": ""}], None)
        return max(0, await self._count([{"role": "user", "content": text}], None) - self._empty_count)


_CUT_RESERVE = 4
"""Tokens kept free per answer: joining texts can tokenize a little differently."""


def default_workload(agents: Mapping[str, Agent], main: str) -> flow.Node:
    """The workload when none is given: the main agent as a Delegate over its sub-agents in
    parallel (a chat turn that @mentions all of them), or just the main agent."""
    lead = agents[main]
    names = list(lead.agents) or [n for n in agents if n != main]
    call = flow.Call(lead.name, lead.budget)
    if not names:
        return call
    return flow.Delegate(main=call, subs=flow.Parallel(tuple(flow.Call(n, agents[n].budget) for n in names)))


def run_sync(agents: Sequence[Agent], text: str, **squad_options: Any) -> RunResult:
    """Open a :class:`Squad` (``squad_options`` as for its constructor), run one turn on
    ``text`` and close it, from synchronous code (``anyio.run``)."""

    async def main() -> RunResult:
        async with Squad(agents, **squad_options) as sq:
            return await sq.run(text)

    return anyio.run(main)
