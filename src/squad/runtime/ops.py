"""What a recipe's flow calls on a squad (:func:`squad.recipes.run.execute_flow`): the
:class:`SquadOps` protocol. :class:`~squad.runtime.squad.Squad` satisfies it, and so does the
cluster's squad (:mod:`squad.cluster.pool`: maps on Ray workers, the rest on a local squad), so
neither the flow nor the cluster imports the other."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Protocol

from squad.events import Event
from squad.runtime.blocks import Policy
from squad.runtime.outcome import Outcome
from squad.runtime.results import AgentResult, RunResult

__all__ = ["SquadOps", "OnResult"]

OnResult = Callable[[int, AgentResult], None]
"""Called with ``(i, result)`` as the ``i``-th conversation of a ``parallel``/``map`` ends (its
``item_ids[i]`` names its map item): what a resumable run records (:mod:`squad.runtime.journal`)."""


class SquadOps(Protocol):
    """The operations of an open squad a flow uses (each as :class:`~squad.runtime.squad.Squad`
    documents it): ``run`` (a main-agent turn), ``run_agent``, ``parallel``, ``map``, ``emit``
    (an event to the squad's sinks) and ``shared_input`` (how a fan-out's shared text is sent); a
``parallel``/``map`` reports each result as it ends to ``on_result``."""

    @property
    def shared_input(self) -> str: ...

    async def run(self, text: str, *, output_type: Any = None) -> RunResult: ...

    async def run_agent(self, name: str, prompt: str, *, output_type: Any = None,
                        shared: str | None = None) -> AgentResult: ...

    async def parallel(self, calls: Iterable[tuple[str, str]], *, policy: Policy = "collect", check: bool = False,
                       fail_on: Collection[Outcome | str] = (), output_type: Any = None,
                       on_result: OnResult | None = None,
                       shared: str | Sequence[str | None] | None = None) -> list[AgentResult]: ...

    async def map(self, name: str, inputs: Iterable[str], *, max_concurrency: int | None = None,
                  fail_on: Collection[Outcome | str] = (), output_type: Any = None,
                  item_ids: Sequence[int] | None = None, on_result: OnResult | None = None,
                  shared: str | Sequence[str | None] | None = None) -> list[AgentResult]: ...

    def emit(self, event: Event) -> None: ...
