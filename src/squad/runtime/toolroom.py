"""Tool results held to the room an agent has left, counted with the model's tokenizer.

After a model round that called tools, :func:`fit_results` places the results so the next
request fits the agent's budget (its fixed or planned one, else the context one request may
use): room = budget − ``max_tokens`` − the next request without the results (system, history,
the call, the tool definitions it offers), counted exactly (:meth:`~squad.chat.ChatEngine.count`).
While more tool rounds may follow, the results leave room for one more of them
(``max_tokens`` for the call + :data:`RESULT_FLOOR`); when the results fit whole only without
that room, or it would leave them less than :data:`RESULT_FLOOR` tokens each, the next round
offers no tools (the model answers with what it has) and the results get all the room. Several results of one round
share the room equally (one shorter than its share keeps all of it and leaves the rest to the others). A cut
result keeps its longest prefix that fits and ends with :data:`CUT_MARK`, which names the
tool and what was dropped; :class:`Cut` records it (the caller emits ``tool.truncated``).

An agent's ``tool_results: fail`` makes a result that does not fit a
:class:`~squad.errors.ToolResultTooLarge` instead (the step fails, nothing is cut).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from squad.chat import ChatEngine
from squad.chat.counting import MAX_BYTES_PER_TOKEN
from squad.engine.llama import round_ctx
from squad.errors import ToolResultTooLarge
from squad.runtime.handback import CUT_RESERVE, TextCounter

__all__ = ["CUT_MARK", "RESULT_FLOOR", "MAX_TOOL_ROUNDS", "Cut", "Fitted", "fit_results", "request_limit"]

CUT_MARK = ("[squad cut this result of tool '{tool}' to fit the agent's budget: {dropped:,} of {total:,} "
            "characters dropped]")
"""Ends a tool result cut to fit (``tool``: its name as the model calls it)."""

RESULT_FLOOR = 48
"""Tokens kept for a tool result of a later round (and the least a cut result is given before
the next round stops offering tools): room for the marker and a few words."""

MAX_TOOL_ROUNDS = 4
"""Model rounds of one turn that may call tools, unless the squad (``Squad(max_tool_rounds=)``)
or the agent (``max_tool_rounds``) says otherwise."""

Count = Callable[[str], Awaitable[int]]


@dataclass(frozen=True)
class Cut:
    """One tool result cut to fit: ``tool`` (the name the model called), sizes of the result
    and what was kept (characters; ``result_tokens`` None when it was too long to be worth
    counting: more than :data:`~squad.chat.counting.MAX_BYTES_PER_TOKEN` bytes per token of the
    budget), ``room_tokens`` the round's room for all its results, ``limit`` the budget."""

    tool: str
    result_chars: int
    kept_chars: int
    result_tokens: int | None
    kept_tokens: int
    room_tokens: int
    limit: int

    @property
    def dropped_chars(self) -> int:
        return self.result_chars - self.kept_chars


@dataclass(frozen=True)
class Fitted:
    """What :func:`fit_results` placed: ``texts`` (the tool messages' contents, in call order),
    ``cuts`` (one per cut result), ``tools_open``: whether the next round still offers tools."""

    texts: list[str]
    cuts: list[Cut]
    tools_open: bool


def request_limit(chat: ChatEngine, budget: int | None) -> int:
    """Tokens one request of an agent may hold: its ``budget``, else the engine's context for
    one request (``n_ctx``, per slot)."""
    return budget if budget is not None else chat.engine.n_ctx


async def fit_results(
    chat: ChatEngine,
    messages: Sequence[dict[str, Any]],
    calls: Sequence[tuple[str, str, str]],
    *,
    limit: int,
    max_tokens: int,
    tools: list[dict[str, Any]] | None,
    agent: str,
    mode: str = "cut",
    trained: int | None = None,
    count_text: Count | None = None,
    listed: list[dict[str, Any]] | None = None,
) -> Fitted:
    """Fit one round's tool results into the next request (rule in the module docstring).

    ``messages``: the next request's messages up to and including the assistant message that
    called the tools; ``calls``: ``(tool_call_id, tool name, result text)`` in call order;
    ``limit``: the agent's budget (tokens); ``tools``: the definitions the next round would
    offer (None: it offers none); ``listed``: the definitions every round sends whether or not it
    offers them (a round that offers none says ``tool_choice: none``, :func:`squad.runtime.turn.run_turn`).
    ``mode``: ``cut`` or ``fail``; ``trained``: the model's
    training context, so a suggested budget is one the model can hold.

    Raises :class:`ToolResultTooLarge` in ``fail`` mode for a result that does not fit, and in
    either mode when not even the cut markers fit (the call itself filled the budget).
    """
    count = count_text or TextCounter(chat)
    texts = [text for _, _, text in calls]
    n = len(calls)

    def build(contents: Sequence[str]) -> list[dict[str, Any]]:
        return [*messages, *({"role": "tool", "tool_call_id": cid, "content": c}
                             for (cid, _, _), c in zip(calls, contents))]

    async def room_for(offer: list[dict[str, Any]] | None) -> int:
        keep = max_tokens + RESULT_FLOOR if offer else 0  # one more round: its call and a short result
        used = await chat.count(build([""] * n), offer or listed)
        return limit - max_tokens - used - keep - CUT_RESERVE * n

    sizes = [await _size(t, limit, count) for t in texts]

    def fit(room: int) -> bool:
        return all(s is not None for s in sizes) and sum(s for s in sizes if s is not None) <= room

    offer = tools
    room = await room_for(offer)
    whole = fit(room)
    if offer and not whole:
        last = await room_for(None)  # no further round: the model answers with what these results give
        if fit(last) or room < RESULT_FLOOR * n:
            offer, room, whole = None, last, fit(last)
    if whole:
        return Fitted(texts, [], offer is not None)
    if mode == "fail":
        raise _too_large(agent, calls, sizes, room, limit, trained)
    for _ in range(3):  # joined texts can count a token or two more than their parts: check
        placed, cuts = await _cut(calls, sizes, room, limit, count)
        total = await chat.count(build(placed), offer or listed)
        over = total + max_tokens + (max_tokens + RESULT_FLOOR if offer else 0) - limit
        if over <= 0:
            return Fitted(placed, cuts, offer is not None)
        room -= over
    raise ToolResultTooLarge(
        f"agent '{agent}': its budget of {limit:,} tokens has no room left for the result of tool "
        f"'{calls[0][1]}' (not even a note that it was cut): "
        f"{_budget_fix(agent, limit + max(0, -room) + 256, trained)}",
        agent=agent, tool=calls[0][1])


