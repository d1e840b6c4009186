"""Import paths of the flat layout (before the seam folders), kept for one release.

``import squad.client`` still works: it gives the very module now at ``squad.chat.client``
(the same object, so patches through either name reach the same code) and emits a
:class:`DeprecationWarning` naming the new path. ``docs/moved-paths.md`` lists the table.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import warnings
from collections.abc import Sequence
from types import ModuleType

MOVED: dict[str, str] = {
    "squad.admission": "squad.sched.admission",
    "squad.agent": "squad.runtime.agent",
    "squad.blocks": "squad.runtime.blocks",
    "squad.chatloop": "squad.runtime.chatloop",
    "squad.client": "squad.chat.client",
    "squad.counting": "squad.chat.counting",
    "squad.deadline": "squad.chat.deadline",
    "squad.engine.plan": "squad.sched.plan",
    "squad.engines": "squad.chat.routing",
    "squad.fanout": "squad.cluster.dispatch",
    "squad.handback": "squad.runtime.handback",
    "squad.machine": "squad.sched.memory",
    "squad.mention": "squad.runtime.mention",
    "squad.otel": "squad.events.otel",
    "squad.outcome": "squad.runtime.outcome",
    "squad.planner": "squad.sched.planner",
    "squad.planview": "squad.cli.planview",
    "squad.queue_policy": "squad.sched.policy",
    "squad.ray": "squad.cluster.ray",
    "squad.raycluster": "squad.cluster.local",
    "squad.results": "squad.runtime.results",
    "squad.sandbox": "squad.templates.sandbox",
    "squad.session": "squad.engine.session",
    "squad.settle": "squad.chat.settle",
    "squad.share": "squad.sched.share",
    "squad.stream": "squad.chat.stream",
    "squad.structured": "squad.chat.structured",
    "squad.summary": "squad.events.summary",
    "squad.toolroom": "squad.runtime.toolroom",
    "squad.trace": "squad.events.jsonl",
    "squad.turn": "squad.runtime.turn",
    "squad.verify": "squad.engine.verify",
    "squad.view": "squad.events.view",
    "squad.workload": "squad.sched.workload",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old dotted path in :data:`MOVED` to the module at its new path."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran when it was imported under its new path."""


FINDER = _MovedFinder()
