"""Run events: one frozen dataclass per kind, each carrying the ids that place it.

Every event has ``agent``, ``conversation`` (``"security#3"``), ``parent`` (the conversation
that started it, or None), ``call`` (``"c17"``), ``engine`` (base URL), ``worker`` (a Ray
worker, or None), ``t`` (``time.monotonic()`` seconds) and ``wall`` (Unix seconds). So a call
nests in its conversation, a conversation in its parent: trace and view match calls exactly.
On disk (:mod:`squad.events.jsonl`) an event is ``{"kind", "t", "wall", "agent",
"conversation", "parent", "call", "engine", "worker", "data": {...}}``; :func:`event_from_record`
reads it back. The kinds (``Event.kind``), each with its fields, are listed in the design doc;
a test keeps that list equal to the emitted kinds.

Modules: :mod:`squad.events.event` (the base, the registry), :mod:`squad.events.kinds` (every
kind), :mod:`squad.events.sink` (the :class:`Sink` protocol, flush and close); the sinks:
:mod:`squad.events.jsonl`, :mod:`squad.events.otel`, :mod:`squad.events.view`,
:mod:`squad.events.collect` (the summary, :mod:`squad.events.summary`).

Design: docs/design/events.md
"""

from __future__ import annotations

from squad.events.event import EVENT_TYPES, Event, Origin, event_from_record, item_label
from squad.events.kinds import (
    AgentCancelled,
    AgentFailed,
    AgentFinished,
    AgentResumed,
    AgentStarted,
    AnswerCut,
    CallAdmitted,
    CallFailed,
    CallFinished,
    CallFirstToken,
    CallMoved,
    CallQueued,
    CallReleased,
    CallRetried,
    ClusterConnected,
    ClusterStarting,
    EngineExited,
    EngineLoaded,
    EngineLoading,
    EngineLost,
    EnginePlanned,
    EngineReplanning,
    EngineWarning,
    ItemLost,
    MapProgress,
    MCPWarning,
    MentionDispatched,
    MentionQueued,
    OutputRetried,
    ShareSkipped,
    StepWarning,
    ToolCalled,
    ToolLimited,
    ToolTruncated,
    WorkerFailed,
    WorkerStarted,
)
from squad.events.sink import EventSink, Sink, close_all, emit_to, flush_all

__all__ = [
    "Event",
    "EventSink",
    "Sink",
    "Origin",
    "item_label",
    "EVENT_TYPES",
    "emit_to",
    "flush_all",
    "close_all",
    "event_from_record",
    "EnginePlanned",
    "EngineLoaded",
    "EngineReplanning",
    "EngineWarning",
    "EngineLoading",
    "EngineExited",
    "EngineLost",
    "MentionDispatched",
    "MentionQueued",
    "AgentStarted",
    "AgentFinished",
    "AgentResumed",
    "AgentFailed",
    "AgentCancelled",
    "CallQueued",
    "CallAdmitted",
    "CallFirstToken",
    "CallFinished",
    "CallFailed",
    "CallRetried",
    "CallReleased",
    "CallMoved",
    "ShareSkipped",
    "ToolCalled",
    "ToolLimited",
    "ToolTruncated",
    "OutputRetried",
    "AnswerCut",
    "StepWarning",
    "MCPWarning",
    "ClusterStarting",
    "ClusterConnected",
    "WorkerStarted",
    "WorkerFailed",
    "ItemLost",
    "MapProgress",
]
