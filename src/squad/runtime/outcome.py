"""What an agent conversation produced: an answer, or one of the non-answers (field case F11).

Every place a result is shown or passed on uses :class:`Outcome`: agent results
(:attr:`squad.runtime.results.AgentResult.outcome`), the ``agent.finished`` event, recipe steps, the
``squad run`` table, the live view and ``squad trace show``.

==============  ==================================================================  ==========
outcome         what happened                                                       flows on
==============  ==================================================================  ==========
``ok``          the model ended its answer itself (``finish_reason`` ``stop``)      as is
``truncated``   the call stopped at ``max_tokens`` (``finish_reason`` ``length``):  ``mark``
                the text is the first part of an answer                             (default)
``empty``       the call finished without any answer text                           ``mark``
                                                                                    (default)
``failed``      the conversation failed with an error (no answer)                   ``fail``
``cancelled``   it was cancelled (a failed sibling, ``Squad.cancel``)                ``fail``
==============  ==================================================================  ==========

How a truncated or empty answer flows on to whatever uses it next is one :data:`Handling`:

- ``accept``: the text as it is; asked for deliberately, e.g. a recipe that uses
  ``max_tokens`` as a length limit;
- ``mark`` (the default): the text with a visible mark at its end (:func:`marked`):
  ``"... [truncated at max_tokens]"``, ``"[empty answer]"``;
- ``fail``: it counts as a failure, an :class:`~squad.errors.IncompleteAnswer` error on the
  result (``Squad.run(..., fail_on=...)``), so the failure rules apply.

A failed or cancelled conversation always counts as a failure (``fail``): a later recipe step
that uses its output fails, a parallel block's policy (``collect``/``fail-fast``) decides
its siblings, ``squad run`` exits 1; where its place is shown among others (a block's or
map's joined output, answers handed back to a main agent, an ``ask_<name>`` tool result)
it appears as its mark, ``[failed: why]`` or ``[cancelled: why]``, never as nothing.

Recipes choose per step with ``non_answers: {truncated: ..., empty: ...}`` (recipe-wide
and per step, :mod:`squad.recipes.spec`); answers handed back to a main agent and
``ask_<name>`` tool results are always marked. Not to be confused with a hand-back's
``[cut: N tokens omitted]`` (:mod:`squad.runtime.handback`: squad shortened a finished answer to fit
a budget) or with :class:`~squad.errors.TruncatedStream` (the stream broke off: a failure).
"""

from __future__ import annotations

from enum import Enum
from typing import Iterable, Literal, Mapping

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


def marked(outcome: Outcome, text: str, detail: str = "") -> str:
    """``text`` as a later reader sees it under ``mark``: a truncated answer ends with
    ``[truncated at max_tokens]``; an empty one is ``[empty answer]``; a failed or cancelled
    one is ``[failed: detail]`` / ``[cancelled: detail]``; an answer (``ok``) is unchanged."""
    if outcome is Outcome.OK:
        return text
    if outcome is Outcome.TRUNCATED:
        body = text.rstrip()
        return f"{body} {TRUNCATED_MARK}" if body else TRUNCATED_MARK
    if outcome is Outcome.EMPTY:
        return EMPTY_MARK
    return f"[{outcome.value}: {detail}]" if detail else f"[{outcome.value}]"


def fix_for(outcome: Outcome, agent: str, max_tokens: int | None = None) -> str:
    """What to do about a non-answer of ``agent`` (a name, the fix names its setting)."""
    if outcome is Outcome.TRUNCATED:
        now = f" (now {max_tokens})" if max_tokens is not None else ""
        return f"raise max_tokens of agent '{agent}'{now} or ask for a shorter answer"
    if outcome is Outcome.EMPTY:
        return f"check agent '{agent}''s instructions and prompt (the model said nothing)"
    return "see the error"
