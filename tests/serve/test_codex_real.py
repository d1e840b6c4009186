"""Codex CLI (npm ``@openai/codex``) runs one non-interactive task (``codex exec``) through
``squad serve``'s Responses API, on the real engine with SmolLM2-135M: a custom model provider
(``wire_api = "responses"``, ``base_url`` squad serve's ``/v1``, the key from an environment
variable) given with ``-c`` overrides, ``CODEX_HOME`` a fresh directory.

The binary: ``$SQUAD_CODEX``, else ``codex`` on PATH, else the one ``.ci/run`` installs under
``~/.cache/squad/npm`` (``npm install @openai/codex``: a Node launcher and the platform
package's native binary). Skipped when none is found."""

from __future__ import annotations

import os
import subprocess
import time

import httpx
import pytest

from serve_support import NPM_PREFIX, npm_cli, squad_serve

pytestmark = pytest.mark.engine

KEY = "codex-test-key-0123456789abcdef"


def codex_binary() -> str | None:
    return npm_cli("SQUAD_CODEX", "codex", NPM_PREFIX / "node_modules" / "@openai" / "codex" / "bin" / "codex.js")


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama_server_path, default_model_path):
    """``squad serve -c 8192 -np 2 -t THREADS`` on a free port: its URL."""
    state = tmp_path_factory.mktemp("state")
    with squad_serve(state, KEY, llama_server_path, default_model_path, ctx=8192, slots=2) as (url, _):
        yield url


@pytest.mark.timeout(600)
def test_codex_exec_runs_a_task_through_serve(served, tmp_path):
    binary = codex_binary()
    if binary is None:
        pytest.skip("Codex CLI is not installed: npm install --prefix ~/.cache/squad/npm @openai/codex")
    url = served
    work, home = tmp_path / "work", tmp_path / "codex-home"
    work.mkdir()
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "CODEX_HOME": str(home),
           "SQUAD_SERVE_KEY": KEY}
    provider = (f'{{name = "squad serve", base_url = "{url}/v1", env_key = "SQUAD_SERVE_KEY", '
                f'wire_api = "responses"}}')
    argv = [binary] if not binary.endswith(".js") else ["node", binary]
    answer = tmp_path / "answer.txt"
    argv += ["exec", "--skip-git-repo-check", "--ephemeral", "-c", "model_provider=squad",
             "-c", f"model_providers.squad={provider}", "-m", "local", "-o", str(answer),
             "Say hello in one short sentence."]
    done = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          check=False, timeout=540)
    status = httpx.get(url + "/squad/status", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], status["clients"])
    assert answer.exists() and answer.read_text().strip(), (done.stdout[-2000:], done.stderr[-2000:])
    # Codex exits once it has read response.completed, which can be before squad serve has read the
    # engine's stream to its end and counted the request (seen in CI: requests 1, completed 0, failed 0):
    # the books are read again until no request of it is live (10 s at most)
    deadline = time.monotonic() + 10
    while True:
        counts = list(status["clients"].values())
        if sum(c["requests"] - c["completed"] - c["failed"] - c["refused"] - c.get("disconnected", 0)
               for c in counts) <= 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
        status = httpx.get(url + "/squad/status", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()
    answered = sum(c["completed"] + c.get("disconnected", 0) for c in counts)  # a client leaving after its answer
    assert answered >= 1 and sum(c["failed"] for c in counts) == 0, status["clients"]
