"""Shared input, paid once: the agents of one fan-out whose prompts hold the same long text.

Two parts (measured on llama-server b11434, ``docs/shared-input.md``):

- **Order** (:func:`arrange`): the shared text (the longest common beginning or end of the
  fan-out's prompts, at least :data:`MIN_SHARED_CHARS` characters) moves to the start of each
  agent's system message, before its own instructions, and the user message names it instead
  (:data:`SHARED_MARK`). Only then do the prompts share a prefix in token order.
- **Prefill once** (:class:`ShareGroup`): the first member admitted prefills only that prefix in
  its slot (``POST /completion`` pinned with ``id_slot``, ``n_predict`` 1), saves the slot
  (``POST /slots/N?action=save``) and every other member restores the file into the slot
  admission granted it (``?action=restore``) before its own request, pinned to that slot. LCP
  slot choice and the RAM prompt cache feed one slot only; save/restore is what b11434 honours.
  It needs ``--slot-save-path`` (squad's launcher adds it under ``state_dir()/slots`` with
  ``--no-cache-idle-slots``); an engine without it, or any step that fails, sends the request
  as before (unpinned, whole prompt prefilled): slower, never a different answer.

Restored cells are a copy per slot, not shared cells, so admission counts each member's whole
prompt as before.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import httpx

if TYPE_CHECKING:
    from squad.chat import ChatRequest

__all__ = [
    "MIN_SHARED_CHARS",
    "MIN_SHARED_TOKENS",
    "SHARED_MARK",
    "SHARE_MODES",
    "Arrangement",
    "ShareGroup",
    "ShareMode",
    "arrange",
    "board_group",
    "current_group",
    "joined",
    "sharing",
]

ShareMode = Literal["first", "order", "off"]
SHARE_MODES: tuple[str, ...] = ("first", "order", "off")
"""``first`` (default): shared text first and prefilled once; ``order``: shared text first, each
slot prefills its own copy (today's engine use; for comparisons); ``off``: prompts as written."""

MIN_SHARED_CHARS = 600
"""Shortest common text (characters) that is moved first: below it a fan-out is sent as written."""
MIN_SHARED_TOKENS = 64
"""Shortest shared prefix (tokens) worth a slot save and restores (each costs a few ms)."""
SEPARATOR = "\n\n---\n\n"
"""Between the shared text and an agent's own instructions in its system message."""
SHARED_MARK = "(the shared input is at the start of the system message)"
"""What the user message says where the shared text stood."""
_TRIM_TOKENS = 2
"""Tokens dropped from the end of the probed prefix (where the text next to it may merge with it)."""

_IDS = itertools.count(1)
_GROUP: ContextVar[ShareGroup | None] = ContextVar("squad_share_group", default=None)
_BOARD: ContextVar[dict[str, ShareGroup] | None] = ContextVar("squad_share_board", default=None)


@dataclass(frozen=True)
class Arrangement:
    """How a fan-out's prompts are rearranged: ``shared`` (the text several prompts hold) goes
    first in each system message."""

    shared: str

    def system(self, instructions: str) -> str:
        """The system message of a member whose own system message is ``instructions``."""
        return self.shared + SEPARATOR + instructions if instructions else self.shared

    def prompt(self, prompt: str) -> str:
        """The user message of a member whose prompt was ``prompt``."""
        return prompt.replace(self.shared, SHARED_MARK, 1) if self.shared in prompt else prompt


def arrange(prompts: Sequence[str], *, min_chars: int = MIN_SHARED_CHARS) -> Arrangement | None:
    """The arrangement for a fan-out of ``prompts`` (one per agent), or None when fewer than two
    prompts, or when their longest common beginning or end is shorter than ``min_chars``
    characters. A common beginning is cut back to a line end so no word is split."""
    if len(prompts) < 2:
        return None
    if len(set(prompts)) == 1:  # the same prompt to every agent: all of it is shared
        shared = prompts[0]
    else:
        head = os.path.commonprefix(list(prompts))
        head = head[: head.rfind("\n") + 1]  # back to a line end ("" if none)
        tail = os.path.commonprefix([p[::-1] for p in prompts])[::-1]
        tail = tail[tail.find("\n") + 1:] if "\n" in tail else ""
        shared = head if len(head) >= len(tail) else tail
    return Arrangement(shared) if len(shared.strip()) >= min_chars else None


@dataclass
class ShareGroup:
    """The members of one fan-out that share ``arrangement.shared``; ``mode`` as in
    :data:`SHARE_MODES`. Members join by conversation id (:meth:`join`); only each member's
    first call uses the shared prefix (:meth:`claim`)."""

    arrangement: Arrangement
    mode: ShareMode = "first"
    id: str = field(default_factory=lambda: f"squad-share-{os.getpid()}-{next(_IDS)}")
    members: set[str] = field(default_factory=set)
    tokens: list[int] | None = None
    """The shared prefix in tokens once probed (empty: nothing to share on this engine)."""
    file: Path | None = None
    _claimed: set[str] = field(default_factory=set)
    _probe_lock: anyio.Lock = field(default_factory=anyio.Lock)
    _leader: bool = False
    _ready: anyio.Event = field(default_factory=anyio.Event)
    _failed: str | None = None

    def join(self, conversation: str) -> None:
        self.members.add(conversation)

    def claim(self, conversation: str | None) -> bool:
        """True once per member: its first call goes through the group."""
        if self.mode != "first" or conversation not in self.members or conversation in self._claimed:
            return False
        self._claimed.add(conversation)
        return True

    @property
    def failed(self) -> str | None:
        """Why the prefix was not prefilled once (None: it was, or not yet tried)."""
        return self._failed

    async def probe(self, http: httpx.AsyncClient) -> int:
        """The shared prefix's length in tokens as the engine tokenizes it (once per group): the
        common start of two chat prompts that hold the shared text then different instructions,
        rendered by ``/apply-template`` and tokenized by ``/tokenize``. 0 when the engine cannot tell."""
        async with self._probe_lock:
            if self.tokens is None:
                self.tokens = []
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError, TypeError):
                    runs = []
                    for probe in ("A", "Z"):
                        msgs = [{"role": "system", "content": self.arrangement.system(probe)},
                                {"role": "user", "content": probe}]
                        r = await http.post("/apply-template", json={"messages": msgs})
                        r.raise_for_status()
                        t = await http.post("/tokenize", json={"content": r.json()["prompt"], "add_special": True,
                                                                "parse_special": True})
                        t.raise_for_status()
                        runs.append([int(x) for x in t.json()["tokens"]])
                    n = 0
                    for a, b in zip(*runs):
                        if a != b:
                            break
                        n += 1
                    self.tokens = runs[0][: max(0, n - _TRIM_TOKENS)]
            return len(self.tokens)

    async def enter(self, http: httpx.AsyncClient, slot: int, save_dir: str | None) -> bool:
        """Make ``slot`` hold the shared prefix before a member's call; True when it does (the
        call must then be pinned to ``slot``). The first member to enter prefills and saves; the
        others wait for it, then restore. Any failure: False (the call goes as before)."""
        if not self.tokens or save_dir is None or slot < 0:
            return False
        if not self._leader:
            self._leader = True
            try:
                self._failed = await self._warm(http, slot, save_dir)
            except BaseException:
                self._failed = "the first member's call ended before the prefix was saved"
                raise
            finally:
                self._ready.set()
            return self._failed is None
        await self._ready.wait()
        if self._failed is not None:
            return False
        with contextlib.suppress(httpx.HTTPError):
            r = await http.post(f"/slots/{slot}", params={"action": "restore"}, json={"filename": self._name})
            return r.status_code == 200
        return False

    @property
    def _name(self) -> str:
        return f"{self.id}.bin"

    async def _warm(self, http: httpx.AsyncClient, slot: int, save_dir: str) -> str | None:
        assert self.tokens is not None
        try:
            r = await http.post("/completion", json={"prompt": self.tokens, "n_predict": 1, "id_slot": slot,
                                                     "cache_prompt": True, "temperature": 0.0})
            if r.status_code != 200:
                return f"prefill refused: HTTP {r.status_code} {r.text[:200]}"
            r = await http.post(f"/slots/{slot}", params={"action": "save"}, json={"filename": self._name})
            if r.status_code != 200:
                return f"slot save refused: HTTP {r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            return f"engine did not answer ({exc!r})"
        self.file = Path(save_dir) / self._name
        return None

    def close(self) -> None:
        """Delete the saved slot file (the fan-out is over)."""
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.unlink()
            self.file = None


