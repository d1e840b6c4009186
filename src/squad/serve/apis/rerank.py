"""Reranking (``/rerank``, ``/reranking``, ``/v1/rerank``, ``/v1/reranking``): a ``query`` and
``documents`` (or TEI's ``texts``); llama-server b11434 scores each document as one task of its own
(``format_prompt_rerank``: query and document, with separators or the model's rerank template),
all posted at once. A request generates nothing and reserves the sum over its documents of query +
document + :data:`RERANK_OVERHEAD`. b11434 serves it only when started with ``--reranking`` (else 501
``This server does not support reranking``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from squad.serve.apis.embeddings import Embeddings
from squad.serve.demand import Refused

if TYPE_CHECKING:
    from squad.serve.apis.base import Counting

__all__ = ["Rerank", "RERANK_OVERHEAD"]

RERANK_OVERHEAD = 128
"""Tokens per document besides the query and the document: BOS, EOS and SEP, or the words of a
model's rerank template (``tokenizer.chat_template.rerank``)."""


class Rerank(Embeddings):
    name = "rerank"
    paths: ClassVar[tuple[str, ...]] = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")
    prompt_fields: ClassVar[tuple[str, ...]] = ("query", "documents", "texts")

    def check(self, body: dict[str, Any]) -> None:
        super().check(body)
        if not isinstance(body.get("query"), str):
            raise Refused(400, "'query' is required: a text", param="query")
        docs = _documents(body)
        if not docs or not all(isinstance(d, str) for d in docs):
            raise Refused(400, "'documents' must be a non-empty list of texts", param="documents")
        top_n = body.get("top_n")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)):
            raise Refused(400, "top_n must be a whole number", param="top_n")

    async def count(self, host: Counting, body: dict[str, Any], big: bool = False) -> int:
        query = await host.count_text(body["query"], big)
        return sum([query + await host.count_text(d, big) + RERANK_OVERHEAD for d in _documents(body)])


def _documents(body: dict[str, Any]) -> Any:
    return body.get("documents", body.get("texts"))
