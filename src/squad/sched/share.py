"""Shared input, paid once: the members of one fan-out whose prompts really begin the same way.

squad never changes a prompt for this (invariant I2, ``docs/shared-input.md``). Two parts
(measured on llama-server b11434):

- **Find** (:func:`common_prefixes`): among a fan-out's members, each ``(system, prompt)``, the
  subsets whose messages begin byte-identically: the same system message and the same start
  of the user message, or the same start of the system message. Any subset counts (2 of 3 share
  among the 2); a common part under :data:`MIN_SHARED_CHARS` characters is left alone. Authors
  who want a long text shared put it first on purpose: a fan-out's ``shared`` context starts
  every member's system message (:func:`with_shared`), a layout they declared and ``squad plan`` shows.
- **Prefill once** (:class:`ShareGroup`): the first member admitted prefills only that prefix in
  its slot (``POST /completion`` pinned with ``id_slot``, ``n_predict`` 1, within a deadline from
  the counted tokens and the engine's measured speed), saves the slot (``?action=save``) and
  every other member restores the file into the slot admission granted it (``?action=restore``)
  before its own request, pinned there. It needs ``--slot-save-path`` (squad's launcher adds it);
  an engine without it, or any step that fails, sends the request as before (unpinned, whole
  prompt prefilled) and says why (``share.skipped``). What the engine really reused is read from
  its own ``timings.cache_n`` (``call.finished``), never from this plan.

Restored cells are a copy per slot, not shared cells, so admission counts each member's whole
prompt as before.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx

__all__ = [
    "MIN_SHARED_CHARS",
    "MIN_SHARED_TOKENS",
    "SEPARATOR",
    "SHARE_MODES",
    "CommonPrefix",
    "ShareGroup",
    "ShareMode",
    "board_group",
    "common_prefixes",
    "share_mode",
    "sharing",
    "with_shared",
]

ShareMode = Literal["prefix", "off"]
SHARE_MODES: tuple[str, ...] = ("prefix", "off", "first", "order")
"""``prefix`` (default): a prefix the members really have in common is prefilled once; ``off``:
each slot prefills its own prompt. ``first`` and ``order`` are the old names (issue 29): ``first``
is ``prefix`` and ``order`` is ``off``; neither moves text any more."""

MIN_SHARED_CHARS = 600
"""Shortest common part (characters) a group is formed for: below it every member goes alone."""
MIN_SHARED_TOKENS = 64
"""Shortest common prefix (tokens) worth a slot save and restores (each costs a few ms)."""
SEPARATOR = "\n\n"
"""Between a fan-out's declared ``shared`` context and a member's own instructions (:func:`with_shared`)."""
_TRIM_TOKENS = 2
"""Tokens dropped from the end of the probed prefix (where the text next to it may merge with it)."""

_IDS = itertools.count(1)
_BOARD: ContextVar[dict[str, ShareGroup] | None] = ContextVar("squad_share_board", default=None)


def share_mode(name: str) -> ShareMode:
    """The mode ``name`` stands for (:data:`SHARE_MODES`; old names mapped); raises ValueError."""
    if name not in SHARE_MODES:
        raise ValueError(f"shared_input {name!r} is not one of {', '.join(SHARE_MODES)}")
    return "off" if name in ("off", "order") else "prefix"


def with_shared(shared: str | None, system: str) -> str:
    """The system message of a member of a fan-out whose author declared ``shared`` context:
    that text first, then the member's own instructions (``system``). ``shared`` None or empty:
    ``system`` unchanged."""
    if not shared:
        return system
    return shared + SEPARATOR + system if system else shared


@dataclass(frozen=True)
class CommonPrefix:
    """What several members' messages begin with, byte for byte: ``system`` is the whole system
    message of each (``whole``) followed by a user message starting with ``user``, or, when not
    ``whole``, the start of each one's system message (``user`` is then "")."""

    system: str
    user: str = ""
    whole: bool = True

    @property
    def chars(self) -> int:
        return len(self.system) + len(self.user)

    def probe(self, tail: str) -> list[dict[str, Any]]:
        """Messages that render as this prefix followed by ``tail`` (two tails: where they part)."""
        if not self.whole:
            return [{"role": "system", "content": self.system + tail}, {"role": "user", "content": tail}]
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, {"role": "user", "content": self.user + tail}]

    def held_by(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """True when ``messages`` (a request's, as sent) begin with this prefix."""
        def text(i: int, role: str) -> str | None:
            if i >= len(messages) or messages[i].get("role") != role:
                return None
            content = messages[i].get("content")
            return content if isinstance(content, str) else None

        if not self.whole:
            first = text(0, "system")
            return first is not None and first.startswith(self.system)
        at = 0
        if self.system:
            if text(0, "system") != self.system:
                return False
            at = 1
        elif text(0, "system") is not None:
            return False
        user = text(at, "user")
        return user is not None and user.startswith(self.user)


def _common(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def _prefix_of(members: Sequence[tuple[str, str]]) -> CommonPrefix | None:
    systems = {s for s, _ in members}
    if len(systems) == 1:
        system = systems.pop()
        user = os.path.commonprefix([p for _, p in members])
        return CommonPrefix(system, user, whole=True)
    if any(not s for s in systems):
        return None  # one has no system message, another has one: they part at once
    return CommonPrefix(os.path.commonprefix([s for s, _ in members]), whole=False)


def common_prefixes(members: Sequence[tuple[str, str]], *,
                    min_chars: int = MIN_SHARED_CHARS) -> list[tuple[list[int], CommonPrefix]]:
    """The subsets of ``members`` (each ``(system message, user prompt)`` as sent) that begin the
    same way, and what they have in common: disjoint, each of two or more members, each prefix at
    least ``min_chars`` characters. Chosen to save the most prefill ((members - 1) x length): a
    long part two members share beats a short one all share."""
    if len(members) < 2:
        return []
    keys = [s + "\x00" + p for s, p in members]
    order = sorted(range(len(members)), key=keys.__getitem__)
    adjacent = [_common(keys[order[i]], keys[order[i + 1]]) for i in range(len(order) - 1)]
    if max(adjacent) < min_chars:  # a group's prefix is at most its members' common key: none can be long enough
        return []  # (O(n log n) for a map of short prompts; the search below is O(n^2) in the worst case)

    def value(lo: int, hi: int) -> tuple[int, CommonPrefix | None]:
        found = _prefix_of([members[order[i]] for i in range(lo, hi + 1)])
        if found is None or len(found.system.strip()) + len(found.user.strip()) < min_chars:
            return 0, None
        return (hi - lo) * found.chars, found

    # best[(lo, hi)] over runs of the sorted order, split where adjacent members part soonest
    best: dict[tuple[int, int], tuple[int, list[tuple[int, int, CommonPrefix]]]] = {}
    stack: list[tuple[int, int, bool]] = [(0, len(order) - 1, False)]
    while stack:
        lo, hi, expanded = stack.pop()
        if hi <= lo:
            best[(lo, hi)] = (0, [])
            continue
        cut = min(range(lo, hi), key=lambda i: adjacent[i])
        if not expanded:
            stack += [(lo, hi, True), (lo, cut, False), (cut + 1, hi, False)]
            continue
        whole, prefix = value(lo, hi)
        split = best[(lo, cut)][0] + best[(cut + 1, hi)][0]
        if prefix is not None and whole >= split:
            best[(lo, hi)] = (whole, [(lo, hi, prefix)])
        else:
            best[(lo, hi)] = (split, best[(lo, cut)][1] + best[(cut + 1, hi)][1])
    return [([order[i] for i in range(lo, hi + 1)], prefix) for lo, hi, prefix in best[(0, len(order) - 1)][1]]


Skip = Callable[[str], None]
"""Told why a group did not prefill once (a ``share.skipped`` event)."""


@dataclass
class ShareGroup:
    """The members of one fan-out whose messages begin with ``prefix``. Members join by
    conversation id (:meth:`join`); only each member's first call uses the shared prefix (:meth:`claim`)."""

    prefix: CommonPrefix
    mode: ShareMode = "prefix"
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
    _told: bool = False

    def join(self, conversation: str) -> None:
        self.members.add(conversation)

    def claim(self, conversation: str | None, messages: Sequence[Mapping[str, Any]] = ()) -> bool:
        """True once per member whose call holds the prefix: its first call goes through the group."""
        if self.mode != "prefix" or conversation not in self.members or conversation in self._claimed:
            return False
        self._claimed.add(conversation)
        return self.prefix.held_by(messages)

    @property
    def failed(self) -> str | None:
        """Why the prefix was not prefilled once (None: it was, or not yet tried)."""
        return self._failed

    def tell_once(self, reason: str, skip: Skip | None) -> None:
        """Say (once per group) why it falls back to each member prefilling its own prompt."""
        if not self._told and skip is not None:
            self._told = True
            skip(reason)

    async def probe(self, http: httpx.AsyncClient, tools: list[dict[str, Any]] | None = None) -> int:
        """The common prefix's length in tokens as the engine renders and tokenizes it (once per
        group): the common start of two chat prompts that hold the prefix then different tails,
        rendered by ``/apply-template`` (with the members' ``tools``) and tokenized by
        ``/tokenize``. 0 when the engine cannot tell."""
        async with self._probe_lock:
            if self.tokens is None:
                tokens: list[int] = []
                self.tokens = tokens
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError, TypeError):
                    runs = []
                    for tail in ("A", "Z"):
                        body: dict[str, Any] = {"messages": self.prefix.probe(tail)}
                        if tools:
                            body["tools"] = tools
                        r = await http.post("/apply-template", json=body)
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
                    tokens = runs[0][: max(0, n - _TRIM_TOKENS)]
                self.tokens = tokens
            return len(self.tokens)

    async def enter(self, http: httpx.AsyncClient, slot: int, save_dir: str | None, *,
                    deadline_s: float = 600.0, skip: Skip | None = None) -> bool:
        """Make ``slot`` hold the shared prefix before a member's call; True when it does (the
        call must then be pinned to ``slot``). The first member to enter prefills (within
        ``deadline_s`` seconds) and saves; the others wait for it, then restore. Any failure:
        False (the call goes as before) and ``skip`` is told why."""
        if not self.tokens or save_dir is None or slot < 0:
            return False
        if not self._leader:
            self._leader = True
            try:
                with anyio.fail_after(deadline_s):
                    self._failed = await self._warm(http, slot, save_dir)
            except TimeoutError:
                self._failed = (f"the one-time prefill of {len(self.tokens):,} tokens passed its deadline of "
                                f"{deadline_s:,.1f} s (from the engine's measured speed)")
            except BaseException:
                self._failed = "the first member's call ended before the prefix was saved"
                raise
            finally:
                self._ready.set()
                if self._failed is not None:
                    self.tell_once(self._failed + "; each member prefills its own prompt", skip)
            return self._failed is None
        await self._ready.wait()
        if self._failed is not None:
            return False
        with contextlib.suppress(httpx.HTTPError):
            r = await http.post(f"/slots/{slot}", params={"action": "restore"}, json={"filename": self._name})
            if r.status_code == 200:
                return True
            self.tell_once(f"slot restore refused: HTTP {r.status_code} {r.text[:200]}", skip)
            return False
        self.tell_once("the engine did not answer a slot restore", skip)
        return False

    @property
    def _name(self) -> str:
        return f"{self.id}.bin"

    async def _warm(self, http: httpx.AsyncClient, slot: int, save_dir: str) -> str | None:
        assert self.tokens is not None
        try:
            r = await http.post("/completion", json={"prompt": self.tokens, "n_predict": 1, "id_slot": slot,
                                                     "cache_prompt": True, "temperature": 0.0}, timeout=None)
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
    """Within the block, a fan-out member whose system message starts with one of ``texts`` (the
    ``shared`` context its author declared, e.g. a chunk several map steps of one recipe
    ``parallel`` block each put first) joins that text's group (:func:`board_group`). ``mode`` as in
    :data:`SHARE_MODES`; texts shorter than :data:`MIN_SHARED_CHARS` are left alone. Deletes the
    groups' slot files at the end."""
    on = share_mode(mode) == "prefix"
    board = {t: ShareGroup(CommonPrefix(t, whole=False)) for t in texts if on and len(t.strip()) >= MIN_SHARED_CHARS}
    token = _BOARD.set(board or None)
    try:
        yield
    finally:
        _BOARD.reset(token)
        for group in board.values():
            group.close()


def board_group(system: str) -> ShareGroup | None:
    """The group of the longest declared shared text (:func:`sharing`) ``system`` starts with, or None."""
    board = _BOARD.get()
    if not board:
        return None
    held = [t for t in board if system.startswith(t)]
    return board[max(held, key=len)] if held else None
