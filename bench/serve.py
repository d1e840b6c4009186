"""squad serve: what its admission buys naive clients, and what the proxy costs.

(a) 8 naive clients at once (openai SDK, streaming, ~650 prompt tokens + ``max_tokens`` 48 with
    ``ignore_eos``) on ``-c 2048 -np 4``: directly to llama-server, then through ``squad serve``
    in front of the same engine. Completed/failed and the tokens each client received (a lone
    client with ``ignore_eos`` gets all 48).
(b1) The proxy's own added latency per request against a zero-latency fake upstream
    (``squad.testing.FakeEngine`` in a process of its own; squad serve in another): the median
    time of a streamed 4-token request through serve minus directly, at 1 and 64 concurrent
    streams (median of the repeats, target <= 2 ms).
(b2) Tokens/s of one streamed 64-token request through serve vs directly on the real engine
    (median of >= 5 repeats each, alternating).

    .venv/bin/python bench/serve.py [--repeats 5] [--out bench/serve-results.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import openai
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BINARY, MODEL, THREADS, fake_engine_process, free_port, md_table, spread  # noqa: E402

KEY = "bench-serve-key-0123456789abcdef"
SRC = str(Path(__file__).resolve().parents[1] / "src")


class ServeProcess:
    """``squad serve`` ARGS in a process of its own; ``url``, ``pid``; stopped with SIGTERM."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "SQUAD_SERVE_API_KEY": KEY, "PYTHONPATH": SRC}
        self.proc = subprocess.Popen([sys.executable, "-m", "squad", "serve", "--port", str(self.port), *args],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("squad serve exited")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("squad serve did not come up")
            time.sleep(0.2)
        self.pid = self.proc.pid

    def engine(self) -> tuple[str, str]:
        """(URL, key) of the llama-server behind it (read here only to go around it)."""
        url = httpx.get(self.url + "/squad/status", headers={"Authorization": f"Bearer {KEY}"}).json()["engine"]["url"]
        (child,) = [c for c in psutil.Process(self.pid).children(recursive=True) if "llama-server" in c.name()]
        return url, child.environ().get("LLAMA_API_KEY", "none")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def stream_once(client: openai.AsyncOpenAI, messages: list[dict], max_tokens: int, **extra) -> tuple[float, int]:
    """(seconds, completion tokens) of one streamed request."""
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(model="any", messages=messages, max_tokens=max_tokens, stream=True,
                                                  stream_options={"include_usage": True}, extra_body=extra or None)
    tokens = 0
    async for chunk in stream:
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return time.perf_counter() - t0, tokens


# --- (a) -----------------------------------------------------------------------------------------

async def naive_burst(base_url: str, key: str) -> list[str | int]:
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0, timeout=600) as client:
        got: list[str | int] = [0] * 8

        async def one(i: int) -> None:
            words = " ".join(f"w{i}x{k}" for k in range(120))
            try:
                got[i] = (await stream_once(client, [{"role": "user", "content": f"Repeat: {words}"}], 48,
                                            ignore_eos=True))[1]
            except openai.APIError as exc:
                got[i] = type(exc).__name__

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
        return got


def part_a() -> str:
    serve = ServeProcess("-c", "2048", "-np", "4", "-t", str(THREADS), "--llama-server", str(BINARY), "-m", str(MODEL))
    try:
        engine_url, engine_key = serve.engine()
        rows = []
        for way, url, key in (("direct", engine_url, engine_key), ("squad serve", serve.url, KEY)):
            t0 = time.monotonic()
            got = anyio.run(naive_burst, url, key)
            wall = time.monotonic() - t0
            done = [g for g in got if isinstance(g, int) and g == 48]
            rows.append([way, len(done), 8 - len(done), " ".join(str(g) for g in got), f"{wall:.1f}"])
    finally:
        serve.stop()
    return md_table(["way", "completed (48 tokens)", "failed or short", "tokens (or error) per client", "wall s"], rows)


# --- (b1) ----------------------------------------------------------------------------------------

