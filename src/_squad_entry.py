"""The ``squad`` console script's entry point, outside the ``squad`` package so that not even the
package's own ``__init__`` runs before the early Ctrl-C/SIGTERM handlers are in place
(:mod:`squad._entry` says what they do)."""

from __future__ import annotations

import os
import signal
import sys


def _early(signum: int, frame: object) -> None:
    try:
        sys.stderr.write("terminated (SIGTERM)\n" if signum == signal.SIGTERM else "interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(128 + signum)


_early.squad_early = True  # type: ignore[attr-defined]


def main() -> None:
    """Install the early handlers, then run :func:`squad._entry.main` (which keeps them until
    the command line is imported)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _early)
    from squad._entry import main as run

    run()
