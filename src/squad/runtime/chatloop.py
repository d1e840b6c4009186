"""The chat loop: a main agent in a conversation with a person, sub-agents by @mention.

:func:`chat_loop` reads lines, runs each as one main-agent turn (:meth:`Squad.run`: the
@mentioned sub-agents run at once and their answers are handed back), and prints the answer.
It is the library's loop; ``squad chat`` only wires it to the terminal.

- A line is the user's own text: its @mentions dispatch (:mod:`squad.runtime.mention`); answers,
  history and tool results never do. An unknown @mention is a warning with suggestions; the
  line runs with that mention as written, dispatching no one (:func:`squad.runtime.mention.quote_unknown`).
  A mention with nothing to do (``@security`` alone) is an error; the line is not run.
- An answer that stopped at max_tokens (or is empty) is followed by a warning with the fix.
- History is kept within half of the main agent's budget (tokens, counted exactly; an auto
  budget as the plan resolved it, :meth:`Squad.budget_of`): the oldest turns are dropped first, a whole user turn at a
  time (:func:`trim_history`).
- ``/quit`` or ``/exit`` (or end of input) ends the loop.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from squad.chat import ChatEngine
from squad.errors import AgentRunError, UserError
from squad.runtime.mention import parse_mentions, quote_unknown
from squad.runtime.outcome import fix_for
from squad.runtime.squad import Squad

__all__ = ["chat_loop", "trim_history", "HISTORY_SHARE"]


async def _read_line(read: Callable[[], str]) -> str:
    """``read()`` in a daemon thread. Cancelling the wait (Ctrl-C, SIGTERM at the prompt) ends
    it at once; the thread stays blocked in ``read()`` but, being a daemon, never keeps the
    process from exiting (an anyio worker thread would: the interpreter joins it at exit)."""
    token = anyio.lowlevel.current_token()
    done = anyio.Event()
    outcome: list[Any] = []

    def work() -> None:
        try:
            outcome.append(read())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting task
            outcome.append(exc)
        with contextlib.suppress(RuntimeError):  # the loop has ended: nobody waits any more
            anyio.from_thread.run_sync(done.set, token=token)

    threading.Thread(target=work, name="squad chat input", daemon=True).start()
    await done.wait()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]

HISTORY_SHARE = 0.5
"""The share of the main agent's budget its kept history may use (tokens)."""

Say = Callable[[str, str], None]
"""``say(kind, text)``: kind is ``answer``, ``warning``, ``error`` or ``info``."""


async def chat_loop(squad: Squad, read: Callable[[], str], say: Say) -> list[dict[str, Any]]:
    """Run the loop on an open ``squad``; ``read()`` returns the next line (raises EOFError at
    the end; it runs in a worker thread). Returns the history kept at the end."""
    main = squad.agents[squad.main]
    subs = squad._sub_names(main)  # noqa: SLF001 - the runtime's rule for who may be mentioned
    say("info", f"chat with {main.name}; sub-agents: {', '.join('@' + s for s in subs) or 'none'}; "
                f"engine {squad.info.slots} slots, context {squad.info.n_ctx}. /quit ends.")
    history: list[dict[str, Any]] = []
    limit = int(squad.context_limit(main) * HISTORY_SHARE)
    while True:
        try:
            line = await _read_line(read)
        except EOFError:
            break
        if line.strip() in ("/quit", "/exit"):
            break
        if not line.strip():
            continue
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 (read with surrogateescape)
            line = line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            say("warning", "the line had bytes that are not UTF-8 text; they were replaced with U+FFFD")
        unknown = parse_mentions(line, subs).unknown
        for mention in unknown:
            say("warning", f"{mention.message()}; not dispatched")
        if unknown:
            line = quote_unknown(line, subs)
        try:
            result = await squad.run(line, history=history)
        except UserError as exc:
            say("error", str(exc))
            continue
        except AgentRunError as exc:
            say("error", f"{type(exc).__name__}: {exc}")
            continue
        say("answer", result.output)
        if not result.outcome.is_answer:  # truncated or empty: never shown as if it were whole
            fix = fix_for(result.outcome, result.main.agent, result.main.max_tokens,
                          thinking=result.main.cut_while_thinking)
            say("warning", f"the answer is {result.outcome.value}: {fix}")
        history = await trim_history(squad.chat, result.history, limit)
    return history


async def trim_history(chat: ChatEngine, history: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """Drop the oldest user turns (a user message and what followed it) until ``history``
    counts at most ``limit`` tokens."""
    history = list(history)
    while history and await chat.count(history, None) > limit:
        cut = next((i for i, m in enumerate(history[1:], 1) if m.get("role") == "user"), len(history))
        history = history[cut:]
    return history
