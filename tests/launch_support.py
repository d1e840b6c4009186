"""Fixtures shared by the launcher, remote and verify tests (import them into a test module).

They prefer the session fixtures ``llama_server_path`` / ``default_model_path`` from
``conftest.py`` and fall back to the paths where the engine and model are placed by hand.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil
import pytest

from squad.engine.build import usable_cores

_FALLBACK_BIN = Path.home() / ".cache/squad/engine/b11434/bin/llama-server"
_FALLBACK_MODEL = Path.home() / ".cache/squad/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def _from_conftest(request: pytest.FixtureRequest, name: str, fallback: Path) -> Path:
    try:
        return Path(request.getfixturevalue(name))
    except pytest.FixtureLookupError:
        if not fallback.is_file():
            pytest.skip(f"{fallback} missing: install the engine and model first")
        return fallback


@pytest.fixture(scope="session")
def server_bin(request: pytest.FixtureRequest) -> Path:
    return _from_conftest(request, "llama_server_path", _FALLBACK_BIN)


@pytest.fixture(scope="session")
def model_file(request: pytest.FixtureRequest) -> Path:
    return _from_conftest(request, "default_model_path", _FALLBACK_MODEL)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=False)
def state_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private SQUAD_STATE_DIR so pid files and logs of one test do not meet another's."""
    monkeypatch.setenv("SQUAD_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout: float = 15.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if gone(pid):
            return True
        time.sleep(0.1)
    return gone(pid)


def _threads() -> int:
    """CPU threads per engine in the tests: the usable cores shared among pytest-xdist's workers. llama.cpp's threads
    spin at each operation's barrier, so two engines of 2 threads each on 2 cores wait on one another's time slices
    at every step (measured: bench/threads.py); one thread each keeps both cores busy without that."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    return max(1, min(4, usable_cores() // workers))


THREADS = _threads()


_SIZE = re.compile(r"llama_kv_cache: size =\s*([0-9.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers")


def engine_kv_bytes(log: str) -> tuple[int, list[tuple[int, int]]]:
    """Bytes of every ``llama_kv_cache: size = X MiB (N cells, L layers, ...)`` line in ``log``
    (one line per cache: a sliding-window model has two) and their (cells, layers)."""
    found = _SIZE.findall(log)
    total = sum(round(float(mib) * 2**20) for mib, _, _ in found)
    return total, [(int(cells), int(layers)) for _, cells, layers in found]
