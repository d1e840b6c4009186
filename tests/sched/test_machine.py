"""Memory available for the KV cache (squad.sched.memory)."""

from types import SimpleNamespace

import pytest

from squad.errors import UserError
from squad.sched import memory as machine


@pytest.mark.parametrize("text, value", [
    ("2GiB", 2 * 2**30), ("512MiB", 512 * 2**20), ("1.5G", 1_500_000_000), ("300000000", 300_000_000),
    (" 4 gib ", 4 * 2**30), ("10kb", 10_000),
])
def test_parse_bytes(text, value):
    assert machine.parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "2 parsecs", "-1GiB"])
def test_parse_bytes_rejects(text):
    with pytest.raises(UserError, match="memory size"):
        machine.parse_bytes(text)


def test_env_override(monkeypatch):
    monkeypatch.setenv("SQUAD_KV_MEMORY", "2GiB")
    assert machine.memory_for_kv() == 2 * 2**30


def test_rule_subtracts_model_and_margin(monkeypatch, tmp_path):
    monkeypatch.delenv("SQUAD_KV_MEMORY", raising=False)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 1000)
    monkeypatch.setattr(machine.psutil, "virtual_memory",
                        lambda: SimpleNamespace(total=24 * 2**30, available=20 * 2**30))
    margin = int(24 * 2**30 * 0.10)  # above the 1 GiB floor
    assert machine.memory_for_kv(model) == 20 * 2**30 - 1000 - margin
    assert machine.memory_for_kv(tmp_path / "missing.gguf") == 20 * 2**30 - margin
    monkeypatch.setattr(machine.psutil, "virtual_memory", lambda: SimpleNamespace(total=4 * 2**30, available=2**29))
    assert machine.memory_for_kv(model) == 0  # never negative


def test_real_machine_reports_something(monkeypatch):
    monkeypatch.delenv("SQUAD_KV_MEMORY", raising=False)
    assert machine.memory_for_kv() >= 0
