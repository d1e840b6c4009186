"""One agent conversation on a squad: its id and parent, its tools (``ask_<name>`` sub-agents
within the run's bound), its turn (:func:`squad.runtime.turn.run_turn`), the result it always
produces (:meth:`Conversations._recorded`), and a fan-out of conversations as one block.

:class:`Conversations` is the part of :class:`~squad.runtime.squad.Squad` that runs them; the
context variables below say which conversation and run the running task belongs to.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import anyio

from squad.chat import ChatEngine
from squad.chat.routing import EngineGroup
from squad.chat.structured import OutputSchema
from squad.engine.chat_templates import template_thinks
from squad.engine.info import EngineInfo
from squad.engine.session import EngineSession
from squad.errors import (
    AgentRunError,
    IncompleteAnswer,
    InvalidOutput,
    ReasoningBudgetExhausted,
    SquadError,
    UserError,
)
from squad.events import AgentCancelled as AgentCancelledEvent
from squad.events import (
    AgentFailed,
    AgentFinished,
    AgentStarted,
    EngineWarning,
    Event,
    EventSink,
    MentionQueued,
    Origin,
    ToolLimited,
    emit_to,
)
from squad.mcp import MCPTool
from squad.runtime.agent import Agent, sub_agent_names
from squad.runtime.blocks import Policy, run_block
from squad.runtime.blocks import cancel_reason as operation_cancel_reason
from squad.runtime.blocks import stopped_by as operation_stopped_by
from squad.runtime.outcome import Outcome, fix_for
from squad.runtime.progress import MapProgressMeter
from squad.runtime.results import AgentResult, AgentTimings, cancelled_result
from squad.runtime.turn import SubAgentBound, agent_tools, no_tool_template, run_turn
from squad.sched.share import ShareGroup, board_group, common_prefixes, share_mode, with_shared
from squad.sched.workload import Call
from squad.tools import Tool, ToolError

__all__ = ["Conversations", "incomplete_answer"]

WINDOW_PER_SLOT = 4
"""A fan-out starts at most this many items per engine slot at once (and at least :data:`MIN_WINDOW`,
or ``max_concurrency`` when given): the next starts as one ends (:func:`squad.runtime.blocks.run_block`),
so memory grows with the window and the results, not with every item waiting (issue 31)."""
MIN_WINDOW = 32

_CONVERSATION: ContextVar[str | None] = ContextVar("squad_conversation", default=None)
"""The conversation whose turn is running: the parent of conversations it starts."""
_BOUND: ContextVar[SubAgentBound | None] = ContextVar("squad_sub_agent_bound", default=None)
"""The running run's sub-agent tool call bound (:mod:`squad.runtime.squad`'s docstring)."""
_ASK_DEPTH: ContextVar[int] = ContextVar("squad_ask_depth", default=0)
"""How many sub-agent tool calls deep the running conversation is (0: started by the caller)."""


class Conversations:
    """How a :class:`~squad.runtime.squad.Squad` runs agent conversations (a base class of it;
    the attributes below are the squad's)."""

    agents: dict[str, Agent]
    main: str
    tools: dict[str, Tool]
    variables: dict[str, Any]
    replan: bool
    max_tool_rounds: int
    max_sub_depth: int
    max_sub_calls: int
    shared_input: str
    session: EngineSession | EngineGroup
    _mcp_tools: dict[str, dict[str, MCPTool]]
    _sinks: list[EventSink]
    _tool_warned: set[str]
    _conversations: itertools.count[int]
    _share_member: dict[str, ShareGroup]
    """conversation id -> the fan-out share group it is a member of (its calls carry it: ``ChatRequest.share``)."""

    @property
    def info(self) -> EngineInfo:
        """What the engine reported (``/props`` read back), once open."""
        return self.session.info

    @property
    def chat(self) -> ChatEngine:
        """The :class:`~squad.chat.ChatEngine` every call goes through, once open."""
        return self.session.chat

    def _emit(self, event: Event) -> None:
        emit_to(self._sinks, event)

    def _agent(self, name: str) -> Agent:
        try:
            return self.agents[name]
        except KeyError:
            raise UserError(f"no agent named {name!r} (agents: {', '.join(self.agents)})") from None

    def _sub_names(self, agent: Agent) -> list[str]:
        """Sub-agents ``agent`` may call (:func:`squad.runtime.agent.sub_agent_names`)."""
        return sub_agent_names(agent, self.agents, self.main)

    def budget_of(self, agent: Agent) -> int | None:
        """``agent``'s budget in tokens: its fixed one, else the one the plan resolved for
        ``auto`` (``session.plan.budgets``); None for an auto budget on an engine squad did
        not plan (attached or given), where only the engine's context bounds a call."""
        if agent.fixed_budget is not None:
            return agent.fixed_budget
        plan = self.session.plan
        return plan.budgets.get(agent.name) if plan is not None else None

    def context_limit(self, agent: Agent) -> int:
        """Tokens ``agent``'s conversation may hold: :meth:`budget_of`, else the context one
        request may use on this engine."""
        return self.budget_of(agent) or self.info.n_ctx

    def _resolved(self, agent: Agent) -> Agent:
        """``agent`` with an auto budget replaced by the planned one (when there is one)."""
        budget = self.budget_of(agent)
        return agent if budget is None or agent.budget == budget else agent.model_copy(update={"budget": budget})

    def _origin(self, agent: Agent, parent: str | None = None, item: int | None = None) -> Origin:
        """A new conversation of ``agent``; its parent is ``parent`` or the running turn's."""
        return Origin(agent.name, f"{agent.name}#{next(self._conversations)}", parent or _CONVERSATION.get(), item)

    async def _fit_fanout(self, main: Agent, subs: Sequence[str], origin: Origin) -> None:
        """More sub-agents than slots: replan a launched engine if allowed, else say they queue."""
        n = len(subs)
        if n <= self.info.slots:
            return
        if self.replan:
            group = [Call(main.name, self.context_limit(main))] + [
                Call(s, self.context_limit(self.agents[s])) for s in subs]
            await self.session.replan(group)
            if n <= self.info.slots:
                return
        self._emit(MentionQueued(
            agent=main.name, conversation=origin.conversation, parent=origin.parent, agents=n, slots=self.info.slots,
            message=f"{n} sub-agents mentioned but the engine has slots={self.info.slots}: "
                    f"{n - self.info.slots} wait in squad's queue (pass replan=True or raise slots)"))

    async def _parallel(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        policy: Policy,
        priority: int,
        max_concurrency: int | None = None,
        variables: Mapping[str, Any] | None = None,
        parent: str | None = None,
        items: bool = False,
        fail_on: frozenset[Outcome] = frozenset(),
        output: OutputSchema | None = None,
        first_item: int = 0,
        item_ids: Sequence[int] | None = None,
        on_result: Callable[[int, AgentResult], None] | None = None,
        shared: str | Sequence[str | None] | None = None,
    ) -> list[AgentResult]:
        """``items``: the pairs are map items; conversation ``i`` carries ``item=first_item + i``
        (``item_ids[i]`` when given: a map resumed with only some of its items);
        ``output`` replaces each agent's own output schema; ``on_result(i, result)`` is called as
        each conversation ends (a resumable run records it then, :mod:`squad.runtime.journal`);
        ``shared``: context the author put first in every member's system message (one text, or one per
        pair; :func:`squad.sched.share.with_shared`)."""
        shares = [shared] * len(pairs) if shared is None or isinstance(shared, str) else list(shared)
        if len(shares) != len(pairs):
            raise UserError(f"shared= gives {len(shares)} texts for {len(pairs)} calls: give one, or one per call")
        own = {name: self._system(self.agents[name], variables) for name in dict.fromkeys(name for name, _ in pairs)}
        systems = [with_shared(shares[i], own[name]) for i, (name, _) in enumerate(pairs)]
        groups = self._share_groups(systems, [prompt for _, prompt in pairs])
        meter = MapProgressMeter(pairs[0][0], len(pairs), self._emit) if items and len(pairs) > 1 else None

        async def one(i: int, limiter: anyio.CapacityLimiter | None, reason: Callable[[], str | None],
                      record: Callable[[AgentResult], None]) -> AgentResult:
            agent = self.agents[pairs[i][0]]
            item = (item_ids[i] if item_ids is not None else first_item + i) if items else None
            origin = self._origin(agent, parent, item)
            assert origin.conversation is not None  # _origin names every conversation
            with self._member(groups[i] or board_group(systems[i]), origin.conversation):
                result = await self._recorded(agent, pairs[i][1], priority=priority, variables=variables,
                                              limiter=limiter, cancel_reason=reason, origin=origin,
                                              record=record, fail_on=fail_on, output=output, shared=shares[i])
            if on_result is not None:
                on_result(i, result)
            if meter is not None:
                meter.item_done(result.ok)
            return result

        if meter is not None:
            meter.start()
        window = max_concurrency or max(MIN_WINDOW, WINDOW_PER_SLOT * self.info.slots)
        try:
            results = await run_block([name for name, _ in pairs], one, policy=policy,
                                      max_concurrency=max_concurrency, window=window)
            if items:  # an item cancelled before its window reached it still names its item
                for i, result in enumerate(results):
                    if result.item is None:
                        result.item = item_ids[i] if item_ids is not None else first_item + i
            return results
        finally:
            for group in {id(g): g for g in groups if g is not None}.values():
                group.close()

    @contextlib.contextmanager
    def _member(self, group: ShareGroup | None, conversation: str) -> Iterator[None]:
        """Run the block with ``conversation`` a member of ``group`` (None: no group): its calls carry the
        group (:meth:`_converse`), for the admitted layer to restore the prefix once (:mod:`squad.sched.share`)."""
        if group is None:
            yield
            return
        group.join(conversation)
        self._share_member[conversation] = group
        try:
            yield
        finally:
            self._share_member.pop(conversation, None)

    def _share_groups(self, systems: Sequence[str], prompts: Sequence[str]) -> list[ShareGroup | None]:
        """Each member's share group (:mod:`squad.sched.share`): the subsets of the fan-out whose
        messages really begin the same way; None for a member in none."""
        found: list[ShareGroup | None] = [None] * len(prompts)
        if share_mode(self.shared_input) == "off":
            return found
        for members, prefix in common_prefixes(list(zip(systems, prompts))):
            group = ShareGroup(prefix)
            for i in members:
                found[i] = group
        return found

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
        origin: Origin | None = None,
        record: Callable[[AgentResult], None] | None = None,
        fail_on: frozenset[Outcome] = frozenset(),
        output: OutputSchema | None = None,
        shared: str | None = None,
    ) -> AgentResult:
        """Run one conversation and always produce its AgentResult (given to ``record`` too,
        so a cancelled one is recorded before the cancellation propagates). An outcome in
        ``fail_on`` gets an :class:`IncompleteAnswer` error (after ``agent.finished`` said
        what the outcome was)."""
        origin = origin or self._origin(agent)
        ids: dict[str, Any] = dict(agent=agent.name, conversation=origin.conversation, parent=origin.parent)
        start = time.monotonic()
        self._emit(AgentStarted(**ids, priority=priority, item=origin.item))
        token = _CONVERSATION.set(origin.conversation)
        bound = _BOUND.set(_BOUND.get() or self._bound(agent))  # a conversation the caller started is a run
        try:
            async with limiter if limiter is not None else contextlib.nullcontext():
                result = await self._converse(agent, origin, prompt, history, priority, variables, output, shared)
        except anyio.get_cancelled_exc_class():
            reason = cancel_reason() or operation_cancel_reason()
            result = cancelled_result(agent.name, reason, time.monotonic() - start, origin.conversation)
            result.item = origin.item
            self._emit(AgentCancelledEvent(**ids, reason=reason))
            if record is not None:
                record(result)
            raise
        except AgentRunError as exc:
            result = AgentResult(agent=agent.name, error=exc, timings=AgentTimings(total_s=time.monotonic() - start),
                                 conversation=origin.conversation, item=origin.item,
                                 output=exc.raw if isinstance(exc, InvalidOutput) else "")
            self._emit(AgentFailed(**ids, error=f"{type(exc).__name__}: {exc}"))
        except SquadError as exc:  # not this agent's failure (every engine lost): it ends the operation
            operation_stopped_by(str(exc))
            raise
        else:
            result.item = origin.item
            if self._sinks:
                self._emit(AgentFinished(**ids, summary=result.summary(), outcome=result.outcome.value,
                                         finish_reason=result.finish_reason, max_tokens=result.max_tokens,
                                         cut_while_thinking=result.cut_while_thinking))
            if result.outcome in fail_on:
                result.error = incomplete_answer(result)
        finally:
            _BOUND.reset(bound)
            _CONVERSATION.reset(token)
        return result

    async def _converse(self, agent: Agent, origin: Origin, prompt: str, history: Sequence[Mapping[str, Any]],
                        priority: int, variables: Mapping[str, Any] | None,
                        output: OutputSchema | None = None, shared: str | None = None) -> AgentResult:
        """One turn of ``agent`` with its tools (:func:`squad.runtime.turn.run_turn`), its answer held
        to ``output`` or its own ``output_type``; raises AgentRunError."""
        subs: list[AgentResult] = []
        notes: list[str] = []
        tools = self._tools_for(agent, priority, subs, variables, origin=origin, notes=notes)
        if tools and self.info.template_has_tools is False and agent.name not in self._tool_warned:
            self._tool_warned.add(agent.name)  # once per agent
            self._emit(EngineWarning(agent=agent.name, engine=self.info.base_url,
                                     warning=no_tool_template(agent.name, tools)))
        if (agent.thinking_budget is not None and self.info.engine_kind.thinking_fields(agent.thinking_budget) is None
                and f"thinking:{agent.name}" not in self._tool_warned):
            self._tool_warned.add(f"thinking:{agent.name}")  # once per agent
            self._emit(EngineWarning(agent=agent.name, engine=self.info.base_url, warning=(
                f"agent '{agent.name}': thinking_budget {agent.thinking_budget} is not sent: a {self.info.kind} "
                "server takes no per-request thinking budget (its squad.engine.kinds record); its calls "
                "think as the model pleases, still within max_tokens")))
        elif (agent.thinking_budget is not None and template_thinks(self.info.chat_template) is False
                and "thinking-model" not in self._tool_warned):
            self._tool_warned.add("thinking-model")  # once: it is the model's, not the agent's
            self._emit(EngineWarning(agent=agent.name, engine=self.info.base_url, warning=thinks_not(
                agent.name, agent.thinking_budget, self.info.model_alias or self.info.model_path)))
        system = with_shared(shared, self._system(agent, variables))  # the author's declared layout only
        share = self._share_member.get(origin.conversation or "")  # a fan-out member's group, its calls carry it
        result = await run_turn(self.chat, self._resolved(agent), origin, system=system, prompt=prompt,
                                history=history, tools=tools, priority=priority,
                                max_tool_rounds=agent.max_tool_rounds or self.max_tool_rounds, on_event=self._emit,
                                output=output or agent.output_type, share=share)
        result.subs, result.notes = subs, [*notes, *result.notes]
        return result

    def _system(self, agent: Agent, variables: Mapping[str, Any] | None) -> str:
        subs = [self.agents[n] for n in self._sub_names(agent)]
        return agent.system_prompt(subs, {**self.variables, **(variables or {})})

    def _bound(self, agent: Agent) -> SubAgentBound:
        """The sub-agent tool call bound of a run ``agent`` starts: its own, else the squad's."""
        return SubAgentBound(max_depth=agent.max_sub_depth or self.max_sub_depth,
                             max_calls=agent.max_sub_calls or self.max_sub_calls)

    def _tools_for(self, agent: Agent, priority: int, subs: list[AgentResult],
                   variables: Mapping[str, Any] | None, *, origin: Origin | None = None,
                   notes: list[str] | None = None) -> dict[str, Tool]:
        """Its function tools and, with ``sub_agent_tools``, an ``ask_<name>`` tool per sub-agent
        (a sub-agent conversation at ``priority + 1``; its result is appended to ``subs``).
        A call past the run's bound is refused (:class:`ToolError` to the model, a
        ``tool.limited`` event and a line in ``notes``, once per limit per run)."""
        depth = _ASK_DEPTH.get() + 1  # of the calls this conversation makes

        async def ask(sub: Agent, task: str) -> AgentResult:
            bound = _BOUND.get()
            refused = bound.admit(depth, agent.name, sub.name) if bound is not None else None
            if refused is not None:
                if refused.note is not None:
                    if notes is not None:
                        notes.append(refused.note)
                    where = origin or Origin(agent.name)
                    self._emit(ToolLimited(agent=agent.name, conversation=where.conversation, parent=where.parent,
                                           tool=f"ask_{sub.name}", limit=refused.limit, value=refused.value,
                                           message=refused.note))
                raise ToolError(refused.reply)
            token = _ASK_DEPTH.set(depth)
            try:
                result = await self._recorded(sub, task, priority=priority + 1, variables=variables)
            finally:
                _ASK_DEPTH.reset(token)
            subs.append(result)
            return result

        subs_as_tools = [self.agents[n] for n in agent.agents] if agent.sub_agent_tools else []
        return agent_tools(agent, self.tools, subs_as_tools, ask, self._mcp_tools.get(agent.name))


