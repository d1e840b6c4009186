"""The GGUF token counter (squad.engine.tokens) without an engine.

Tests on the built-in model use numbers measured on llama-server b11434 (see
test_tokens_real.py, which re-measures them); they are skipped when the model is not pulled,
unless CI is set. Tests on tiny synthetic GGUF files always run.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gguf_support import tiny_gguf
from squad.engine import tokens, vocab
from squad.engine.tokens import GGUFCounter, NotExact, TokenCounter, counter_for_model
from squad.errors import ModelError

SMOL = Path.home() / ".cache" / "squad" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SQUAD_CACHE_DIR", str(tmp_path / "cache"))
    tokens._counter.cache_clear()
    yield tmp_path / "cache" / "tokenizers"
    tokens._counter.cache_clear()


@pytest.fixture
def smol() -> GGUFCounter:
    path = Path(os.environ.get("SQUAD_TEST_MODEL", SMOL))
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the token counter tests; no model at {path} (run `squad models pull`)")
        pytest.skip(f"no model at {path}; run `squad models pull`")
    counter = counter_for_model(path)
    assert counter is not None
    return counter


NO_SYSTEM_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}"
    "{% endif %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


# --- the built-in model: numbers measured on llama-server b11434 -----------------------------


def test_counts_match_numbers_measured_on_the_engine(smol):
    assert isinstance(smol, TokenCounter)
    hello = [{"role": "user", "content": "Hello there! 12345 <|im_end|> x"}]
    assert smol.count_chat(hello) == 42
    assert smol.count_chat([{"role": "system", "content": "Be brief."},
                            {"role": "user",
                             "content": "안녕하세요 😀 café @alice a@b.io {\"k\": [1, 2]}"}]) == MEASURED_MIXED
    assert smol.count_text("") == 0
    assert smol.count_text("<|im_end|>") == 1
    assert smol.count_text("first.last+tag@sub.example.org") == MEASURED_EMAIL


MEASURED_MIXED = 51  # corpus "pinned_mixed" in test_tokens_real.py
MEASURED_EMAIL = 11  # corpus text "email"


def test_template_facts_of_the_builtin_model(smol):
    prompt = smol.render([{"role": "user", "content": "hi"}])
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert smol.supports_system_role
    # developer → system, as the engine maps it
    assert smol.render([{"role": "developer", "content": "S"}, {"role": "user", "content": "u"}]).startswith(
        "<|im_start|>system\nS<|im_end|>")


def test_a_final_assistant_message_is_continued(smol):
    prompt = smol.render([{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi"}])
    assert prompt.endswith("<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\nHi")
    assert smol.count_chat([{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi"}]) == 33


def test_tools_do_not_change_the_count_when_the_template_ignores_them(smol):
    msgs = [{"role": "user", "content": "What's the weather?"}]
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    assert smol.count_chat(msgs, [tool]) == smol.count_chat(msgs) == smol.count_chat(msgs, [])


def test_requests_it_cannot_reproduce_raise_not_exact(smol):
    with pytest.raises(NotExact, match="two final assistant"):
        smol.count_chat([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                         {"role": "assistant", "content": "c"}])
    with pytest.raises(NotExact, match="typed"):
        smol.count_chat([{"role": "user", "content": [{"type": "text", "text": "a"}]}])
    with pytest.raises(NotExact):
        smol.count_chat([])


def test_memoized_and_cached_on_disk(smol, cache, monkeypatch):
    again = counter_for_model(smol.path)
    assert again is smol
    assert len(list(cache.glob("*.json"))) == 1
    tokens._counter.cache_clear()
    monkeypatch.setattr(vocab, "build_record", lambda *a: pytest.fail("should load from the disk cache"))
    reloaded = counter_for_model(smol.path)
    assert reloaded is not smol and reloaded.count_text("hello world") == smol.count_text("hello world")


def test_a_damaged_disk_cache_entry_is_rebuilt(smol, cache):
    (entry,) = cache.glob("*.json")
    record = json.loads(entry.read_text())
    entry.write_text(json.dumps({**record, "tokenizer": "{not json"}))
    tokens._counter.cache_clear()
    rebuilt = counter_for_model(smol.path)
    assert rebuilt is not None and rebuilt.count_text("hello world") == smol.count_text("hello world")
    assert json.loads(entry.read_text())["tokenizer"] == record["tokenizer"]


def test_thread_safe(smol):
    texts = [f"line {i}: ünïcode 한국 {'x' * i} @user{i}" for i in range(200)]
    serial = [smol.count_text(t) for t in texts]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(smol.count_text, texts)) == serial
        assert len(set(pool.map(lambda _: id(counter_for_model(smol.path)), range(8)))) == 1


# --- synthetic GGUF files --------------------------------------------------------------------


def test_tiny_vocabulary_bpe_and_special_tokens(tmp_path):
    counter = counter_for_model(tiny_gguf(tmp_path / "t.gguf", template=NO_SYSTEM_TEMPLATE))
    assert counter is not None
    assert counter.count_text("hello") == 1  # merged all the way
    assert counter.count_text("hello hello") == 1 + 1 + 1  # " " is its own byte token; no "Ġhello"
    assert counter.count_text("<s></s>") == 2  # special-token text is one token each


def test_system_message_merged_when_the_template_ignores_it(tmp_path):
    counter = counter_for_model(tiny_gguf(tmp_path / "t.gguf", template=NO_SYSTEM_TEMPLATE))
    assert counter is not None and not counter.supports_system_role
    prompt = counter.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert prompt == "<s>[user]S\nU\n[assistant]"
    # add_bos is false here (llama.cpp's default for these pre-tokenizers): the BOS text stays
    assert counter.count_chat([{"role": "user",
                                "content": "hello"}]) == counter.count_text("<s>[user]hello\n[assistant]")


def test_bos_added_by_the_tokenizer_is_cut_from_the_rendered_text(tmp_path):
    counter = counter_for_model(tiny_gguf(tmp_path / "t.gguf", template=NO_SYSTEM_TEMPLATE, add_bos=True))
    assert counter is not None
    assert counter.render([{"role": "user", "content": "hello"}]) == "[user]hello\n[assistant]"
    assert counter.count_chat([{"role": "user",
                                "content": "hello"}]) == 1 + counter.count_text("[user]hello\n[assistant]")


def test_template_errors_and_tool_templates_raise_not_exact(tmp_path):
    src = "{% for m in messages %}{{ m.content | upper_no_such_filter_at_runtime if m.x else m.content }}{% endfor %}"
    counter = counter_for_model(tiny_gguf(tmp_path / "a.gguf", template=src))
    assert counter is not None
    tool_src = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    tools_counter = counter_for_model(tiny_gguf(tmp_path / "b.gguf", template=tool_src))
    assert tools_counter is not None
    with pytest.raises(NotExact, match="tools"):
        tools_counter.count_chat([{"role": "user", "content": "x"}], [{"type": "function", "function": {"name": "f"}}])
    assert tools_counter.count_chat([{"role": "user", "content": "hello"}]) == 1


def test_unsupported_files_give_none(tmp_path):
    assert counter_for_model(tiny_gguf(tmp_path / "spm.gguf", template="{{ 'x' }}", model="llama")) is None
    assert counter_for_model(tiny_gguf(tmp_path / "pre.gguf", template="{{ 'x' }}", pre="deepseek-llm")) is None
    assert counter_for_model(tiny_gguf(tmp_path / "none.gguf", template=None)) is None
    gpt_oss = "{% for m in messages %}<|channel|>{{ m.content }}{% endfor %}"
    assert counter_for_model(tiny_gguf(tmp_path / "oss.gguf", template=gpt_oss)) is None


def test_missing_file_is_a_model_error(tmp_path):
    with pytest.raises(ModelError):
        counter_for_model(tmp_path / "nope.gguf")
