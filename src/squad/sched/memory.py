"""What this machine can give the KV cache: the planner's only outside fact, read here.

:func:`kv_memory` says which memory the KV cache lives in and how much of it there is: system
RAM (:func:`memory_for_kv`), or GPU memory when model layers are offloaded (``-ngl``), read
through NVIDIA's NVML bindings (:func:`gpu_devices`; the optional ``nvidia-ml-py`` package,
``squad[gpu]``). Not verified on a real GPU from squad's test machine (CPU only): the GPU rule
is tested with a faked NVML.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from squad.engine.stores import model_bytes
from squad.errors import ModelError, UserError

__all__ = ["memory_for_kv", "parse_bytes", "SAFETY_MIN", "SAFETY_FRACTION", "ENV_VAR", "GpuDevice", "gpu_devices",
           "KvMemory", "kv_memory", "GPU_MARGIN", "GpuLayers"]

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
    model_size = _size(model)
    margin = max(SAFETY_MIN, int(vm.total * SAFETY_FRACTION))
    return max(0, int(vm.available) - model_size - margin)


# --- GPU memory ------------------------------------------------------------------------------

GpuLayers = int | Literal["all"]
"""``-ngl``: how many model layers llama-server stores in GPU memory (a count, or ``"all"``)."""

GPU_MARGIN = 1 << 30
"""Bytes left free on each GPU for compute buffers (1 GiB: llama.cpp b11434's ``--fit-target``
default margin per device)."""


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as NVML reports it: ``total``/``free`` in bytes."""

    index: int
    name: str
    total: int
    free: int


def gpu_devices() -> list[GpuDevice]:
    """The NVIDIA GPUs NVML sees (``pynvml`` from ``nvidia-ml-py``), or ``[]`` when the package
    is not installed, no driver answers, or there is no GPU. Never raises."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound/DriverNotLoaded...: no GPU to plan for
        return []
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            found.append(GpuDevice(i, name.decode() if isinstance(name, bytes) else str(name), int(mem.total),
                                   int(mem.free)))
        return found
    except Exception:  # noqa: BLE001 - a device that cannot be read: plan against RAM
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


@dataclass(frozen=True)
class KvMemory:
    """Bytes for the KV cache, where they are (``source``, shown in plans) and the ``-ngl`` to
    pass (``gpu_layers``: None = pass none, a CPU run)."""

    bytes: int
    source: str
    gpu_layers: GpuLayers | None = None


def kv_memory(model: Path | str | None, *, n_layer: int, gpu_layers: GpuLayers | None = None,
              devices: list[GpuDevice] | None = None) -> KvMemory:
    """Which memory the KV cache is planned against, and how much.

    - ``gpu_layers`` None (the default): ``"all"`` when a GPU is found (most local setups offload
      every layer), else 0. 0 or no GPU: system RAM, :func:`memory_for_kv`.
    - Layers offloaded: llama.cpp keeps each offloaded layer's KV on the GPU (KV offload is on by
      default). All layers: the GPUs' free memory minus the model file (its weights go there too)
      minus :data:`GPU_MARGIN` per GPU. Some layers (``f`` = offloaded / ``n_layer``): the KV
      splits the same way, so the memory is ``min(GPU room / f, RAM room / (1 - f))``, each room
      net of its share of the weights.
    - ``SQUAD_KV_MEMORY`` replaces the whole rule (source ``SQUAD_KV_MEMORY``).

    ``devices``: the GPUs (None: :func:`gpu_devices`). Raises :class:`UserError` for a bad
    ``gpu_layers`` or ``SQUAD_KV_MEMORY``.
    """
    if gpu_layers is not None and gpu_layers != "all" and (
            isinstance(gpu_layers, bool) or not isinstance(gpu_layers, int) or gpu_layers < 0):
        raise UserError(f"gpu_layers {gpu_layers!r}: give a number of layers (0 = none) or 'all'")
    if devices is None:
        devices = [] if gpu_layers == 0 else gpu_devices()  # no layers offloaded: no need to ask NVML
    if gpu_layers is None:
        gpu_layers = "all" if devices else None
    override = os.environ.get(ENV_VAR)
    if override:
        return KvMemory(parse_bytes(override), ENV_VAR, gpu_layers)
    offloaded = n_layer if gpu_layers == "all" else min(int(gpu_layers or 0), n_layer)
    if not devices or offloaded <= 0 or n_layer <= 0:
        ram = "system RAM" if devices or not offloaded else "system RAM (no GPU found through NVML)"
        return KvMemory(memory_for_kv(model), ram, gpu_layers)
    share = offloaded / n_layer
    model_size = _size(model)
    gpu_room = max(0, sum(d.free for d in devices) - int(model_size * share) - GPU_MARGIN * len(devices))
    names = ", ".join(f"GPU {d.index} {d.name} ({d.free / 2**30:.1f} GiB free)" for d in devices)
    layers = f"{offloaded}/{n_layer} layers offloaded"
    if share >= 1:
        return KvMemory(gpu_room, f"{names}, {layers}", gpu_layers)
    ram_room = max(0, memory_for_kv(None) - int(model_size * (1 - share)))
    return KvMemory(int(min(gpu_room / share, ram_room / (1 - share))), f"{names} + system RAM, {layers}", gpu_layers)


def _size(model: Path | str | None) -> int:
    """Bytes of the model's weights: every part of a split model
    (:func:`squad.engine.stores.model_bytes`); 0 for None or a file that cannot be read."""
    if model is None:
        return 0

    try:
        return model_bytes(model)
    except (OSError, ModelError):
        return 0
