"""Run the ``squad`` CLI in-process for tests: ``(exit code, stdout, stderr)``."""

from __future__ import annotations

from squad.cli import main


def squad(capsys, *argv: object) -> tuple[int, str, str]:
    """``squad ARGV...`` (each argument passed as ``str``) with pytest's ``capsys``."""
    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err
