"""Shared parts of the benchmarks: the engine and model, a hand-started llama-server, the raw
``openai`` + anyio baseline, statistics and markdown tables. Not part of the squad package."""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
from openai import AsyncOpenAI

HOME = Path.home()
BINARY = Path(os.environ.get("SQUAD_BENCH_BINARY", HOME / ".cache/squad/engine/b11434/bin/llama-server"))
MODEL = Path(os.environ.get("SQUAD_BENCH_MODEL", HOME / ".cache/squad/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
THREADS = int(os.environ.get("SQUAD_BENCH_THREADS", "2"))

TOPICS = [
    "a lighthouse keeper", "a lost robot", "a river in winter", "a bakery at dawn",
    "an old map", "a city under rain", "a chess player", "a garden on a roof",
    "a night train", "a broken clock", "a desert well", "a mountain radio",
]


def story_prompt(i: int) -> str:
    """A short, distinct prompt that makes the model write until max_tokens."""
    return f"Write a long, detailed story about {TOPICS[i % len(TOPICS)]}."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> Callable[[], None] | None:
    """Linux: the engine gets SIGKILL when this process dies (squad's launcher does the same)."""
    try:
        from squad.engine.process import _pdeathsig_preexec
    except ImportError:
        return None
    return _pdeathsig_preexec()


# SIGTERM (e.g. `kill` or a timeout) unwinds like Ctrl-C, so hand-started engines are stopped.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


@dataclass
class HandEngine:
    """A llama-server started by hand (plain subprocess) for a baseline."""

    base_url: str
    api_key: str
    proc: subprocess.Popen
    ready_s: float
    argv: list[str]
    slots: int
    """``total_slots`` read back from ``/props``."""
    n_ctx: int
    """``default_generation_settings.n_ctx`` read back from ``/props`` (per slot; with unified KV the pool)."""


DEFAULTS_ARGS = ["-m", str(MODEL)]
"""llama-server as users start it: only the model (plus host, port and threads like every hand
engine). b11434 then picks its own slot count and context; read them back, never assume them."""


def defaults_label(engine: HandEngine) -> str:
    """The engine column for the llama-server defaults way: what it read back."""
    return f"defaults (read back: {engine.slots} slots, n_ctx {engine.n_ctx})"


def hand_argv(server_args: Sequence[str], port: int) -> list[str]:
    """The exact command line a user would type: binary, plan flags, host/port, threads."""
    return [str(BINARY), *server_args, "--host", "127.0.0.1", "--port", str(port), "-t", str(THREADS)]


@contextlib.asynccontextmanager
async def hand_engine(server_args: Sequence[str], *, timeout: float = 120.0) -> AsyncIterator[HandEngine]:
    """Start ``llama-server`` with ``server_args`` by hand; ready when ``/health`` is 200."""
    port = free_port()
    key = secrets.token_hex(8)
    argv = hand_argv(server_args, port)
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "LLAMA_API_KEY": key}, preexec_fn=_die_with_parent())
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as http:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {proc.returncode}: {' '.join(argv)}")
                try:
                    if (await http.get(base + "/health", timeout=1.0)).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - started > timeout:
                    raise RuntimeError("llama-server not ready in time")
                await anyio.sleep(0.02)
            ready_s = time.monotonic() - started
            props = (await http.get(base + "/props", headers={"Authorization": f"Bearer {key}"}, timeout=10.0)).json()
        yield HandEngine(base, key, proc, ready_s, argv, slots=int(props["total_slots"]),
                         n_ctx=int(props["default_generation_settings"]["n_ctx"]))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_FAKE_SERVER = """
import sys, anyio
from squad.testing import FakeEngine
async def main():
    fe = FakeEngine(slots=int(sys.argv[1]), n_ctx=int(sys.argv[2]), model_path=sys.argv[3],
                    token_delay=float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
    await fe.start()
    print(fe.base_url, flush=True)
    await anyio.to_thread.run_sync(sys.stdin.read)  # until the bench closes our stdin (or dies)
    await fe.stop()
anyio.run(main)
"""


