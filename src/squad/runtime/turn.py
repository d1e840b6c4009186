"""One agent turn: the model call, and the tool-calling loop when the agent has tools.

:func:`run_turn` sends the agent's conversation through a :class:`~squad.chat.ChatEngine`;
when the model asks for tools it runs them (:func:`squad.tools.run_tool_calls`), appends the
results as ``tool`` messages and asks again, at most ``max_tool_rounds`` times; the last
round offers no tools, so the model must answer. Every round sends the same tool definitions and
system message (a round that offers none says ``tool_choice: "none"``, which llama-server b11434
honours with the tools still rendered: ``common/chat.cpp``), so the engine reuses the
conversation's cached prefix round after round (issue 29). Each round's results are fitted to the room
the agent's budget has left (:func:`squad.runtime.toolroom.fit_results`: cut with a marker and a
``tool.truncated`` event, or :class:`~squad.errors.ToolResultTooLarge` with
``tool_results: fail``); when no room is left for another tool round, the next one offers no
tools. The agent's ``tool_choice`` applies to the
first round only (:func:`forced_choice`); later rounds are ``auto``. Call or thinking markup the
engine left in the final answer (a call cut by ``max_tokens``, one its parser did not take) is
removed from it, with a note (:func:`squad.engine.template_profile.strip_raw_markup`). The result is an
:class:`~squad.runtime.results.AgentResult` (errors propagate as :class:`~squad.errors.AgentRunError`).

:func:`agent_tools` gives an agent its tools, with an ``ask_<name>`` tool per sub-agent;
:class:`SubAgentBound` is one run's bound on those calls (depth and count; defaults
:data:`squad.runtime.agent.MAX_SUB_DEPTH`, :data:`squad.runtime.agent.MAX_SUB_CALLS`), checked before each.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from squad.chat import ChatEngine, ChatRequest, ChatResult
from squad.chat.structured import OutputInvalid, OutputSchema, retry_message
from squad.engine.template_profile import strip_raw_markup
from squad.errors import InvalidOutput, UserError
from squad.events import EventSink, Origin, OutputRetried, ToolCalled, ToolTruncated
from squad.mcp import is_mcp_ref, split_ref
from squad.runtime.agent import MAX_SUB_CALLS, MAX_SUB_DEPTH, Agent
from squad.runtime.handback import TextCounter
from squad.runtime.results import AgentResult, slot_of, timings_of, usage_of
from squad.runtime.toolroom import Cut, fit_results, request_limit
from squad.sched.share import ShareGroup
from squad.tools import Tool, arguments_for_history, run_tool_calls

__all__ = ["run_turn", "agent_tools", "forced_choice", "no_tool_template", "SubAgentBound", "Refusal"]

Ask = Callable[[Agent, str], Awaitable[AgentResult]]
"""Runs a sub-agent conversation on a task and returns its result."""


@dataclass(frozen=True)
class Refusal:
    """A sub-agent tool call past a bound: ``limit`` (``"depth"`` or ``"calls"``) and its
    ``value``; ``reply`` goes to the model as the tool's error; ``note`` says it for people,
    set only the first time the run hits this limit."""

    limit: str
    value: int
    reply: str
    note: str | None


@dataclass
class SubAgentBound:
    """The sub-agent tool calls (``ask_<name>``) of one run against its bounds: nested at most
    ``max_depth`` deep (a call by the run's first agent is depth 1, a call by that sub-agent
    depth 2, ...) and at most ``max_calls`` in all. ``calls`` counts the calls let through,
    ``hit`` the limits reached (``"depth"``, ``"calls"``)."""

    max_depth: int = MAX_SUB_DEPTH
    max_calls: int = MAX_SUB_CALLS
    calls: int = 0
    hit: set[str] = field(default_factory=set)

    def admit(self, depth: int, asker: str, sub: str) -> Refusal | None:
        """Count ``asker``'s call of ``sub`` at ``depth`` and return None, or refuse it."""
        if depth > self.max_depth:
            limit, value = "depth", self.max_depth
            reply = (f"refused: sub-agents may be called only {value} level(s) deep in this run "
                     f"(max_sub_depth={value}); do this part yourself")
            note = f"{asker} asked sub-agent {sub} {depth} level(s) deep, past this run's max_sub_depth={value}"
        elif self.calls >= self.max_calls:
            limit, value = "calls", self.max_calls
            reply = (f"refused: this run has made all {value} of its sub-agent calls "
                     f"(max_sub_calls={value}); answer with what you have")
            note = f"{asker} asked sub-agent {sub} after this run's {value} sub-agent calls (max_sub_calls={value})"
        else:
            self.calls += 1
            return None
        first = limit not in self.hit
        self.hit.add(limit)
        return Refusal(limit, value, reply, f"{note}; the call was refused and the agent went on without it"
                       if first else None)


