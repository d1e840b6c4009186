"""``squad engine start``: ``squad serve`` left running in the background (field case F20).

Every ``squad run --url`` (and any other client) that uses the started engine then goes through
one admission: requests running together never exceed its slots or its KV pool, whichever
process sends them. The serve process owns the engine (stopping it, with ``squad engine stop``
or SIGTERM, stops the engine too). Its key travels in the environment
(``SQUAD_SERVE_API_KEY``), never argv.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from squad import children
from squad.dirs import open_private, private_dir, state_dir
from squad.engine.control import control_client, squad_serve_status, wait_healthy
from squad.engine.launcher import default_load_timeout
from squad.engine.process import free_port, listens, log_tail, port_in_use
from squad.errors import EngineError, EngineStartError, UserError

__all__ = ["Background", "start_background"]

KEY_VAR = "SQUAD_SERVE_API_KEY"


@dataclass(frozen=True)
class Background:
    """A detached ``squad serve``: ``url`` (no ``/v1``), ``api_key``, ``pid``, ``log_path``."""

    url: str
    api_key: str
    pid: int
    log_path: Path


async def start_background(model: Path, *, slots: int, ctx: int, port: int | None = None,
                           binary: Path | str | None = None, threads: int | None = None,
                           load_timeout: float | None = None,
                           progress: Callable[[float, float], None] | None = None) -> Background:
    """Start ``squad serve`` for ``model`` with ``slots`` and ``ctx`` pinned, detached, on
    ``127.0.0.1:port`` (None: a free one); return once it answers ``/health``.

    Raises what the serve process reported when it exited first (:class:`UserError` for its
    exit status 2, else :class:`EngineStartError` with its log tail), or
    :class:`~squad.errors.EngineLoadTimeout`.
    """
    port = port or free_port()
    if port_in_use(port):  # never report another program's server as ours (F15)
        raise UserError(f"port {port} on 127.0.0.1 is in use by another program: pass another --port, or none so "
                        "squad picks a free one")
    key = secrets.token_urlsafe(24)
    argv = [sys.executable, "-m", "squad", "serve", "--port", str(port), "--model", str(model), "--slots", str(slots),
            "--ctx", str(ctx)]
    if binary is not None:
        argv += ["--llama-server", str(binary)]
    if threads is not None:
        argv += ["-t", str(threads)]
    if load_timeout is not None:
        argv += ["--load-timeout", str(load_timeout)]
    logs = private_dir(state_dir() / "logs")
    log_path = logs / f"squad-serve-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"
    env = {**os.environ, KEY_VAR: key}
    env.pop("LLAMA_API_KEY", None)  # the engine serve launches gets its own
    with open_private(log_path, "ab") as log:  # 0600 in 0700: serve's output is the owner's only
        proc = children.start(argv, stdout=log, stderr=subprocess.STDOUT, env=env, detached=True)
    url = f"http://127.0.0.1:{port}"

    def check_alive() -> None:
        if proc.poll() is not None:
            children.release(proc)
            raise _exited(proc.returncode, log_path)

    try:
        limit = (load_timeout if load_timeout is not None else default_load_timeout(model)) + 30
        async with control_client(url, key) as client:
            await wait_healthy(client, timeout=limit, check_alive=check_alive,
                               progress=(lambda elapsed: progress(elapsed, limit)) if progress else None)
            if listens(proc.pid, port) is False or await squad_serve_status(client) is None:
                raise EngineStartError(f"port {port} on 127.0.0.1 is in use by another program: a server answered "
                                       f"there, but not the squad serve started (pid {proc.pid}); pass another "
                                       "--port, or none so squad picks a free one")
    except BaseException:
        with anyio.CancelScope(shield=True):
            await children.stop(proc, children.GRACE)  # serve stops the engine it started
        raise
    children.let_go(proc)
    return Background(url=url, api_key=key, pid=proc.pid, log_path=log_path)


def _exited(status: int, log_path: Path) -> EngineError | UserError:
    tail = log_tail(log_path)
    said = [line.split("error:", 1)[1].strip() for line in tail.splitlines() if line.startswith("error:")]
    message = said[-1] if said else f"squad serve exited with status {status} before it was ready; log: {log_path}"
    message = re.sub(r"\s+", " ", message)
    if status == 2:
        return UserError(message)
    return EngineStartError(message, log_tail="" if said else tail, log_path=str(log_path))
