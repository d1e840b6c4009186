"""Names in any language on the REAL llama-server with the default model (issue 32 item 2).

A main agent ``총괄`` @mentions ``@리뷰어`` and ``@レビュー`` (Korean, Japanese and mixed text): both are dispatched,
each receives its text with the mention stripped, the trace names every agent exactly, and every call's prompt
counted by squad (the reservation admission made, minus ``max_tokens``) is the engine's own ``prompt_tokens``.
Only what squad controls is asserted, never what the 135M model writes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launch_support import THREADS
from squad.engine.session import EngineSpec
from squad.events import Event
from squad.events.jsonl import JsonlTrace, load_trace
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

TINY = dict(budget=256, max_tokens=8, sampling={"temperature": 0.0, "seed": 1})


async def test_korean_and_japanese_mentions_dispatch_and_counts_are_exact(
    llama_server_path: Path, default_model_path: Path, tmp_path: Path
) -> None:
    agents = [Agent(name="총괄", instructions="당신은 팀장입니다. 한 문장으로 답하세요.", agents=["리뷰어", "レビュー"],
                    sub_agent_tools=False, **{**TINY, "budget": 512, "max_tokens": 12}),
              Agent(name="리뷰어", instructions="당신은 리뷰어입니다.", **TINY),
              Agent(name="レビュー", instructions="あなたはレビュー担当です。", **TINY)]
    events: list[Event] = []
    trace = JsonlTrace(tmp_path / "trace.jsonl")
    async with Squad(agents, engine=EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS),
                     on_event=[events.append, trace]) as sq:
        result = await sq.run("@리뷰어 이 함수의 보안을 확인해 주세요. @レビュー、このコードの style を見てください。"
                              "Mixed 텍스트 and 日本語 context.")
    trace.close()
    assert [s.agent for s in result.subs] == ["리뷰어", "レビュー"]
    assert all(s.ok for s in result.subs) and result.main.ok
    assert not [e for e in events if e.kind in ("call.failed", "agent.failed")]
    admitted = {e.call: e for e in events if e.kind == "call.admitted"}
    finished = [e for e in events if e.kind == "call.finished"]
    assert {e.agent for e in finished} == {"총괄", "리뷰어", "レビュー"}
    max_tokens = {a.name: a.max_tokens for a in agents}
    for done in finished:  # the prompt squad counted and reserved is the engine's own count
        assert admitted[done.call].tokens - max_tokens[done.agent or ""] == done.prompt_tokens, done
    traced = load_trace(tmp_path / "trace.jsonl")
    assert {e.agent for e in traced if e.kind == "call.finished"} == {"총괄", "리뷰어", "レビュー"}