def agent_tools(agent: Agent, registry: Mapping[str, Tool], sub_agents: Sequence[Agent], ask: Ask,
                mcp: Mapping[str, Tool] | None = None) -> dict[str, Tool]:
    """The tools ``agent`` may call: its named function tools from ``registry``, an
    ``ask_<name>`` tool per agent in ``sub_agents`` whose answer is that sub-agent's output,
    marked when it is not a whole answer (:func:`squad.runtime.outcome.marked`: truncated, empty);
    its error, if it fails, goes back to the model as the tool result; and ``mcp``, its MCP
    tools by the names the model sees (:meth:`squad.mcp.MCPServers.tools_for`)."""
    tools = {name: registry[name] for name in agent.tools if not is_mcp_ref(name)}  # those are in mcp
    for sub in sub_agents:
        tools[f"ask_{sub.name}"] = _ask_tool(sub, ask)
    tools.update(mcp or {})
    return tools


def _ask_tool(sub: Agent, ask: Ask) -> Tool:
    async def ask_sub(task: str) -> str:
        result = await ask(sub, task)
        if result.error is not None:
            raise result.error
        return result.marked_output

    description = f"Ask the sub-agent {sub.name!r} to do a task and return its answer."
    if sub.description:
        description += f" It is for: {sub.description}"
    ask_sub.__doc__ = f"{description}\n\nArgs:\n    task: what {sub.name} should do, self-contained"
    return Tool.from_function(ask_sub, name=f"ask_{sub.name}", description=description,
                              timeout=None)  # a sub-agent is bounded by its own calls' deadlines, not a tool's


def no_tool_template(agent: str, tools: Mapping[str, Tool]) -> str:
    """The warning for an agent with tools on a model whose chat template has no tools section."""
    return (f"agent '{agent}' has tools ({', '.join(tools)}) but the engine's chat template has no tools "
            "section, so llama-server drops them: the model cannot call them. squad ships a tool template "
            "only for ChatML, Phi-3 and Granite models (used when squad starts the engine); use a model whose "
            "template supports "
            "tool calls, or @mentions instead of sub-agents as tools.")


