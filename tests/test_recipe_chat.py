"""`squad chat`'s loop on the fake engine: @mentions dispatch, unknown ones only warn, /quit ends."""

import pytest

from squad.agent import Agent
from squad.cli.run import chat_loop
from squad.testing import FakeEngine, Reply


@pytest.mark.anyio
async def test_chat_loop_mentions_and_unknown_warning(capsys):
    agents = [
        Agent(name="lead", instructions="You are lead.", budget=1024, max_tokens=32, agents=("a",), sub_agent_tools=False),
        Agent(name="a", instructions="You are a.", budget=512, max_tokens=32),
    ]
    lines = iter(["@a say hi and @zzz too", "plain question", "/quit", "never read"])
    async with FakeEngine(slots=2) as fe:
        fe.responder = lambda body: Reply(content="reply from " + body["messages"][0]["content"][8:-1])
        history = await chat_loop(agents, "lead", variables={}, engine=fe.info, read=lambda: next(lines), quiet=True)
    out = capsys.readouterr()
    assert "unknown agent '@zzz'" in out.err and "not dispatched" in out.err
    assert out.out.count("lead>") == 2
    assert [b["messages"][0]["content"] for b in fe.requests].count("You are a.") == 1
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