@contextlib.asynccontextmanager
async def fake_engine_process(slots: int, n_ctx: int, model_path: str, token_delay: float = 0.0) -> AsyncIterator[str]:
    """``squad.testing.FakeEngine`` in a process of its own (so its CPU does not share this
    process's GIL with what is measured); yields its base URL; stopped when the block ends.
    ``token_delay``: seconds before each generated token."""
    proc = subprocess.Popen([sys.executable, "-c", _FAKE_SERVER, str(slots), str(n_ctx), model_path, str(token_delay)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=_die_with_parent())
    try:
        assert proc.stdout is not None
        base = (await anyio.to_thread.run_sync(proc.stdout.readline)).strip()
        if not base.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"the fake engine did not start: {base!r}")
        yield base
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@dataclass
class CallResult:
    """One call seen from the fan-out start ``t0``: seconds to first token and to the end."""

    ttft_s: float | None = None
    end_s: float | None = None
    tokens: int = 0
    error: str | None = None


async def raw_call(client: AsyncOpenAI, prompt: str, max_tokens: int, t0: float) -> CallResult:
    """One streaming chat call with the plain openai SDK, as users write it."""
    out = CallResult()
    try:
        stream = await client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and out.ttft_s is None:
                out.ttft_s = time.monotonic() - t0
            if chunk.usage is not None:
                out.tokens = chunk.usage.completion_tokens
    except Exception as exc:  # noqa: BLE001 - a failure is a measurement here
        out.error = f"{type(exc).__name__}: {exc}"
    out.end_s = time.monotonic() - t0
    return out


def raw_client(base_url: str, api_key: str, *, retries: int = 0) -> AsyncOpenAI:
    """A plain openai client for the engine at ``base_url`` (no SDK retries unless ``retries``: the SDK's own
    retry of a connection error or a 5xx, which a loaded machine needs, as squad's client retries them too)."""
    return AsyncOpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=retries, timeout=600)


async def raw_fanout(
    base_url: str, api_key: str, prompts: Sequence[str], max_tokens: int, *, client: AsyncOpenAI | None = None
) -> tuple[float, list[CallResult]]:
    """All prompts at once with ``openai`` + an anyio task group (naive gather): (wall s, results).

    Pass ``client`` to reuse one (its connection pool) across runs; else one is made and closed."""
    own = client is None
    client = client or raw_client(base_url, api_key)
    results: list[CallResult] = [CallResult() for _ in prompts]
    t0 = time.monotonic()

    async def one(i: int) -> None:
        results[i] = await raw_call(client, prompts[i], max_tokens, t0)

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    wall = time.monotonic() - t0
    if own:
        await client.close()
    return wall, results


def pct(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1), linear between closest ranks; None without values."""
    ordered = sorted(values)
    if not ordered:
        return None
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def spread(values: Sequence[float], digits: int = 2) -> str:
    """``median (min–max)`` of repeated measurements; just the value for one; ``-`` for none."""
    if not values:
        return "-"
    if len(values) == 1:
        return fmt(values[0], digits)
    return f"{fmt(statistics.median(values), digits)} ({fmt(min(values), digits)}–{fmt(max(values), digits)})"


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Per-repeat ratios of paired measurements (repeat i of one way over repeat i of the other)."""
    return [a / b for a, b in zip(numerators, denominators) if b]


def against(value: float | None, target: float) -> str:
    """``met`` when ``value`` <= ``target``; ``not met`` otherwise; ``no data`` without a value."""
    if value is None:
        return "no data"
    return "met" if value <= target else "not met"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def engine_build() -> str:
    """``build_info`` as the binary reports it (``--version``)."""
    try:
        out = subprocess.run([str(BINARY), "--version"], capture_output=True, text=True, timeout=30)
        text = (out.stdout + out.stderr).strip().splitlines()
        return "; ".join(line for line in text if "version" in line or "built" in line) or "unknown"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"


def machine_info() -> dict[str, str]:
    """CPU, cores, memory, OS, python and engine build of this machine."""
    import psutil

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": f"{psutil.cpu_count(logical=False)} physical / {psutil.cpu_count()} logical",
        "memory": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "llama.cpp": engine_build(),
        "binary": str(BINARY),
        "model": f"{MODEL.name} ({MODEL.stat().st_size if MODEL.exists() else '?'} bytes)",
        "threads": str(THREADS),
    }
