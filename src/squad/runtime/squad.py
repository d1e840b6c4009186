"""The runtime: a :class:`Squad` runs a main agent and its sub-agents as concurrent tasks
on one engine session (:class:`~squad.engine.session.EngineSession`).

Every model call goes through the session's :class:`~squad.chat.ChatEngine` and its
:class:`~squad.sched.admission.Admission`, so no more requests are in flight than the engine has
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

Each agent conversation gets an id (``name#n``) and knows its parent conversation; events
carry both (:mod:`squad.events`). One agent turn is :func:`squad.runtime.turn.run_turn`; answers
handed back to a main agent are cut by :mod:`squad.runtime.handback`'s rule.

Who can delegate: only ``Squad.run`` reads @mentions, and only from the caller's own text
(data put into it with :func:`squad.runtime.mention.as_data` never dispatches). Model answers, tool
results, sub-agent answers, hand-backs and history are never parsed for mentions. A model
delegates only through ``ask_<name>`` tools, bounded per run (:class:`squad.runtime.turn.SubAgentBound`):
a run is a conversation the caller starts (a ``run`` turn with its @mentioned sub-agents, a
``run_agent`` call, each ``parallel``/``map`` item) with everything it calls.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from squad.chat.structured import OutputSchema, output_schema
from squad.engine.session import EngineSource
from squad.errors import MentionError, UserError
from squad.events import Event, EventSink, MentionDispatched, Origin, close_all, emit_to, flush_all
from squad.mcp import MCPServer, MCPServers, MCPTool, is_mcp_ref
from squad.runtime.agent import MAX_SUB_CALLS, MAX_SUB_DEPTH, Agent, check_squad, sub_agent_names
from squad.runtime.blocks import Operations, Policy
from squad.runtime.conversation import _BOUND, Conversations, _fail_on, incomplete_answer
from squad.runtime.engine_choice import MOVED, chosen_engine, renamed_hint, session_for
from squad.runtime.handback import TextCounter, hand_back
from squad.runtime.mention import Dispatch, parse_mentions, unmark
from squad.runtime.outcome import Outcome
from squad.runtime.results import AgentResult, RunResult, first_failure
from squad.runtime.toolroom import MAX_TOOL_ROUNDS
from squad.sched.share import SHARE_MODES, ShareGroup
from squad.sched.workload import Call, Delegate, Node, Parallel
from squad.tools import Tool

__all__ = ["Squad", "Policy", "run_sync", "default_workload", "incomplete_answer"]


class Squad(Conversations):
    """Agents that share one engine. ``async with Squad(agents, ...) as sq: await sq.run(text)``.

    The engine (``engine=``), one of:

    - an :class:`~squad.engine.session.EngineSpec`: launch one planned for ``workload`` (default
      :func:`default_workload`), or attach to ``EngineSpec(url=...)``;
    - an :class:`~squad.engine.info.EngineInfo`: an engine already running, used as reported;
    - a :class:`~squad.chat.ChatEngine`: used as is (``squad.testing.ScriptedEngine``);
    - an :class:`~squad.engine.provider.EngineProvider`: any engine source, opened for
      ``workload`` (``LaunchedEngine(spec, share=..., restart=...)``, or a kind of your own);
    - None: the short forms ``model``, ``slots``, ``ctx``, ``threads`` (launch) or ``url`` +
      ``api_key`` (attach) build the spec; nothing at all launches the built-in model.

    Or several engines (``engines=``, a list of the items ``engine=`` takes, e.g.
    ``[EngineSpec(url=A), EngineSpec(model=M, threads=1)]``): calls are routed over them, a
    conversation stays on its engine, and an engine that dies is taken out, its calls moved or
    re-run on the others (:mod:`squad.chat.routing`; ``session`` is then an
    :class:`~squad.chat.routing.EngineGroup`). Not together with ``engine=`` or the short forms. One
    engine given twice (two URLs of one engine, :func:`~squad.chat.routing.engine_key`, or one object
    twice) raises :class:`UserError`: its slots and pool would count twice.

    ``main`` names the main agent (default: the first). ``tools`` are the function tools
    agents may name. ``mcp_servers`` (:class:`~squad.mcp.MCPServer`) are MCP servers whose
    tools agents name as ``server.tool`` or ``server.*``: they start when the squad opens,
    before the engine, and stop when it closes (:mod:`squad.mcp`); an
    :class:`~squad.mcp.MCPServers` already open is used as it is and left open. ``variables`` are passed to every
    agent's instructions template. ``replan=True`` lets a turn that @mentions more agents than the engine has slots
    reload a launched engine with more slots (otherwise they queue in squad, with an event).
    ``queue`` orders the calls waiting for admission (:mod:`squad.sched.policy`: ``program``
    default, ``fifo``, ``backfill``).
    ``max_tool_rounds`` bounds tool-calling rounds per agent turn; after that the model is
    asked once more without tools. ``max_sub_depth`` (default 2) and ``max_sub_calls``
    (default 8) bound the sub-agent tool calls (``ask_<name>``) of one run (see the module
    docstring): how deep they nest and how many there are in all; an agent's own
    ``max_sub_depth``/``max_sub_calls`` replace them for the runs it starts. A call past a
    bound is not made: the model gets ``error: refused: ...`` as the tool's result, the run
    emits ``tool.limited`` and the asking conversation's result has a note
    (``RunResult.notes``).

    After entry, ``session`` is the :class:`~squad.engine.session.EngineSession` (``session.info``:
    what the engine reported; ``session.plan``: the plan, None when not launched).

    Raises :class:`UserError` for an inconsistent squad (unknown sub-agent or tool, a
    cycle, duplicate names, short forms together with ``engine=``, pins with ``url``); on
    entry, for an MCP tool its server does not have (or two tools with one name), and
    :class:`~squad.errors.MCPServerError` for an MCP server that does not start.
    """

    def __init__(
        self,
        agents: Sequence[Agent],
        *,
        main: str | None = None,
        engine: EngineSource | None = None,
        engines: Sequence[EngineSource] | None = None,
        model: str | Path | None = None,
        slots: int | None = None,
        ctx: int | None = None,
        threads: int | None = None,
        url: str | None = None,
        api_key: str | None = None,
        workload: Node | None = None,
        replan: bool = False,
        on_event: EventSink | Sequence[EventSink] | None = None,
        tools: Sequence[Tool] = (),
        mcp_servers: Sequence[MCPServer] | MCPServers = (),
        variables: Mapping[str, Any] | None = None,
        max_tool_rounds: int = MAX_TOOL_ROUNDS,
        max_sub_depth: int = MAX_SUB_DEPTH,
        max_sub_calls: int = MAX_SUB_CALLS,
        queue: str | None = None,
        shared_input: str = "prefix",
        **renamed: Any,
    ) -> None:
        if renamed:
            raise UserError(renamed_hint(renamed))
        if shared_input not in SHARE_MODES:
            raise UserError(f"shared_input={shared_input!r} is not one of {', '.join(SHARE_MODES)}")
        self.shared_input = shared_input
        """Whether a prefix a fan-out's prompts really begin with is prefilled once (:mod:`squad.sched.share`):
        ``prefix`` (default) or ``off`` (``first``/``order``: old names of the two). No prompt is changed for it."""
        if not agents:
            raise UserError("a squad needs at least one agent")
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        self._own_mcp = not isinstance(mcp_servers, MCPServers)
        self.mcp = mcp_servers if isinstance(mcp_servers, MCPServers) else MCPServers(list(mcp_servers))
        self._mcp_tools: dict[str, dict[str, MCPTool]] = {}
        self.agents: dict[str, Agent] = check_squad(agents, list(self.tools), self.mcp.names)
        if main is not None and main not in self.agents:
            raise UserError(f"main agent {main!r} is not in the squad (agents: {', '.join(self.agents)})")
        self.main: str = main or agents[0].name
        short = dict(model=model, slots=slots, ctx=ctx, threads=threads, url=url, api_key=api_key)
        engine = chosen_engine(engine, engines, short, queue)
        self.workload: Node = workload or default_workload(self.agents, self.main)
        self.variables = dict(variables or {})
        self.replan = replan
        self.max_tool_rounds = max_tool_rounds
        for name, value in (("max_sub_depth", max_sub_depth), ("max_sub_calls", max_sub_calls)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{name} must be a whole number of at least 1, got {value!r}")
        self.max_sub_depth, self.max_sub_calls = max_sub_depth, max_sub_calls
        self._tool_warned: set[str] = set()
        self._share_member: dict[str, ShareGroup] = {}
        self._sinks: list[EventSink] = [] if on_event is None else (
            list(on_event) if isinstance(on_event, (list, tuple)) else [on_event]  # type: ignore[list-item]
        )
        self.session = session_for(engine, engines, short, queue, self.workload, self._emit if self._sinks else None)
        self._open = False
        self._operations = Operations()
        self._conversations = itertools.count(1)
        self._count_text: TextCounter | None = None

    # --- engine -------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name in MOVED:
            raise AttributeError(f"Squad.{name} moved: use {MOVED[name]}")
        raise AttributeError(f"'Squad' object has no attribute {name!r}")

    async def __aenter__(self) -> Squad:
        if self._own_mcp:
            await self.mcp.__aenter__()  # before the engine: a server that fails costs no model load
        self.mcp.listen(self._emit)  # its warnings so far (a server's stdout noise) and later ones (an exit)
        try:
            self._mcp_tools = {a.name: self.mcp.tools_for(a, taken=self._other_tool_names(a))
                               for a in self.agents.values() if self.mcp}
            await self.session.__aenter__()
        except BaseException:
            self.mcp.unlisten(self._emit)
            if self._own_mcp:
                await self.mcp.aclose()
            raise
        self._count_text = TextCounter(self.session.chat)
        self._open = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.mcp.unlisten(self._emit)
        self.cancel("the squad is closing")
        self._open = False
        try:
            await self.session.aclose()
        finally:
            try:
                if self._own_mcp:
                    await self.mcp.aclose()
            finally:
                flush_all(self._sinks)  # the squad's events are all out (the sinks' makers close them)

    def _other_tool_names(self, agent: Agent) -> list[str]:
        """Names of ``agent``'s function and ``ask_<name>`` tools (an MCP tool may not reuse one)."""
        subs = [f"ask_{n}" for n in agent.agents] if agent.sub_agent_tools else []
        return [t for t in agent.tools if not is_mcp_ref(t)] + subs

    def emit(self, event: Event) -> None:
        """Give ``event`` to the squad's event sinks (for layers above the runtime, e.g. a
        recipe step's :class:`~squad.events.StepWarning`); a failing sink never breaks a run."""
        emit_to(self._sinks, event)

    def _require_open(self) -> None:
        if not self._open:
            raise UserError("the squad is not open: use `async with Squad(...) as sq:` (or run_sync)")

    # --- public operations --------------------------------------------------------------

    async def run(
        self,
        text: str,
        *,
        history: Sequence[Mapping[str, Any]] = (),
        policy: Policy = "collect",
        variables: Mapping[str, Any] | None = None,
        fail_on: Collection[Outcome | str] = (),
        output_type: Any = None,
    ) -> RunResult:
        """One main-agent turn on ``text``.

        @mentions of the main agent's sub-agents are dispatched in parallel (each gets the
        part of the text addressed to it, see :mod:`squad.runtime.mention`); their answers go back
        to the main agent in ONE user message after ``text``, cut by the rule in the module
        docstring if they would overflow its budget; then the main agent answers.

        ``text`` is the caller's own words: its @mentions dispatch. Put data in it (a file, a
        model's answer) with :func:`squad.runtime.mention.as_data` so an ``@`` there dispatches no one.
        ``RunResult.notes`` says when a sub-agent tool call was refused by the run's bound.

        The result's ``outcome`` says whether the answer is whole (``ok``) or ``truncated``
        at max_tokens / ``empty`` (:mod:`squad.runtime.outcome`); sub-agent answers that are not
        whole are handed back marked (``[truncated at max_tokens]``, ``[failed: why]``, ...).
        ``fail_on`` lists the outcomes (``truncated``, ``empty``) that count as a failure of
        the main agent here: it raises :class:`IncompleteAnswer` instead of returning.
        ``output_type`` (a pydantic model class, another type, or a JSON schema) is what the
        main agent's answer must be here, in place of its own ``output_type``; the value is
        ``RunResult.output_value`` (:mod:`squad.chat.structured`; :class:`InvalidOutput` on a miss).

        Raises :class:`MentionError` before any model call for an unknown @mention or one with
        nothing to do (``"@security"`` alone); the main agent's :class:`AgentRunError` if it
        fails; with ``policy="fail-fast"`` the first failing sub-agent's error;
        :class:`AgentCancelled` after ``cancel()``.
        """
        self._require_open()
        failing = _fail_on(fail_on)
        main = self.agents[self.main]
        known = self._sub_names(main)
        parsed = parse_mentions(text, known)
        if parsed.unknown or parsed.idle or parsed.glued:
            hint = f" (known sub-agents of {main.name!r}: {', '.join(known) or 'none'})" if parsed.unknown else ""
            raise MentionError("; ".join(parsed.problems()) + hint)
        origin = self._origin(main)
        bound = _BOUND.set(self._bound(main))  # the @mentioned sub-agents and the main turn are one run
        try:
            return await self._run(main, text, parsed.dispatches, origin, history=history, policy=policy,
                                   variables=variables, fail_on=failing, output=output_schema(output_type))
        finally:
            _BOUND.reset(bound)

    async def _run(self, main: Agent, text: str, dispatches: Sequence[Dispatch], origin: Origin, *,
                   history: Sequence[Mapping[str, Any]], policy: Policy,
                   variables: Mapping[str, Any] | None, fail_on: frozenset[Outcome],
                   output: OutputSchema | None = None) -> RunResult:
        """:meth:`run` after its mentions were parsed and checked."""
        async with self._operations.operation():
            subs: list[AgentResult] = []
            message = unmark(text)
            if dispatches:
                names = [d.agent for d in dispatches]
                self._emit(MentionDispatched(agent=main.name, conversation=origin.conversation,
                                             parent=origin.parent, agents=names))
                await self._fit_fanout(main, names, origin)
                subs = await self._parallel([(d.agent, d.text) for d in dispatches], policy=policy,
                                            priority=1, variables=variables, parent=origin.conversation)
                failed = first_failure(subs)
                if policy == "fail-fast" and failed is not None:
                    raise failed
                message = await self.hand_back(main, message, subs, history=history, variables=variables,
                                               origin=origin)
            result = await self._recorded(main, message, history=history, priority=0, variables=variables,
                                          origin=origin, fail_on=fail_on, output=output)
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
        fail_on: Collection[Outcome | str] = (),
        output_type: Any = None,
        shared: str | None = None,
    ) -> AgentResult:
        """One turn of agent ``name`` on ``prompt`` (after ``history``, OpenAI-style messages).
        ``shared``: context put first in its system message (see :meth:`parallel`).

        Runs the tool loop if it has tools or sub-agent tools. ``output_type``: see :meth:`run`
        (the value is ``AgentResult.output_value``). Raises its
        :class:`AgentRunError` on failure (:class:`IncompleteAnswer` for an outcome in
        ``fail_on``, see :meth:`run`), :class:`UserError` for an unknown agent.
        """
        self._require_open()
        agent = self._agent(name)
        failing = _fail_on(fail_on)
        async with self._operations.operation():
            result = await self._recorded(agent, unmark(prompt), history=history, priority=priority,
                                          variables=variables, fail_on=failing, output=output_schema(output_type),
                                          shared=shared)
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
        fail_on: Collection[Outcome | str] = (),
        output_type: Any = None,
        on_result: Callable[[int, AgentResult], None] | None = None,
        shared: str | Sequence[str | None] | None = None,
    ) -> list[AgentResult]:
        """Run ``(agent, prompt)`` pairs at once; results in the same order.

        Failures are recorded in each result's ``error`` (see the policies in the module
        docstring). ``check=True`` raises the first failure's error instead of returning.
        ``max_concurrency`` bounds how many run at once in addition to the engine's slots.
        An outcome in ``fail_on`` (``truncated``, ``empty``) is a failure like any other: an
        :class:`IncompleteAnswer` error, and under ``fail-fast`` it cancels the siblings.
        ``output_type`` applies to every answer (see :meth:`run`). ``on_result(i, result)`` is
        called as pair ``i``'s conversation ends (what a resumable run records,
        :mod:`squad.runtime.journal`). ``shared``: context put first in
        every agent's system message, before its own instructions (one text, or one per call): a
        layout you ask for, so the engine prefills it once for all of them (``docs/shared-input.md``).
        Without it squad sends each prompt as written and shares only what they already begin with.
        """
        self._require_open()
        pairs = [(self._agent(name).name, unmark(prompt)) for name, prompt in calls]
        failing = _fail_on(fail_on)
        async with self._operations.operation():
            results = await self._parallel(pairs, policy=policy, priority=priority, max_concurrency=max_concurrency,
                                           variables=variables, fail_on=failing, output=output_schema(output_type),
                                           on_result=on_result, shared=shared)
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
        fail_on: Collection[Outcome | str] = (),
        output_type: Any = None,
        first_item: int = 0,
        item_ids: Sequence[int] | None = None,
        on_result: Callable[[int, AgentResult], None] | None = None,
        shared: str | Sequence[str | None] | None = None,
    ) -> list[AgentResult]:
        """Run agent ``name`` once per input, at most ``max_concurrency`` at a time (and never
        more than the engine's slots in flight); results in input order, each with its
        ``item`` index (events, errors and views name it ``name[i]``), counted from
        ``first_item`` (a part of a larger map, e.g. one item a Ray worker runs), or
        ``item_ids[i]`` for input ``i`` (the items of a map a resumed run still had to do). See
        :meth:`parallel` (``output_type``, ``on_result`` and ``shared`` too)."""
        self._require_open()
        pairs = [(self._agent(name).name, unmark(text)) for text in inputs]
        if item_ids is not None and len(item_ids) != len(pairs):
            raise UserError(f"item_ids: {len(item_ids)} ids for {len(pairs)} inputs; give one per input")
        failing = _fail_on(fail_on)
        async with self._operations.operation():
            results = await self._parallel(pairs, policy=policy, priority=0, max_concurrency=max_concurrency,
                                           items=True, fail_on=failing, output=output_schema(output_type),
                                           first_item=first_item, item_ids=item_ids, on_result=on_result,
                                           shared=shared)
        failed = first_failure(results)
        if check and failed is not None:
            raise failed
        return results

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Cancel every running operation; each agent records ``reason``. Safe to call from
        any task of the squad's event loop; operations started later run normally."""
        self._operations.cancel(reason)

    # --- internals ----------------------------------------------------------------------

    async def hand_back(
        self,
        main: Agent,
        text: str,
        subs: Sequence[AgentResult],
        *,
        history: Sequence[Mapping[str, Any]] = (),
        variables: Mapping[str, Any] | None = None,
        origin: Origin | None = None,
    ) -> str:
        """The ONE user message giving the main agent ``text`` and its sub-agents' answers,
        cut to fit its budget by the rule of :mod:`squad.runtime.handback`."""
        self._require_open()
        assert self._count_text is not None
        system = self._system(main, variables)
        prefix = ([{"role": "system", "content": system}] if system else []) + [*map(dict, history)]
        specs = [t.spec() for t in self._tools_for(main, 0, [], variables).values()] or None
        return await hand_back(self.chat, origin or Origin(main.name), budget=self.context_limit(main),
                               max_tokens=main.max_tokens,
                               prefix=prefix, tools=specs, text=text, subs=subs, count_text=self._count_text,
                               on_event=self._emit)


def default_workload(agents: Mapping[str, Agent], main: str) -> Node:
    """The workload when none is given: the main agent as a Delegate over its sub-agents in
    parallel (a chat turn that @mentions all of them), or just the main agent."""
    lead = agents[main]
    names = sub_agent_names(lead, agents, main)
    call = Call(lead.name, lead.fixed_budget)
    if not names:
        return call
    return Delegate(main=call, subs=Parallel(tuple(Call(n, agents[n].fixed_budget) for n in names)))


def run_sync(agents: Sequence[Agent], text: str, **squad_options: Any) -> RunResult:
    """Open a :class:`Squad` (``squad_options`` as for its constructor), run one turn on
    ``text`` and close it, from synchronous code (``anyio.run``). The run owns its event sinks
    (``on_event``): they are flushed and closed after the squad closes
    (:func:`squad.events.sink.close_all`)."""

    async def main() -> RunResult:
        async with Squad(agents, **squad_options) as sq:
            return await sq.run(text)

    try:
        return anyio.run(main)
    finally:
        sinks = squad_options.get("on_event")
        close_all([] if sinks is None else list(sinks) if isinstance(sinks, (list, tuple)) else [sinks])
