"""What this machine can give the KV cache: the planner's only outside fact, read here.

Rule (:func:`memory_for_kv`): available memory (``psutil.virtual_memory().available``:
free plus reclaimable page cache) minus the model file (its weights are loaded, or mapped
and touched, alongside the KV cache) minus a safety margin of ``max(1 GiB, 10% of total
memory)`` for llama-server's compute buffers, the OS and everything else the user runs.
Never below 0. ``SQUAD_KV_MEMORY`` (e.g. ``2GiB``, ``512MiB``, ``1.5G``, ``300000000``)
replaces the whole rule, for tests and for users who know better.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil

from squad.errors import ModelError, UserError

__all__ = ["memory_for_kv", "parse_bytes", "SAFETY_MIN", "SAFETY_FRACTION", "ENV_VAR"]

ENV_VAR = "SQUAD_KV_MEMORY"
SAFETY_MIN = 1 << 30
"""Smallest safety margin in bytes (1 GiB)."""
SAFETY_FRACTION = 0.10
"""Safety margin as a fraction of total memory, when that is larger than :data:`SAFETY_MIN`."""

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"2GiB"`` → 2147483648. Units: B, K/KB, KiB, M/MB, MiB, G/GB, GiB, T/TB, TiB
    (case-insensitive; KB/MB/GB are decimal). Raises :class:`UserError` on anything else."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise UserError(f"cannot read {text!r} as a memory size: write e.g. 2GiB, 512MiB or 1500000000")
    return int(float(m.group(1)) * _UNITS[unit])


def memory_for_kv(model: Path | str | None = None) -> int:
    """Bytes available for the KV cache (rule in the module docstring).

    ``model``: the GGUF file whose size is set aside; None or a missing file sets nothing
    aside. Raises :class:`UserError` when ``SQUAD_KV_MEMORY`` cannot be read.
    """
    override = os.environ.get(ENV_VAR)
    if override:
        return parse_bytes(override)
    vm = psutil.virtual_memory()
    model_size = 0
    if model is not None:
        from squad.engine.stores import model_bytes  # all parts of a split model

        try:
            model_size = model_bytes(model)
        except (OSError, ModelError):
            model_size = 0
    margin = max(SAFETY_MIN, int(vm.total * SAFETY_FRACTION))
    return max(0, int(vm.available) - model_size - margin)
