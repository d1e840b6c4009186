"""Exact prompt counts for admission, with no round trip on the common path.

:class:`PromptCounter` answers "how many tokens is this prompt?" as the engine would
(``POST /v1/chat/completions/input_tokens``):

1. a count it gave recently for the same messages and tools (remembered, LRU);
2. the model's own tokenizer and chat template from its GGUF file when that file is on this
   machine (:func:`squad.engine.tokens.counter_for_model`, proved equal to the engine's count
   on a corpus of real prompts) — no round trip;
3. otherwise (an attached engine elsewhere, or a request the local counter cannot count
   exactly, :class:`~squad.engine.tokens.NotExact`) the engine's own count, through ``remote``.

The engine's ``usage.prompt_tokens`` after each call is the truth: :meth:`reconcile` stops
using the local counter for good if the engine ever reports more than it counted (admission
must never reserve less than the engine uses).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

import anyio

from squad.engine.kinds.counting import ESTIMATE_OVERHEAD, estimate_chat_tokens, estimate_tokens
from squad.engine.template_profile import call_id_length, fit_call_ids
from squad.engine.tokens import NotExact, TokenCounter, counter_for_model
from squad.errors import SquadError

__all__ = ["PromptCounter", "COUNT_CACHE", "MAX_BYTES_PER_TOKEN", "estimate_tokens", "estimate_chat_tokens",
           "ESTIMATE_OVERHEAD"]

COUNT_CACHE = 4096
"""Prompt counts remembered (least recently used dropped first)."""

MAX_BYTES_PER_TOKEN = 8
"""A prompt above this many UTF-8 bytes per token of the context it must fit is refused without
counting it: no tokenizer packs more than a few bytes into one token of ordinary text, so it
cannot fit, and counting 100 MB would take minutes (field case F18)."""

Remote = Callable[[list[dict], "list[dict] | None"], Awaitable[int]]


class PromptCounter:
    """Prompt token counts for one engine (see the module docstring).

    - ``model_path``: the engine's model file as it reported it (``/props`` ``model_path``);
    - ``remote``: asks the engine to count (``async (messages, tools) -> int``);
    - ``local``: ``"auto"`` finds the model's tokenizer from ``model_path``; a
      :class:`~squad.engine.tokens.TokenCounter` to use; None never counts locally.
    - ``template``: the chat template the engine applies (``/props`` ``chat_template``), used by
      an ``"auto"`` local counter in place of the model file's when they differ (an engine
      started with squad's tool template); None: the model file's.
    """

    def __init__(self, model_path: str, remote: Remote,
                 local: TokenCounter | None | Literal['auto'] = "auto", *, template: str | None = None) -> None:
        self.model_path, self._remote, self._local_arg = model_path, remote, local
        self.template = template
        self._id_length = call_id_length(template)
        self._local: TokenCounter | None = None
        self._ready = False
        self._lock = anyio.Lock()
        self._cache: OrderedDict[str, int] = OrderedDict()
        self.remote_counts = 0
        """How many counts had to ask the engine."""

    @property
    def local(self) -> TokenCounter | None:
        """The local counter in use (after :meth:`prepare`), or None."""
        return self._local

    async def prepare(self) -> None:
        """Load the local counter once, in a worker thread (~0.1 s from squad's cache, ~2 s the
        first time for a model)."""
        if self._ready:
            return
        async with self._lock:
            if not self._ready:
                self._local = await anyio.to_thread.run_sync(self._find_local)
                self._ready = True

    def _find_local(self) -> TokenCounter | None:
        if not isinstance(self._local_arg, str):  # the counter given (or None), not "auto"
            return self._local_arg
        path = Path(self.model_path) if self.model_path else None
        if path is None or not path.is_file():
            return None
        try:
            return counter_for_model(path, template=self.template)
        except SquadError:
            return None

    async def __call__(self, messages: list[dict], tools: list[dict] | None = None, *,
                       in_thread: bool = False) -> tuple[int, bool]:
        """``(tokens, local)``: the exact prompt count, and whether it was counted here (not
        by the engine). Tool call ids are counted as they are sent: fitted to what the template
        demands (:func:`squad.engine.template_profile.fit_call_ids`). ``in_thread``: do the CPU work
        (the cache key, the local count) in a worker thread, for a large prompt that would hold up the
        event loop (``squad serve``). Raises what ``remote`` raises."""
        if in_thread:
            messages, key = await anyio.to_thread.run_sync(self._keyed, messages, tools)
        else:
            messages, key = self._keyed(messages, tools)
        known = self._cache.get(key)
        if known is not None:
            self._cache.move_to_end(key)
            return known, self._local is not None
        await self.prepare()
        if in_thread and self._local is not None:
            n = await anyio.to_thread.run_sync(self._count_local, messages, tools)
        else:
            n = self._count_local(messages, tools)
        local = n is not None
        if n is None:
            self.remote_counts += 1
            n = await self._remote(messages, tools)
        self._cache[key] = n
        if len(self._cache) > COUNT_CACHE:
            self._cache.popitem(last=False)
        return n, local

    def _keyed(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], str]:
        messages = fit_call_ids(messages, self._id_length)
        return messages, _key(messages, tools)

    def _count_local(self, messages: list[dict], tools: list[dict] | None) -> int | None:
        if self._local is None:
            return None
        try:
            return self._local.count_chat(messages, tools)
        except (NotExact, TypeError, UnicodeError):  # not countable here (e.g. text that is not UTF-8)
            return None

    def reconcile(self, counted: int, engine_prompt_tokens: int) -> str | None:
        """After a call counted here at ``counted`` tokens: if the engine reports more, stop
        counting locally and return a warning to show (else None)."""
        if self._local is None or engine_prompt_tokens <= counted:
            return None
        self._local, self._cache = None, OrderedDict()
        return (f"the local token count ({counted}) was below the engine's ({engine_prompt_tokens}) for "
                f"{Path(self.model_path).name}: squad now asks the engine to count every prompt")


def _key(messages: list[dict], tools: list[dict] | None) -> str:
    text = json.dumps([messages, tools], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