async def latencies(base_url: str, key: str, concurrent: int, rounds: int) -> list[float]:
    """Seconds of each streamed 4-token request, ``concurrent`` at a time, ``rounds`` times."""
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0, timeout=60) as client:
        messages = [{"role": "user", "content": "one two three four"}]
        await stream_once(client, messages, 4)  # warm the connection pool
        out: list[float] = []

        async def one() -> None:
            out.append((await stream_once(client, messages, 4))[0])

        for _ in range(rounds):
            async with anyio.create_task_group() as tg:
                for _ in range(concurrent):
                    tg.start_soon(one)
        return out


async def part_b1(repeats: int) -> str:
    rows = []
    async with fake_engine_process(slots=64, n_ctx=64 * 256, model_path=str(MODEL)) as fake:
        serve = await anyio.to_thread.run_sync(lambda: ServeProcess("--url", fake))
        try:
            for concurrent, rounds in ((1, 50), (64, 5)):
                added, direct_med, served_med = [], [], []
                for _ in range(repeats):
                    d = statistics.median(await latencies(fake, "none", concurrent, rounds))
                    s = statistics.median(await latencies(serve.url, KEY, concurrent, rounds))
                    direct_med.append(d * 1000)
                    served_med.append(s * 1000)
                    added.append((s - d) * 1000)
                rows.append([concurrent, spread(direct_med), spread(served_med), spread(added),
                             "met" if statistics.median(added) <= 2.0 else "not met"])
        finally:
            await anyio.to_thread.run_sync(serve.stop)
    return md_table(["concurrent streams", "direct ms (median per request)", "through serve ms",
                     "added ms, median (min–max) of repeats", "target <= 2 ms"], rows)


# --- (b2) ----------------------------------------------------------------------------------------

def part_b2(repeats: int) -> str:
    serve = ServeProcess("-c", "2048", "-np", "1", "-t", str(THREADS), "--llama-server", str(BINARY), "-m", str(MODEL))
    try:
        engine_url, engine_key = serve.engine()

        async def rate(url: str, key: str) -> float:
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120) as client:
                seconds, tokens = await stream_once(client, [{"role": "user", "content": "Tell a story."}], 64,
                                                    ignore_eos=True, temperature=0)
                return tokens / seconds

        direct, served = [], []
        anyio.run(rate, engine_url, engine_key)  # warm up
        for i in range(repeats):
            pair = [("direct", engine_url, engine_key), ("serve", serve.url, KEY)]
            for way, url, key in (pair if i % 2 == 0 else pair[::-1]):
                (direct if way == "direct" else served).append(anyio.run(rate, url, key))
    finally:
        serve.stop()
    ratio = statistics.median(served) / statistics.median(direct)
    within = min(direct) <= statistics.median(served) <= max(direct)
    return md_table(["way", "tokens/s, median (min–max)", "serve / direct (medians)", "serve's median within the "
                     "direct runs' spread"],
                    [["direct", spread(direct, 1), "", ""],
                     ["through squad serve", spread(served, 1), f"{ratio:.3f}", "yes" if within else "no"]])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parts", default="a,b1,b2")
    args = parser.parse_args()
    parts = args.parts.split(",")
    print(f"## serve (issue 13)\n\nCommand: `.venv/bin/python bench/serve.py --repeats {args.repeats}`\n")
    if "a" in parts:
        print("### (a) 8 naive clients, ~650 prompt tokens + max_tokens 48 (ignore_eos), -c 2048 -np 4\n")
        print(part_a() + "\n")
    if "b1" in parts:
        print(f"### (b1) proxy added latency, zero-latency fake upstream, 4-token streams, {args.repeats} repeats\n")
        print(anyio.run(part_b1, args.repeats) + "\n")
    if "b2" in parts:
        print(f"### (b2) tokens/s of one 64-token stream, -np 1, {args.repeats} repeats each, alternating\n")
        print(part_b2(args.repeats) + "\n")


if __name__ == "__main__":
    main()
