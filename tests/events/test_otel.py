"""OpenTelemetry export (:mod:`squad.events.otel`): spans from a run's events, checked on the SDK's
in-memory exporter — a real run on llama-server (main agent + two @mentioned sub-agents,
max_tokens 16, threads 2) and the same team on the scripted engine, plus failures and the
exporter configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from launch_support import THREADS
from squad.engine.session import EngineSpec
from squad.errors import AgentRunError, UserError
from squad.events import Event
from squad.events.otel import OtelSink, configured_provider
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.testing import ScriptedEngine

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def exported():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def team(max_tokens: int = 16) -> list[Agent]:
    sampling = {"temperature": 0.0, "seed": 1}
    return [
        Agent(name="lead", instructions="You lead. Answer in one sentence.", agents=("a", "b"), sub_agent_tools=False,
              budget=1024, max_tokens=max_tokens, sampling=sampling),
        Agent(name="a", instructions="You review security. One sentence.", budget=512, max_tokens=max_tokens,
              sampling=sampling),
        Agent(name="b", instructions="You review style. One sentence.", budget=512, max_tokens=max_tokens,
              sampling=sampling),
    ]


def check_spans(spans, events: list[Event], model: str, *, usage: bool = True) -> None:
    """One invoke_agent span per conversation, one chat span per call, nested as the events say,
    with the GenAI and squad attributes."""
    agents = [s for s in spans if s.attributes["gen_ai.operation.name"] == "invoke_agent"]
    chats = [s for s in spans if s.attributes["gen_ai.operation.name"] == "chat"]
    assert len(agents) + len(chats) == len(spans)
    started = {e.conversation: e for e in events if e.kind == "agent.started"}
    finished = {e.call: e for e in events if e.kind == ("call.finished" if usage else "call.released")}
    admitted = {e.call: e for e in events if e.kind == "call.admitted"}
    assert {s.attributes["gen_ai.conversation.id"] for s in agents} == set(started) and len(agents) == len(started)
    assert {s.attributes["squad.call.id"] for s in chats} == set(finished) and len(chats) == len(finished)

    by_conversation = {s.attributes["gen_ai.conversation.id"]: s for s in agents}
    for conversation, span in by_conversation.items():
        event = started[conversation]
        assert span.name == f"invoke_agent {event.agent}" and span.kind == SpanKind.INTERNAL
        assert span.attributes["gen_ai.agent.name"] == event.agent
        assert span.attributes["gen_ai.request.model"] == model
        assert span.status.status_code != StatusCode.ERROR
        if event.parent is None:
            assert span.parent is None
        else:  # a sub-agent nests in the conversation that mentioned it
            parent = by_conversation[event.parent]
            assert span.parent.span_id == parent.context.span_id
            assert span.context.trace_id == parent.context.trace_id
    lead = next(s for s in agents if s.attributes["gen_ai.agent.name"] == "lead")
    assert {s.attributes["gen_ai.agent.name"] for s in agents if s.parent and s.parent.span_id == lead.context.span_id
            } == {"a", "b"}

    for span in chats:
        call = span.attributes["squad.call.id"]
        done, took = finished[call], admitted[call]
        assert span.name == f"chat {model}" and span.kind == SpanKind.CLIENT
        assert span.parent.span_id == by_conversation[done.conversation].context.span_id  # call in its conversation
        assert span.attributes["gen_ai.request.model"] == model
        assert span.attributes["gen_ai.provider.name"] == "llama.cpp"
        if usage:
            assert span.attributes["gen_ai.response.finish_reasons"] == (done.finish_reason,)
            assert span.attributes["gen_ai.usage.input_tokens"] == done.prompt_tokens > 0
            assert span.attributes["gen_ai.usage.output_tokens"] == done.completion_tokens > 0
        assert span.attributes["squad.slot"] == took.slot
        assert span.attributes["squad.reserved_tokens"] == took.tokens > 0
        assert span.attributes["squad.queue_wait_s"] == pytest.approx(took.queued_s)
        assert span.start_time <= span.end_time
        assert by_conversation[done.conversation].start_time <= span.start_time
        assert span.end_time <= by_conversation[done.conversation].end_time


@pytest.mark.engine
@pytest.mark.timeout(600)
async def test_a_real_run_exports_one_span_per_agent_and_per_call(exported, llama_server_path, default_model_path):
    provider, exporter = exported
    events: list[Event] = []
    spec = EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS)
    with OtelSink(model=default_model_path.name, tracer_provider=provider) as sink:
        async with Squad(team(), engine=spec, on_event=[sink, events.append]) as sq:
            result = await sq.run("@a @b review: def add(a, b): return a + b")
    assert result.main.output.strip()
    spans = exporter.get_finished_spans()
    check_spans(spans, events, default_model_path.name)
    assert len([s for s in spans if s.name.startswith("invoke_agent")]) == 3
    assert len([s for s in spans if s.name.startswith("chat")]) == 3
    chat = next(s for s in spans if s.name.startswith("chat"))
    assert chat.attributes["server.address"] == "127.0.0.1" and chat.attributes["server.port"] > 0
    assert chat.attributes["gen_ai.response.time_to_first_chunk"] > 0


async def test_a_scripted_run_nests_the_same_way(exported):
    provider, exporter = exported
    events: list[Event] = []
    with OtelSink(model="scripted", tracer_provider=provider) as sink:
        def both(event: Event) -> None:
            sink(event), events.append(event)

        # the scripted engine reports its call events to its own sink
        engine = ScriptedEngine(responder=lambda req: f"answer from {req.agent}", slots=3, on_event=both)
        async with Squad(team(), engine=engine, on_event=both) as sq:
            await sq.run("@a @b check this")
    spans = exporter.get_finished_spans()
    assert len(spans) == 6
    check_spans(spans, events, "scripted", usage=False)  # the scripted engine reports no usage


async def test_failed_and_cancelled_agents_have_an_error_status(exported):
    provider, exporter = exported

    def respond(req):
        return AgentRunError("a broke", agent="a") if req.agent == "a" else f"answer from {req.agent}"

    engine = ScriptedEngine(responder=respond, slots=3, delay=lambda req: 0.01 if req.agent == "a" else 30.0)
    with OtelSink(tracer_provider=provider) as sink:
        async with Squad(team(), engine=engine, on_event=sink) as sq:
            await sq.parallel([("a", "x"), ("b", "y")], policy="fail-fast")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["invoke_agent a"].status.status_code == StatusCode.ERROR
    assert spans["invoke_agent a"].status.description == "AgentRunError: a broke"
    assert spans["invoke_agent a"].attributes["error.type"] == "AgentRunError"
    assert spans["invoke_agent b"].status.status_code == StatusCode.ERROR
    assert spans["invoke_agent b"].attributes["error.type"] == "cancelled"


def test_spans_still_open_when_the_sink_closes_end_with_an_error(exported):
    from squad.events import AgentStarted, CallQueued

    provider, exporter = exported
    sink = OtelSink(tracer_provider=provider)
    sink(AgentStarted(agent="lead", conversation="lead#1"))
    sink(CallQueued(agent="lead", conversation="lead#1", call="c1", tokens=100))
    sink.close()
    sink(AgentStarted(agent="late", conversation="late#1"))  # dropped
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["chat", "invoke_agent lead"]
    assert all(s.status.status_code == StatusCode.ERROR for s in spans)
    assert spans[0].attributes["squad.reserved_tokens"] == 100


def test_the_exporter_is_named_by_otel_traces_exporter(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-agents")
    provider = configured_provider()
    assert provider.resource.attributes["service.name"] == "my-agents"
    provider.shutdown()
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    assert configured_provider(exporter="none").resource.attributes["service.name"] == "squad"
    with pytest.raises(UserError, match="no OpenTelemetry span exporter 'zipkin_json'"):
        configured_provider(exporter="zipkin_json")


def test_the_otel_module_is_optional():
    """squad imports without OpenTelemetry: only squad.events.otel needs it (the ``otel`` extra)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['opentelemetry'] = None\n"
            "import squad, squad.runtime.squad, squad.events.jsonl, squad.cli\n"
            "from squad.events.otel import OtelSink\n"
            "try:\n    OtelSink()\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": src},
                         timeout=120)
    assert "UserError" in out.stdout and "squad[otel]" in out.stdout, out.stderr
