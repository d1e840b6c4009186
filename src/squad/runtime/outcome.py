"""What an agent conversation produced: an answer, or one of the non-answers (field case F11).

:class:`Outcome` is one of ``ok``, ``truncated`` (stopped at ``max_tokens``), ``empty``,
``failed``, ``cancelled``; every place a result is shown or passed on uses it. How a truncated
or empty answer flows on is one :data:`Handling`: ``accept``, ``mark`` (the default: a visible
mark at its end, :func:`marked`) or ``fail`` (an :class:`~squad.errors.IncompleteAnswer`).
A failed or cancelled conversation always counts as a failure and shows as ``[failed: why]``
or ``[cancelled: why]``, never as nothing.

Design (the table, and what flows on where): docs/design/non-answers.md
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Literal

__all__ = ["Outcome", "Handling", "HANDLINGS", "DEFAULT_HANDLING", "outcome_of", "marked", "fix_for", "worst"]


class Outcome(str, Enum):
    """See the module docstring. A ``str``: ``result.outcome == "truncated"`` works."""

    OK = "ok"
    TRUNCATED = "truncated"
    EMPTY = "empty"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value

    @property
    def is_answer(self) -> bool:
        """True only for ``ok``."""
        return self is Outcome.OK


Handling = Literal["accept", "mark", "fail"]
HANDLINGS: tuple[Handling, ...] = ("accept", "mark", "fail")

DEFAULT_HANDLING: Mapping[Outcome, Handling] = {
    Outcome.TRUNCATED: "mark",
    Outcome.EMPTY: "mark",
    Outcome.FAILED: "fail",
    Outcome.CANCELLED: "fail",
}
"""How each non-answer flows on unless a recipe says otherwise (module docstring)."""

TRUNCATED_MARK = "[truncated at max_tokens]"
THINKING_MARK = "[truncated at max_tokens: cut while thinking]"
EMPTY_MARK = "[empty answer]"


_SEVERITY = (Outcome.OK, Outcome.EMPTY, Outcome.TRUNCATED, Outcome.CANCELLED, Outcome.FAILED)


def worst(outcomes: Iterable[Outcome | str]) -> Outcome:
    """The most serious of ``outcomes`` (failed > cancelled > truncated > empty > ok); ``ok``
    for none. How a block, a map or an agent with several conversations is summed up."""
    return max((Outcome(o) for o in outcomes), key=_SEVERITY.index, default=Outcome.OK)


def outcome_of(finish_reason: str | None, text: str) -> Outcome:
    """The outcome of a finished call: ``truncated`` for ``finish_reason == "length"``,
    ``empty`` for no answer text (whitespace only), else ``ok``."""
    if finish_reason == "length":
        return Outcome.TRUNCATED
    return Outcome.EMPTY if not text.strip() else Outcome.OK


def marked(outcome: Outcome, text: str, detail: str = "", *, thinking: bool = False) -> str:
    """``text`` as a later reader sees it under ``mark``: a truncated answer ends with
    ``[truncated at max_tokens]`` (``thinking``: it was cut while thinking, and is
    ``[truncated at max_tokens: cut while thinking]``; the thinking itself is never handed on);
    an empty one is ``[empty answer]``; a failed or cancelled one is ``[failed: detail]`` /
    ``[cancelled: detail]``; an answer (``ok``) is unchanged."""
    if outcome is Outcome.OK:
        return text
    if outcome is Outcome.TRUNCATED:
        mark = THINKING_MARK if thinking else TRUNCATED_MARK
        body = text.rstrip()
        return f"{body} {mark}" if body else mark
    if outcome is Outcome.EMPTY:
        return EMPTY_MARK
    return f"[{outcome.value}: {detail}]" if detail else f"[{outcome.value}]"


def fix_for(outcome: Outcome, agent: str, max_tokens: int | None = None, *, thinking: bool = False) -> str:
    """What to do about a non-answer of ``agent`` (a name, the fix names its setting; ``thinking``:
    the answer was cut while thinking)."""
    if outcome is Outcome.TRUNCATED:
        now = f" (now {max_tokens})" if max_tokens is not None else ""
        if thinking:
            return (f"it spent all of max_tokens{now} thinking: give agent '{agent}' a thinking_budget below "
                    "max_tokens, or raise max_tokens")
        return f"raise max_tokens of agent '{agent}'{now} or ask for a shorter answer"
    if outcome is Outcome.EMPTY:
        return f"check agent '{agent}''s instructions and prompt (the model said nothing)"
    return "see the error"
