"""The template profile (family, tool-call style, reasoning, counting) and the wrong-template warning."""

from __future__ import annotations

from gguf_support import tiny_gguf

from squad.engine.chat_templates import CHATML_TOOLS
from squad.engine.template_profile import profile, template_markers
from squad.engine.tokens import counter_for_model


def test_markers_found_in_templates():
    assert template_markers("{{ '<|im_start|>' }}x[INST]y<｜User｜><start_of_turn><|turn>") >= {
        "<|im_start|>", "[INST]", "<｜User｜>", "<start_of_turn>", "<|turn>"}


def test_families_are_named_by_their_markers():
    assert profile("{{ '<|start_header_id|>' }}{{ tools }}").family == "Llama 3"
    assert profile("{{ '[TOOL_CALLS]' }}").tool_calls.startswith("[TOOL_CALLS]")
    assert profile("{{ '<|channel|>' }}").reasoning.startswith("harmony")
    assert profile("<|im_start|>{{ '<think>' }}<tool_call>").reasoning == "<think> → reasoning_content"
    assert profile(CHATML_TOOLS.text).tool_calls.startswith("squad:chatml-tools")
    assert "fallback" in profile(None).family


def test_a_template_whose_markers_are_not_vocabulary_tokens_warns(tmp_path):
    model = tiny_gguf(tmp_path / "m.gguf", template="{{ '<|im_start|>' }}{{ messages[0].content }}")
    found = profile("{{ '<|im_start|>' }}{{ messages[0].content }}", model)
    assert found.warnings and "another model family's" in found.warnings[0]
    assert "<|im_start|>" in found.warnings[0]
    none = profile(None, model)
    assert none.warnings and "fallback" in none.warnings[0]


def test_counts_say_whether_they_are_exact_offline(tmp_path):
    model = tiny_gguf(tmp_path / "m.gguf", template=CHATML_TOOLS.text)
    assert profile(CHATML_TOOLS.text, model).counts == "exact offline"
    spm = tiny_gguf(tmp_path / "spm.gguf", template="{{ 'x' }}", model="llama")
    assert profile("{{ 'x' }}", spm).counts.startswith("asked of the engine (tokenizer")


def test_tool_call_arguments_are_counted_as_the_engine_re_serializes_them(tmp_path):
    """llama.cpp parses each call's argument text when the template reads arguments as an object
    (squad's does) and the template's tojson writes it with ', ' and ': ': compact and spaced
    text count the same."""
    counter = counter_for_model(tiny_gguf(tmp_path / "m.gguf", template=CHATML_TOOLS.text))

    def chat(args: str) -> list[dict]:
        return [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"}]

    assert counter.render(chat('{"a":"x"}')) == counter.render(chat('{"a": "x"}'))
    assert '{"name": "f", "arguments": {"a": "x"}}' in counter.render(chat('{"a":"x"}'))
