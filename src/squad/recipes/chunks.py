"""Cutting a long text into pieces of at most N tokens (a map step's ``split: chunks``).

:func:`split_chunks` is pure: text and a token counter in, chunks out. Chunks are cut after
a blank line (a paragraph) when one lies in the second half of the chunk, else after any
line; a single line longer than the limit is cut inside, at the longest prefix that fits.
``overlap`` repeats whole lines from the end of the previous chunk (at most ``overlap``
tokens of them) at the start of the next.

:func:`squad.recipes.modelfile.text_counter` gives the count to use for a model: its own
tokenizer when the GGUF file is on disk and supported, else :func:`estimate_tokens`, UTF-8
bytes / 2 rounded up. Code and prose tokenize at about 3-4 bytes per token, so the estimate
gives chunks about half the size asked for; it is not a bound for unusual text (a tokenizer
may spend one token per byte).
"""

from __future__ import annotations

from collections.abc import Callable

from squad.chat.counting import estimate_tokens

__all__ = ["split_chunks", "estimate_tokens", "Count"]

Count = Callable[[str], int]
"""Tokens of a text."""


def split_chunks(text: str, max_tokens: int, count: Count = estimate_tokens, *, overlap: int = 0) -> list[str]:
    """``text`` cut into chunks of at most ``max_tokens`` tokens each (``count(chunk) <=
    max_tokens``), in order; joined without the overlap they give ``text`` back.

    Empty or whitespace-only text gives ``[]``; text that fits gives ``[text]``. Raises
    ``ValueError`` unless ``max_tokens >= 1`` and ``0 <= overlap < max_tokens``.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if not 0 <= overlap < max_tokens:
        raise ValueError(f"overlap must be 0 or more and below max_tokens ({max_tokens}), got {overlap}")
    if not text.strip():
        return []
    if count(text) <= max_tokens:
        return [text]
    pieces = [p for line in text.splitlines(keepends=True) for p in _cut_line(line, max_tokens, count)]
    sizes = [count(p) for p in pieces]
    chunks: list[str] = []
    start = 0  # first piece not yet in a chunk
    carry: list[str] = []  # overlap lines from the previous chunk
    while start < len(pieces):
        end = _fill(pieces, sizes, start, max_tokens, count, carry)
        while carry and end == start:  # the overlap leaves no room for a new line: drop it
            carry = carry[1:]
            end = _fill(pieces, sizes, start, max_tokens, count, carry)
        end = _paragraph_end(pieces, start, end)
        lines = carry + pieces[start:end]
        chunks.append("".join(lines))
        carry = _tail(lines, overlap, count) if overlap else []
        start = end
    return chunks


def _cut_line(line: str, max_tokens: int, count: Count) -> list[str]:
    """``line`` as pieces of at most ``max_tokens`` each (itself when it fits)."""
    out = []
    while count(line) > max_tokens:
        lo, hi = 1, len(line) - 1  # longest prefix that fits; at least one character
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(line[:mid]) <= max_tokens:
                lo = mid
            else:
                hi = mid - 1
        out.append(line[:lo])
        line = line[lo:]
    return [*out, line] if line else out


def _fill(pieces: list[str], sizes: list[int], start: int, max_tokens: int, count: Count, carry: list[str]) -> int:
    """The end of the longest run ``pieces[start:end]`` that fits after ``carry``: guessed
    from the pieces' own counts, then moved one piece at a time until exact."""
    head = "".join(carry)
    total, end = count(head) if carry else 0, start
    while end < len(pieces) and total + sizes[end] <= max_tokens:
        total += sizes[end]
        end += 1
    while end > start and count(head + "".join(pieces[start:end])) > max_tokens:
        end -= 1
    while end < len(pieces) and count(head + "".join(pieces[start:end + 1])) <= max_tokens:
        end += 1
    return end


def _paragraph_end(pieces: list[str], start: int, end: int) -> int:
    """Cut after the last blank line in the second half of ``pieces[start:end]``, if any
    (only when more text follows)."""
    if end >= len(pieces):
        return end
    for i in range(end - 1, start + (end - start) // 2 - 1, -1):
        if not pieces[i].strip():
            return i + 1
    return end


def _tail(lines: list[str], overlap: int, count: Count) -> list[str]:
    """The last whole lines of ``lines`` that fit in ``overlap`` tokens."""
    out: list[str] = []
    for line in reversed(lines):
        if count("".join([line, *out])) > overlap:
            break
        out.insert(0, line)
    return out
