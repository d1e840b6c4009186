"""hypothesis strategies for names (:mod:`squad.names`), shared by the runtime and recipe tests."""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st

from squad.names import name_problem, normalize

LETTERS = st.characters(categories=["Lu", "Ll", "Lt", "Lm", "Lo"])
NAME_CHARS = st.characters(categories=["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Nd"]) | st.sampled_from("_-")


DEVANAGARI = st.characters(min_codepoint=0x915, max_codepoint=0x939)  # consonants
ARABIC_DUAL = st.sampled_from("بپتثجچحخسشصضطظعغفقکگلمنهیئ")  # Arabic/Persian letters that join on both sides
JOINED = (st.tuples(DEVANAGARI, st.sampled_from(["\u094d\u200d", "\u094d\u200c"]), DEVANAGARI).map("".join)
          | st.tuples(ARABIC_DUAL, st.just("\u200c"), ARABIC_DUAL).map("".join))
"""A piece of a word that needs a joiner (UAX #31 A1, A2, B): after a virama (क्‍ष), between joining letters."""


@st.composite
def plain_names(draw: st.DrawFn) -> str:
    """A valid name in NFC without joiners: a letter of any script, then name characters, not ending in '-'."""
    text = normalize(draw(LETTERS) + "".join(draw(st.lists(NAME_CHARS, max_size=12)))).rstrip("-")
    assume(name_problem(text) is None)
    return text


@st.composite
def names(draw: st.DrawFn) -> str:
    """A valid name in NFC: mostly :func:`plain_names`, some with zero-width joiners where Unicode's identifier
    rules put them (a Persian or Hindi word's joiner) at its start, middle or end."""
    text = draw(plain_names())
    if draw(st.integers(0, 3)) == 0:
        piece = draw(JOINED)
        where = draw(st.sampled_from(["start", "middle", "end"]))
        text = piece + text if where == "start" else text + piece if where == "end" else \
            text[:1] + piece + text[1:]
        text = normalize(text)[:64]
        assume(name_problem(text) is None)
    return text
