"""Run the ``squad`` CLI in-process for tests: ``(exit code, stdout, stderr)``; fixtures ``state``
(a fresh state directory) and ``engine`` (a fake llama-server) for ``--url`` runs: import them."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from squad.cli import main
from squad.testing import FakeEngine


def squad(capsys, *argv: object) -> tuple[int, str, str]:
    """``squad ARGV...`` (each argument passed as ``str``) with pytest's ``capsys``."""
    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    """A fresh squad state directory (``SQUAD_STATE_DIR``) for a CLI run."""
    path = tmp_path / "state"
    monkeypatch.setenv("SQUAD_STATE_DIR", str(path))
    return path


@pytest.fixture
def engine():
    """A fake llama-server over HTTP (2 slots, 4,096 tokens) for ``squad ... --url`` runs."""
    fe = FakeEngine(slots=2, n_ctx=4096)
    anyio.run(fe.start)
    yield fe
    anyio.run(fe.stop)
