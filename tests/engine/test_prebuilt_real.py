"""The prebuilt engine (xllamacpp, llama.cpp b11549) against the source build (b11434), both real.

The whole real-engine suite also runs on the prebuilt engine (``SQUAD_ENGINE=prebuilt``, as
.ci/run does); this file pins, on the prebuilt engine itself, the endpoints squad reads
(``/props``, ``/slots``, ``/metrics``, ``/v1/chat/completions/input_tokens``, the 401 for a
wrong key, the error shape of a prompt above the slot context), and, with both engines, that
they report the same for the same plan and count every corpus chat alike (the source build's
own real test: .ci/run builds it when it is not cached).
"""

from __future__ import annotations

import os

import httpx
import pytest

from launch_support import THREADS
from squad.engine import binary
from squad.engine.binary import prebuilt_server_path
from squad.engine.launcher import Launcher
from squad.sched.plan import EnginePlan
from token_corpus import chats

pytestmark = [pytest.mark.engine, pytest.mark.anyio]


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _need(path, what: str, fix: str, *, in_ci: bool = True):
    if path is not None and os.access(path, os.X_OK):
        return path
    if os.environ.get("CI") and in_ci:
        pytest.fail(f"CI must test the {what}; to fix: {fix}", pytrace=False)
    pytest.skip(f"no {what}; to fix: {fix}")


@pytest.fixture(scope="module")
def prebuilt():
    return _need(prebuilt_server_path(), "prebuilt engine", "pip install -e '.[prebuilt]'")


@pytest.fixture(scope="module")
def source_build():
    # CI's pass on the prebuilt engine may come before the source build exists; its SQUAD_ENGINE=source
    # pass (.ci/run) must not skip this
    return _need(binary.cached_binary_path(), "source build", "squad engine install --build",
                 in_ci=os.environ.get("SQUAD_ENGINE", "").lower() == "source")


def _headers(info) -> dict[str, str]:
    return {"Authorization": f"Bearer {info.api_key}"}


@pytest.mark.timeout(300)
async def test_prebuilt_answers_what_squad_reads_like_llama_server(prebuilt, default_model_path):
    plan = EnginePlan.simple(default_model_path, slots=4, n_ctx=1000)
    async with Launcher(plan, binary=prebuilt, threads=THREADS) as engine:
        info = engine.info
        assert (info.slots, info.n_ctx, info.pool, info.n_ctx_train) == (4, 1024, 1024, 8192)  # unified: n_ctx = pool
        assert info.kind == "llama.cpp"
        async with httpx.AsyncClient(base_url=info.base_url, headers=_headers(info), timeout=60) as http:
            slots = (await http.get("/slots")).json()
            assert [s["id"] for s in slots] == [0, 1, 2, 3]
            assert all(s["n_ctx"] == 1024 and s["is_processing"] is False for s in slots)
            metrics = (await http.get("/metrics")).text
            assert "llamacpp:requests_processing" in metrics and "llamacpp:requests_deferred" in metrics
            body = {"messages": [{"role": "user", "content": "hi there"}]}
            counted = (await http.post("/v1/chat/completions/input_tokens", json=body)).json()
            assert counted["input_tokens"] > 0
            wrong = await http.get("/props", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
            assert (await http.get("/health", headers={})).status_code == 200
            long = {"messages": [{"role": "user", "content": "word " * 1500}], "max_tokens": 8}
            r = await http.post("/v1/chat/completions", json=long)
            assert r.status_code == 400
            error = r.json()["error"]
            assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == 1024
            assert "exceeds the available context size" in error["message"]


@pytest.mark.timeout(900)
async def test_source_build_and_prebuilt_agree(prebuilt, source_build, default_model_path):
    """Same plan on both: the same slots and context read back, and every corpus chat counted alike
    by ``/v1/chat/completions/input_tokens`` (what squad's exact counter is proven against)."""
    plan = EnginePlan.simple(default_model_path, slots=2, n_ctx=3000)
    seen = {}
    for name, path in (("source", source_build), ("prebuilt", prebuilt)):
        async with Launcher(plan, binary=path, threads=THREADS) as engine:
            info = engine.info
            counts = {}
            async with httpx.AsyncClient(base_url=info.base_url, headers=_headers(info), timeout=120) as http:
                for chat, (messages, tools) in chats().items():
                    body: dict = {"messages": messages, **({"tools": tools} if tools else {})}
                    r = await http.post("/v1/chat/completions/input_tokens", json=body)
                    assert r.status_code == 200, (name, chat, r.text[:300])
                    counts[chat] = r.json()["input_tokens"]
            seen[name] = (info.slots, info.n_ctx, info.pool, info.n_ctx_train, counts)
    assert seen["source"][:4] == seen["prebuilt"][:4] == (2, 3072, 3072, 8192)
    differ = {c: (n, seen["prebuilt"][4][c]) for c, n in seen["source"][4].items() if seen["prebuilt"][4][c] != n}
    assert not differ, differ