def _fail_on(outcomes: Collection[Outcome | str]) -> frozenset[Outcome]:
    """``fail_on`` checked: only ``truncated`` and ``empty`` can be made failures."""
    try:
        found = frozenset(Outcome(o) for o in outcomes)
    except ValueError:
        found = frozenset({Outcome.OK})
    if found - {Outcome.TRUNCATED, Outcome.EMPTY}:
        raise UserError(f"fail_on={sorted(map(str, outcomes))!r}: use 'truncated' and/or 'empty' "
                        "(failed and cancelled already are failures)")
    return found


def incomplete_answer(result: AgentResult) -> IncompleteAnswer:
    """The error of a non-answer (truncated or empty) a ``fail_on`` policy made a failure."""
    thinking = result.cut_while_thinking and result.outcome is Outcome.TRUNCATED
    what = (f"stopped at max_tokens ({result.max_tokens}) while thinking, before any answer" if thinking else
            f"stopped at max_tokens ({result.max_tokens}) before its answer was complete"
            if result.outcome is Outcome.TRUNCATED else "gave an empty answer")
    fix = fix_for(result.outcome, result.agent, result.max_tokens, thinking=thinking)
    message = f"agent '{result.label}' {what}: {fix}"
    if thinking:  # the thinking is never the partial answer kept for the user
        return ReasoningBudgetExhausted(message, agent=result.agent)
    return IncompleteAnswer(message, agent=result.agent, outcome=result.outcome.value, partial=result.output or "")


def thinks_not(agent: str, budget: int, model: str) -> str:
    """The warning for a ``thinking_budget`` given to a model that does not think."""
    name = model.rsplit("/", 1)[-1] or "the model"
    return (f"agent '{agent}': thinking_budget {budget} has no effect: {name} does not think (its chat template has "
            "no thinking: no <think>, no reasoning switch), so there is nothing to cut and all of max_tokens is the "
            "answer. Drop thinking_budget, or serve a model that thinks (Qwen3, DeepSeek-R1, gpt-oss, ...); said "
            "once per run, for every agent with a budget")
