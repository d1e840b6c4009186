"""Embeddings (``/v1/embeddings``, ``/embeddings``, llama-server's legacy ``/embedding``): a request
holds its input's tokens and generates none, so it reserves its input (each text counted as a
completion prompt is). b11434 serves embeddings only when started with ``--embeddings`` (else 501
``This server does not support embeddings``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from squad.engine.llama import LIMIT_FIELDS
from squad.serve.apis.base import Api, written_limit

if TYPE_CHECKING:
    from squad.serve.apis.base import Counting

__all__ = ["Embeddings"]


class Embeddings(Api):
    name = "embeddings"
    paths: ClassVar[tuple[str, ...]] = ("/v1/embeddings", "/embeddings", "/embedding")
    prompt_fields: ClassVar[tuple[str, ...]] = ("input", "content")
    generates = False
    several = False

    async def count(self, host: Counting, body: dict[str, Any], big: bool = False) -> int:
        texts = body.get("input", body.get("content"))
        texts = texts if isinstance(texts, list) and texts and not isinstance(texts[0], int) else [texts]
        return sum([await host.count_text(t, big) for t in texts])

    def write_limit(self, body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        out = written_limit(body, 0, None)
        return {k: v for k, v in out.items() if k not in (*LIMIT_FIELDS, "max_output_tokens")}
