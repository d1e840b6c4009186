"""squad serve: what its admission buys naive clients, and what the proxy costs.

(a) 8 naive clients at once (openai SDK, streaming, ~650 prompt tokens + ``max_tokens`` 48 with
    ``ignore_eos``) on ``-c 2048 -np 4``: directly to llama-server, then through ``squad serve``
    in front of the same engine. Completed/failed and the tokens each client received (a lone
    client with ``ignore_eos`` gets all 48).
(cost) What squad serve itself costs, measured side by side in one run, direct and through serve
    taking turns within each repeat:
    - tokens/s on the real engine (``-c 4096 -np 4 --kv-unified``, squad serve attached with
      ``--url``): 1 stream and 4 streams at once, 64 tokens each (``ignore_eos``);
    - latency squad serve adds at 1, 16 and 64 concurrent streams, against the fake engine
      (``squad.testing.FakeEngine`` in a process of its own, 5 ms per token, 16 tokens): time to
      first token, and the gap between two chunks (each request's mean gap).
    Targets (issue 22): tokens/s >= 0.98 of direct, <= 2 ms added at 64 streams. The machine's
    load average is printed with the tables: on a shared machine, read the figures with it.
(stall) No client can stall another (issue 28): a small streamed request's time to first token
    through squad serve (the fake engine, the real model's tokenizer counting) alone, and while
    another client sends, again and again, a 50 MB body (refused 413 by its Content-Length), a
    30 MB valid chat body (read and parsed off the event loop, refused 400: its length alone cannot
    fit) or a 3 MB one (also tokenized, in a worker thread, then refused 400: too long for the
    context). Target: within 1.2x of alone.
(fair) Two clients on one engine (issue 30; the real engine, ``--slots 2 --ctx 2048``, each client its own key):
    one floods 12 sub-agent requests of one program (``X-Squad-Priority: -1000``, the best it may ask), the other
    sends one main request once the flood is queued; and the main request alone. Queue wait
    (``X-Squad-Queued-Ms``) p50/p95 per client over the repeats, and the requests of the flood admitted while the
    main request waited (``X-Squad-Passed``). Target (squad.serve.shares): 0 passed, the main request's wait within
    one running request's end, far below the flood's.

    .venv/bin/python bench/serve.py [--repeats 5] [--parts a,cost,stall,fair]
"""

from __future__ import annotations

import argparse
import json
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
from _common import BINARY, MODEL, THREADS, fake_engine_process, free_port, hand_engine, md_table, spread

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
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:  # still counting a large body in a worker thread
            self.proc.kill()
            self.proc.wait()


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


# --- (cost) --------------------------------------------------------------------------------------

