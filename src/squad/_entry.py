"""The ``squad`` console script's first code: Ctrl-C and SIGTERM are handled before the command
line's imports (about a second on a busy machine), so an early interrupt exits 130 (143 for
SIGTERM) with one line instead of a traceback from inside an import. Nothing has started yet
then (no engine, no child process), so there is nothing to stop."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

__all__ = ["main"]


def _early(signum: int, frame: Any) -> None:
    """SIGINT/SIGTERM while the command line is still importing: say so and leave at once."""
    terminated = signum == signal.SIGTERM
    try:
        sys.stderr.write("terminated (SIGTERM)\n" if terminated else "interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(128 + signum)


_early.squad_early = True  # type: ignore[attr-defined]  # squad.cli._app.main hands Ctrl-C back to Python


def main(argv: list[str] | None = None) -> None:
    """Install the early handlers, import the command line, run it (:func:`squad.cli.main`)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            current = signal.getsignal(sig)
            if current is not signal.SIG_IGN and not getattr(current, "squad_early", False):  # an ignored signal
                signal.signal(sig, _early)  # stays ignored (a background job); the console script's stays
        except ValueError:  # not the main thread: an embedding caller's signals stay theirs
            break
    from squad.cli import main as run

    run(argv)
