"""Text completions: OpenAI's ``/v1/completions`` and llama-server's own ``/completion`` and
``/completions``. The prompt is a text, a list of token ids, or a list of those (several prompts:
:mod:`squad.serve.fanout`); counted by the model's tokenizer (+ 1 for a BOS the engine may add), else
the engine's ``/tokenize``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from squad.serve.apis.base import Api
from squad.serve.apis.chat import _stop

if TYPE_CHECKING:
    from squad.serve.apis.base import Counting

__all__ = ["Completion"]


class Completion(Api):
    name = "completion"
    paths: ClassVar[tuple[str, ...]] = ("/v1/completions", "/completions", "/completion")
    prompt_fields: ClassVar[tuple[str, ...]] = ("prompt",)

    def check(self, body: dict[str, Any]) -> None:
        super().check(body)
        _stop(body)

    async def count(self, host: Counting, body: dict[str, Any], big: bool = False) -> int:
        return await host.count_text(body.get("prompt"), big)
