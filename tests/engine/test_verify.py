"""The product page's verification procedure, and the launch commands of the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import pytest

from launch_support import THREADS, anyio_backend, model_file, server_bin, state_tmp, wait_gone  # noqa: F401
from squad.engine.control import attach
from squad.engine.launcher import Launcher
from squad.engine.verify import RequestTiming, VerifyReport, _checks, verify_engine
from squad.sched.planner import EnginePlan


def report(busy: int = 4, timings: list[tuple[float, float]] | None = None, n_ctx: int = 8192) -> VerifyReport:
    timings = timings or [(0.5, 2.0)] * 4
    r = VerifyReport(
        base_url="http://x",
        model="m",
        build_info="b",
        ctx_asked=8192,
        parallel=4,
        n_ctx=n_ctx,
        total_slots=4,
        max_busy_slots=busy,
        requests=[RequestTiming(i, first, done, 48) for i, (first, done) in enumerate(timings)],
    )
    r.checks = _checks(r)
    return r


def failed(r: VerifyReport) -> set[str]:
    return {c.name for c in r.checks if not c.ok}


def test_all_checks_pass_on_overlapping_requests():
    assert report().passed and len(report().checks) == 5


def test_serialized_requests_fail():
    serial = report(busy=1, timings=[(0.2, 0.5), (0.6, 1.0), (1.1, 1.5), (1.6, 2.0)])
    assert failed(serial) == {"max busy slots (/slots)", "every first token before any other request finished"}


def test_wrong_context_and_errors_fail():
    bad = report(n_ctx=4096)
    bad.requests[0].error = "APIError: Context size has been exceeded."
    bad.checks = _checks(bad)
    assert failed(bad) == {"/props n_ctx", "requests finished"}
    assert "Context size" in next(c.measured for c in bad.checks if c.name == "requests finished")


@pytest.mark.engine
@pytest.mark.anyio
async def test_one_slot_engine_fails_verification(server_bin, model_file, state_tmp):
    """Proof the check can fail: with 1 slot the engine serializes the requests."""
    plan = EnginePlan.simple(model_file, slots=1, n_ctx=2048)
    async with Launcher(plan, binary=server_bin, threads=THREADS) as engine:
        r = await verify_engine(engine.info, parallel=2, ctx=2048, max_tokens=8)
    assert not r.passed
    assert r.max_busy_slots == 1 and r.total_slots == 1
    assert "every first token before any other request finished" in failed(r)
    assert all(t.error is None and t.tokens == 8 for t in r.requests)


def squad(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "squad", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.engine
def test_squad_verify_passes_on_the_real_engine(server_bin, model_file, state_tmp):
    done = squad("verify", "--model", str(model_file), "--llama-server", str(server_bin), "-t", str(THREADS), "--json",
                 "--max-tokens", "24",
                 "--slots", "4", "-c", "8192")  # the same option names as run, plan, chat and engine start
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert out["passed"] and out["n_ctx"] == 8192 and out["total_slots"] == 4 and out["max_busy_slots"] == 4
    firsts = [r["first_token"] for r in out["requests"]]
    finishes = [r["finished"] for r in out["requests"]]
    assert max(firsts) < min(finishes)


def test_squad_verify_bad_model_is_a_clear_error(state_tmp):
    done = squad("verify", "--model", "/no/such/model.gguf")
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr
    assert "no model" in done.stderr


@pytest.mark.engine
def test_engine_start_status_stop(server_bin, model_file, state_tmp):
    env = {"SQUAD_STATE_DIR": str(state_tmp)}
    started = squad(
        "engine", "start", "--model", str(model_file), "--slots", "2", "--ctx", "1000",
        "--llama-server", str(server_bin), "-t", str(THREADS), env=env,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    record = json.loads((state_tmp / "engine.json").read_text())
    try:
        assert record["url"] in started.stdout.replace("\n", "")
        again = squad("engine", "start", "--model", str(model_file), env=env)
        assert again.returncode == 2 and "already runs" in again.stderr
        status = squad("engine", "status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert (info["slots"], info["n_ctx"], info["kv_unified"], info["busy_slots"]) == (2, 1024, True, 0)
        assert info["api_key"] is None  # never printed
        from squad.engine.binary import read_build_info

        built = read_build_info(server_bin)
        if built:  # squad's own build reports b0-unknown in /props; squad knows which sdist it built (issue 19)
            assert info["build_info"] == built["llama_cpp_tag"], info["build_info"]
            shown = squad("engine", "status", env=env)
            assert f"build        {built['llama_cpp_tag']}" in shown.stdout and "b0-unknown" not in shown.stdout
        by_url = squad("engine", "status", "--url", record["url"], "--json", env=env)
        assert by_url.returncode == 0, by_url.stderr  # the recorded key is used for that URL
        attached = anyio.run(attach, record["url"])
        assert (attached.slots, attached.n_ctx, attached.kv_unified) == (2, 1024, True)
        stopped = squad("engine", "stop", env=env)
        assert stopped.returncode == 0 and "stopped" in stopped.stdout
        assert wait_gone(record["pid"]) and not (state_tmp / "engine.json").exists()
    finally:
        if not wait_gone(record["pid"], timeout=0):
            os.kill(record["pid"], 9)
