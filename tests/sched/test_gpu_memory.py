"""GPU memory for KV planning (:func:`squad.sched.memory.kv_memory`) with a faked NVML device report.

squad reads GPUs through ``pynvml`` (``nvidia-ml-py``); here a fake ``pynvml`` module answers
NVML's calls as a driver would (bytes names, ``nvmlDeviceGetMemoryInfo().free``), so the real
reading code runs. Not verified on a real GPU from this (CPU-only) machine."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from squad.engine.session import EngineSpec, plan_engine
from squad.errors import UserError
from squad.sched import memory as machine
from squad.sched.memory import GPU_MARGIN, GpuDevice, gpu_devices, kv_memory
from squad.sched.workload import Call, Parallel

GIB = 2**30


def fake_nvml(monkeypatch, devices: list[tuple[str, int, int]], *, fail_init: bool = False) -> None:
    """Install a fake ``pynvml``: ``devices`` = (name, total bytes, free bytes) per GPU."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init() -> None:
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    nvml.NVMLError = NVMLError
    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: len(devices)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: devices[h][0].encode()  # older bindings return bytes
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=devices[h][1], free=devices[h][2],
                                                                    used=devices[h][1] - devices[h][2])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    monkeypatch.delenv("SQUAD_KV_MEMORY", raising=False)


def test_devices_are_read_through_nvml(monkeypatch):
    fake_nvml(monkeypatch, [("NVIDIA GeForce RTX 4090", 24 * GIB, 20 * GIB), ("NVIDIA A2", 16 * GIB, 15 * GIB)])
    assert gpu_devices() == [GpuDevice(0, "NVIDIA GeForce RTX 4090", 24 * GIB, 20 * GIB),
                             GpuDevice(1, "NVIDIA A2", 16 * GIB, 15 * GIB)]


@pytest.mark.parametrize("state", ["not installed", "no driver"])
def test_no_nvml_means_no_gpu(monkeypatch, state):
    if state == "not installed":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    else:
        fake_nvml(monkeypatch, [("x", GIB, GIB)], fail_init=True)
    assert gpu_devices() == []
    got = kv_memory(None, n_layer=30)
    assert got.source == "system RAM" and got.gpu_layers is None  # CPU: no -ngl passed


def test_all_layers_offloaded_plans_against_gpu_memory(monkeypatch, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"\0" * 1000)
    fake_nvml(monkeypatch, [("NVIDIA GeForce RTX 4090", 24 * GIB, 20 * GIB)])
    got = kv_memory(model, n_layer=30)  # default: all layers when a GPU is found
    assert got.gpu_layers == "all"
    assert got.bytes == 20 * GIB - 1000 - GPU_MARGIN
    assert got.source == "GPU 0 NVIDIA GeForce RTX 4090 (20.0 GiB free), 30/30 layers offloaded"


def test_some_layers_offloaded_split_the_kv_by_layer(monkeypatch):
    monkeypatch.setattr(machine, "memory_for_kv", lambda model: 100 * GIB)
    two = [GpuDevice(0, "a", 8 * GIB, 4 * GIB + GPU_MARGIN)]
    got = kv_memory(None, n_layer=40, gpu_layers=10, devices=two)
    assert got.bytes == 16 * GIB  # a quarter of the KV on the GPU: 4 GiB there holds 16 GiB in all
    assert "10/40 layers offloaded" in got.source and "system RAM" in got.source
    assert kv_memory(None, n_layer=40, gpu_layers=0, devices=two).source == "system RAM"


def test_bad_gpu_layers_are_user_errors():
    for bad in (-1, "some", True):
        with pytest.raises(UserError, match="gpu_layers"):
            kv_memory(None, n_layer=4, gpu_layers=bad, devices=[])
        with pytest.raises(UserError, match="gpu_layers"):
            EngineSpec(gpu_layers=bad)


def test_the_plan_says_which_memory_and_passes_ngl(monkeypatch, default_model_path):
    """A fake 24 GiB GPU with 1.5 GiB free: the planner cuts the context to what the GPU holds,
    names the GPU, and the engine gets -ngl all."""
    fake_nvml(monkeypatch, [("NVIDIA Fake", 24 * GIB, 3 * GIB // 2)])
    room = 3 * GIB // 2 - Path(default_model_path).stat().st_size - GPU_MARGIN  # ~ 438 MB: 19K tokens of SmolLM2 KV
    four = Parallel(tuple(Call(f"a{i}", 8192) for i in range(4)))
    planned = plan_engine(EngineSpec(model=default_model_path), four)
    assert planned.memory_for_kv == room and planned.memory_source.startswith("GPU 0 NVIDIA Fake")
    assert planned.n_ctx == room // 23_040 // 256 * 256 < 32768
    assert any("planned against GPU 0 NVIDIA Fake" in r for r in planned.reasons)
    args = planned.server_args()
    assert args[args.index("-ngl") + 1] == "all"
    cpu = plan_engine(EngineSpec(model=default_model_path, gpu_layers=0), four)
    assert "-ngl" in cpu.server_args() and cpu.memory_source == "system RAM"  # -ngl 0 as asked
