"""Handing sub-agent answers back to a main agent, cut by one visible rule.

A main agent that @mentioned sub-agents gets ONE user message: its own text, then each
answer under ``[@name]`` (:func:`compose_hand_back`). When the answers would overflow its
budget, :func:`cut_answers` shares the room left (budget − max_tokens − the message without
the answers, counted exactly) equally: an answer shorter than its share keeps all of it and
leaves the rest to the others; a longer one is cut to its share and ends with
``[cut: N tokens omitted]``. An answer that is not a whole answer is handed back with its
mark (:mod:`squad.runtime.outcome`: ``[truncated at max_tokens]``, ``[empty answer]``,
``[failed: ...]``, ``[cancelled: ...]``). :func:`hand_back` does both and emits ``answer.cut`` for each
answer it cut.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from squad.chat import ChatEngine
from squad.events import AnswerCut, EventSink, Origin
from squad.runtime.results import AgentResult

__all__ = ["CUT_MARK", "compose_hand_back", "cut_answers", "hand_back", "TextCounter"]

CUT_MARK = "[cut: {n} tokens omitted]"
"""Appended to a sub-agent answer cut to fit the main agent's budget."""

CUT_RESERVE = 4
"""Tokens kept free per answer: joining texts can tokenize a little differently."""

Count = Callable[[str], Awaitable[int]]


def compose_hand_back(text: str, names: Sequence[str], answers: Sequence[str]) -> str:
    """``text``, then each sub-agent's answer under ``[@name]``: the ONE message a main agent gets."""
    parts = [text.rstrip(), "", "Answers from the sub-agents you mentioned:"]
    for name, answer in zip(names, answers):
        parts += ["", f"[@{name}]", answer.strip()]
    return "\n".join(parts)


async def cut_answers(answers: Sequence[str], room: int, count: Count) -> list[tuple[str, int]]:
    """Fit ``answers`` into ``room`` tokens by equal shares; returns ``(text, omitted_tokens)``.

    ``count`` gives a text's tokens (the model's tokenizer). Answers that fit their share
    are kept whole and the rest of their share goes to the others (water-filling); a cut
    answer keeps the longest prefix that fits its share minus the marker and ends with
    :data:`CUT_MARK`.
    """
    sizes = [await count(a) for a in answers]
    room = max(0, room)
    if sum(sizes) <= room:
        return [(a, 0) for a in answers]
    shares = [0] * len(answers)
    left, order = room, sorted(range(len(answers)), key=lambda i: sizes[i])
    for k, i in enumerate(order):
        share = left // (len(order) - k)
        shares[i] = min(sizes[i], share)
        left -= shares[i]
    out = []
    for answer, size, share in zip(answers, sizes, shares):
        if size <= share:
            out.append((answer, 0))
            continue
        mark_cost = await count(CUT_MARK.format(n=size))
        keep = await _prefix(answer, share - mark_cost, count)
        omitted = size - await count(keep)
        out.append(((keep.rstrip() + " " if keep.strip() else "") + CUT_MARK.format(n=omitted), omitted))
    return out


async def _prefix(text: str, tokens: int, count: Count) -> str:
    """Longest prefix of ``text`` with at most ``tokens`` tokens (binary search on characters)."""
    if tokens <= 0:
        return ""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if await count(text[:mid]) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


class TextCounter:
    """Tokens of a bare text as one user message adds them: the count of ``[{"role": "user",
    "content": text}]`` minus that of an empty one (asked once), from a :class:`ChatEngine`."""

    def __init__(self, chat: ChatEngine) -> None:
        self.chat = chat
        self._empty: int | None = None

    async def __call__(self, text: str) -> int:
        if self._empty is None:
            self._empty = await self.chat.count([{"role": "user", "content": ""}], None)
        return max(0, await self.chat.count([{"role": "user", "content": text}], None) - self._empty)


async def hand_back(
    chat: ChatEngine,
    main: Origin,
    *,
    budget: int,
    max_tokens: int,
    prefix: Sequence[Mapping[str, Any]],
    tools: list[dict[str, Any]] | None,
    text: str,
    subs: Sequence[AgentResult],
    count_text: Count,
    on_event: EventSink,
) -> str:
    """The ONE user message giving the main agent ``text`` and its sub-agents' answers, cut
    to fit ``budget`` (tokens) after ``max_tokens``, the messages before it (``prefix``:
    system and history) and ``tools``. Emits ``answer.cut`` per cut answer."""
    answers = [r.marked_output for r in subs]  # a non-answer is never handed back unmarked
    frame = compose_hand_back(text, [r.agent for r in subs], [""] * len(subs))
    used = await chat.count([*map(dict, prefix), {"role": "user", "content": frame}], tools)
    room = budget - max_tokens - used - CUT_RESERVE * len(subs)
    cut = await cut_answers(answers, room, count_text)
    for r, (_, omitted) in zip(subs, cut):
        if omitted:
            on_event(AnswerCut(agent=r.agent, conversation=r.conversation, parent=main.conversation,
                               omitted_tokens=omitted, room_tokens=room, main=main.agent))
    return compose_hand_back(text, [r.agent for r in subs], [kept for kept, _ in cut])
