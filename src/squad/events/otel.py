"""OpenTelemetry export: squad's run events as spans following the GenAI semantic conventions.

An optional extra (``pip install 'squad[otel]'``). :class:`OtelSink` is an event sink like
:class:`squad.events.jsonl.JsonlTrace`: ``invoke_agent {agent}`` spans per conversation (a
sub-agent's a child of its parent's), ``chat {model}`` spans per model call, retries and tool
runs as span events; span times are the events' own wall-clock times. Spans go through the
tracer provider given, else the global one; :func:`configured_provider` builds one the way
``squad run --otel`` does (``OTEL_TRACES_EXPORTER``, default ``otlp``, and the SDK's ``OTEL_*``).

Design (span names and attributes): docs/design/otel.md
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from squad.engine.registry import DEFAULT_MODEL
from squad.errors import UserError
from squad.events import Event

__all__ = ["OtelSink", "configured_provider", "export_run", "model_label", "PROVIDER_NAME", "INSTALL_HINT"]

PROVIDER_NAME = "llama.cpp"
"""``gen_ai.provider.name`` of every span: the engine squad drives (not one of the convention's
well-known values, which name hosted providers; the convention allows others)."""

INSTALL_HINT = "install squad's otel extra: pip install 'squad[otel]'"

_ENDS = {"agent.finished", "agent.failed", "agent.cancelled"}


def _api() -> Any:
    try:
        from opentelemetry import trace
    except ImportError:
        raise UserError(f"OpenTelemetry export needs the OpenTelemetry SDK; {INSTALL_HINT}") from None
    return trace


def _ns(wall: float) -> int:
    return int(wall * 1e9)


class OtelSink:
    """An :data:`~squad.events.EventSink` that turns a run's events into OpenTelemetry spans
    (module docstring for the spans and their attributes).

    - ``model``: what ``gen_ai.request.model`` says (a model name or file name; None: left out);
    - ``tracer_provider``: where spans go (None: the global provider);
    - ``parent``: the OpenTelemetry context top-level conversations nest in (None: the current
      context when the sink is made).

    Use as a context manager, or call :meth:`close`: spans still open then (a run interrupted)
    end with an error status. Raises :class:`UserError` when the SDK is not installed.
    """

    def __init__(self, *, model: str | None = None, tracer_provider: Any = None, parent: Any = None) -> None:
        trace = _api()
        from opentelemetry import context

        self._trace = trace
        self._provider = tracer_provider
        self._tracer = trace.get_tracer("squad", tracer_provider=tracer_provider)
        self._parent = parent if parent is not None else context.get_current()
        self.model = model
        self._agents: dict[str, Any] = {}  # conversation id -> its invoke_agent span
        self._calls: dict[str, Any] = {}  # call id -> its chat span
        self._released: dict[str, int] = {}  # call id -> when its slot was given back (ns)
        self._call_conversation: dict[str, str] = {}
        self._closed = False

    def __enter__(self) -> OtelSink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __call__(self, event: Event) -> None:
        if self._closed:
            return
        kind = event.kind
        if kind == "agent.started":
            self._start_agent(event)
        elif kind == "mention.dispatched" and event.conversation:
            self._agent_span(event.conversation, event.agent, event.parent, event.wall)
        elif kind in _ENDS:
            self._end_agent(event)
        elif kind.startswith("call.") and event.call:
            self._on_call(event)
        elif kind == "tool.called" and event.conversation in self._agents:
            self._agents[event.conversation].add_event(
                "squad.tool", {"gen_ai.tool.name": event.data["tool"], "squad.ok": bool(event.data["ok"])},
                timestamp=_ns(event.wall))

    def flush(self) -> None:
        """Ask the tracer provider to export the spans ended so far (``force_flush``, when it has one)."""
        provider = self._provider if self._provider is not None else self._trace.get_tracer_provider()
        force_flush = getattr(provider, "force_flush", None)
        if callable(force_flush):
            force_flush()

    def close(self) -> None:
        """End every span still open (status ERROR: the run ended before them); later events are dropped."""
        self._closed = True
        from opentelemetry.trace import Status, StatusCode

        for span in [*self._calls.values(), *reversed(list(self._agents.values()))]:
            span.set_status(Status(StatusCode.ERROR, "the run ended before this span"))
            span.end()
        self._calls.clear()
        self._agents.clear()
        self._released.clear()
        self._call_conversation.clear()

    # --- agents ---------------------------------------------------------------------------

    def _start_agent(self, event: Event) -> None:
        span = self._agent_span(event.conversation or f"_{event.t}", event.agent, event.parent, event.wall)
        if event.data.get("item") is not None:
            span.set_attribute("squad.map_item", event.data["item"])

    def _agent_span(self, conversation: str, agent: str | None, parent: str | None, wall: float) -> Any:
        """The span of ``conversation``, started now if it is new. A parent conversation not seen
        yet gets its span first (its agent's name is filled in when its own event comes)."""
        span = self._agents.get(conversation)
        if span is not None:
            if agent and span.name == "invoke_agent":
                span.update_name(f"invoke_agent {agent}")
                span.set_attribute("gen_ai.agent.name", agent)
            return span
        up = self._agent_span(parent, None, None, wall) if parent else None
        ctx = self._trace.set_span_in_context(up) if up is not None else self._parent
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": PROVIDER_NAME,
            "gen_ai.conversation.id": conversation,
        }
        if agent:
            attrs["gen_ai.agent.name"] = agent
        if self.model:
            attrs["gen_ai.request.model"] = self.model
        if parent:
            attrs["squad.parent_conversation"] = parent
        span = self._tracer.start_span(f"invoke_agent {agent}" if agent else "invoke_agent", context=ctx,
                                       kind=self._trace.SpanKind.INTERNAL, attributes=attrs, start_time=_ns(wall))
        self._agents[conversation] = span
        return span

    def _end_agent(self, event: Event) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self._agents.pop(event.conversation or "", None)
        if span is None:
            return
        for call in [c for c, conv in self._call_conversation.items() if conv == event.conversation]:
            self._end_call(call, Status(StatusCode.ERROR, "the conversation ended before this call")
                           if call not in self._released else None, self._released.get(call, _ns(event.wall)))
        data = event.data
        if event.kind == "agent.finished":
            span.set_attribute("squad.runtime.outcome", data.get("outcome") or "ok")
            if data.get("finish_reason"):
                span.set_attribute("gen_ai.response.finish_reasons", [data["finish_reason"]])
        else:
            reason = data.get("error") or data.get("reason") or event.kind
            span.set_attribute("error.type", "cancelled" if event.kind == "agent.cancelled" else _error_type(reason))
            span.set_status(Status(StatusCode.ERROR, str(reason)))
        span.end(end_time=_ns(event.wall))

    # --- calls ----------------------------------------------------------------------------

    def _on_call(self, event: Event) -> None:
        from opentelemetry.trace import Status, StatusCode

        call = event.call
        assert call is not None  # __call__ sends only events of a call here
        span = self._calls.get(call)
        if span is None:
            if event.kind not in ("call.queued", "call.admitted", "call.first_token"):
                return  # a call that ended before the sink saw it start
            span = self._start_call(event)
        data = event.data
        if "tokens" in data and event.kind in ("call.queued", "call.admitted"):
            span.set_attribute("squad.reserved_tokens", int(data["tokens"]))
        if data.get("slot") is not None:
            span.set_attribute("squad.slot", int(data["slot"]))
        if event.kind == "call.admitted":
            span.set_attribute("squad.queue_wait_s", float(data.get("queued_s") or 0.0))
        elif event.kind == "call.first_token":
            span.set_attribute("gen_ai.response.time_to_first_chunk", float(data["ttft_s"]))
        elif event.kind == "call.retried":
            span.add_event("squad.retry", {"squad.reason": str(data["reason"]), "squad.attempt": int(data["attempt"]),
                                           "error.type": str(data.get("error") or "")}, timestamp=_ns(event.wall))
        elif event.kind == "call.finished":
            span.set_attribute("gen_ai.response.finish_reasons", [data["finish_reason"]])
            for key, attr in (("prompt_tokens", "gen_ai.usage.input_tokens"),
                              ("completion_tokens", "gen_ai.usage.output_tokens")):
                if data.get(key) is not None:
                    span.set_attribute(attr, int(data[key]))
            if data.get("ttft_s") is not None:
                span.set_attribute("gen_ai.response.time_to_first_chunk", float(data["ttft_s"]))
            if data.get("tokens_per_s") is not None:
                span.set_attribute("squad.tokens_per_s", float(data["tokens_per_s"]))
            span.set_attribute("squad.queue_wait_s", float(data.get("queued_s") or 0.0))
            span.set_attribute("squad.attempts", int(data.get("attempts") or 1))
            self._end_call(call, None, _ns(event.wall))
        elif event.kind == "call.failed":
            span.set_attribute("error.type", _error_type(data.get("error") or "error"))
            span.set_attribute("squad.attempts", int(data.get("attempts") or 1))
            self._end_call(call, Status(StatusCode.ERROR, str(data.get("message") or data.get("error") or "")),
                           _ns(event.wall))
        elif event.kind == "call.released":
            span.set_attribute("squad.held_s", float(data.get("held_s") or 0.0))
            self._released[call] = _ns(event.wall)

    def _end_call(self, call: str, status: Any, end_ns: int) -> None:
        span = self._calls.pop(call)
        self._released.pop(call, None)
        self._call_conversation.pop(call, None)
        if status is not None:
            span.set_status(status)
        span.end(end_time=end_ns)

    def _start_call(self, event: Event) -> Any:
        parent = self._agent_span(event.conversation, event.agent, event.parent,
                                  event.wall) if event.conversation else None
        ctx = self._trace.set_span_in_context(parent) if parent is not None else self._parent
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER_NAME,
            "squad.call.id": event.call,
        }
        if self.model:
            attrs["gen_ai.request.model"] = self.model
        if event.agent:
            attrs["gen_ai.agent.name"] = event.agent
        if event.conversation:
            attrs["gen_ai.conversation.id"] = event.conversation
        if event.engine:
            url = urlsplit(event.engine)
            if url.hostname:
                attrs["server.address"] = url.hostname
            if url.port:
                attrs["server.port"] = url.port
        name = f"chat {self.model}" if self.model else "chat"
        span = self._tracer.start_span(name, context=ctx, kind=self._trace.SpanKind.CLIENT, attributes=attrs,
                                       start_time=_ns(event.wall))
        assert event.call is not None
        self._calls[event.call] = span
        self._call_conversation[event.call] = event.conversation or ""
        return span


