"""@mention parsing: the one parser the runtime, ``squad chat`` and recipes share.

What counts as a mention
------------------------
- ``@name`` at the start of the text, after whitespace, or after opening punctuation
  ``( [ { " '``. ``name`` is letters, digits, ``_`` and ``-`` (not ending in ``-``);
  trailing punctuation (``@style,`` ``@style.`` ``@style:``) is not part of the name.
- Matched whole-name and case-insensitively against the known agents.
- Never inside inline code (`` `@x` ``), fenced code blocks (```` ``` ```` / ``~~~``), e-mail
  addresses (``a@b.com``) or address-like tokens (``@b.com``, ``@user@host``).
- Each agent is dispatched once, in order of its first mention.
- A name that matches no known agent is reported in :attr:`MentionParse.unknown` with
  difflib suggestions, never silently dropped (the runtime and recipes raise
  :class:`~squad.errors.MentionError` via :meth:`MentionParse.check`; chat warns).

What each sub-agent receives
----------------------------
The message is cut into *units*: lines, and sentences within a line (a sentence ends at
``.``, ``!`` or ``?`` followed by whitespace); a fenced code block is one unit. A unit that
mentions known agents is *addressed* to them; the others are *shared context*.

- A sub-agent receives the message in its original order, keeping the units addressed to
  it (even if addressed to others too) and the shared context, and leaving out units
  addressed only to other agents. So ``"@security @style review this diff:"`` followed by a
  code block gives both agents ``"review this diff:"`` plus the code block.
- Mention tokens are stripped: leading mentions (``"@a, @b: do x"``) are removed; a
  mention inside a sentence becomes the bare name (``"ask @a about x"`` -> ``"ask a about x"``).
- :attr:`MentionParse.remainder` is the shared context alone (mentions stripped): what is
  left for the main agent to answer itself; ``""`` when every unit was addressed.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from squad.errors import MentionError

__all__ = ["Dispatch", "UnknownMention", "MentionParse", "parse_mentions", "suggest", "DATA_MARK", "as_data",
           "unmark"]

DATA_MARK = "\u2063"
"""INVISIBLE SEPARATOR put before every ``@`` of text that is data, not the author's words
(values substituted into a recipe template: parameters, step outputs, map items), so the
parser never reads a mention there (field case F13: a model answer or a source file full of
``@dataclass`` must not dispatch anyone). :func:`unmark` removes it before text is sent."""


def as_data(value: Any) -> Any:
    """``value`` with :data:`DATA_MARK` before every ``@`` of every string in it (dicts and
    lists walked); other values unchanged."""
    if isinstance(value, str):
        return value.replace("@", DATA_MARK + "@")
    if isinstance(value, Mapping):
        return {k: as_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_data(v) for v in value]
    return value


def unmark(text: str) -> str:
    """``text`` without :data:`DATA_MARK` (what the model sees)."""
    return text.replace(DATA_MARK, "")

_MENTION = re.compile(r"""(?<![^\s(\[{"'])@(\w(?:[\w-]*\w)?)""")
_ADDRESS_TAIL = re.compile(r"[.@]\w")
_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[^\n]*$", re.MULTILINE)
_SENTENCE_END = re.compile(r"[.!?]+[ \t]+|\n")
_LEAD_SEP = re.compile(r"[\s,:;&]*(?:and\s+)?")


@dataclass(frozen=True)
class Dispatch:
    """One sub-agent to run: ``agent`` is the known name as declared; ``text`` what it receives."""

    agent: str
    text: str


@dataclass(frozen=True)
class UnknownMention:
    """``@name`` that matched no known agent; ``suggestions`` are close known names."""

    name: str
    suggestions: tuple[str, ...] = ()

    def message(self) -> str:
        hint = f"; did you mean '{self.suggestions[0]}'?" if self.suggestions else ""
        return f"unknown agent '@{self.name}'{hint}"


@dataclass(frozen=True)
class MentionParse:
    """Result of :func:`parse_mentions`."""

    dispatches: list[Dispatch] = field(default_factory=list)
    unknown: list[UnknownMention] = field(default_factory=list)
    remainder: str = ""

    @property
    def agents(self) -> list[str]:
        """Mentioned known agents, in order of first mention."""
        return [d.agent for d in self.dispatches]

    def check(self, known: Iterable[str] = ()) -> "MentionParse":
        """Return self, or raise :class:`MentionError` naming every unknown mention."""
        if self.unknown:
            names = sorted(known)
            tail = f" (known agents: {', '.join(names)})" if names else ""
            raise MentionError("; ".join(u.message() for u in self.unknown) + tail)
        return self


@dataclass(frozen=True)
class _Mention:
    start: int
    end: int
    name: str  # as written, without "@"
    agent: str | None  # canonical known name, or None


def suggest(name: str, known: Iterable[str], n: int = 3) -> tuple[str, ...]:
    """Known names close to ``name`` (case-insensitive difflib), best first."""
    by_lower = {k.lower(): k for k in known}
    return tuple(by_lower[m] for m in difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.6))


def _code_spans(text: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Character ranges of fenced code blocks, and of those plus inline code."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while (opening := _FENCE.search(text, pos)) is not None:
        marker = opening.group(1)
        close = re.compile(rf"^[ \t]{{0,3}}{re.escape(marker[0])}{{{len(marker)},}}[ \t]*$", re.MULTILINE)
        closing = close.search(text, opening.end() + 1)
        end = closing.end() if closing else len(text)
        spans.append((opening.start(), end))
        pos = end
    fences = list(spans)
    inline = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
    for m in inline.finditer(text):
        if not _inside(m.start(), fences):
            spans.append((m.start(), m.end()))
    return fences, sorted(spans)


def _inside(pos: int, spans: list[tuple[int, int]]) -> bool:
    return any(a <= pos < b for a, b in spans)


def _units(text: str, fences: list[tuple[int, int]], code: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Cut ``text`` into consecutive (start, end) units covering it exactly."""
    cuts = {0, len(text)}
    for a, b in fences:
        cuts.update((a, b))  # a fenced block is a unit of its own
    for m in _SENTENCE_END.finditer(text):
        if not _inside(m.start(), code):
            cuts.add(m.end())
    ordered = sorted(cuts)
    return [(a, b) for a, b in zip(ordered, ordered[1:]) if a < b]


def _find(text: str, code: list[tuple[int, int]], known: dict[str, str]) -> list[_Mention]:
    found = []
    for m in _MENTION.finditer(text):
        if _inside(m.start(), code) or _ADDRESS_TAIL.match(text, m.end()):
            continue
        found.append(_Mention(m.start(), m.end(), m.group(1), known.get(m.group(1).lower())))
    return found


def _strip(text: str, start: int, end: int, mentions: list[_Mention]) -> str:
    """The unit ``text[start:end]`` with known mention tokens removed or made bare names."""
    out: list[str] = []
    pos = start
    lead = start + len(text[start:end]) - len(text[start:end].lstrip())
    for m in mentions:
        if m.agent is None:
            continue
        out.append(text[pos : m.start])
        if m.start == lead:  # a leading mention: drop it and the separator after it
            sep = _LEAD_SEP.match(text, m.end, end)
            pos = lead = sep.end() if sep else m.end
        else:
            out.append(m.name)
            pos = m.end
    out.append(text[pos:end])
    return "".join(out)


def parse_mentions(text: str, known: Iterable[str]) -> MentionParse:
    """Find the @mentions in ``text`` and the text each mentioned agent receives.

    ``known``: agent names that may be mentioned (matched case-insensitively).
    Returns :class:`MentionParse`; never raises (call ``.check()`` to make unknown
    mentions an error).
    """
    known_list = list(known)
    by_lower = {k.lower(): k for k in known_list}
    fences, code = _code_spans(text)
    mentions = _find(text, code, by_lower)

    order: list[str] = []
    unknown: dict[str, UnknownMention] = {}
    for m in mentions:
        if m.agent is not None and m.agent not in order:
            order.append(m.agent)
        elif m.agent is None and m.name.lower() not in unknown:
            unknown[m.name.lower()] = UnknownMention(m.name, suggest(m.name, known_list))

    units = []
    for a, b in _units(text, fences, code):
        inside = [m for m in mentions if a <= m.start < b]
        addressed = {m.agent for m in inside if m.agent is not None}
        units.append((a, b, inside, addressed))

    def compose(agent: str | None) -> str:
        parts = [
            _strip(text, a, b, inside)
            for a, b, inside, addressed in units
            if not addressed or agent in addressed
        ]
        return "".join(parts).strip()

    return MentionParse(
        dispatches=[Dispatch(agent, compose(agent)) for agent in order],
        unknown=list(unknown.values()),
        remainder=compose(None),
    )
