"""The typer application and the error boundary shared by every command module."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from squad.errors import EngineStartError, SquadError, UserError, leaf_errors

app = typer.Typer(
    name="squad",
    help=(
        "Run agents that share one local llama-server: squad plans slots and context for "
        "the work, launches the engine, and never sends it more than it can hold."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

console = Console()
err_console = Console(stderr=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``squad`` console script.

    Exit codes: 0 ok, 1 failure, 2 bad input (usage or a user mistake), 130 interrupted.
    User mistakes print one clear message, never a traceback.
    """
    try:
        app(args=argv)  # standalone: typer handles usage errors and exits
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        sys.exit(130)
    except SystemExit as exc:  # typer turns Ctrl-C into exit 130 after the engine was stopped
        if exc.code == 130:
            err_console.print("[yellow]interrupted[/]: agents cancelled, engine stopped")
        raise
    except SquadError as exc:
        sys.exit(_report(exc))
    except BaseExceptionGroup as group:  # a task group that let several errors out
        first = next((e for e in leaf_errors(group) if isinstance(e, SquadError)), None)
        if first is None:
            raise
        sys.exit(_report(first))


def _report(exc: SquadError) -> int:
    """Print a squad error for a person; return the exit code (2 = their input, 1 = failure)."""
    err_console.print("[red]error:[/] " + _escape(str(exc)))
    if isinstance(exc, EngineStartError) and exc.log_tail:
        err_console.print("[dim]--- engine log (last lines) ---[/]")
        err_console.print(_escape(exc.log_tail), highlight=False)
    return 2 if isinstance(exc, UserError) else 1


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
