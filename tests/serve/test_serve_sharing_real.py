"""squad serve as the place local agents share one model, in front of the real llama-server (the CLI, as a separate
process, ``--slots 2 --ctx 2048``): one client's flood of 12 sub-agent requests in one program does not keep another
client's main request waiting past the stated bound (:mod:`squad.serve.shares`); a streamed request whose prompt the
engine reads for longer than the client's idle timeout completes through the real openai and anthropic SDKs
(keep-alives and prefill progress, :mod:`squad.serve.early`, :mod:`squad.serve.progress`); a program's next turn
finds its prefix in its slot (``id_slot``, the engine's ``cache_n``). The fake engine: test_serve_sharing.py."""

from __future__ import annotations

import threading
import time

import anthropic
import httpx
import openai
import pytest

from serve_support import squad_serve

pytestmark = pytest.mark.engine

KEY = "sharing-test-key-0123456789abcdef"
KEYS = {"flood": "flood-key-0123456789", "editor": "editor-key-0123456789"}
KEEPALIVE = 0.2
"""Seconds between keep-alives (``--keepalive``): the idle timeouts below are scaled down from 30 s to 2 s (a
shorter one trips between two generated tokens on a loaded 2-core machine, after the first token)."""
IDLE = 2.0


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama_server_path, default_model_path):
    state = tmp_path_factory.mktemp("state")
    keys = [a for name, key in KEYS.items() for a in ("--client-key", f"{name}={key}")]
    args = ("--keepalive", str(KEEPALIVE), *keys)
    with squad_serve(state, KEY, llama_server_path, default_model_path, ctx=2048, slots=2, args=args) as (url, _):
        yield url


def status(url: str) -> dict:
    return httpx.get(url + "/squad/status", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()


@pytest.mark.timeout(900)
def test_a_flood_of_sub_agents_does_not_keep_another_clients_main_request_waiting(served):
    """12 sub-agent requests of one program from one client (the best priority it may ask), then one main request
    from another: no request of the flood is admitted between the main request's arrival and its admission
    (``X-Squad-Passed: 0``): it waits at most for one running request to end."""
    url = served
    results: dict[str, list] = {"flood": [], "editor": []}

    def ask(who: str, i: int, headers: dict) -> None:
        with httpx.Client(base_url=url, timeout=600, headers={"Authorization": f"Bearer {KEYS[who]}"}) as c:
            t0 = time.monotonic()
            r = c.post("/v1/chat/completions", headers=headers, json={
                "messages": [{"role": "user", "content": f"Write item {i} of a list of fruits."}],
                "max_tokens": 24, "ignore_eos": True})
            results[who].append((r.status_code, int(r.headers.get("x-squad-queued-ms", -1)),
                                 int(r.headers.get("x-squad-passed", -1)), time.monotonic() - t0))

    sub = {"X-Squad-Program": "swarm", "X-Squad-Agent": "sub", "X-Squad-Priority": "-1000"}
    threads = [threading.Thread(target=ask, args=("flood", i, sub)) for i in range(12)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while status(url)["admission"]["queued"] < 8:  # the flood is queued (2 run)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    main = threading.Thread(target=ask, args=("editor", 0, {"X-Squad-Program": "session-1"}))
    main.start()
    for t in [*threads, main]:
        t.join(600)
    ((code, queued_ms, passed, took),) = results["editor"]
    assert code == 200 and all(r[0] == 200 for r in results["flood"])
    assert passed == 0, results
    flood_waits = sorted(r[1] for r in results["flood"])
    flood_took = sorted(r[3] for r in results["flood"])
    print(f"\nmain waited {queued_ms} ms (bound: one running request's end; a flood request takes "
          f"{flood_took[0]:.2f}-{flood_took[-1]:.2f} s); the flood waited p50 {flood_waits[len(flood_waits) // 2]} ms, "
          f"max {flood_waits[-1]} ms")
    shares = {row["client"]: row for row in status(url)["shares"]}
    assert shares["flood"]["admitted"] >= 12 and shares["editor"]["admitted"] >= 1


LONG = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog near the river bank." for i in range(90))
"""About 1,600 tokens: the engine reads it for seconds on this machine."""


@pytest.mark.timeout(600)
def test_a_stream_whose_prefill_outlasts_the_clients_idle_timeout_completes_through_both_sdks(served):
    url = served
    oai = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=openai.Timeout(IDLE, connect=10))
    ant = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=anthropic.Timeout(IDLE, connect=10))
    try:
        for i in range(1):  # a new prompt each time: nothing of it cached
            t0 = time.monotonic()
            stream = oai.chat.completions.create(
                model="m", max_tokens=8, stream=True,
                messages=[{"role": "user", "content": f"{i} {LONG}\nSummarise in one word."}])
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            took_oai = time.monotonic() - t0
            assert text
            t0 = time.monotonic()
            with ant.messages.stream(model="m", max_tokens=8, messages=[
                    {"role": "user", "content": f"{i} anthropic {LONG}\nSummarise in one word."}]) as s:
                final = s.get_final_message()
            took_ant = time.monotonic() - t0
            assert final.content and final.stop_reason in ("max_tokens", "end_turn")
            print(f"\nopenai stream {took_oai:.2f} s, anthropic stream {took_ant:.2f} s with a {IDLE} s idle timeout")
    finally:
        oai.close()
        ant.close()
    # what kept them alive: the engine's progress as comments, then keep-alives until the first token
    lines = []
    with httpx.Client(base_url=url, timeout=600, headers={"Authorization": f"Bearer {KEY}"}) as c:
        with c.stream("POST", "/v1/chat/completions", json={
                "max_tokens": 4, "stream": True,
                "messages": [{"role": "user", "content": f"raw {LONG}\nSummarise in one word."}]}) as r:
            for line in r.iter_lines():
                lines.append(line)
    first = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert any(line.startswith(": prefill 0/") for line in lines[:first]), lines[:first]
    assert not any("prompt_progress" in line for line in lines)


@pytest.mark.timeout(600)
def test_a_programs_next_turn_finds_its_prefix_in_its_slot(served):
    """Turn 1 of a conversation, another program's request, turn 2: turn 2 runs on turn 1's slot (``id_slot``)
    and the engine reuses the prefix (its ``timings.cache_n``)."""
    url = served
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly and politely." for i in range(40))
    with httpx.Client(base_url=url, timeout=600, headers={"Authorization": f"Bearer {KEY}"}) as c:
        def chat(program: str, messages: list[dict]) -> dict:
            r = c.post("/v1/chat/completions", headers={"X-Squad-Program": program},
                       json={"messages": messages, "max_tokens": 8})
            assert r.status_code == 200, r.text
            return r.json()

        turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "Name a fruit."}]
        first = chat("p1", turn1)
        chat("p2", [{"role": "system", "content": "Other. " + system[::-1]}, {"role": "user", "content": "Hi."}])
        second = chat("p1", [*turn1, {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                             {"role": "user", "content": "And another?"}])
    programs = {p["program"]: p for p in status(url)["programs"]}
    (conversation,) = programs[f"{'127.0.0.1'}/p1"]["conversations"]
    assert second.get("timings", {}).get("cache_n", 0) >= 400, second.get("timings")
    assert conversation["slot"] in (0, 1)
