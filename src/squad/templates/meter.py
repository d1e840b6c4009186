"""One render's account and the limits it is held to (:mod:`squad.templates.sandbox`).

A :class:`Meter` counts the steps, the values built and the characters written of one render,
set with :func:`metered`; each limit breached is a :class:`TemplateLimit` saying what the
template tried and the fix. :func:`flat_size` sizes a value without building its text.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["TemplateLimit", "Meter", "metered", "current_meter", "flat_size", "size_of", "as_int",
           "MAX_VALUE", "MAX_STEPS", "MAX_INT_DIGITS", "BUILT_FACTOR", "RENDER_SECONDS", "FIX"]

MAX_VALUE = 1_000_000
"""Characters (or list items) a template may build beyond the size of the data it was given."""

MAX_STEPS = 250_000
"""Steps one render may take (loop iterations, calls, operators, lookups, filter items)."""

MAX_INT_DIGITS = 4_300
"""Decimal digits an integer may reach in a template (Python's own int -> text limit)."""

BUILT_FACTOR = 10
"""All the values one render builds may hold this many times the single-value limit."""

RENDER_SECONDS = 2.0
"""The most CPU time (of the rendering thread, so a busy machine does not count) one render may
take; a backstop behind the limits above, far above what any template within them needs (a
10,000-line loop renders in ~0.1 s)."""

FIX = "build less in the template, or pass the text in as a parameter"


class TemplateLimit(Exception):
    """A template tried to build too much or take too long; the message says what and the fix."""


class Meter:
    """One render's account: ``steps`` taken, ``written`` characters of output, against
    ``max_steps``, ``max_chars`` and ``max_value`` (the largest value the template may build)."""

    def __init__(self, *, max_value: int = MAX_VALUE, max_chars: int | None = None,
                 max_steps: int = MAX_STEPS, why: str = "") -> None:
        self.max_value, self.max_steps = max_value, max_steps
        self.max_chars = max_value if max_chars is None else max_chars
        self.why = why
        self.steps = 0
        self.written = 0
        self.built = 0
        self.deadline = time.thread_time() + RENDER_SECONDS

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.max_steps:
            raise TemplateLimit(f"the template takes more than {self.max_steps:,} steps (loops, calls, lookups); "
                                "loop over less, or do the work outside the template")
        if time.thread_time() > self.deadline:
            raise TemplateLimit(f"the template still renders after {RENDER_SECONDS:g} s; loop over less, or do "
                                "the work outside the template")

    def check(self, size: int, what: str) -> None:
        """Refuse ``what`` when it would build ``size`` characters or items, above the limit;
        else count it as built."""
        if size > self.max_value:
            raise TemplateLimit(f"{what} would build {size:,} characters or items, more than the "
                                f"{self.max_value:,} a template may build; {FIX}")
        self.build(size)

    def build(self, size: int) -> None:
        """Count ``size`` characters or items built; refuse when the render has built too much."""
        self.built += size
        limit = BUILT_FACTOR * self.max_value
        if self.built > limit:
            raise TemplateLimit(f"the template builds more than {limit:,} characters or items in all; {FIX}")

    def write(self, size: int) -> None:
        self.written += size
        if self.written > self.max_chars:
            raise TemplateLimit(f"the template renders more than {self.max_chars:,} characters{self.why}; "
                                "shorten the text it renders")


_METER: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("squad_template_meter", default=None)


def current_meter() -> Meter:
    """The meter of the render in progress; outside one (jinja folding constants while it
    compiles) a fresh meter, so the value limits still hold."""
    return _METER.get() or Meter()


@contextlib.contextmanager
def metered(meter: Meter) -> Iterator[Meter]:
    """Count every render inside the ``with`` block on ``meter``."""
    token = _METER.set(meter)
    try:
        yield meter
    finally:
        _METER.reset(token)


def flat_size(value: Any, cap: int) -> int:
    """About how many characters ``str(value)`` has, computed without building it and without
    walking further than ``cap`` (returns a number above ``cap`` as soon as it knows it is).
    Lists, tuples, dicts and sets are walked (a list holding the same big string many times
    counts it each time); an integer counts its digits; other objects count 16."""
    total, stack = 0, [value]
    while stack and total <= cap:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += max(1, math.ceil(item.bit_length() / 3.32))
        elif isinstance(item, Mapping):
            total += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset, range)):
            total += 2 + 2 * len(item)
            if not isinstance(item, range):
                stack.extend(item)
        else:
            total += 16
    return total


def size_of(value: Any) -> int:
    """Shallow size of a built value: characters of a string, items of a collection, else 0."""
    if isinstance(value, (str, list, tuple, dict, set, frozenset)):
        return len(value)
    return 0


def as_int(value: Any) -> int | None:
    """``value`` when it is an int, else None."""
    return int(value) if isinstance(value, int) else None
