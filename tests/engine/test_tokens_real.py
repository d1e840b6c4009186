"""The GGUF token counter against the REAL llama-server with the default model.

Every chat in ``token_corpus.chats()`` must count exactly what ``POST
/v1/chat/completions/input_tokens`` says (or the counter must raise ``NotExact``), and every
text in ``token_corpus.texts()`` what ``POST /tokenize`` (no BOS/EOS, special text parsed) says.
"""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from launch_support import THREADS
from squad.engine.launcher import Launcher
from squad.engine.tokens import NotExact, counter_for_model
from squad.sched.planner import EnginePlan
from token_corpus import chats, texts

pytestmark = [pytest.mark.engine, pytest.mark.anyio]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
async def engine(llama_server_path, default_model_path):
    plan = EnginePlan.simple(default_model_path, slots=1, n_ctx=2048)
    async with Launcher(plan, binary=llama_server_path, threads=THREADS) as launcher:
        assert launcher.info is not None
        yield launcher.info


@pytest.mark.timeout(600)
async def test_counter_matches_engine_on_corpus(engine, default_model_path):
    counter = counter_for_model(default_model_path)
    assert counter is not None
    headers = {"Authorization": f"Bearer {engine.api_key}"} if engine.api_key else {}
    async with httpx.AsyncClient(base_url=engine.base_url, headers=headers, timeout=120) as http:
        results: dict[str, tuple[int, int | str]] = {}
        for name, (messages, tools) in chats().items():
            body: dict = {"messages": messages}
            if tools:
                body["tools"] = tools
            r = await http.post("/v1/chat/completions/input_tokens", json=body)
            assert r.status_code == 200, (name, r.text[:300])
            try:
                local: int | str = counter.count_chat(messages, tools)
            except NotExact as exc:
                local = f"NotExact: {exc}"
            results[name] = (r.json()["input_tokens"], local)

        # Outside what the counter reproduces: it must say so (callers then ask the engine).
        for messages in ([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                         ):
            r = await http.post("/v1/chat/completions/input_tokens", json={"messages": messages})
            assert r.status_code == 200, r.text[:300]
            with pytest.raises(NotExact):
                counter.count_chat(messages)
            print(f"\nNotExact as it should be; engine says {r.json()['input_tokens']} for {messages}")

        text_results: dict[str, tuple[int, int]] = {}
        for name, text in texts().items():
            r = await http.post("/tokenize", json={"content": text, "add_special": False, "parse_special": True})
            assert r.status_code == 200, (name, r.text[:300])
            text_results[name] = (len(r.json()["tokens"]), counter.count_text(text))

    print()
    for name, (engine_n, local) in {**results, **{f"text:{k}": v for k, v in text_results.items()}}.items():
        print(f"{name:28} engine {engine_n:6}  local {local}")
    wrong = {k: v for k, v in results.items() if isinstance(v[1], int) and v[0] != v[1]}
    wrong |= {k: v for k, v in text_results.items() if v[0] != v[1]}
    assert not wrong, wrong
    not_exact = [k for k, v in results.items() if not isinstance(v[1], int)]
    assert not_exact == [], not_exact  # every corpus chat is within what the counter reproduces
    assert results["long_document"][0] > 8000


TOOLS = [
    {"type": "function", "function": {
        "name": "add_note", "description": "Add a note about <things> & 'stuff' — é 日本",
        "parameters": {"type": "object", "properties": {"text": {"type": "string", "description": "the note"},
                                                        "tags": {"type": "array", "items": {"type": "string"}}},
                       "required": ["text"]}}},
    {"type": "function", "function": {"name": "ask_helper", "description": "Ask helper {x} @bob",
                                      "parameters": {"type": "object", "properties": {"task": {"type": "string"}},
                                                     "required": ["task"]}}},
]
_ASK = [{"role": "system", "content": "You keep notes."}, {"role": "user", "content": "Save a note about tea {x} @bob"}]
_CALLED = _ASK + [
    {"role": "assistant", "content": "Let me.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add_note",
                                                      "arguments": '{"text":"thé 日本",  "tags": ["a"]}'}},
        {"id": "c2", "type": "function", "function": {"name": "ask_helper", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "saved"},
    {"role": "tool", "tool_call_id": "c2", "content": "done {ok}"},
]
TOOL_CHATS = {
    "tools, first round": _ASK,
    "no system message": _ASK[1:],
    "two calls, two results": _CALLED,
    "an answer, then a new question": _CALLED + [{"role": "assistant", "content": "All saved."},
                                                 {"role": "user", "content": "again"}],
    "forced call prefix": _ASK + [{"role": "assistant", "content": "<tool_call>\n"}],
}


@pytest.fixture
async def tool_engine(llama_server_path, default_model_path):
    from squad.engine.chat_templates import CHATML_TOOLS

    plan = dataclasses.replace(EnginePlan.simple(default_model_path, slots=1, n_ctx=2048),
                               chat_template=CHATML_TOOLS.path)
    async with Launcher(plan, binary=llama_server_path, threads=THREADS) as launcher:
        yield launcher.info


async def test_tools_and_tool_calls_count_exactly_with_squads_template(tool_engine, default_model_path):
    """Budgets of agents with tools (MCP tools, ask_<name>) are counted before launch with the
    template squad will pass: the counter renders tools and calls as the engine does."""
    from squad.engine.chat_templates import CHATML_TOOLS

    counter = counter_for_model(default_model_path, template=CHATML_TOOLS.text)
    headers = {"Authorization": f"Bearer {tool_engine.api_key}"} if tool_engine.api_key else {}
    got = {}
    async with httpx.AsyncClient(base_url=tool_engine.base_url, headers=headers, timeout=120) as http:
        for name, messages in TOOL_CHATS.items():
            r = await http.post("/v1/chat/completions/input_tokens", json={"messages": messages, "tools": TOOLS})
            assert r.status_code == 200, r.text[:300]
            got[name] = (r.json()["input_tokens"], counter.count_chat(messages, TOOLS))
    print(got)
    assert all(engine_n == local for engine_n, local in got.values()), got
