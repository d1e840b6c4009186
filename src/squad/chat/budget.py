"""Refusing a call before it is sent: a prompt too large to count (F18), a call over its agent's budget.

Both raise :class:`~squad.errors.AdmissionError` with the fix in the message; the call is never
sent. Used by the admitted layer (:mod:`squad.chat.admitted`).
"""

from __future__ import annotations

from squad.chat import ChatRequest
from squad.chat.counting import MAX_BYTES_PER_TOKEN
from squad.engine.llama import round_ctx
from squad.errors import AdmissionError

__all__ = ["refuse_oversized", "refuse_over_budget"]


def refuse_oversized(req: ChatRequest, pool: int) -> None:
    """Raise :class:`AdmissionError` for a prompt of more than :data:`~squad.chat.counting.MAX_BYTES_PER_TOKEN`
    bytes per token of the agent's budget (or of the engine's ``pool``, tokens): it cannot fit, so
    it is neither counted nor sent (field case F18)."""
    tokens, what = (req.budget, "its budget") if req.budget else (pool, "the engine's pool")
    if not tokens:
        return
    limit = MAX_BYTES_PER_TOKEN * tokens
    size = 0
    for m in req.messages:
        content = m.get("content")
        if content:
            text = content if isinstance(content, str) else str(content)
            # a character is at most 4 bytes: only a long text needs encoding to be measured
            size += len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        agent = req.origin.agent
        raise AdmissionError(
            f"agent '{agent}': its prompt is {size:,} bytes, more than {what} of {tokens:,} tokens can hold even at "
            f"{MAX_BYTES_PER_TOKEN} bytes per token; it was neither counted nor sent: shorten the prompt", agent=agent)


def refuse_over_budget(req: ChatRequest, prompt: int, n_ctx_train: int | None) -> None:
    """Raise :class:`AdmissionError` when ``prompt`` (counted tokens) + ``max_tokens`` exceeds the
    request's ``budget``, naming the fixes (a budget the model can hold, per ``n_ctx_train``)."""
    need = prompt + req.max_tokens
    if req.budget is None or need <= req.budget:
        return
    agent = req.origin.agent
    fixes = [f"raise its budget to {round_ctx(need)}"] if not n_ctx_train or round_ctx(need) <= n_ctx_train else []
    if prompt < req.budget:
        fixes.append(f"lower max_tokens to {req.budget - prompt}")
    fixes.append("lower its max_tool_rounds (tool results are cut to fit, the rounds still add up)"
                 if any(m.get("role") == "tool" for m in req.messages) else
                 "shorten the prompt or the history it is given")
    raise AdmissionError(
        f"agent '{agent}' needs {need} tokens (prompt {prompt} + max_tokens {req.max_tokens}) but its budget "
        f"is {req.budget}: " + ", or ".join(fixes), agent=agent)
