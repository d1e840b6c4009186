"""llama-server's code infill (``/infill``): ``input_prefix``, ``input_suffix``, an optional
``prompt`` and ``input_extra`` chunks (``{"filename", "text"}``), put together by the engine with the
model's fill-in-the-middle tokens (``format_prompt_infill`` in ``tools/server/server-common.cpp``) and
then generated as ``/completion`` is (same generation fields, same ``n_predict`` default of no limit).

Counted as an upper bound of what the engine holds: every piece counted as the engine tokenizes it
(each on its own, + 1 each for a BOS the count may add), + :data:`INFILL_OVERHEAD` for the FIM tokens,
the repository header and the file separators (the engine may also leave extra chunks out; never
more). A model without FIM tokens gets the engine's own 501 ``Infill is not supported by this model``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from squad.serve.apis.base import Api, objects
from squad.serve.demand import Refused

if TYPE_CHECKING:
    from squad.serve.apis.base import Counting

__all__ = ["Infill", "INFILL_OVERHEAD", "CHUNK_OVERHEAD"]

INFILL_OVERHEAD = 16
"""Tokens besides the pieces: FIM prefix, suffix, middle, repo and separator tokens, ``myproject\\n``,
``filename\\n``, a BOS."""
CHUNK_OVERHEAD = 24
"""Tokens per extra chunk besides its text and file name: the separator (a FIM token, or the
``\\n\\n--- snippet ---\\n\\n`` text when the model has none)."""


class Infill(Api):
    name = "infill"
    paths: ClassVar[tuple[str, ...]] = ("/infill",)
    prompt_fields: ClassVar[tuple[str, ...]] = ("input_prefix", "input_suffix", "prompt", "input_extra")

    def check(self, body: dict[str, Any]) -> None:
        super().check(body)
        for field in ("input_prefix", "input_suffix"):
            if not isinstance(body.get(field), str):
                raise Refused(400, f"'{field}' is required: a text", param=field)
        if body.get("prompt") is not None and not isinstance(body["prompt"], str):
            raise Refused(400, "'prompt' must be a text", param="prompt")
        for i, chunk in enumerate(objects(body, "input_extra", what="{\"filename\", \"text\"} objects")):
            if not isinstance(chunk.get("text"), str) or not isinstance(chunk.get("filename", ""), str):
                raise Refused(400, f"input_extra[{i}] needs a 'text' (and an optional 'filename'), both texts",
                              param=f"input_extra[{i}]")

    async def count(self, host: Counting, body: dict[str, Any], big: bool = False) -> int:
        pieces = [body["input_prefix"], body["input_suffix"]]
        if body.get("prompt"):
            pieces.append(body["prompt"])
        extra = body.get("input_extra") or []
        for chunk in extra:
            pieces += [chunk["text"], (chunk.get("filename") or "tmp") + "\n"]
        counted = [await host.count_text(p, big) for p in pieces if p]
        return sum(counted) + INFILL_OVERHEAD + CHUNK_OVERHEAD * len(extra)