def forced_choice(agent: Agent, tools: Mapping[str, Tool],
                  specs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """The tools offered and the ``tool_choice`` sent in the first round of ``agent``'s turn:
    ``(specs, None)`` for ``auto``; ``(specs, "required")``; for a named choice only that tool's
    spec with ``"required"`` (llama-server b11434 reads ``tool_choice`` only as a string, see
    :mod:`squad.engine.chat_templates`). Raises :class:`UserError` when the named tool is not
    among ``tools``."""
    choice = agent.tool_choice
    if choice == "auto":
        return specs, None
    if choice == "required":
        return specs, "required"
    if is_mcp_ref(choice):  # SERVER.TOOL: the MCP tool by the name the model sees
        server, remote = split_ref(choice)
        choice = next((name for name, t in tools.items()
                       if getattr(t, "server", None) == server and getattr(t, "remote", None) == remote), choice)
    if choice not in tools:
        raise UserError(f"agent {agent.name!r} has tool_choice {choice!r} but may not call it here (its tools: "
                        f"{', '.join(tools) or 'none'}): use auto, required or one of those names")
    return [tools[choice].spec()], "required"


async def run_turn(
    chat: ChatEngine,
    agent: Agent,
    origin: Origin,
    *,
    system: str,
    prompt: str,
    history: Sequence[Mapping[str, Any]],
    tools: Mapping[str, Tool],
    priority: int,
    max_tool_rounds: int,
    on_event: EventSink,
    output: OutputSchema | None = None,
    share: ShareGroup | None = None,
) -> AgentResult:
    """One turn of ``agent`` on ``prompt`` after ``history`` (OpenAI-style messages).

    ``system`` is its rendered system message ("" for none); ``tools`` the tools it may call
    by name. ``output``: the schema its answer must match (:mod:`squad.chat.structured`): sent as
    ``response_format`` in rounds that offer no tools; the answer is validated into
    ``AgentResult.output_value`` (its ``output`` is then that value as JSON). ``share``: the fan-out
    share group the conversation is a member of (its calls carry it, ``ChatRequest.share``). Returns its
    :class:`AgentResult` with the conversation in ``history``; raises the call's
    :class:`~squad.errors.AgentRunError`, and :class:`~squad.errors.InvalidOutput` when the
    answer misses ``output`` also when asked once more.
    """
    start = time.monotonic()
    specs = [t.spec() for t in tools.values()] or None
    convo: list[dict[str, Any]] = [*map(dict, history), {"role": "user", "content": prompt}]
    calls: list[ChatResult] = []
    tool_log: list[tuple[str, str, str]] = []

    async def send(messages: list[dict[str, Any]], offer: list[dict[str, Any]] | None = None,
                   choice: str | None = None) -> ChatResult:
        # the same tool definitions in every round (the cached prefix stays); a round that offers none
        # says tool_choice "none". b11434 lets a response_format grammar win over offered tools
        # (squad.chat.structured): the schema goes only with a round that offers none
        answering = not offer
        sent, choice = (offer, choice) if offer else (specs, "none" if specs else None)
        fmt = output.response_format() if output is not None and answering else None
        reply = await chat.complete(ChatRequest(
            origin=origin, messages=([{"role": "system", "content": system}] if system else []) + messages,
            max_tokens=agent.max_tokens, budget=agent.fixed_budget, tools=sent, tool_choice=choice,
            parallel_tool_calls=None if agent.parallel_tool_calls or not sent else False, response_format=fmt,
            sampling=agent.sampling.as_params() or None, priority=priority, thinking_budget=agent.thinking_budget,
            share=share,
        ))
        calls.append(reply)
        return reply

    limit = request_limit(chat, agent.fixed_budget)
    counter = TextCounter(chat)
    notes: list[str] = []
    tools_open = True
    round_no = 0
    while True:  # rounds 0..max_tool_rounds: the last one offers no tools, so it ends the loop
        offer = specs if round_no < max_tool_rounds and tools_open else None
        choice = None
        if offer and round_no == 0:
            offer, choice = forced_choice(agent, tools, offer)
        reply = await send(convo, offer, choice)
        if not (offer and reply.tool_calls):
            break
        # llama-server b11434 ignores parallel_tool_calls=false for per-call markers (its
        # grammar is one or more <tool_call> blocks), so squad keeps only the first call itself
        wanted = reply.tool_calls if agent.parallel_tool_calls else reply.tool_calls[:1]
        convo.append({"role": "assistant", "content": reply.content or None, "tool_calls": [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": arguments_for_history(c.arguments)}}
            for c in wanted
        ]})
        tools_open = await _results(chat, agent, origin, reply, wanted, tools, convo, system=system,
                                    offer=specs if round_no + 1 < max_tool_rounds else None, limit=limit, listed=specs,
                                    count_text=counter, tool_log=tool_log, notes=notes, on_event=on_event)
        round_no += 1
    value, text = None, reply.content or ""
    text, marker = strip_raw_markup(text, getattr(chat.engine, "chat_template", None))
    if marker is not None:
        notes.append(raw_markup_note(agent.name, marker, reply.finish_reason))
    if output is not None:
        reply, value = await _structured(output, reply, convo, send, agent=agent.name,
                                         unconstrained=bool(offer), origin=origin, on_event=on_event)
        text = output.dump(value)
    if text:
        convo.append({"role": "assistant", "content": text})
    return AgentResult(
        agent=agent.name, output=text, output_value=value, reasoning=reply.reasoning or "",
        usage=usage_of(calls), timings=timings_of(calls, time.monotonic() - start),
        slot=slot_of(reply), history=convo, tool_calls=tool_log, conversation=origin.conversation,
        finish_reason="stop" if output is not None else reply.finish_reason,  # validated: whole
        max_tokens=agent.max_tokens, notes=[*notes, *(rerun_note(c) for c in calls if c.rerun_from)],
        engine=reply.engine, cut_while_thinking=output is None and reply.cut_while_thinking,
    )


async def _results(chat: ChatEngine, agent: Agent, origin: Origin, reply: ChatResult, wanted: Sequence[Any],
                   tools: Mapping[str, Tool], convo: list[dict[str, Any]], *, system: str,
                   offer: list[dict[str, Any]] | None, limit: int, count_text: TextCounter,
                   listed: list[dict[str, Any]] | None,
                   tool_log: list[tuple[str, str, str]], notes: list[str], on_event: EventSink) -> bool:
    """Run the ``wanted`` calls of ``reply``, fit their results to the room left
    (:func:`squad.runtime.toolroom.fit_results`; ``offer``: the tools the next round would offer) and
    append them to ``convo``, with ``tool.called`` and ``tool.truncated`` events. Returns whether
    the next round still offers tools."""
    outcomes = await run_tool_calls(tools, wanted)
    fitted = await fit_results(
        chat, ([{"role": "system", "content": system}] if system else []) + convo,
        [(c.id, c.name, o.text) for c, o in zip(wanted, outcomes)], limit=limit, max_tokens=agent.max_tokens,
        tools=offer, agent=agent.name, mode=agent.tool_results,
        trained=getattr(chat.engine, "n_ctx_train", None), count_text=count_text, listed=listed)
    agent_id, conversation, parent, call_id = origin.agent, origin.conversation, origin.parent, reply.call
    for call, outcome, text in zip(wanted, outcomes, fitted.texts):
        convo.append({"role": "tool", "tool_call_id": call.id, "content": text})
        tool_log.append((call.name, call.arguments, text))
        on_event(ToolCalled(agent=agent_id, conversation=conversation, parent=parent, call=call_id, tool=call.name,
                            ok=outcome.ok))
    closed = offer is not None and not fitted.tools_open  # room ran out before the rounds did
    for cut in fitted.cuts:
        message = truncated_message(agent.name, cut, closed=closed)
        notes.append(message)
        on_event(ToolTruncated(agent=agent_id, conversation=conversation, parent=parent, call=call_id, tool=cut.tool,
                               result_chars=cut.result_chars, kept_chars=cut.kept_chars,
                               result_tokens=cut.result_tokens, kept_tokens=cut.kept_tokens,
                               room_tokens=cut.room_tokens, budget=cut.limit, tools_closed=closed, message=message))
    return fitted.tools_open


def truncated_message(agent: str, cut: Cut, *, closed: bool) -> str:
    """The warning for a tool result cut to fit ``agent``'s budget (``closed``: no room was left
    for another tool round, so the model answers next)."""
    size = f"{cut.result_tokens:,} tokens" if cut.result_tokens is not None else f"over {cut.limit:,} tokens"
    then = "; no room is left for another tool round, so the model answers now" if closed else ""
    return (f"agent '{agent}': the result of tool '{cut.tool}' ({cut.result_chars:,} characters, {size}) was cut to "
            f"{cut.kept_chars:,} characters ({cut.kept_tokens:,} tokens) to fit the {cut.room_tokens:,} tokens its "
            f"budget of {cut.limit:,} had left; the model was told what was dropped{then}")


def raw_markup_note(agent: str, marker: str, finish_reason: str | None) -> str:
    """What an agent's result says of call or thinking markup the engine left in its answer."""
    why = ("the call was cut by max_tokens" if finish_reason == "length"
           else "the engine's parser did not take it as a tool call or thinking")
    return (f"agent '{agent}': its answer held raw markup ({marker!r}; {why}); it was removed from the answer "
            "handed on")


def rerun_note(reply: ChatResult) -> str:
    """What an agent's result says of a call re-run after its engine died mid-stream (:mod:`squad.chat.routing`)."""
    return (f"call {reply.call} was re-run from its start on {reply.engine}: the engine at {reply.rerun_from} "
            "was lost while it streamed, and its cut text was dropped")


async def _structured(output: OutputSchema, reply: ChatResult, convo: list[dict[str, Any]],
                      send: Callable[..., Awaitable[ChatResult]], *, agent: str, unconstrained: bool,
                      origin: Origin, on_event: EventSink) -> tuple[ChatResult, Any]:
    """The answer ``reply`` validated against ``output``: ``(reply used, value)``.

    An answer from a round that offered tools was generated without the schema: if it does
    not validate it is dropped and the answering round is asked again without tools, with the
    schema. An answer generated with the schema that does not validate is asked once more, the
    error shown to the model (an :class:`OutputRetried` event); neither exchange enters the
    history. Raises :class:`InvalidOutput` (with the raw text) when that also fails."""
    try:
        return reply, output.parse(reply.content or "")
    except OutputInvalid as exc:
        problem = _with_cut(str(exc), reply)
    if unconstrained:  # the tool round's free text: ask for the answer under the schema
        reply = await send(convo)
        try:
            return reply, output.parse(reply.content or "")
        except OutputInvalid as exc:
            problem = _with_cut(str(exc), reply)
    text = reply.content or ""
    on_event(OutputRetried(agent=origin.agent, conversation=origin.conversation, parent=origin.parent,
                           call=reply.call, problem=problem,
                           message=f"{agent}: the answer missed its output schema ({problem}); asked once more"))
    again = await send([*convo, {"role": "assistant", "content": text},
                        {"role": "user", "content": retry_message(problem)}])
    try:
        return again, output.parse(again.content or "")
    except OutputInvalid as exc:
        last = _with_cut(str(exc), again)
        fix = (f"raise its max_tokens (the answer was cut at {again.usage.completion_tokens if again.usage else '?'} "
               "tokens)" if again.finish_reason == "length" else "simplify the schema, or use a larger model")
        raise InvalidOutput(
            f"agent {agent!r}: its answer does not match its output schema ({last}), also when asked again "
            f"with the error; {fix}. The raw answer is kept", agent=agent, raw=again.content or "") from None


def _with_cut(problem: str, reply: ChatResult) -> str:
    return problem + (" (the answer was cut at max_tokens)" if reply.finish_reason == "length" else "")
