"""The marks around text that is data, not the author's words (field case F13).

A recipe template's ``{{ ... }}`` output is data (:func:`squad.templates.render_template` with
``data=True``), and so is any value put into a prompt with :func:`as_data`: the mention parser
(:mod:`squad.runtime.mention`, which re-exports these names) reads a data region as one opaque
piece, so no @mention in it dispatches anyone. :func:`unmark` removes the marks (what the model
sees).
"""

from __future__ import annotations

from typing import Any

__all__ = ["DATA_OPEN", "DATA_CLOSE", "as_data", "unmark"]

DATA_OPEN = "\ufdd0"
DATA_CLOSE = "\ufdd1"
"""The marks around text that is data. They are Unicode noncharacters (U+FDD0, U+FDD1),
reserved for a program's internal use, so they never stand for anything in real text;
:func:`as_data` removes them from the data it wraps, so data cannot close its own region early."""

_MARKS = str.maketrans("", "", DATA_OPEN + DATA_CLOSE)


def as_data(value: Any) -> str:
    """``str(value)`` as one data region: wrapped in :data:`DATA_OPEN`/:data:`DATA_CLOSE`
    (marks inside it removed). No @mention in it dispatches anyone::

        await squad.run(f"@security review this file:\\n{as_data(source)}")
    """
    return DATA_OPEN + unmark(str(value)) + DATA_CLOSE


def unmark(text: str) -> str:
    """``text`` without the data marks (what the model sees)."""
    return text.translate(_MARKS)
