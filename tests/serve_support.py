"""A real ``squad serve`` for the tests that point clients at it (serve APIs, release, peers, Claude Code)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from launch_support import THREADS
from squad.engine.process import free_port


@contextlib.contextmanager
def squad_serve(state: Path, key: str, llama_server: Path, model: Path, *, ctx: int = 2048,
                slots: int = 4, args: tuple[str, ...] = ()) -> Iterator[tuple[str, subprocess.Popen]]:
    """``squad serve -c CTX -np SLOTS -t THREADS [ARGS]`` on a free port with key ``key`` and state dir ``state``;
    yields ``(url, process)`` once ``/health`` is 200 (at most 120 s; its log in the assertion);
    stopped with SIGINT."""
    port = free_port()
    env = {**os.environ, "SQUAD_STATE_DIR": str(state), "SQUAD_SERVE_API_KEY": key,
           "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    log = open(state / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "squad", "serve", "--port", str(port), "-c", str(ctx),
                             "-np", str(slots), "-t", str(THREADS), "--llama-server", str(llama_server),
                             "-m", str(model), *args],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (state / "serve.log").read_text()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (state / "serve.log").read_text()
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.send_signal(2)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # still an error, but nothing is left running behind the test
            proc.kill()
            proc.wait(30)
            raise
        finally:
            log.close()


NPM_PREFIX = Path.home() / ".cache" / "squad" / "npm"
"""Where .ci/run installs the coding-agent CLIs from npm."""


def npm_cli(env_var: str, command: str, *candidates: Path) -> str | None:
    """A coding agent's CLI: ``$env_var``, else ``command`` on PATH, else the first of
    ``candidates`` (paths under :data:`NPM_PREFIX`) that exists; None when none is there."""
    found = os.environ.get(env_var) or shutil.which(command)
    if found:
        return found
    return next((str(c) for c in candidates if c.exists()), None)
