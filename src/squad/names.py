"""The one rule for names: agents, step ids, parameters, recipe names and ``@mentions``.

A name is NFC-normalised text of at most :data:`MAX_NAME` characters: a letter of any script
first (Unicode category ``L*``: ``reviewer``, ``리뷰어``, ``レビュー``, ``समीक्षक``), then
letters, combining marks (``Mn``/``Mc``, the vowel signs of Hindi or Thai), decimal digits
of any script (``Nd``), ``_`` and ``-``; never ending in ``-`` (so ``@name-`` reads as the
name and a dash). Everything else, spaces, punctuation, symbols, emoji, zero-width joiners,
is refused, and the message names the character (``'!' (U+0021 EXCLAMATION MARK)``).

The same characters make an ``@mention`` (:func:`scan_name`), so every valid agent name can be
mentioned; a name without ``-`` is also a jinja identifier (``params.문서``,
``steps.요약.output``). Names are compared after NFC and case folding (:func:`name_key`), so
text typed on a system that writes decomposed Hangul (NFD) still finds ``리뷰어``.

Design (the rule and why): docs/recipes.md, "Names".
"""

from __future__ import annotations

import unicodedata

__all__ = ["MAX_NAME", "NAME_RULE", "is_name_char", "is_name_start", "name_problem", "check_name", "normalize",
           "name_key", "scan_name", "describe_char"]

MAX_NAME = 64
"""The most characters a name may have (after NFC)."""

NAME_RULE = "a letter (of any script) first, then letters, digits, '_' or '-', not ending in '-'"
"""The rule in words, for messages."""

_MARKS = ("Mn", "Mc")


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


def normalize(name: str) -> str:
    """``name`` in Unicode NFC (composed Hangul, composed accents)."""
    return unicodedata.normalize("NFC", name)


def name_key(name: str) -> str:
    """What two names are compared by: NFC, then case folded (``Reviewer`` = ``reviewer``)."""
    return normalize(name).casefold()


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
    for char in text[1:]:
        if not is_name_char(char):
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
    characters, without trailing ``-``; ``start`` itself when there is none. The token may
    still not be a valid name (``@2nd``): the caller compares it with the known names."""
    end = start
    n = len(text)
    while end < n and is_name_char(text[end]):
        end += 1
    while end > start and text[end - 1] == "-":
        end -= 1
    return end