async def _size(text: str, limit: int, count: Count) -> int | None:
    """Tokens of ``text``, or None when it is so long it cannot fit ``limit`` at any tokenizer."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES_PER_TOKEN * max(1, limit):
        return None
    return await count(text)


async def _cut(calls: Sequence[tuple[str, str, str]], sizes: Sequence[int | None], room: int, limit: int,
               count: Count) -> tuple[list[str], list[Cut]]:
    """Equal shares of ``room`` (water-filling); a result over its share is cut with the marker."""
    room = max(0, room)
    big = 1 << 62
    need = [size if size is not None else big for size in sizes]
    order = sorted(range(len(calls)), key=lambda i: need[i])
    shares, left = [0] * len(calls), room
    for k, i in enumerate(order):
        share = left // (len(order) - k)
        shares[i] = min(need[i], share)
        left -= shares[i]
    placed: list[str] = []
    cuts: list[Cut] = []
    for (_, name, text), size, share in zip(calls, sizes, shares):
        if size is not None and size <= share:
            placed.append(text)
            continue
        mark = CUT_MARK.format(tool=name, dropped=len(text), total=len(text))  # the longest it can be
        keep = await _prefix(text, share - await count(mark) - 1, count)
        kept = keep.rstrip()
        note = CUT_MARK.format(tool=name, dropped=len(text) - len(kept), total=len(text))
        placed.append(f"{kept}\n{note}" if kept else note)
        cuts.append(Cut(tool=name, result_chars=len(text), kept_chars=len(kept), result_tokens=size,
                        kept_tokens=await count(kept) if kept else 0, room_tokens=room, limit=limit))
    return placed, cuts


async def _prefix(text: str, tokens: int, count: Count) -> str:
    """The longest prefix of ``text`` of at most ``tokens`` tokens (binary search on characters;
    no prefix longer than :data:`MAX_BYTES_PER_TOKEN` characters per token is tried)."""
    if tokens <= 0:
        return ""
    lo, hi = 0, min(len(text), MAX_BYTES_PER_TOKEN * tokens)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if await count(text[:mid]) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def _budget_fix(agent: str, need: int, trained: int | None) -> str:
    """A fix the user can apply: a budget the model can hold, else fewer or smaller rounds."""
    budget = round_ctx(need)
    fixes = [f"raise agents.{agent}.budget to {budget:,}"] if trained is None or budget <= trained else []
    fixes.append(f"lower agents.{agent}.max_tokens or max_tool_rounds")
    return ", or ".join(fixes)


def _too_large(agent: str, calls: Sequence[tuple[str, str, str]], sizes: Sequence[int | None], room: int,
               limit: int, trained: int | None) -> ToolResultTooLarge:
    i = next((i for i, s in enumerate(sizes) if s is None or s > max(0, room) // max(1, len(calls))), 0)
    _, name, text = calls[i]
    tokens = sizes[i]
    size = f"{tokens:,} tokens" if tokens is not None else f"more than {limit:,} tokens"
    fixes = ["set tool_results: cut to cut it visibly", "make the tool return less"]
    if tokens is not None:
        fixes.append(_budget_fix(agent, limit + tokens - max(0, room), trained))
    return ToolResultTooLarge(
        f"agent '{agent}': tool '{name}' returned {len(text):,} characters ({size}), more than the {max(0, room):,} "
        f"tokens its budget of {limit:,} has left for this round's results, and its tool_results setting is fail: "
        + ", or ".join(fixes), agent=agent, tool=name)
