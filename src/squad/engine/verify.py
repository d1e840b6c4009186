"""The product page's verification procedure, run on the real engine (``docs/product.md`` fact 11).

Load a small model with context 8192 and 4 parallel slots; ``/props`` must report
``default_generation_settings.n_ctx`` = 8192; send 4 overlapping streaming requests to
``/v1/chat/completions`` with short prompts; ``/slots`` must show 4 slots processing at the
same time, and each request's first token must arrive before any other request finishes.

:func:`run_verify` launches the engine and runs the checks; :func:`verify_engine` runs them
against an engine that is already up. Both return a :class:`VerifyReport` (times in seconds
from the moment the requests were sent).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio
import httpx
from openai import AsyncOpenAI

from squad.engine.control import control_client, read_engine
from squad.engine.info import EngineInfo
from squad.engine.launcher import Launcher
from squad.engine.llama import round_ctx
from squad.engine.registry import resolve_model
from squad.sched.plan import EnginePlan

__all__ = ["RequestTiming", "Check", "VerifyReport", "verify_engine", "run_verify"]

SLOTS_POLL = 0.05
"""Seconds between ``/slots`` polls while the requests run."""

_PROMPTS = [
    "Count from one to fifty in words.",
    "List the names of twenty animals.",
    "Write a short poem about the sea.",
    "Name twenty colours, one per line.",
    "List twenty fruits, one per line.",
    "Describe a busy city street.",
    "Count from fifty down to one.",
    "List twenty countries in Europe.",
]


@dataclass
class RequestTiming:
    """One streaming request: ``first_token`` and ``finished`` in seconds since the start,
    ``tokens`` generated (from the usage chunk), ``error`` if it failed."""

    index: int
    first_token: float | None = None
    finished: float | None = None
    tokens: int = 0
    error: str | None = None


@dataclass
class Check:
    """One pass/fail line of the report."""

    name: str
    ok: bool
    measured: str
    expected: str


@dataclass
class VerifyReport:
    """Everything measured; ``passed`` is True when every check passed."""

    base_url: str
    model: str
    build_info: str
    ctx_asked: int
    parallel: int
    n_ctx: int
    total_slots: int
    max_busy_slots: int
    requests: list[RequestTiming] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.ok for check in self.checks)

    def to_dict(self) -> dict:
        """JSON-ready form (what ``squad verify --json`` prints)."""
        return {**asdict(self), "passed": self.passed}


async def _stream_one(client: AsyncOpenAI, timing: RequestTiming, start: float, max_tokens: int) -> None:
    try:
        stream = await client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": _PROMPTS[timing.index % len(_PROMPTS)]}],
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            # llama.cpp: keep generating to max_tokens, so every request stays busy long
            # enough for the overlap to be seen on a fast machine too
            extra_body={"ignore_eos": True},
        )
        async with stream:
            async for chunk in stream:
                if chunk.usage is not None:
                    timing.tokens = chunk.usage.completion_tokens
                if timing.first_token is None and chunk.choices and chunk.choices[0].delta.content:
                    timing.first_token = anyio.current_time() - start
    except Exception as exc:  # noqa: BLE001  (reported as a failed check, not raised)
        timing.error = f"{type(exc).__name__}: {exc}"
    timing.finished = anyio.current_time() - start


async def verify_engine(info: EngineInfo, *, parallel: int = 4, ctx: int = 8192, max_tokens: int = 48) -> VerifyReport:
    """Run the checks against the engine described by ``info`` (it must be up).

    Sends ``parallel`` overlapping streaming chat requests with ``max_tokens`` each while
    polling ``/slots`` every 50 ms. Never raises for a failed check; raises
    :class:`~squad.errors.EngineError` subclasses when the engine cannot be read at all.
    """
    async with control_client(info.base_url, info.api_key) as control:
        state = await read_engine(control, with_slots=False)
        timings = [RequestTiming(index=i) for i in range(parallel)]
        max_busy = 0
        client = AsyncOpenAI(base_url=f"{info.base_url}/v1", api_key=info.api_key or "none", max_retries=0)
        async with client:
            start = anyio.current_time()

            async def poll_slots() -> None:
                nonlocal max_busy
                while True:
                    max_busy = max(max_busy, await read_engine_slots(control) or 0)
                    await anyio.sleep(SLOTS_POLL)

            async with anyio.create_task_group() as tg:
                tg.start_soon(poll_slots)
                async with anyio.create_task_group() as requests:
                    for timing in timings:
                        requests.start_soon(_stream_one, client, timing, start, max_tokens)
                tg.cancel_scope.cancel()

    report = VerifyReport(
        base_url=info.base_url,
        model=str(state.props.get("model_path", "")),
        build_info=info.build_info if info.launched and info.build_info else str(state.props.get("build_info", "")),
        ctx_asked=ctx,
        parallel=parallel,
        n_ctx=state.n_ctx,
        total_slots=state.total_slots,
        max_busy_slots=max_busy,
        requests=timings,
    )
    report.checks = _checks(report)
    return report


async def read_engine_slots(control: httpx.AsyncClient) -> int | None:
    """Busy slots right now (``/slots`` entries with ``is_processing``), None without ``/slots``."""
    response = await control.get("/slots")
    if response.status_code != 200:
        return None
    return sum(1 for slot in response.json() if slot.get("is_processing"))


def _checks(report: VerifyReport) -> list[Check]:
    reqs = report.requests
    failed = [r for r in reqs if r.error or r.first_token is None]
    checks = [
        Check("/props n_ctx", report.n_ctx == round_ctx(report.ctx_asked), str(report.n_ctx),
              str(round_ctx(report.ctx_asked))),
        Check("/props total_slots", report.total_slots == report.parallel, str(report.total_slots),
              str(report.parallel)),
        Check(
            "requests finished",
            not failed,
            f"{len(reqs) - len(failed)}/{len(reqs)}" + (f" ({failed[0].error})" if failed and failed[0].error else ""),
            f"{len(reqs)}/{len(reqs)}",
        ),
        Check("max busy slots (/slots)", report.max_busy_slots == report.parallel, str(report.max_busy_slots),
              str(report.parallel)),
    ]
    if not failed:
        firsts = [(r.index, r.first_token) for r in reqs if r.first_token is not None]  # every one: none failed
        ends = [(r.index, r.finished) for r in reqs if r.finished is not None]
        late = [i for i, first in firsts if any(j != i and first >= end for j, end in ends)]
        last_first = max(first for _, first in firsts)
        first_done = min(end for _, end in ends)
        checks.append(
            Check(
                "every first token before any other request finished",
                not late,
                f"last first token {last_first:.2f} s, first finish {first_done:.2f} s",
                "last first token < first finish",
            )
        )
    return checks


async def run_verify(
    *,
    model: Path | str | None = None,
    ctx: int = 8192,
    parallel: int = 4,
    binary: Path | str | None = None,
    threads: int | None = None,
    max_tokens: int = 48,
    load_timeout: float | None = None,
) -> VerifyReport:
    """Launch the engine with ``ctx`` tokens and ``parallel`` unified slots, run the checks, stop it.

    ``model``: a known model name or a ``.gguf`` path (None → the default model);
    ``load_timeout``: seconds the model may take to load (None → the launcher's default).
    Raises what :class:`Launcher` raises (``PlanMismatch`` when ``/props`` disagrees).
    """
    plan = EnginePlan.simple(resolve_model(model), slots=parallel, n_ctx=ctx)
    async with Launcher(plan, binary=binary, threads=threads, load_timeout=load_timeout) as engine:
        assert engine.info is not None
        return await verify_engine(engine.info, parallel=parallel, ctx=ctx, max_tokens=max_tokens)
