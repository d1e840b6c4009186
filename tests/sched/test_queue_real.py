"""The default queue policy on the REAL llama-server with the default model: bench/mixed.py's
shape, small. Engine ``-c 2048 -np 4 --kv-unified``; two long calls reserve 1,000 cells each
(prompt + max_tokens), so once both run only 48 cells are free and no short call fits.

Checked are ordering properties, never timings: the first long call goes at once, every short
call asked with the second long one is admitted before it, a main-agent call (priority 0) asked
while calls wait goes before the sub-agents still waiting, and no call overflows the pool.
"""

from __future__ import annotations

import anyio
import pytest

from launch_support import THREADS
from squad.chat import ChatRequest
from squad.chat.client import EngineClient
from squad.engine.launcher import Launcher
from squad.engine.session import EngineSpec
from squad.events import Event, Origin
from squad.sched.admission import Admission
from squad.sched.planner import EnginePlan

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

LONG = " ".join(f"Line {i}: the committee reviewed the budget, the schedule and the open risks." for i in range(50))


@pytest.mark.timeout(600)
async def test_default_queue_lets_short_calls_pass_the_second_long_call(llama_server_path, default_model_path):
    default = EngineSpec().queue
    async with Launcher(EnginePlan.simple(default_model_path, slots=4, n_ctx=2048), binary=llama_server_path,
                        threads=THREADS) as launcher:
        info = launcher.info
        assert info is not None and (info.slots, info.pool) == (4, 2048)
        events: list[Event] = []
        async with EngineClient(info, admission=Admission.for_engine(info, on_event=events.append,
                                                                     queue=default)) as client:
            def long_messages(i: int) -> list[dict]:
                return [{"role": "user", "content": f"Summarize report {i} in one line:\n{LONG}"}]

            prompt = await client.count(long_messages(0))  # also loads the tokenizer before the calls race
            assert 600 <= prompt <= 960, prompt
            long_max = 1000 - prompt  # each long call reserves 1,000 cells

            async def call(name: str, messages: list[dict], max_tokens: int, priority: int = 1) -> None:
                await client.complete(ChatRequest(origin=Origin(name, conversation=f"{name}#1"), messages=messages,
                                                  max_tokens=max_tokens, priority=priority,
                                                  sampling={"temperature": 0, "seed": 1}))

            async def main_call() -> None:
                while sum(e.kind == "call.queued" for e in events) < 3:
                    await anyio.sleep(0.01)
                await call("main", [{"role": "user", "content": "Say yes."}], 8, priority=0)

            async with anyio.create_task_group() as tg:
                await call_soon(tg, call, "long0", long_messages(0), long_max)
                tg.start_soon(call, "long1", long_messages(1), long_max)
                for i in range(8):
                    tg.start_soon(call, f"short{i}", [{"role": "user", "content": f"Greet colleague {i}."}], 48)
                tg.start_soon(main_call)

        admitted = [e.agent for e in events if e.kind == "call.admitted"]
        print(f"\n{default}: admission order {admitted}")
        assert not [e for e in events if e.kind == "call.retried"], "a call overflowed or was resent"
        assert admitted[0] == "long0"
        assert set(admitted[1:admitted.index("long1")]) >= {f"short{i}" for i in range(8)}
        queued_main = [i for i, e in enumerate(events) if e.kind == "call.queued" and e.agent == "main"]
        if queued_main:  # the main call waited: every sub-agent call waiting then was admitted after it
            before = events[:queued_main[0]]
            waiting = {e.agent for e in before if e.kind == "call.queued"} - {e.agent for e in before
                                                                              if e.kind == "call.admitted"}
            assert waiting <= set(admitted[admitted.index("main") + 1:]), (waiting, admitted)

async def call_soon(tg, call, *args) -> None:  # type: ignore[no-untyped-def]
    """Start the first long call and give it the engine before the others ask."""
    tg.start_soon(call, *args)
    await anyio.sleep(0.2)
