"""Anthropic Messages (``/v1/messages``). llama-server b11434 converts the body to a chat body
(``server_chat_convert_anthropic_to_oai``: its ``max_tokens``, 4096 when absent, and only
``temperature``, ``top_p``, ``top_k``, ``stream``, ``chat_template_kwargs`` besides messages, system,
tools, tool choice and stop sequences); its prompt is counted by the engine's
``/v1/messages/count_tokens``. Errors are Anthropic's shape: ``{"type": "error", "error": {"type",
"message"}}``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from squad.serve.apis.base import Api, check_tools, objects, text_or_parts
from squad.serve.demand import Refused

if TYPE_CHECKING:
    from squad.serve.apis.base import Counting

__all__ = ["Messages", "ERROR_TYPES"]

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error", 529: "overloaded_error"}
"""Anthropic's error ``type`` by HTTP status (others: ``api_error``)."""


class Messages(Api):
    name = "messages"
    paths: ClassVar[tuple[str, ...]] = ("/v1/messages",)
    prompt_fields: ClassVar[tuple[str, ...]] = ("messages", "system", "tools")
    limit_fields = ("max_tokens",)
    several = False

    def check(self, body: dict[str, Any]) -> None:
        super().check(body)
        messages = objects(body, "messages", required=True, what="Anthropic messages (objects)")
        for i, m in enumerate(messages):
            if m.get("role") not in ("user", "assistant"):
                raise Refused(400, f"messages[{i}].role must be 'user' or 'assistant', got {m.get('role')!r}",
                              param=f"messages[{i}].role")
            text_or_parts(m.get("content"), f"messages[{i}].content", none=False)
        system = body.get("system")
        if system is not None and not isinstance(system, str):
            objects(body, "system", what="text blocks (objects)")
        for i, tool in enumerate(check_tools(body)):
            if not isinstance(tool.get("name"), str):
                raise Refused(400, f"tools[{i}] needs a 'name'", param=f"tools[{i}]")
        if body.get("tool_choice") is not None and not isinstance(body["tool_choice"], dict):
            raise Refused(400, "tool_choice must be an object such as {\"type\": \"auto\"}", param="tool_choice")
        stop = body.get("stop_sequences")
        if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
            raise Refused(400, "stop_sequences must be a list of texts", param="stop_sequences")

    async def count(self, host: Counting, body: dict[str, Any], big: bool = False) -> int:
        return await host.engine_count("/v1/messages/count_tokens", body)

    def error(self, body: dict[str, Any]) -> dict[str, Any]:
        inner = body.get("error") if isinstance(body, dict) else None
        if isinstance(body, dict) and body.get("type") == "error":
            return body
        if not isinstance(inner, dict):
            return {"type": "error", "error": {"type": "api_error", "message": str(body)[:1000]}}
        code = inner["code"] if isinstance(inner.get("code"), int) else 500
        return {"type": "error", "error": {"type": ERROR_TYPES.get(code, "api_error"),
                                           "message": str(inner.get("message", ""))}}