def _error_type(text: str) -> str:
    """``error.type``: the error's class name when ``text`` is ``"TypeName: message"``, else the text."""
    head = str(text).split(":", 1)[0].strip()
    return head if head and " " not in head else str(text)[:80]


def configured_provider(*, exporter: str | None = None, service_name: str = "squad") -> Any:
    """A new SDK ``TracerProvider`` with a batch span processor and the exporter named by
    ``exporter`` or ``OTEL_TRACES_EXPORTER`` (default ``otlp``): ``console``, ``otlp`` (the
    ``opentelemetry-exporter-otlp`` package, HTTP or gRPC by ``OTEL_EXPORTER_OTLP_PROTOCOL``), or
    any name an installed package registers under the ``opentelemetry_traces_exporter`` entry
    point group. The resource comes from the SDK's ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES``
    (service name ``squad`` when neither names one). Call ``shutdown()`` on it to flush.

    Raises :class:`UserError` when the SDK or the exporter is not installed.
    """
    _api()
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise UserError(f"OpenTelemetry export needs the OpenTelemetry SDK; {INSTALL_HINT}") from None
    names = [n.strip().lower() for n in (exporter or os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")]
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", "") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    for name in dict.fromkeys(n for n in names if n and n != "none"):  # each one named, in order
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    return provider


def _exporter(name: str) -> Any:
    from importlib.metadata import entry_points

    if name == "console":  # to stderr: stdout carries the run's output (and --json)
        import sys

        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)
    if name == "otlp":
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        name = "otlp_proto_grpc" if protocol == "grpc" else "otlp_proto_http"
    found = [e for e in entry_points(group="opentelemetry_traces_exporter") if e.name == name]
    if not found:
        have = sorted({e.name for e in entry_points(group="opentelemetry_traces_exporter")})
        raise UserError(f"no OpenTelemetry span exporter {name!r} is installed (installed: "
                        f"{', '.join(have) or 'none'}); "
                        f"{INSTALL_HINT} for OTLP, or set OTEL_TRACES_EXPORTER=console")
    return found[0].load()()


def model_label(model: str | Path | None) -> str:
    """``gen_ai.request.model`` for a model argument: a known name as is, a path by its file
    name, None as the default model's name."""
    if model is None:
        return DEFAULT_MODEL
    return Path(model).name if isinstance(model, Path) or "/" in str(model) else str(model)


def export_run(name: str, *, model: str | None = None) -> AbstractContextManager[OtelSink]:
    """What ``squad run --otel`` does: a :func:`configured_provider`, one ``invoke_workflow {name}``
    span (``gen_ai.operation.name`` = ``invoke_workflow``) holding the whole run, and an
    :class:`OtelSink` (``model``: its ``gen_ai.request.model``) whose top-level conversations nest in it. On exit the
    workflow span ends (status ERROR if the run raised) and the provider is flushed and shut down.

    Raises :class:`UserError` (SDK or exporter missing) when called, before anything runs: the
    provider and its exporter are set up here, once.
    """
    trace = _api()
    provider = configured_provider()
    return _exporting(trace.get_tracer("squad", tracer_provider=provider), provider, name, model)


@contextmanager
def _exporting(tracer: Any, provider: Any, name: str, model: str | None) -> Iterator[OtelSink]:
    try:
        with tracer.start_as_current_span(f"invoke_workflow {name}", attributes={
                "gen_ai.operation.name": "invoke_workflow", "gen_ai.provider.name": PROVIDER_NAME,
                "gen_ai.workflow.name": name}):
            with OtelSink(model=model, tracer_provider=provider) as sink:
                yield sink
    finally:
        provider.shutdown()
