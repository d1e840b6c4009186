"""Which program a request of ``squad serve`` belongs to, so that serve orders external agents the way squad's
runtime orders its own (the ``program`` queue policy, :mod:`squad.sched.policies.program`).

A *program* is one session of one client: a Claude Code session with its sub-agents, one OpenCode run. A
*conversation* is one thread of it (the main agent's, each sub-agent's): its next request finds its prefix in the
slot its last one used. Both come from what the request says, first match wins:

1. ``X-Squad-Program: NAME`` (any client can send it);
2. what clients send already: Anthropic ``metadata.user_id`` (Claude Code puts its session there: the
   ``session_id`` of its JSON form, the part after ``_session_`` of its older text form), OpenAI ``user``,
   ``prompt_cache_key`` (Codex CLI sends its conversation id), Responses' ``safety_identifier``;
3. ``X-Squad-Client`` (a client that names itself) with the conversation's start: one program per client name;
4. else the request alone is its own program.

The conversation is the program plus a digest of the conversation's start (the system prompt and the first user
message, the part that stays the same turn after turn): a main agent and each of its sub-agents are different
conversations of one program. Programs are named per client (``client/program``): two clients that send the same
``user`` are still two programs.

Within a program the main thread goes before its sub-agents when the client says so: ``X-Squad-Priority`` (lower
first), or ``X-Squad-Agent: sub`` (priority 1 when no priority is given). Between programs the policy gives the
engine to the one that has held it least (least attained service); between clients :mod:`squad.serve.shares`
decides first.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from squad.events import Origin
from squad.serve.http import header

__all__ = ["PROGRAM_HEADER", "AGENT_HEADER", "Program", "Programs", "program_of", "session_of"]

PROGRAM_HEADER = "x-squad-program"
AGENT_HEADER = "x-squad-agent"
"""``main`` or ``sub``: a sub-agent's request goes after its program's main thread (priority 1)."""
MAX_NAME = 128
"""Characters of a program name kept (a longer one is cut and a digest of the whole added)."""
PREFIX_CHARS = 4096
"""Characters of a conversation's start digested to tell its threads apart."""
KEPT = 256
"""Programs :class:`Programs` keeps for ``/squad/status`` (the least recently seen forgotten first)."""


@dataclass(frozen=True)
class Program:
    """Where a request belongs: ``client``, ``program`` (``client/name``), ``conversation`` (the program plus its
    thread), ``source`` (what named it: ``header``, ``user_id``, ``user``, ``prompt_cache_key``,
    ``safety_identifier``, ``client``, ``request``), ``sub`` (the client said it is a sub-agent's)."""

    client: str
    program: str
    conversation: str
    source: str
    sub: bool = False

    def origin(self) -> Origin:
        """The admission origin: the client as the agent, the thread as the conversation, the program as its
        parent (the ``program`` policy groups a conversation under its parent)."""
        return Origin(self.client, conversation=self.conversation, parent=self.program)


def _name(value: str) -> str:
    value = value.strip()
    if len(value) <= MAX_NAME:
        return value
    return value[:MAX_NAME - 13] + "~" + hashlib.sha256(value.encode()).hexdigest()[:12]


def session_of(user_id: str) -> str:
    """The session in an Anthropic ``metadata.user_id``: Claude Code's JSON form ``{"session_id": ...}``, its
    text form ``user_<h>_account_<a>_session_<s>``; else the whole value."""
    text = user_id.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            return text
        if isinstance(data, dict):
            for key in ("session_id", "sessionId", "session"):
                if isinstance(data.get(key), str) and data[key]:
                    return str(data[key])
        return text
    _, found, session = text.partition("_session_")
    return session if found and session else text


def _named(body: dict[str, Any]) -> tuple[str, str] | None:
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str) and metadata["user_id"].strip():
        return "user_id", session_of(metadata["user_id"])
    for field_ in ("prompt_cache_key", "user", "safety_identifier"):
        value = body.get(field_)
        if isinstance(value, str) and value.strip():
            return field_, value
    return None


