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


MISTRAL_LIKE = ("{%- for m in messages %}{%- if m.tool_calls %}{%- for tool_call in m.tool_calls %}"
                "{%- if tool_call.id|length != 9 %}{{ raise_exception('ids of 9') }}{% endif %}"
                "{%- endfor %}{%- endif %}{%- if m.role == 'tool' and message.tool_call_id|length != 9 %}x{% endif %}"
                "{%- endfor %}[TOOL_CALLS]")


def test_a_template_demanding_call_ids_of_a_length_is_found_and_ids_are_fitted():
    from squad.engine.template_profile import call_id_length, fit_call_id, fit_call_ids

    assert call_id_length(MISTRAL_LIKE) == 9 and call_id_length(CHATML_TOOLS.text) is None
    assert "9 alphanumeric" in profile(MISTRAL_LIKE).call_ids and profile(CHATML_TOOLS.text).call_ids == "any"
    long = "v2ImRnl38SFNSM1RC59Wd8aB4hIFNY6p"  # as b11434 makes them
    short = fit_call_id(long, 9)
    assert len(short) == 9 and short.isalnum() and fit_call_id(long, 9) == short != fit_call_id("call_1", 9)
    assert fit_call_id("abc123XYZ", 9) == "abc123XYZ"
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": "", "tool_calls": [{"id": long, "type": "function",
                                                                     "function": {"name": "f", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": long, "content": "ok"}]
    fitted = fit_call_ids(history, 9)
    assert fitted[1]["tool_calls"][0]["id"] == fitted[2]["tool_call_id"] == short
    assert history[1]["tool_calls"][0]["id"] == long  # the caller's history is not changed
    assert fit_call_ids(history, None) is history and fit_call_ids(fitted, 9) is fitted


def test_serve_fits_a_chat_historys_call_ids_as_the_client_does():
    from squad.serve.apis import prepare

    body = {"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]}
    out = prepare(body, "chat", None, 9)
    assert len(out["messages"][0]["tool_calls"][0]["id"]) == 9
    assert out["messages"][0]["tool_calls"][0]["id"] == out["messages"][1]["tool_call_id"]
    assert prepare(body, "chat", None) is body


def test_serve_fits_call_ids_in_responses_and_messages_histories_too():
    """b11434 converts Responses ``call_id`` and Messages ``tool_use.id``/``tool_use_id`` to the chat
    history's call ids, which a Mistral template checks: fitted the same way, pairs kept."""
    from squad.serve.apis import prepare

    items = [{"role": "user", "content": "hi"},
             {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "call_1", "output": "ok"}]
    out = prepare({"input": items}, "responses", None, 9)["input"]
    assert len(out[1]["call_id"]) == 9 and out[1]["call_id"] == out[2]["call_id"] and out[0] is items[0]
    assert items[1]["call_id"] == "call_1"
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "x"},
                                                  {"type": "tool_use", "id": "toolu_01", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "ok"}]}]
    sent = prepare({"messages": messages}, "messages", None, 9)["messages"]
    assert len(sent[1]["content"][1]["id"]) == 9 and sent[1]["content"][1]["id"] == sent[2]["content"][0]["tool_use_id"]
    assert sent[0] is messages[0] and sent[1]["content"][0] is messages[1]["content"][0]
    body = {"messages": messages}
    assert prepare(body, "messages", None) is body


def test_raw_call_and_thinking_markup_is_removed_from_an_answer():
    from squad.engine.template_profile import strip_raw_markup

    cases = {
        'Let me check. <tool_call>\n{"name": "get_wea': ("Let me check.", "<tool_call>"),
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa': ("", "[TOOL_CALLS]"),
        '<|python_tag|>get_weather.call(city="Paris")': ("", "<|python_tag|>"),
        " to=functions.get_weather<|channel|>commentary json<|message|>{": ("", "to=functions."),
        "<|tool_call>call:get_time{zone:": ("", "<|tool_call>"),
        "<think>two and two</think>\n\nFour.": ("Four.", "</think>"),
        "still thinking</think>Four.": ("Four.", "</think>"),
        "<think>cut inside the thinking": ("", "<think>"),
        "A plain answer.": ("A plain answer.", None),
        # a small model echoing the tool result it was given: that is its answer (real SmolLM2, MCP)
        "<tool_response>\n42\n</tool_response>": ("42", "</tool_response>"),
        "The sum is <tool_response>42</tool_response>. <tool_call>{": ("The sum is 42.", "</tool_response>"),
        "[TOOL_RESULTS]42[/TOOL_RESULTS]": ("42", "[/TOOL_RESULTS]"),
    }
    for text, want in cases.items():
        assert strip_raw_markup(text) == want, text
    # only what the engine's template writes: an answer discussing another family's markup stays
    assert strip_raw_markup("Qwen writes <tool_call> tags.", "{{ '[TOOL_CALLS]' }}") == (
        "Qwen writes <tool_call> tags.", None)
    assert strip_raw_markup("x <think>y", CHATML_TOOLS.text) == ("x <think>y", None)
    assert strip_raw_markup('ok <tool_call>\n{"na', CHATML_TOOLS.text) == ("ok", "<tool_call>")
    # the template's own call markers count too
    assert strip_raw_markup("ok <|my_call|>{", "{{ '<|my_call|>' }}") == ("ok", "<|my_call|>")
