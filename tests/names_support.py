"""hypothesis strategies for names (:mod:`squad.names`), shared by the runtime and recipe tests."""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st

from squad.names import name_problem, normalize

LETTERS = st.characters(categories=["Lu", "Ll", "Lt", "Lm", "Lo"])
NAME_CHARS = st.characters(categories=["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Nd"]) | st.sampled_from("_-")


@st.composite
def names(draw: st.DrawFn) -> str:
    """A valid name in NFC: a letter of any script, then name characters, not ending in '-'."""
    text = normalize(draw(LETTERS) + "".join(draw(st.lists(NAME_CHARS, max_size=12)))).rstrip("-")
    assume(name_problem(text) is None)
    return text