def _start(body: dict[str, Any]) -> str:
    """The conversation's start: what stays the same from one turn to the next (system prompt and instructions,
    the first user message; a text prompt's first characters)."""
    parts: list[Any] = [body.get("system"), body.get("instructions")]
    for key in ("messages", "input"):
        items = body.get(key)
        if isinstance(items, list):
            firsts = [m for m in items if isinstance(m, dict) and m.get("role") in ("system", "developer")]
            users = [m for m in items if isinstance(m, dict) and m.get("role") == "user"]
            parts += [m.get("content") for m in firsts] + ([users[0].get("content")] if users else [])
        elif isinstance(items, str):
            parts.append(items)
    for key in ("prompt", "input_prefix", "query"):
        if isinstance(body.get(key), str):
            parts.append(body[key])
    text = json.dumps(parts, sort_keys=True, default=str)[:PREFIX_CHARS]
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def program_of(scope: dict[str, Any], body: dict[str, Any], client: str, request_id: str,
               priority_given: bool = False) -> Program:
    """The program and conversation of one request (see the module docstring). ``client`` is the request's
    client as squad serve shares it (its key's label, else its name); ``request_id`` names a request alone."""
    agent = (header(scope, AGENT_HEADER.encode()) or "").strip().lower()
    sub = agent in ("sub", "subagent", "sub-agent")
    explicit = header(scope, PROGRAM_HEADER.encode())
    if explicit and explicit.strip():
        source, name = "header", explicit
    elif (named := _named(body)) is not None:
        source, name = named
    elif header(scope, b"x-squad-client"):
        source, name = "client", "-"
    else:
        source, name = "request", request_id
    program = f"{client}/{_name(name)}"
    conversation = program if source == "request" else f"{program}#{_start(body)}"
    return Program(client=client, program=program, conversation=conversation, source=source, sub=sub)


@dataclass
class _Seen:
    client: str
    source: str
    requests: int = 0
    running: int = 0
    queued: int = 0
    held_s: float = 0.0
    conversations: OrderedDict[str, int] = field(default_factory=OrderedDict)
    """Conversation -> the slot its last request ran on (-1 before it ran)."""
    last: float = field(default_factory=time.monotonic)


class Programs:
    """The programs squad serve has seen lately, for ``/squad/status`` (at most :data:`KEPT`; requests alone
    are not kept): requests, running, queued, seconds their requests held a slot, conversations and their slots."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._seen: OrderedDict[str, _Seen] = OrderedDict()

    def _get(self, p: Program) -> _Seen | None:
        if p.source == "request":
            return None
        seen = self._seen.pop(p.program, None) or _Seen(client=p.client, source=p.source)
        self._seen[p.program] = seen
        while len(self._seen) > self.kept:
            oldest = next(iter(self._seen))
            if self._seen[oldest].running or self._seen[oldest].queued:
                self._seen.move_to_end(oldest)
                if next(iter(self._seen)) == oldest:
                    break
                continue
            del self._seen[oldest]
        seen.last = time.monotonic()
        return seen

    def queued(self, p: Program) -> None:
        seen = self._get(p)
        if seen is not None:
            seen.requests += 1
            seen.queued += 1

    def admitted(self, p: Program, slot: int) -> None:
        seen = self._seen.get(p.program)
        if seen is not None:
            seen.queued -= 1
            seen.running += 1
            seen.conversations.pop(p.conversation, None)
            seen.conversations[p.conversation] = slot
            while len(seen.conversations) > 32:
                seen.conversations.popitem(last=False)

    def left(self, p: Program, *, admitted: bool, held_s: float = 0.0) -> None:
        seen = self._seen.get(p.program)
        if seen is not None:
            if admitted:
                seen.running -= 1
                seen.held_s += held_s
            else:
                seen.queued -= 1

    def view(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [{"program": name, "client": s.client, "source": s.source, "requests": s.requests,
                 "running": s.running, "queued": s.queued, "held_s": round(s.held_s, 3),
                 "idle_s": round(now - s.last, 1),
                 "conversations": [{"id": c.rpartition("#")[2] or c, "slot": slot}
                                   for c, slot in s.conversations.items()]}
                for name, s in reversed(self._seen.items())]
