"""Call deadlines from the work: a no-progress window plus an overall bound estimated from the
counted prompt, ``max_tokens`` and the engine's measured speed.

One attempt of a call (:class:`CallWatch`, a context manager holding an anyio cancel scope) is
stopped when either passes:

- **no progress** for :meth:`CallWatch.window` seconds: nothing arrived (neither the slot's
  start, a ``prompt_progress`` chunk nor a token). llama-server reports prompt progress only
  per batch of :data:`~squad.engine.llama.N_BATCH` tokens, so the window is
  ``margin × (one batch ÷ prefill speed)`` (or ``margin ×`` :data:`DECODE_WINDOW_TOKENS` ``÷
  decode speed`` between tokens: on a busy CPU single token gaps vary a lot), at
  least ``no_progress_floor``; on an engine that has sent no progress chunk yet (another kind,
  an older build) the window before the first token covers the whole prompt;
- the **overall bound**: ``margin × (prompt ÷ prefill speed + max_tokens ÷ decode speed)``, at
  least ``floor``, at most :data:`~squad.engine.llama.LONGEST_CALL_S` (the engine's ``-to`` is
  above it, F04); prompt progress and tokens re-estimate (only ever extend) it from the speed
  this call is really getting, so a call that keeps progressing is not stopped by it.

A fixed ``request_timeout`` (``--request-timeout``) overrides both: one deadline, no
no-progress check (the behaviour before deadlines were derived). Speeds are kept per engine
(:class:`EngineSpeed`: an EWMA of recent calls' ``timings``), starting from conservative
defaults or the engine's ``/metrics``. A stopped call is :class:`~squad.errors.CallTimeout`,
whose message says what was measured; it is never resent unchanged (F04).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from squad.engine.llama import LONGEST_CALL_S, N_BATCH
from squad.errors import CallTimeout, UserError

__all__ = ["Deadlines", "EngineSpeed", "EngineDeadlines", "CallWatch",
           "DEFAULT_PREFILL_TPS", "DEFAULT_DECODE_TPS"]

DEFAULT_PREFILL_TPS = 8.0
"""Prompt tokens per second assumed before anything is measured: below a 4B model's prefill on
a laptop CPU, so a first call is not stopped early (a slow bound, not a slow call)."""

DEFAULT_DECODE_TPS = 2.0
"""Generated tokens per second assumed before anything is measured."""

ALPHA = 0.3
"""Weight of the newest call in the speed averages (EWMA)."""

DECODE_WINDOW_TOKENS = 8
"""Tokens' time (at the slower of the call's and the engine's decode speed) the no-progress window
covers between tokens: measured on a 2-core CPU at load 17, one gap was 3x the average token time."""

MIN_PREFILL_SAMPLE = 32
"""Fewer new prompt tokens than this (a cached prompt) say little about prefill speed: skipped."""

MIN_DECODE_SAMPLE = 4
"""Fewer generated tokens than this say little about decode speed: skipped."""


@dataclass(frozen=True)
class Deadlines:
    """How call deadlines are set (seconds; see the module docstring).

    - ``request_timeout``: a fixed deadline for every call, no no-progress check (None: derived);
    - ``floor``: the least overall bound a derived deadline gives a call;
    - ``no_progress_floor``: the least no-progress window;
    - ``margin``: how many times the estimate a call may take (> 1);
    - ``n_batch``: the engine's logical batch in tokens (prompt progress comes once per batch);
    - ``longest``: the most a derived deadline allows.

    Raises :class:`UserError` for a value that is not a positive number.
    """

    request_timeout: float | None = None
    floor: float = 600.0
    no_progress_floor: float = 120.0
    margin: float = 3.0
    n_batch: int = N_BATCH
    longest: float = LONGEST_CALL_S

    def __post_init__(self) -> None:
        for name in ("request_timeout", "floor", "no_progress_floor", "margin", "n_batch", "longest"):
            value = getattr(self, name)
            if value is None and name == "request_timeout":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise UserError(f"{name} must be a positive number, got {value!r}")
        if self.margin < 1:
            raise UserError(f"margin must be at least 1 (a call may take its estimate), got {self.margin!r}")

    @property
    def longest_call(self) -> float:
        """Seconds the longest call may take under this policy (the engine's ``-to`` must exceed it)."""
        return self.request_timeout if self.request_timeout is not None else self.longest


@dataclass
class EngineSpeed:
    """One engine's measured speeds, tokens per second: ``prefill`` (prompt processing) and
    ``decode`` (generation), each an EWMA (:data:`ALPHA`) over recent calls; ``*_samples``:
    how many calls were averaged (0: still the default)."""

    prefill: float = DEFAULT_PREFILL_TPS
    decode: float = DEFAULT_DECODE_TPS
    prefill_samples: int = 0
    decode_samples: int = 0
    source: str = "squad's default, nothing measured yet"

    def observe(self, timings: Mapping[str, Any] | None) -> None:
        """Average in one call's llama-server ``timings`` (``prompt_n``, ``prompt_ms``,
        ``predicted_n``, ``predicted_ms``); missing or tiny samples are skipped."""
        if not timings:
            return
        self.observe_prefill(_num(timings.get("prompt_n")), _num(timings.get("prompt_ms")) / 1000)
        self.observe_decode(_num(timings.get("predicted_n")), _num(timings.get("predicted_ms")) / 1000)

    def observe_prefill(self, tokens: float, seconds: float) -> None:
        """``tokens`` new prompt tokens processed in ``seconds``."""
        if tokens >= MIN_PREFILL_SAMPLE and seconds > 0:
            self.prefill = _mix(self.prefill, tokens / seconds, self.prefill_samples)
            self.prefill_samples += 1
            self.source = "measured"

    def observe_decode(self, tokens: float, seconds: float) -> None:
        """``tokens`` generated in ``seconds``."""
        if tokens >= MIN_DECODE_SAMPLE and seconds > 0:
            self.decode = _mix(self.decode, tokens / seconds, self.decode_samples)
            self.decode_samples += 1
            self.source = "measured"

    def seed(self, metrics: str) -> bool:
        """Start from llama-server's ``/metrics`` (Prometheus text) averages
        ``llamacpp:prompt_tokens_seconds`` and ``llamacpp:predicted_tokens_seconds`` when nothing
        was measured here yet and the engine has served calls (non-zero). True if it did."""
        if self.prefill_samples or self.decode_samples:
            return False
        found: dict[str, float] = {}
        for line in metrics.splitlines():
            name, _, value = line.partition(" ")
            if name in ("llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds"):
                found[name] = _num(value.strip())
        prefill = found.get("llamacpp:prompt_tokens_seconds", 0)
        decode = found.get("llamacpp:predicted_tokens_seconds", 0)
        if not (prefill > 0 and decode > 0):
            return False
        self.prefill, self.decode, self.source = prefill, decode, "the engine's /metrics"
        return True

    def describe(self, prompt: int, max_tokens: int) -> str:
        """``prefill at 15 tok/s: 3,478 prompt tokens need ~232 s; decode at 4.0 tok/s: 512
        tokens need ~128 s (measured)``."""
        prefill_s, decode_s = prompt / self.prefill, max_tokens / self.decode
        return (f"prefill at {_rate(self.prefill)} tok/s: {prompt:,} prompt tokens need ~{prefill_s:,.0f} s; "
                f"decode at {_rate(self.decode)} tok/s: max_tokens {max_tokens:,} need ~{decode_s:,.0f} s "
                f"({self.source})")


class EngineDeadlines:
    """The deadline policy and measured speed of one engine, and its calls in flight.

    ``watch(prompt, max_tokens)`` gives the :class:`CallWatch` for one attempt. A watch's window
    depends on whether other calls run (batches are shared), so the calls in flight are re-armed
    when that changes (a second call starts, all but one ended) and once when the engine first
    reports progress; each watch re-arms itself on its own progress (O(1) per event)."""

    def __init__(self, policy: Deadlines | None = None, speed: EngineSpeed | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy or Deadlines()
        self.speed = speed or EngineSpeed()
        self.clock = clock
        self.active: set[CallWatch] = set()
        self.reports_progress = False
        """True once the engine sent a ``prompt_progress`` chunk (then a batch, not the whole
        prompt, is the longest silence before the first token)."""

    def prefill_deadline(self, tokens: int) -> float:
        """Seconds a one-time prefill of ``tokens`` (no answer, no progress chunks) may take: the
        fixed ``request_timeout``, else ``margin ×`` its estimate at the measured speed, within
        ``floor`` and ``longest`` (:mod:`squad.sched.share`)."""
        p = self.policy
        if p.request_timeout is not None:
            return p.request_timeout
        estimate = tokens / self.speed.prefill + 1 / self.speed.decode
        return min(p.longest, max(p.floor, p.margin * estimate))

    def watch(self, prompt: int, max_tokens: int, *, queued_upstream: bool = False) -> CallWatch:
        """The watch for one attempt of ``prompt`` counted tokens and ``max_tokens``.
        ``queued_upstream``: the endpoint admits on its own (squad serve) and may hold the request
        in its queue before answering, so the derived deadlines count from its answer."""
        return CallWatch(self, prompt, max_tokens, queued_upstream=queued_upstream)

    def _changed(self) -> None:
        for w in self.active:
            w._arm()  # noqa: SLF001 - same module: the engine re-arms its watches

    def _entered(self, watch: CallWatch) -> None:
        self.active.add(watch)
        if len(self.active) == 2:  # the first one is shared from now on
            self._changed()
        else:
            watch._arm()  # noqa: SLF001 - same module: the engine re-arms its watches

    def _left(self, watch: CallWatch) -> None:
        self.active.discard(watch)
        if len(self.active) == 1:  # the one left is alone again
            self._changed()


@dataclass(eq=False)
class CallWatch:
    """One attempt's deadlines (see the module docstring). Use as ``with watch:`` around the
    request; feed it :meth:`started`, :meth:`progress`, :meth:`token`; afterwards
    :attr:`expired` says whether it stopped the call and :meth:`error` says why."""

    engine: EngineDeadlines
    prompt: int
    max_tokens: int
    queued_upstream: bool = False
    began: bool = False
    sent: float = 0.0
    last: float = 0.0
    last_what: str = "the request was sent"
    processed: int = 0
    cache: int = 0
    generated: int = 0
    progress_chunks: int = 0
    live_prefill: float | None = None
    live_decode: float | None = None
    first_token_at: float | None = None
    longest_prefill_gap: float = 0.0
    """Seconds of the longest wait between two signs of progress before the first token."""
    longest_decode_gap: float = 0.0
    """Seconds of the longest wait between two generated tokens."""
    bound: float = math.inf
    scope: anyio.CancelScope | None = None
    """The attempt's cancel scope while the watch is entered (made in the caller's event loop)."""
    fired: str | None = None
    armed_window: float | None = None
    """Seconds of the no-progress window the scope's deadline was last set with (:meth:`_arm`)."""
    armed_why: str = ""

    def __post_init__(self) -> None:
        self.sent = self.last = self.engine.clock()
        self.bound = self.sent + self.overall()

    # -- the numbers ------------------------------------------------------------------------

    @property
    def policy(self) -> Deadlines:
        return self.engine.policy

    @property
    def prefill(self) -> float:
        """Prompt tokens/s for this call: what its own progress showed, else the engine's average."""
        return self.live_prefill or self.engine.speed.prefill

    @property
    def decode(self) -> float:
        """Generated tokens/s for this call: its own so far, else the engine's average."""
        return self.live_decode or self.engine.speed.decode

    def estimate(self) -> float:
        """Seconds the remaining work should take at the speeds known now."""
        left = max(0, self.prompt - self.processed)
        return left / self.prefill + max(0, self.max_tokens - self.generated) / self.decode

    def overall(self) -> float:
        """Seconds from :attr:`sent` the call may take in all."""
        p = self.policy
        if p.request_timeout is not None:
            return p.request_timeout
        return min(p.longest, max(p.floor, p.margin * self.estimate()))

    def window(self) -> float:
        """Seconds without progress after which the call is taken for stalled (inf: fixed deadline)."""
        return self._window()[0]

    def _window(self) -> tuple[float, str]:
        """:meth:`window` and what it covers, in words (for the message when it passes)."""
        p = self.policy
        if p.request_timeout is not None:
            return math.inf, "none: a fixed request_timeout"
        active = self.engine.active
        shared = len(active) > (1 if self in active else 0)  # another call's batch may come first
        speed = self.engine.speed  # the slower of this call's own and the engine's average
        prefill, decode = min(self.prefill, speed.prefill), min(self.decode, speed.decode)
        others = " while other calls share the engine" if shared else ""
        if self.generated == 0:
            left = max(1, self.prompt - self.processed)
            chunk = (p.n_batch if shared else min(p.n_batch, left)) if self.engine.reports_progress else left
            work = max(chunk / prefill + 1 / decode, self.longest_prefill_gap)
            what = (f"{p.margin:g}x the time of {chunk:,} prompt tokens at {_rate(prefill)} tok/s and the first token"
                    f"{others}")
        else:
            work = max(DECODE_WINDOW_TOKENS / decode + (p.n_batch / prefill if shared else 0), self.longest_decode_gap)
            what = f"{p.margin:g}x the time of {DECODE_WINDOW_TOKENS} tokens at {_rate(decode)} tok/s{others}"
        # never tighter than a gap this call already showed: a later batch attends over more context and a shared
        # CPU slows unevenly, so the average speed alone under-estimates the next wait (a CI run stopped the last
        # 478-token batch of a 4,597-token prompt after 9 s, its first two batches having taken longer each)
        if p.margin * work <= p.no_progress_floor:
            return p.no_progress_floor, f"the floor, no_progress_floor {p.no_progress_floor:g} s"
        return p.margin * work, what

    def deadline(self) -> float:
        """The clock time at which the call is stopped unless it makes progress first."""
        if self.queued_upstream and not self.began and self.policy.request_timeout is None:
            return self.sent + self.policy.longest  # waiting in the endpoint's own queue
        return min(self.bound, self.last + self.window())

    def _stall_at(self) -> float:
        """When the no-progress window armed last passes (the one the cancel scope holds)."""
        return self.last + (self.armed_window if self.armed_window is not None else self.window())

    # -- feeding it -------------------------------------------------------------------------

    def started(self) -> None:
        """The engine answered with its headers: a slot took the request."""
        if self.queued_upstream and not self.began and self.policy.request_timeout is None:
            self.sent = self.engine.clock()  # the endpoint's queue is not this call's work
            self.bound = self.sent + self.overall()
        self.began = True
        self._moved("the engine started the request")

    def progress(self, prompt_progress: Mapping[str, Any]) -> None:
        """A llama-server ``prompt_progress`` object (``total``, ``cache``, ``processed``,
        ``time_ms``): the prompt is being processed; its live speed re-estimates the bound."""
        total, cache = int(_num(prompt_progress.get("total"))), int(_num(prompt_progress.get("cache")))
        processed, ms = int(_num(prompt_progress.get("processed"))), _num(prompt_progress.get("time_ms"))
        self.progress_chunks += 1
        if not self.engine.reports_progress:  # a batch, not the whole prompt, bounds every window now
            self.engine.reports_progress = True
            self.engine._changed()  # noqa: SLF001 - same module: a watch tells its engine
        if total > 0:
            self.prompt = total
        self.cache, self.processed = cache, max(self.processed, processed)
        new = self.processed - cache
        if new >= MIN_PREFILL_SAMPLE and ms > 0:
            self.live_prefill = new / (ms / 1000)
        self._moved(f"{self.processed:,} of {self.prompt:,} prompt tokens processed", batch=True)

    def token(self) -> None:
        """A chunk with generated text or a tool call arrived."""
        now = self.engine.clock()
        if self.first_token_at is None:
            self.processed, self.first_token_at = max(self.processed, self.prompt), now
        self.generated += 1
        if self.generated > MIN_DECODE_SAMPLE and now > self.first_token_at:
            self.live_decode = (self.generated - 1) / (now - self.first_token_at)
        self._moved(f"{self.generated:,} tokens generated")

    def _moved(self, what: str, batch: bool = False) -> None:
        now = self.engine.clock()
        if batch and self.progress_chunks > 1:
            self.longest_prefill_gap = max(self.longest_prefill_gap, now - self.last)  # one batch's time
        elif self.generated > 1:
            self.longest_decode_gap = max(self.longest_decode_gap, now - self.last)
        self.last, self.last_what = now, what
        if self.policy.request_timeout is None:  # re-estimated from the speed this call really gets
            self.bound = max(self.bound, min(self.sent + self.policy.longest,
                                             self.last + self.policy.margin * self.estimate()))
        self._arm()

    def _arm(self) -> None:
        """Set the scope's deadline, and keep the window it holds: the one a stall message states (the window
        computed later may differ, as speeds and the calls in flight change)."""
        if self.scope is not None:
            self.armed_window, self.armed_why = self._window()
            self.scope.deadline = self.deadline()

    # -- the context manager ----------------------------------------------------------------

    def __enter__(self) -> CallWatch:
        self.scope = anyio.CancelScope()
        self.scope.__enter__()
        self.engine._entered(self)  # noqa: SLF001 - same module: a watch tells its engine
        return self

    def _passed(self, now: float) -> str | None:
        """Which deadline has passed at ``now``: ``"bound"``, ``"stall"`` or None."""
        if now >= self.deadline() and self.deadline() == self.sent + self.policy.longest:
            return "bound"
        if now >= self.bound:
            return "bound"
        return "stall" if now >= self._stall_at() else None

    def __exit__(self, *exc: Any) -> bool:
        self.fired = self._passed(self.engine.clock())
        self.engine._left(self)  # noqa: SLF001 - same module: a watch tells its engine
        assert self.scope is not None
        swallowed = bool(self.scope.__exit__(*exc))
        if not self.scope.cancelled_caught:
            self.fired = None
        elif self.fired is None:  # the clock read just before the deadline: the nearer one passed
            self.fired = "bound" if self.bound <= self._stall_at() else "stall"
        return swallowed

    @property
    def expired(self) -> bool:
        """True when this watch stopped the call."""
        return self.scope is not None and self.scope.cancelled_caught and self.fired is not None

    def error(self, agent: str, engine: str = "") -> CallTimeout:
        """The :class:`CallTimeout` saying which deadline passed and what was measured; ``engine`` says which
        engine (``the engine at http://127.0.0.1:8080 (pid 123, log /path)``, :meth:`EngineInfo.describe_process`),
        named in the message when given."""
        now, p = self.engine.clock(), self.policy
        measured = self.engine.speed.describe(self.prompt, self.max_tokens)
        if self.live_prefill:
            measured += f"; this call's prompt ran at {_rate(self.live_prefill)} tok/s"
        if self.live_decode:
            measured += f", its tokens at {_rate(self.live_decode)} tok/s"
        state = f"last sign of progress: {self.last_what}"
        tail = "it is not resent unchanged (F04)"
        which = engine or "the engine"
        if p.request_timeout is not None:
            return CallTimeout(
                f"agent '{agent}': the call to {which} took longer than its fixed {p.request_timeout:,.0f} s "
                "(request_timeout) "
                f"and was stopped; {tail}. {measured}; {state}. Raise --request-timeout, or leave it unset so squad "
                "derives each call's deadline from the engine's measured speed; or shorten the prompt or lower "
                "max_tokens", agent=agent)
        if (self.fired or self._passed(now)) == "stall":
            quiet = now - self.last
            window = self.armed_window if self.armed_window is not None else self.window()
            why = f", {self.armed_why}" if self.armed_why else ""
            return CallTimeout(
                f"agent '{agent}': no progress from {which} for {quiet:,.0f} s "
                f"(its window: {window:,.0f} s{why}); "
                f"{state}; {measured}. The call was stopped; {tail}. Check that the engine still runs and is not "
                "stopped or starved of CPU (its log; fewer slots or other work on the machine), or pass "
                "--request-timeout SECONDS to replace the derived deadlines with one fixed deadline", agent=agent)
        return CallTimeout(
            f"agent '{agent}': the call to {which} was stopped after {now - self.sent:,.0f} s, {p.margin:g}x its "
            "estimate "
            f"(at least {p.floor:,.0f} s); {measured}; {state}. {tail[0].upper() + tail[1:]}. The engine ran far "
            "slower than measured: pass --request-timeout SECONDS for a fixed deadline, or shorten the prompt or "
            "lower max_tokens", agent=agent)


def _mix(old: float, new: float, samples: int) -> float:
    return new if samples == 0 else ALPHA * new + (1 - ALPHA) * old


def _num(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def _rate(tps: float) -> str:
    return f"{tps:,.0f}" if tps >= 10 else f"{tps:.1f}"
