"""Tool choice and structured output for every client of ``squad serve``, rewritten the way
squad's own client sends them (:meth:`squad.chat.client.EngineClient._messages`,
:func:`squad.runtime.turn.forced_choice`).

llama-server b11434 reads ``tool_choice`` only as a string (an object silently becomes ``auto``)
and, with ``required`` alone, lets a small model write text before the first call
(:mod:`squad.engine.chat_templates`). So for each API a request body is rewritten before it is
counted and sent:

- a **named tool** (chat ``{"type": "function", "function": {"name": N}}``, Responses
  ``{"type": "function", "name": N}``, Messages ``{"type": "tool", "name": N}``) becomes
  ``required`` / ``{"type": "any"}`` with only that tool offered;
- a **forced call** (``required``, Messages ``any``) on an engine that applies squad's tool
  template (``prefix``: :attr:`squad.engine.info.EngineInfo.tool_call_prefix`) ends with an
  assistant message holding the template's call prefix, which llama-server continues (its
  assistant prefill), so the answer starts inside a call; a schema (``response_format``) is then
  dropped, its grammar would win over the call (measured, :mod:`squad.chat.structured`);
- Responses ``text.format`` (which b11434's Responses converter does not read) is sent as the
  chat ``response_format`` the converter passes on (``server_chat_convert_responses_to_chatcmpl``
  copies every other field of the body);
- Messages ``tool_choice: {"type": "none"}`` (b11434 reads it as ``auto``) sends no tools;
- Messages ``output_config.format`` (b11434 drops it) goes as a forced tool with its schema,
  answered as text (:mod:`squad.serve.shapes`);
- a call in the history whose arguments are not a JSON object (a reply cut by ``max_tokens``
  mid-call, which clients send back as they got it: LangChain's ``invalid_tool_calls``, LiteLLM's
  message dump) goes back with ``{}`` (:func:`repair_history`), as squad's own runtime sends it
  (:func:`squad.tools.arguments_for_history`): b11434 refuses the whole request over it.

Each function returns the body to send (a new dict when anything changed, else ``body`` itself)
and raises :class:`~squad.serve.demand.Refused` (400) for a named tool that is not offered.
"""

from __future__ import annotations

from typing import Any

from squad.serve.demand import Refused
from squad.serve.shapes import OUTPUT_TOOL
from squad.tools import arguments_for_history

__all__ = ["force_chat", "force_responses", "force_messages", "repair_history", "output_format"]


def _named(tools: Any, name: str | None, name_of: Any, api: str) -> list[dict[str, Any]]:
    offered = [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
    chosen = [t for t in offered if name_of(t) == name]
    if not chosen:
        names = ", ".join(str(name_of(t)) for t in offered) or "none"
        raise Refused(400, f"tool_choice names the tool {name!r}, which this {api} request does not offer "
                           f"(its tools: {names}): add it to tools, or choose one of those", param="tool_choice")
    return chosen[:1]


def force_chat(body: dict[str, Any], prefix: str | None) -> dict[str, Any]:
    """A ``/v1/chat/completions`` body with its tool choice as b11434 honours it (module docstring)."""
    choice, tools = body.get("tool_choice"), body.get("tools")
    if not tools or choice in (None, "auto", "none"):
        return body
    out = dict(body)
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        out["tools"] = _named(tools, name, lambda t: (t.get("function") or {}).get("name"), "chat")
        out["tool_choice"] = choice = "required"
    messages = out.get("messages")
    if choice == "required" and prefix and isinstance(messages, list) and messages \
            and isinstance(messages[-1], dict) and messages[-1].get("role") != "assistant":
        out["messages"] = [*messages, {"role": "assistant", "content": prefix}]
        out.pop("response_format", None)
    return out


_ASSISTANT_ITEMS = ("function_call", "reasoning")


def force_responses(body: dict[str, Any], prefix: str | None) -> dict[str, Any]:
    """A ``/v1/responses`` body with its tool choice and ``text.format`` as b11434 honours them."""
    out = dict(body)
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and "response_format" not in body:
        if fmt.get("type") == "json_schema":
            out["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.get("name") or "output", "schema": fmt.get("schema") or {},
                "strict": bool(fmt.get("strict", True))}}
        elif fmt.get("type") == "json_object":
            out["response_format"] = {"type": "json_object"}
    choice, tools = body.get("tool_choice"), body.get("tools")
    if not tools or choice in (None, "auto", "none"):
        return out
    if isinstance(choice, dict) and choice.get("type") == "function":
        out["tools"] = _named(tools, choice.get("name"), lambda t: t.get("name"), "Responses")
        out["tool_choice"] = choice = "required"
    items = out.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if choice == "required" and prefix and isinstance(items, list) and items and isinstance(items[-1], dict):
        last = items[-1]
        if last.get("role") != "assistant" and last.get("type") not in _ASSISTANT_ITEMS:
            out["input"] = [*items, {"type": "message", "role": "assistant",
                                     "content": [{"type": "output_text", "text": prefix}]}]
            out.pop("response_format", None)
    return out


