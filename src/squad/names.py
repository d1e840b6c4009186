"""The one rule for names: agents, step ids, parameters, recipe names and ``@mentions``.

A name is NFC-normalised text of at most :data:`MAX_NAME` characters: a letter of any script
first (Unicode category ``L*``: ``reviewer``, ``리뷰어``, ``レビュー``, ``समीक्षक``), then
letters, combining marks (``Mn``/``Mc``, the vowel signs of Hindi or Thai), decimal digits
of any script (``Nd``), ``_`` and ``-``; never ending in ``-`` (so ``@name-`` reads as the
name and a dash). The zero-width non-joiner and joiner (U+200C, U+200D), which Persian, Hindi
and other scripts need inside words (``می‌خواهم``, ``क्‍ष``), are allowed where Unicode's
identifier rules allow them (UAX #31 A1, A2, B; the same contexts as IDNA's CONTEXTJ, RFC 5892,
checked by the ``idna`` package): right after a virama, or between letters that join on both
sides of it; anywhere else they are refused. They are invisible, so names are compared without
them (:func:`name_key`, as Unicode's NFKC_Casefold does): ``می‌خواهم`` and ``میخواهم`` are one
name. Everything else, spaces, punctuation, symbols, emoji, is refused, and the message names
the character (``'!' (U+0021 EXCLAMATION MARK)``).

The same characters make an ``@mention`` (:func:`scan_name`), so every valid agent name can be
mentioned; a name without ``-`` is also a jinja identifier (``params.문서``,
``steps.요약.output``; one with a joiner is reached as ``params["می‌خواهم"]``, jinja's names
have no joiners). Names are compared after NFC and case folding (:func:`name_key`), so
text typed on a system that writes decomposed Hangul (NFD) still finds ``리뷰어``.

Design (the rule and why): docs/recipes.md, "Names".
"""

from __future__ import annotations

import unicodedata

from idna import valid_contextj

__all__ = ["MAX_NAME", "NAME_RULE", "is_name_char", "is_name_start", "joiner_fits", "first_bad_char",
           "name_problem", "check_name", "normalize",
           "name_key", "scan_name", "describe_char"]

MAX_NAME = 64
"""The most characters a name may have (after NFC)."""

NAME_RULE = "a letter (of any script) first, then letters, digits, '_' or '-', not ending in '-'"
"""The rule in words, for messages."""

_MARKS = ("Mn", "Mc")
_JOINERS = "\u200c\u200d"
"""ZERO WIDTH NON-JOINER and ZERO WIDTH JOINER: name characters only where :func:`joiner_fits`."""
_JOINER_RULE = "after a virama (Hindi क्‍ष) or between two letters that join across it (Persian می‌خواهم)"


def is_name_start(char: str) -> bool:
    """``char`` (one character) may start a name: a letter of any script."""
    return unicodedata.category(char).startswith("L")


def is_name_char(char: str) -> bool:
    """``char`` (one character) may be part of a name: a letter, a combining mark, a decimal
    digit (any script), ``_`` or ``-``."""
    if char in "_-":
        return True
    cat = unicodedata.category(char)
    return cat.startswith("L") or cat in _MARKS or cat == "Nd"


def joiner_fits(text: str, at: int) -> bool:
    """``text[at]`` is a zero-width non-joiner or joiner standing where Unicode's identifier rules allow one
    (UAX #31 A1, A2, B; RFC 5892's CONTEXTJ): right after a virama, or (a non-joiner) between a letter that
    joins on its left and one that joins on its right, marks between them aside."""
    if text[at] not in _JOINERS:
        return False
    try:
        return valid_contextj(text, at)
    except ValueError:  # a neighbour without a Unicode name (unassigned): not a joining context
        return False


def first_bad_char(text: str, also: str = "") -> str | None:
    """The first character of ``text`` that is neither a name character, nor a joiner where it fits
    (:func:`joiner_fits`), nor one of ``also``; None when there is none. For text made of names (a tool's name,
    ``ask_리뷰어``, ``SERVER.TOOL``)."""
    for at, char in enumerate(text):
        if not (is_name_char(char) or char in also or (char in _JOINERS and joiner_fits(text, at))):
            return char
    return None


def normalize(name: str) -> str:
    """``name`` in Unicode NFC (composed Hangul, composed accents)."""
    return unicodedata.normalize("NFC", name)


def name_key(name: str) -> str:
    """What two names are compared by: NFC without the invisible joiners, then case folded (``Reviewer`` =
    ``reviewer``; ``می‌خواهم`` = ``میخواهم``)."""
    return normalize(name).replace("\u200c", "").replace("\u200d", "").casefold()


def describe_char(char: str) -> str:
    """``'!' (U+0021 EXCLAMATION MARK)``: a character as a message names it."""
    return f"{char!r} (U+{ord(char):04X} {unicodedata.name(char, 'unnamed character')})"


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a name (naming the first character not allowed where it stands),
    or None when it is one. Checks the NFC form."""
    if not isinstance(name, str):
        return f"a name is text, got {type(name).__name__}"
    text = normalize(name)
    if not text:
        return "a name cannot be empty"
    if len(text) > MAX_NAME:
        return f"a name has at most {MAX_NAME} characters, this one has {len(text)}"
    if not is_name_start(text[0]):
        what = "is not allowed" if not is_name_char(text[0]) else "cannot start a name"
        return f"{describe_char(text[0])} {what}: start with a letter"
    for at, char in enumerate(text[1:], 1):
        if char in _JOINERS and not joiner_fits(text, at):
            return f"{describe_char(char)} is allowed in a name only {_JOINER_RULE}, not here"
        if not is_name_char(char) and char not in _JOINERS:
            return f"{describe_char(char)} is not allowed in a name"
    if text.endswith("-"):
        return "a name cannot end in '-'"
    return None


def check_name(name: object, what: str = "name") -> str:
    """``name`` in NFC, or ``ValueError`` saying which character is not allowed and the rule
    (``what``: ``"agent name"``, ``"step id"``, ``"parameter name"`` for the message)."""
    problem = name_problem(name)
    if problem is not None:
        raise ValueError(f"{what} {name!r} is not a name: {problem}; rename it (a name is {NAME_RULE})")
    assert isinstance(name, str)
    return normalize(name)


def scan_name(text: str, start: int) -> int:
    """The end of the name token that starts at ``text[start]``: the longest run of name
    characters and, after its first, zero-width joiners (wherever they stand: a mention is
    compared by what it shows, :func:`name_key` drops them, so ``@리뷰어`` with a stray joiner
    inside still reads as ``@리뷰어`` and ``@리뷰어`` + joiner + ``님`` as ``@리뷰어님``), without
    trailing ``-``; ``start`` itself when there is none. The token may still not be a valid name
    (``@2nd``): the caller compares it with the known names."""
    end = start
    n = len(text)
    while end < n and (is_name_char(text[end]) or (end > start and text[end] in _JOINERS)):
        end += 1
    while end > start and text[end - 1] == "-":
        end -= 1
    return end
