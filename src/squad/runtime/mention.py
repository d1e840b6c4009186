"""@mention parsing: the one parser the runtime, ``squad chat`` and recipes share.

Only the author's and the user's own text dispatches sub-agents; values put into it are data
(field case F13), wrapped in :data:`DATA_OPEN` ... :data:`DATA_CLOSE` (:func:`as_data`) and read
as one opaque piece. ``@name`` counts at a word start, whole-name and case-insensitively, never
inside data, code or e-mail-like tokens; each agent is dispatched once, in order of first
mention. A name is what :mod:`squad.names` allows (letters of any script, digits, ``_``, ``-``), compared
after NFC and case folding. Each sub-agent gets the units (lines, sentences, fenced blocks) addressed to it plus
the shared context, mentions stripped; :attr:`MentionParse.remainder` is what is left for the
main agent. Unknown names and idle mentions: :class:`~squad.errors.MentionError` via
:meth:`MentionParse.check`.

Design (the rules, with examples): docs/design/mentions.md
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from squad.errors import MentionError
from squad.names import is_name_char, name_key, scan_name
from squad.templates.marks import DATA_CLOSE, DATA_OPEN, as_data, unmark  # the data marks live with the templates

__all__ = ["Dispatch", "UnknownMention", "MentionParse", "parse_mentions", "suggest", "DATA_OPEN", "DATA_CLOSE",
           "as_data", "unmark", "quote_unknown"]

_DATA = re.compile(f"{DATA_OPEN}[^{DATA_CLOSE}]*(?:{DATA_CLOSE}|\\Z)")


def _mask(text: str) -> str:
    """``text`` with every data region (marks included) replaced by as many :data:`DATA_OPEN`
    characters: the same length, and nothing the parser reads (no word, space, punctuation,
    backtick or newline)."""
    return _DATA.sub(lambda m: DATA_OPEN * len(m.group()), text)


_OPENERS = frozenset("\"'\u3001\u3002\uff0c\uff1a\uff1b\uff01\uff1f")
"""Besides whitespace and opening brackets or quotes (Unicode ``Ps``/``Pi``: ``( [ { 「 『 （ « “``), what may
stand right before ``@``: ``" '`` and the CJK/full-width separators ``、 。 ， ： ； ！ ？``, after which scripts
written without spaces go on without one."""


def _starts_word(text: str, at: int) -> bool:
    """``@`` at ``at`` starts a word: at the start, or after whitespace or an opener (:data:`_OPENERS`). After a
    letter, digit or mark of any script (``a@b.com``, ``これを@レビュー``) it is inside a word."""
    if at == 0:
        return True
    before = text[at - 1]
    return before.isspace() or before in _OPENERS or unicodedata.category(before) in ("Ps", "Pi")


def _mention_tokens(text: str, glued: bool = False) -> Iterator[tuple[int, int]]:
    """(start of ``@``, end of the name) of each ``@name`` at a word start, the name a run of name characters
    (:func:`squad.names.scan_name`) not starting with ``-``; not followed by ``.x`` or ``@x`` (an address such as
    ``@b.com`` or ``@user@host``). ``glued``: instead the ``@name`` tokens inside a word (:func:`_starts_word`)."""
    at = text.find("@")
    while at != -1:
        end = scan_name(text, at + 1)
        if end > at + 1 and text[at + 1] != "-" and _starts_word(text, at) != glued and not (
                end + 1 < len(text) and text[end] in ".@" and is_name_char(text[end + 1])):
            yield at, end
        at = text.find("@", at + 1)
_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[^\n]*$", re.MULTILINE)
_SENTENCE_END = re.compile(r"[.!?]+[ \t]+|[\u3002\uff01\uff1f]+|\n")
_LEAD_SEP = re.compile(r"(?:[\s,:;.!?&\u3001\u3002\uff0c\uff1a\uff1b\uff01\uff1f]|[-\u2013\u2014]+(?=\s))*(?:and\s+)?")
"""What may follow a leading mention and goes with it: whitespace, ASCII and CJK/full-width
separators ``, : ; . ! ? &``, dashes before a space, and ``and``."""


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
    """Result of :func:`parse_mentions`. ``idle``: mentioned known agents whose text is empty
    (nothing but the mention was addressed to them)."""

    dispatches: list[Dispatch] = field(default_factory=list)
    unknown: list[UnknownMention] = field(default_factory=list)
    remainder: str = ""
    idle: list[str] = field(default_factory=list)
    glued: list[str] = field(default_factory=list)
    """Known agents written ``@name`` right after a letter of a script often written without spaces
    (``これを@レビュー``, :data:`_UNSPACED`), which is inside a word and dispatches nothing; a problem, so such a
    text does not lose its mention silently."""

    @property
    def agents(self) -> list[str]:
        """Mentioned known agents, in order of first mention."""
        return [d.agent for d in self.dispatches]

    def problems(self) -> list[str]:
        """One message per unknown mention and per idle agent (empty when all is well)."""
        return [u.message() for u in self.unknown] + [
            f"'@{name}' is mentioned with nothing to do: write its task after the mention "
            f"(e.g. '@{name} check the login code')" for name in self.idle] + [
            f"'@{name}' follows a letter with no space, so it is part of a word and dispatches nothing: put a space "
            f"or '、' before '@' (e.g. 'これを @{name} に')" for name in self.glued]

    def check(self, known: Iterable[str] = ()) -> MentionParse:
        """Return self, or raise :class:`MentionError` naming every unknown mention and every
        idle agent (:meth:`problems`), followed by the known names."""
        if self.unknown or self.idle or self.glued:
            names = sorted(known)
            tail = f" (known agents: {', '.join(names)})" if names and self.unknown else ""
            raise MentionError("; ".join(self.problems()) + tail)
        return self


@dataclass(frozen=True)
class _Mention:
    start: int
    end: int
    name: str  # as written, without "@"
    agent: str | None  # canonical known name, or None


def suggest(name: str, known: Iterable[str], n: int = 3) -> tuple[str, ...]:
    """Known names close to ``name`` (case-insensitive difflib), best first."""
    by_key = {name_key(k): k for k in known}
    return tuple(by_key[m] for m in difflib.get_close_matches(name_key(name), list(by_key), n=n, cutoff=0.6))


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
    for start, end in _mention_tokens(text):
        if _inside(start, code):
            continue
        name = text[start + 1:end]
        found.append(_Mention(start, end, name, known.get(name_key(name))))
    return found


_UNSPACED = 0x0E00
"""Letters from here on (Thai, Lao, Tibetan, Myanmar, Khmer, Hangul, kana, CJK ...) belong to scripts often written
without spaces: a known ``@name`` glued to one is reported (:attr:`MentionParse.glued`); glued to a Latin, Greek,
Cyrillic or Indic letter it is an address (``sales@support``) and ignored as before."""


def _glued(text: str, code: list[tuple[int, int]], known: dict[str, str]) -> list[str]:
    """Known agents written as ``@name`` right after a letter (``これを@レビュー``): inside a word, so no mention."""
    found: list[str] = []
    for start, end in _mention_tokens(text, glued=True):
        agent = known.get(name_key(text[start + 1:end]))
        before = text[start - 1]
        if agent is not None and not _inside(start, code) and is_name_char(before) and ord(before) >= _UNSPACED \
                and agent not in found:
            found.append(agent)
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

    ``known``: agent names that may be mentioned (matched case-insensitively). Data regions
    (:func:`as_data`) are read as opaque text; the texts returned are unmarked.
    Returns :class:`MentionParse`; never raises (call ``.check()`` to make unknown and idle
    mentions an error).
    """
    known_list = list(known)
    by_key = {name_key(k): k for k in known_list}
    seen = _mask(text)  # what the parser reads; the same length as text
    fences, code = _code_spans(seen)
    mentions = _find(seen, code, by_key)

    order: list[str] = []
    unknown: dict[str, UnknownMention] = {}
    for m in mentions:
        if m.agent is not None and m.agent not in order:
            order.append(m.agent)
        elif m.agent is None and name_key(m.name) not in unknown:
            unknown[name_key(m.name)] = UnknownMention(m.name, suggest(m.name, known_list))

    units = []
    for a, b in _units(seen, fences, code):
        inside = [m for m in mentions if a <= m.start < b]
        addressed = {m.agent for m in inside if m.agent is not None}
        units.append((a, b, inside, addressed))

    def compose(agent: str | None) -> str:
        parts = [
            _strip(text, a, b, inside)
            for a, b, inside, addressed in units
            if not addressed or agent in addressed
        ]
        return unmark("".join(parts)).strip()

    dispatches = [Dispatch(agent, compose(agent)) for agent in order]
    return MentionParse(
        dispatches=dispatches,
        unknown=list(unknown.values()),
        remainder=compose(None),
        idle=[d.agent for d in dispatches if not d.text],
        glued=_glued(seen, code, by_key),
    )


def quote_unknown(text: str, known: Iterable[str]) -> str:
    """``text`` with each @mention of an agent not in ``known`` made data (:func:`as_data`),
    so it is sent as written and dispatches nothing (``squad chat`` after warning about it);
    everything else, code included, unchanged."""
    by_key = {name_key(k): k for k in known}
    seen = _mask(text)
    _, code = _code_spans(seen)
    out, pos = [], 0
    for m in _find(seen, code, by_key):
        if m.agent is None:
            out += [text[pos:m.start], as_data(text[m.start:m.end])]
            pos = m.end
    return "".join(out) + text[pos:]
