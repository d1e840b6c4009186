"""The on-disk cache of GGUF model facts (``cache_dir()/facts/``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from squad.engine import facts
from squad.engine.facts import read_model_facts


def _gguf(path: Path, n_layer: int = 4) -> Path:
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("cached")
    w.add_block_count(n_layer)
    w.add_context_length(2048)
    w.add_embedding_length(256)
    w.add_head_count(4)
    w.add_head_count_kv([1, 2, 1, 2][:n_layer])
    w.add_sliding_window(128)
    w.add_sliding_window_pattern(2)
    w.add_tensor("dummy", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SQUAD_CACHE_DIR", str(tmp_path / "cache"))
    facts._read_facts.cache_clear()  # the in-process memo would hide the disk cache
    yield tmp_path / "cache" / "facts"
    facts._read_facts.cache_clear()


def _forbid_reader(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF was parsed although the facts are cached")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)


def test_second_read_comes_from_the_cache_without_opening_the_gguf(cache, tmp_path, monkeypatch):
    path = _gguf(tmp_path / "m.gguf")
    first = read_model_facts(path)
    assert len(list(cache.glob("*.json"))) == 1
    facts._read_facts.cache_clear()  # as a new process would start
    _forbid_reader(monkeypatch)
    second = read_model_facts(path)
    assert second == first
    assert second.n_head_kv == (1, 2, 1, 2) and second.sliding_window_pattern == (True, False, True, False)
    assert isinstance(second.path, Path) and second.path == path


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: "{ not json",
        lambda text: "",
        lambda text: text.replace(f'"version": {facts._FACTS_VERSION}', '"version": 0'),  # an older format
        lambda text: text.replace('"n_layer": 4', '"n_layer": "many"'),
        lambda text: text.replace('"n_layer": 4, ', ""),  # a field missing
        lambda text: json.dumps([1, 2]),
    ],
)
def test_corrupt_or_old_entry_is_ignored_and_rewritten(cache, tmp_path, monkeypatch, damage):
    path = _gguf(tmp_path / "m.gguf")
    first = read_model_facts(path)
    (entry,) = cache.glob("*.json")
    good = entry.read_text()
    assert damage(good) != good
    entry.write_text(damage(good))
    facts._read_facts.cache_clear()
    assert read_model_facts(path) == first  # re-parsed
    assert json.loads(entry.read_text()) == json.loads(good)  # and rewritten
    facts._read_facts.cache_clear()
    _forbid_reader(monkeypatch)
    assert read_model_facts(path) == first


def test_a_changed_file_is_parsed_again(cache, tmp_path):
    path = _gguf(tmp_path / "m.gguf")
    assert read_model_facts(path).n_layer == 4
    _gguf(path, n_layer=2)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # even on coarse clocks
    assert read_model_facts(path).n_layer == 2
    assert len(list(cache.glob("*.json"))) == 2


def test_an_unwritable_cache_only_costs_a_reparse(cache, tmp_path, monkeypatch):
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the facts directory should be")
    path = _gguf(tmp_path / "m.gguf")
    assert read_model_facts(path).n_layer == 4


def test_errors_are_not_cached(cache, tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK not a gguf")
    for _ in range(2):
        with pytest.raises(facts.ModelError, match="not a GGUF file"):
            read_model_facts(junk)
        facts._read_facts.cache_clear()
    assert not cache.exists() or not list(cache.glob("*.json"))


def test_the_fields_of_a_file_version_are_read_once_per_process(tmp_path, monkeypatch):
    """The facts, the special tokens and the tokenizer each read the fields the first time squad meets a model: one
    GGUFReader pass serves them all (a 151k-token vocabulary takes ~8 s a pass); a changed file is read again."""
    from squad.engine import gguf as squad_gguf

    passes: list[str] = []
    real = gguf.GGUFReader

    def counting(path, mode="r"):
        passes.append(str(path))
        return real(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
    squad_gguf._read_fields.cache_clear()
    path = _gguf(tmp_path / "m.gguf")
    first = squad_gguf.read_fields(path)
    assert squad_gguf.read_fields(path) is first and len(passes) == 1
    _gguf(path, n_layer=2)  # rewritten: another size
    assert squad_gguf.read_fields(path)["llama.block_count"].contents() == 2 and len(passes) == 2
    squad_gguf._read_fields.cache_clear()
