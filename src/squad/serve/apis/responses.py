"""OpenAI Responses (``/v1/responses``, ``/responses``). llama-server b11434 converts the body to a
chat body itself (``server_chat_convert_responses_to_chatcmpl``: the whole body is copied, ``input``
and ``instructions`` become messages, ``max_output_tokens`` becomes ``max_tokens``), so every chat
field it carries is read too; its prompt is counted by the engine's ``/v1/responses/input_tokens``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from squad.engine.llama import LIMIT_FIELDS
from squad.serve.apis.base import Api, check_tools, text_or_parts
from squad.serve.demand import Refused

if TYPE_CHECKING:
    from squad.serve.apis.base import Counting

__all__ = ["Responses"]


class Responses(Api):
    name = "responses"
    paths: ClassVar[tuple[str, ...]] = ("/v1/responses", "/responses")
    prompt_fields: ClassVar[tuple[str, ...]] = ("input", "instructions", "tools")
    limit_fields = (*LIMIT_FIELDS, "max_output_tokens")
    limit_field = "max_output_tokens"

    def check(self, body: dict[str, Any]) -> None:
        super().check(body)
        items = body.get("input")
        if "input" not in body:
            raise Refused(400, "'input' is required", param="input")
        if not isinstance(items, (str, list)):
            raise Refused(400, "'input' must be a text or a list of input items (objects)", param="input")
        for i, item in enumerate(items if isinstance(items, list) else []):
            if not isinstance(item, dict):
                raise Refused(400, f"input[{i}] must be an input item (an object)", param=f"input[{i}]")
            if "content" in item:
                text_or_parts(item["content"], f"input[{i}].content")
        if body.get("instructions") is not None and not isinstance(body["instructions"], str):
            raise Refused(400, "instructions must be a text", param="instructions")
        check_tools(body)

    async def count(self, host: Counting, body: dict[str, Any], big: bool = False) -> int:
        return await host.engine_count("/v1/responses/input_tokens", body)