async def timed_stream(http: httpx.AsyncClient, url: str, key: str, max_tokens: int,
                       **extra) -> tuple[float, list[float], int]:
    """One streamed chat request read as raw SSE lines (no SDK, so the client's own CPU stays
    small and equal for both ways): (seconds to the first content chunk, arrival times of the
    content chunks from the request's start, completion tokens from the usage chunk)."""
    body = {"model": "any", "messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, **extra}
    t0 = time.perf_counter()
    arrivals: list[float] = []
    tokens = 0
    async with http.stream("POST", url + "/v1/chat/completions", json=body,
                           headers={"Authorization": f"Bearer {key}"}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and (chunk["choices"][0].get("delta") or {}).get("content"):
                arrivals.append(time.perf_counter() - t0)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if not arrivals:
        raise RuntimeError("no content chunk")
    return arrivals[0], arrivals, tokens


async def resent_once(http: httpx.AsyncClient, url: str, key: str, max_tokens: int, **extra) -> tuple[float,
                                                                                                      list[float], int]:
    """timed_stream, sent once more when the server closed the connection without any answer
    (a pooled connection it had just closed, field case F22; llama-server does so under load)."""
    try:
        return await timed_stream(http, url, key, max_tokens, **extra)
    except httpx.RemoteProtocolError:
        RESENT[0] += 1
        return await timed_stream(http, url, key, max_tokens, **extra)


RESENT = [0]
"""Requests resent by resent_once in this run (printed with the tables)."""


async def burst(url: str, key: str, streams: int, max_tokens: int,
                **extra) -> tuple[float, list[tuple[float, list[float], int]]]:
    """``streams`` requests at once: (wall seconds, each request's timed_stream)."""
    # below llama-server's 5 s keep-alive, so no pooled connection the engine has closed is reused
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=128, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        await timed_stream(http, url, key, 4, **extra)  # warm the connection
        got: list[tuple[float, list[float], int]] = []

        async def one() -> None:
            got.append(await resent_once(http, url, key, max_tokens, **extra))

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(streams):
                tg.start_soon(one)
        return time.perf_counter() - t0, got


def _gap_ms(arrivals: list[float]) -> float:
    return (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1) * 1000 if len(arrivals) > 1 else 0.0


async def cost_rate(repeats: int) -> list[list[object]]:
    """tokens/s rows: 1 and 4 streams of 64 tokens on the real engine, direct vs through serve."""
    rows: list[list[object]] = []
    async with hand_engine(["-m", str(MODEL), "-c", "4096", "-np", "4", "--kv-unified"]) as engine:
        serve = await anyio.to_thread.run_sync(lambda: ServeProcess("--url", engine.base_url, "--engine-api-key",
                                                                    engine.api_key))
        try:
            for streams in (1, 4):
                rates: dict[str, list[float]] = {"direct": [], "serve": []}
                for i in range(repeats):
                    pair = [("direct", engine.base_url, engine.api_key), ("serve", serve.url, KEY)]
                    for way, url, key in (pair if i % 2 == 0 else pair[::-1]):
                        wall, got = await burst(url, key, streams, 64, ignore_eos=True, temperature=0)
                        rates[way].append(sum(g[2] for g in got) / wall)
                ratios = [s / d for s, d in zip(rates["serve"], rates["direct"])]
                rows.append([f"tokens/s, {streams} stream{'s' if streams > 1 else ''} x 64 tokens (real engine)",
                             spread(rates["direct"], 1), spread(rates["serve"], 1),
                             f"ratio {spread(ratios, 3)}", ">= 0.98: " + ("met" if statistics.median(ratios) >= 0.98
                                                                          else "not met")])
        finally:
            await anyio.to_thread.run_sync(serve.stop)
    return rows


async def cost_latency(repeats: int) -> list[list[object]]:
    """Added-latency rows at 1, 16 and 64 concurrent streams against the fake engine."""
    rows: list[list[object]] = []
    async with fake_engine_process(slots=64, n_ctx=64 * 256, model_path=str(MODEL), token_delay=0.005) as fake:
        serve = await anyio.to_thread.run_sync(lambda: ServeProcess("--url", fake))
        try:
            for streams in (1, 16, 64):
                rounds = max(1, 64 // streams)  # at least 64 requests per way and repeat
                ttft: dict[str, list[float]] = {"direct": [], "serve": []}
                gap: dict[str, list[float]] = {"direct": [], "serve": []}
                for i in range(repeats):
                    pair = [("direct", fake, "none"), ("serve", serve.url, KEY)]
                    for way, url, key in (pair if i % 2 == 0 else pair[::-1]):
                        got = []
                        for _ in range(rounds):
                            got += (await burst(url, key, streams, 16))[1]
                        ttft[way].append(statistics.median(g[0] for g in got) * 1000)
                        gap[way].append(statistics.median(_gap_ms(g[1]) for g in got))
                for label, data in (("time to first token", ttft), ("gap between chunks", gap)):
                    added = [s - d for s, d in zip(data["serve"], data["direct"])]
                    rows.append([f"{label} ms, {streams} concurrent stream{'s' if streams > 1 else ''} (fake engine)",
                                 spread(data["direct"]), spread(data["serve"]), f"added {spread(added)} ms",
                                 ("<= 2 ms: " + ("met" if statistics.median(added) <= 2.0 else "not met"))
                                 if streams == 64 else ""])
        finally:
            await anyio.to_thread.run_sync(serve.stop)
    return rows


_FLOOD = """
import json, sys, httpx
url, key, kind = sys.argv[1:4]
words = {"50": 10 * 2**20, "30": 6 * 2**20, "3": 600_000}[kind]
body = json.dumps({"messages": [{"role": "user", "content": "word " * words}], "max_tokens": 4}).encode()
with httpx.Client(timeout=600) as client:
    while True:
        try:
            r = client.post(url + "/v1/chat/completions", content=body,
                            headers={"Authorization": "Bearer " + key, "content-type": "application/json"})
            print(r.status_code, flush=True)
        except httpx.TransportError as exc:
            print(type(exc).__name__, flush=True)
"""


async def stall_case(repeats: int) -> list[list[object]]:
    """Rows of the stall case (module docstring): small-request TTFT alone and beside large bodies, each
    sent again and again by a client in a process of its own (so its sending does not share this
    process's CPU with what is measured)."""
    rows: list[list[object]] = []
    async with fake_engine_process(slots=8, n_ctx=8 * 2048, model_path=str(MODEL), token_delay=0.005) as fake:
        serve = await anyio.to_thread.run_sync(lambda: ServeProcess("--url", fake))
        try:
            async with httpx.AsyncClient(timeout=600) as http:
                await timed_stream(http, serve.url, KEY, 4)  # warm: the tokenizer is loaded

                async def smalls() -> list[float]:
                    return [(await resent_once(http, serve.url, KEY, 16))[0] * 1000 for _ in range(10)]

                alone = [statistics.median(await smalls()) for _ in range(repeats)]
                for label, kind in (("a 50 MB body refused (413)", "50"),
                                    ("a 30 MB valid body refused by its length (400)", "30"),
                                    ("a 3 MB valid body tokenized and refused (400)", "3")):
                    answers: list[str] = []
                    beside: list[float] = []
                    for _ in range(repeats):
                        flood = subprocess.Popen([sys.executable, "-c", _FLOOD, serve.url, KEY, kind],
                                                 stdout=subprocess.PIPE, text=True)
                        try:
                            await anyio.sleep(3)  # the large body is built and on its way
                            beside.append(statistics.median(await smalls()))
                        finally:
                            flood.kill()
                            out, _ = flood.communicate()
                            answers += out.split()
                    ratios = [b / a for a, b in zip(alone, beside)]
                    rows.append([f"small request's time to first token, ms, beside {label}", spread(alone),
                                 spread(beside), f"ratio {spread(ratios, 2)}",
                                 "<= 1.2x: " + ("met" if statistics.median(ratios) <= 1.2 else "not met"),
                                 f"{len(answers)} large bodies answered {sorted(set(answers))}"])
        finally:
            await anyio.to_thread.run_sync(serve.stop)
    return rows


# --- (fair) --------------------------------------------------------------------------------------

FAIR_KEYS = {"flood": "bench-flood-key-0123456789", "editor": "bench-editor-key-0123456789"}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


async def fair_case(repeats: int) -> tuple[list[list[object]], list[int]]:
    serve = await anyio.to_thread.run_sync(lambda: ServeProcess(
        "-c", "2048", "-np", "2", "-t", str(THREADS), "--llama-server", str(BINARY), "-m", str(MODEL),
        *[a for name, key in FAIR_KEYS.items() for a in ("--client-key", f"{name}={key}")]))
    waits: dict[str, list[float]] = {"main alone": [], "main beside the flood": [], "flood (12 sub-agents)": []}
    passed: list[int] = []
    took: list[float] = []
    try:
        async with httpx.AsyncClient(timeout=600) as http:
            async def ask(who: str, i: int, headers: dict) -> httpx.Response:
                t0 = time.monotonic()
                r = await http.post(serve.url + "/v1/chat/completions", headers={
                    "Authorization": f"Bearer {FAIR_KEYS[who]}", **headers}, json={
                    "messages": [{"role": "user", "content": f"Write item {i} of a list of fruits."}],
                    "max_tokens": 24, "ignore_eos": True})
                r.raise_for_status()
                took.append(time.monotonic() - t0)
                return r

            def queued(r: httpx.Response) -> float:
                return float(r.headers["x-squad-queued-ms"])

            main = {"X-Squad-Program": "session-1"}
            sub = {"X-Squad-Program": "swarm", "X-Squad-Agent": "sub", "X-Squad-Priority": "-1000"}
            await ask("editor", 0, main)  # warm
            for _ in range(repeats):
                waits["main alone"].append(queued(await ask("editor", 1, main)))
                flood: list[httpx.Response] = []
                got: list[httpx.Response] = []
                async with anyio.create_task_group() as tg:
                    async def one(i: int, flood: list = flood) -> None:
                        flood.append(await ask("flood", i, sub))

                    for i in range(12):
                        tg.start_soon(one, i)
                    while (await http.get(serve.url + "/squad/status", headers={
                            "Authorization": f"Bearer {KEY}"})).json()["admission"]["queued"] < 8:
                        await anyio.sleep(0.05)

                    async def editor(got: list = got) -> None:
                        got.append(await ask("editor", 2, main))

                    tg.start_soon(editor)
                waits["main beside the flood"].append(queued(got[0]))
                passed.append(int(got[0].headers["x-squad-passed"]))
                waits["flood (12 sub-agents)"] += [queued(r) for r in flood]
    finally:
        await anyio.to_thread.run_sync(serve.stop)
    rows = [[who, len(w), f"{_pct(w, 0.5):.0f}", f"{_pct(w, 0.95):.0f}", f"{max(w):.0f}"] for who, w in waits.items()]
    rows.append(["(one request of 24 tokens, start to end, s)", len(took), f"{_pct(took, 0.5):.2f}",
                 f"{_pct(took, 0.95):.2f}", f"{max(took):.2f}"])
    return rows, passed


def part_fair(repeats: int) -> str:
    load0 = os.getloadavg()
    rows, passed = anyio.run(fair_case, repeats)
    load1 = os.getloadavg()
    table = md_table(["client", "requests", "queue wait p50 ms", "p95 ms", "max ms"], rows)
    return (f"{table}\n\nRequests of the flood admitted while the main request waited (X-Squad-Passed), per repeat: "
            f"{passed} (target 0). Load average (1, 5, 15 min) at the start: {load0[0]:.2f} {load0[1]:.2f} "
            f"{load0[2]:.2f}; at the end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} ({os.cpu_count()} CPUs).")


def part_stall(repeats: int) -> str:
    load0 = os.getloadavg()
    rows = anyio.run(stall_case, repeats)
    load1 = os.getloadavg()
    table = md_table(["measure", "alone, median (min–max) of repeats", "beside the large body", "ratio", "target",
                      "large bodies"], rows)
    return (f"{table}\n\nLoad average (1, 5, 15 min) at the start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
            f"at the end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} ({os.cpu_count()} CPUs).")


def part_cost(repeats: int, latency: bool = True, rate: bool = True) -> str:
    load0 = os.getloadavg()
    headers = ["measure", "direct, median (min–max) of repeats", "through squad serve", "serve vs direct (per repeat)",
               "target"]
    rows = anyio.run(cost_latency, repeats) if latency else []
    print(md_table(headers, rows), file=sys.stderr, flush=True)  # kept should the real engine's part fail
    rows += anyio.run(cost_rate, repeats) if rate else []
    load1 = os.getloadavg()
    table = md_table(headers, rows)
    return (f"{table}\n\nLoad average (1, 5, 15 min) at the start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
            f"at the end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} ({os.cpu_count()} CPUs). Requests resent "
            f"after a connection closed without an answer: {RESENT[0]}.")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parts", default="a,cost")
    args = parser.parse_args()
    parts = args.parts.split(",")
    print(f"## serve (issues 13, 22)\n\nCommand: `.venv/bin/python bench/serve.py --repeats {args.repeats}`\n")
    if "a" in parts:
        print("### (a) 8 naive clients, ~650 prompt tokens + max_tokens 48 (ignore_eos), -c 2048 -np 4\n")
        print(part_a() + "\n")
    if "cost" in parts or "latency" in parts or "rate" in parts:  # latency / rate: one half of cost
        print(f"### (cost) what squad serve costs, {args.repeats} repeats, direct and serve taking turns\n")
        print(part_cost(args.repeats, latency="rate" not in parts, rate="latency" not in parts) + "\n")
    if "stall" in parts:
        print(f"### (stall) a small request beside large bodies, {args.repeats} repeats (issue 28)\n")
        print(part_stall(args.repeats) + "\n")
    if "fair" in parts:
        print(f"### (fair) two clients, one flooding 12 sub-agent requests, {args.repeats} repeats (issue 30)\n")
        print(part_fair(args.repeats) + "\n")

if __name__ == "__main__":
    main()