def output_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """A Messages body's structured output format: ``output_config.format`` (or the beta's
    top-level ``output_format``) of type ``json_schema``, else None."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else body.get("output_format")
    return fmt if isinstance(fmt, dict) and fmt.get("type") == "json_schema" else None


def _with_output_tool(body: dict[str, Any], fmt: dict[str, Any]) -> dict[str, Any]:
    """``body`` with its output format as the forced tool :data:`~squad.serve.shapes.OUTPUT_TOOL`
    (offered beside the client's tools, unless its tool choice is ``none``), ``tool_choice: any``."""
    out = dict(body)
    config = out.pop("output_config", None)
    rest = {k: v for k, v in config.items() if k != "format"} if isinstance(config, dict) else {}
    if rest:
        out["output_config"] = rest
    out.pop("output_format", None)
    choice, tools = body.get("tool_choice"), body.get("tools")
    offered = [] if not isinstance(tools, list) or (isinstance(choice, dict) and choice.get("type") == "none") \
        else tools
    schema = fmt.get("schema") if isinstance(fmt.get("schema"), dict) else {"type": "object"}
    out["tools"] = [*offered, {"name": OUTPUT_TOOL, "description": "Give your answer as this tool's input.",
                               "input_schema": schema}]
    out["tool_choice"] = {"type": "any"}
    return out


def force_messages(body: dict[str, Any], prefix: str | None) -> dict[str, Any]:
    """A ``/v1/messages`` (Anthropic) body with its tool choice and output format as b11434
    honours them."""
    fmt = output_format(body)
    named = isinstance(body.get("tool_choice"), dict) and body["tool_choice"].get("type") == "tool"
    if fmt is not None and not named:  # a named tool is the answer's shape already
        body = _with_output_tool(body, fmt)
    choice, tools = body.get("tool_choice"), body.get("tools")
    if not tools or not isinstance(choice, dict):
        return body
    out = dict(body)
    kind = choice.get("type")
    if kind == "none":
        out.pop("tools", None)
        out.pop("tool_choice", None)
        return out
    if kind == "tool":
        out["tools"] = _named(tools, choice.get("name"), lambda t: t.get("name"), "Messages")
        out["tool_choice"] = {"type": "any"}
        kind = "any"
    messages = out.get("messages")
    if kind == "any" and prefix and isinstance(messages, list) and messages \
            and isinstance(messages[-1], dict) and messages[-1].get("role") == "user":
        out["messages"] = [*messages, {"role": "assistant", "content": prefix}]
    return out


def _repaired_call(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or "arguments" not in fn:
        return call
    fixed = arguments_for_history(fn["arguments"])
    return call if fixed is fn["arguments"] else {**call, "function": {**fn, "arguments": fixed}}


def repair_history(body: dict[str, Any], kind: str) -> dict[str, Any]:
    """``body`` with every earlier tool call's arguments as the engine can parse them (module
    docstring): chat ``messages[].tool_calls[].function.arguments``, Responses ``input[]``
    ``function_call`` items' ``arguments``. Returns ``body`` itself when nothing changed."""
    if kind == "chat" and isinstance(body.get("messages"), list):
        messages = []
        for m in body["messages"]:
            calls = m.get("tool_calls") if isinstance(m, dict) else None
            if isinstance(calls, list):
                fixed = [_repaired_call(c) for c in calls]
                if any(a is not b for a, b in zip(fixed, calls)):
                    m = {**m, "tool_calls": fixed}
            messages.append(m)
        if any(a is not b for a, b in zip(messages, body["messages"])):
            return {**body, "messages": messages}
    elif kind == "responses" and isinstance(body.get("input"), list):
        items = [{**i, "arguments": arguments_for_history(i["arguments"])}
                 if isinstance(i, dict) and i.get("type") == "function_call" and "arguments" in i
                 and arguments_for_history(i["arguments"]) is not i["arguments"] else i
                 for i in body["input"]]
        if any(a is not b for a, b in zip(items, body["input"])):
            return {**body, "input": items}
    return body
