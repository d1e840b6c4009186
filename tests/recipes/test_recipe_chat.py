"""The chat loop (squad.runtime.chatloop) on the fake engine: @mentions dispatch, unknown ones only warn,
/quit ends, history is kept within half the main agent's budget."""

import pytest

from squad import Agent, Squad
from squad.runtime.chatloop import chat_loop, trim_history
from squad.testing import FakeEngine, Reply


@pytest.mark.anyio
async def test_chat_loop_mentions_and_unknown_warning():
    agents = [
        Agent(name="lead", instructions="You are lead.", budget=1024, max_tokens=32, agents=("a",),
              sub_agent_tools=False),
        Agent(name="a", instructions="You are a.", budget=512, max_tokens=32),
    ]
    lines = iter(["@a say hi and @zzz too", "plain question", "/quit", "never read"])
    said: list[tuple[str, str]] = []
    async with FakeEngine(slots=2) as fe:
        fe.responder = lambda body: Reply(content="reply from " + body["messages"][0]["content"][8:-1])
        async with Squad(agents, engine=fe.info) as sq:
            history = await chat_loop(sq, lambda: next(lines), lambda kind, text: said.append((kind, text)))
    warnings = [text for kind, text in said if kind == "warning"]
    assert any("unknown agent '@zzz'" in w and "not dispatched" in w for w in warnings)
    assert [kind for kind, _ in said].count("answer") == 2
    assert [b["messages"][0]["content"] for b in fe.requests].count("You are a.") == 1
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]


@pytest.mark.anyio
async def test_trim_history_drops_oldest_whole_turns():
    history = []
    for i in range(6):
        history += [{"role": "user", "content": f"question {i} " + "x " * 40},
                    {"role": "assistant", "content": f"answer {i}"}]
    async with FakeEngine() as fe, Squad([Agent(name="a")], engine=fe.info) as sq:
        full = await sq.chat.count(history)
        kept = await trim_history(sq.chat, history, full // 2)
        assert await sq.chat.count(kept) <= full // 2
        assert kept[0]["role"] == "user" and kept[-1] == history[-1]
