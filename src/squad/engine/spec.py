"""What engine to use: :class:`EngineSpec`, the user's settings for a launched or attached engine.

:func:`squad.engine.planning.plan_engine` turns a spec and a workload into a plan;
:mod:`squad.engine.session` opens the engine it describes (through a provider,
:mod:`squad.engine.provider`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from squad.engine.llama import check_cache_type
from squad.engine.urls import check_engine_url
from squad.errors import UserError
from squad.sched.plan import Backend
from squad.sched.policy import DEFAULT_QUEUE, QUEUE_POLICIES

__all__ = ["EngineSpec"]


@dataclass(frozen=True)
class EngineSpec:
    """What engine to use.

    Launch one (``url`` None):

    - ``model``: a known model name or a ``.gguf`` path (None: the built-in default);
    - ``slots``/``ctx``: pins the planner keeps (None: planned from the workload);
    - ``cache_type_k``/``cache_type_v``: KV cache types (``-ctk``/``-ctv``; ``cache_type_v``
      None = same as K), one of :data:`squad.engine.llama.CACHE_TYPES`;
    - ``binary``: the ``llama-server`` to run (None: found or built by squad); ``threads``: ``-t``;
    - ``gpu_layers``: ``-ngl``, model layers in GPU memory (a count or ``"all"``; None: all when
      NVML finds a GPU, else none); KV is then planned against GPU memory (:func:`squad.sched.memory.kv_memory`);
    - ``backend``/``mlx_max_batch``: for ``squad plan`` of other backends.

    Or attach: ``url`` (+ ``api_key``) of a running server of any kind (:mod:`squad.engine.kinds`);
    ``slots``/``ctx`` are then capacity pins: used where the server reports nothing, and they may
    lower (never raise) what it reports; the other launch settings are an error. ``admits``:
    the engine at ``url`` admits on its own (a proxy in front of llama-server that queues by
    slots and KV pool itself), so squad sends without reserving.

    ``queue``: the order of calls waiting for admission (:mod:`squad.sched.policy`: ``program``
    default, ``fifo``, ``backfill``).

    ``request_timeout`` (seconds) fixes one deadline for every call; None (default) derives each
    call's from its prompt, ``max_tokens`` and the engine's measured speed, and stops a call only
    when it stops making progress or passes that estimate (:mod:`squad.chat.deadline`). The engine's
    own ``-to`` is set above either. ``load_timeout`` (seconds): how long a launched engine may take to load the
    model (None: 60 s + 60 s per GiB of model file). Raises :class:`UserError` for a bad
    combination or cache type.
    """

    model: str | Path | None = None
    slots: int | None = None
    ctx: int | None = None
    cache_type_k: str = "f16"
    cache_type_v: str | None = None
    binary: str | Path | None = None
    threads: int | None = None
    url: str | None = None
    api_key: str | None = None
    admits: bool = False
    request_timeout: float | None = None
    load_timeout: float | None = None
    backend: Backend = "llama-server"
    mlx_max_batch: int | None = None
    gpu_layers: int | str | None = None
    queue: str = DEFAULT_QUEUE

    def __post_init__(self) -> None:
        if self.queue not in QUEUE_POLICIES:
            raise UserError(f"queue must be one of {', '.join(QUEUE_POLICIES)}, got {self.queue!r}")
        for name in ("slots", "ctx", "threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise UserError(f"{name} must be a whole number of at least 1, got {value!r}")
        if self.gpu_layers is not None and self.gpu_layers != "all" and (
                isinstance(self.gpu_layers, bool) or not isinstance(self.gpu_layers, int) or self.gpu_layers < 0):
            raise UserError(f"gpu_layers must be a number of layers (0 = none) or 'all', got {self.gpu_layers!r}")
        if self.request_timeout is not None and (isinstance(self.request_timeout, bool) or not isinstance(
                self.request_timeout, (int, float)) or not self.request_timeout > 0):
            raise UserError(f"request_timeout must be a positive number of seconds, got {self.request_timeout!r}")
        if self.load_timeout is not None and (isinstance(self.load_timeout, bool) or not isinstance(
                self.load_timeout, (int, float)) or not self.load_timeout > 0):
            raise UserError(f"load_timeout must be a positive number of seconds, got {self.load_timeout!r}")
        for name in ("cache_type_k", "cache_type_v"):
            value = getattr(self, name)
            if value is not None:
                try:
                    check_cache_type(value)
                except UserError as exc:
                    raise UserError(f"{name}: {exc}") from None
        if self.url is not None:
            self._check_attach()
        elif self.admits:
            raise UserError("admits=True describes an engine at a URL that admits on its own: give its url")

    def _check_attach(self) -> None:
        try:
            check_engine_url(self.url)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        launch_only = {"model": self.model, "binary": self.binary,
                       "threads": self.threads, "load_timeout": self.load_timeout, "mlx_max_batch": self.mlx_max_batch,
                       "gpu_layers": self.gpu_layers,
                       "cache_type_k": None if self.cache_type_k == "f16" else self.cache_type_k,
                       "cache_type_v": self.cache_type_v}
        given = [k for k, v in launch_only.items() if v is not None]
        if given:
            raise UserError(f"{', '.join(given)} size or start an engine squad launches; an engine at a URL "
                            "runs as it was started: drop them, or drop url to let squad launch one")

    @property
    def kv_types(self) -> tuple[str, str]:
        """``(type_k, type_v)`` as the engine will be started."""
        return self.cache_type_k, self.cache_type_v or self.cache_type_k

    def but(self, **given: object) -> EngineSpec:
        """A copy with the given fields replaced, ignoring those given as None (command-line
        overrides on top of a recipe's settings)."""
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})  # type: ignore[arg-type]
