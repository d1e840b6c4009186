"""OpenAI chat completions (``/v1/chat/completions``, ``/chat/completions``): counted by squad's one
counter (:class:`~squad.chat.counting.PromptCounter`: the model's tokenizer and chat template), or by
the engine's ``/v1/chat/completions/input_tokens`` when the body carries a field that changes the
rendered prompt beyond its messages and tools (:data:`PROMPT_FIELDS`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from squad.serve.apis.base import Api, check_tools, objects, text_or_parts
from squad.serve.demand import Refused

if TYPE_CHECKING:
    from squad.serve.apis.base import Counting

__all__ = ["Chat", "PROMPT_FIELDS", "ROLES"]

PROMPT_FIELDS = ("chat_template_kwargs", "reasoning_effort", "add_generation_prompt", "continue_final_message")
"""Body fields llama-server passes to the chat template (``oaicompat_chat_params_parse``)."""
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class Chat(Api):
    name = "chat"
    paths: ClassVar[tuple[str, ...]] = ("/v1/chat/completions", "/chat/completions")
    prompt_fields: ClassVar[tuple[str, ...]] = ("messages", "tools")

    def check(self, body: dict[str, Any]) -> None:
        super().check(body)
        messages = objects(body, "messages", required=True, empty=False, what="chat messages (objects)")
        for i, m in enumerate(messages):
            role = m.get("role")
            if not isinstance(role, str) or not role:
                raise Refused(400, f"messages[{i}].role must be a text such as {', '.join(sorted(ROLES))}, got "
                                   f"{role!r}", param=f"messages[{i}].role")
            if role != "assistant" and "content" not in m:
                raise Refused(400, f"messages[{i}] ({role}) has no 'content'", param=f"messages[{i}].content")
            if role == "assistant" and "content" not in m and not m.get("tool_calls"):
                raise Refused(400, f"messages[{i}] (assistant) needs 'content' or 'tool_calls'",
                              param=f"messages[{i}]")
            text_or_parts(m.get("content"), f"messages[{i}].content")
            calls = objects(m, "tool_calls", what="tool calls (objects)") if "tool_calls" in m else []
            for j, call in enumerate(calls):
                if not isinstance(call.get("function"), dict):
                    raise Refused(400, f"messages[{i}].tool_calls[{j}].function must be an object with a name",
                                  param=f"messages[{i}].tool_calls[{j}]")
        for i, tool in enumerate(check_tools(body)):
            fn = tool.get("function")
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise Refused(400, f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                              param=f"tools[{i}]")
        choice = body.get("tool_choice")
        if choice is not None and not isinstance(choice, (str, dict)):
            raise Refused(400, "tool_choice must be 'none', 'auto', 'required' or an object naming a tool",
                          param="tool_choice")
        _stop(body)

    async def count(self, host: Counting, body: dict[str, Any], big: bool = False) -> int:
        if any(body.get(f) is not None for f in PROMPT_FIELDS):
            return await host.engine_count("/v1/chat/completions/input_tokens", body)
        return await host.count_chat(body["messages"], body.get("tools") or None, big)


def _stop(body: dict[str, Any]) -> None:
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise Refused(400, "stop must be a text or a list of texts", param="stop")