@contextlib.contextmanager
def sharing(texts: Sequence[str], mode: str) -> Any:
    """Within the block, a fan-out member whose prompt holds one of ``texts`` (e.g. a chunk that
    several map steps of one recipe ``parallel`` block go over, each in its own ``Squad.map``)
    joins that text's group (:func:`board_group`). ``mode`` as in :data:`SHARE_MODES`; texts
    shorter than :data:`MIN_SHARED_CHARS` are left as written. Deletes the groups' slot files at the end."""
    board = {t: ShareGroup(Arrangement(t), mode=mode) for t in texts  # type: ignore[arg-type]
             if mode != "off" and len(t.strip()) >= MIN_SHARED_CHARS}
    token = _BOARD.set(board or None)
    try:
        yield
    finally:
        _BOARD.reset(token)
        for group in board.values():
            group.close()


def board_group(prompt: str) -> ShareGroup | None:
    """The group of the longest shared text (:func:`sharing`) ``prompt`` holds, or None."""
    board = _BOARD.get()
    if not board:
        return None
    held = [t for t in board if t in prompt]
    return board[max(held, key=len)] if held else None


def current_group() -> ShareGroup | None:
    """The share group of the fan-out this task runs in, if any."""
    return _GROUP.get()


@contextlib.contextmanager
def joined(group: ShareGroup | None, conversation: str) -> Any:
    """Run the block as member ``conversation`` of ``group`` (None: no group)."""
    if group is None:
        yield
        return
    group.join(conversation)
    token = _GROUP.set(group)
    try:
        yield
    finally:
        _GROUP.reset(token)


def request_shares(req: ChatRequest) -> ShareGroup | None:
    """The group ``req`` goes through: its conversation's first call in a ``first`` group."""
    group = _GROUP.get()
    if group is not None and group.claim(req.origin.conversation):
        return group
    return None
