"""Real prompts for checking the GGUF token counter against llama-server (see squad.engine.tokens).

``CHATS``: name → (messages, tools or None); ``TEXTS``: name → bare text for ``/tokenize``.
"""

from __future__ import annotations

import json
from pathlib import Path

_SRC = Path(__file__).resolve().parents[1] / "src" / "squad"


def _source(rel: str, lines: int) -> str:
    return "".join((_SRC / rel).read_text(encoding="utf-8").splitlines(keepends=True)[:lines])


PROSE = (
    "The committee met on Tuesday to review the proposal. After a long discussion, which touched on "
    "budgets, timelines and the well-known risks of over-promising, they agreed to revisit it in "
    "March. \"We can't keep doing this,\" she said; he replied that they'd try harder next time.\n\n"
    "Meanwhile, the rain kept falling -- steadily, quietly -- over the old town's red roofs."
)
NON_ASCII = (
    "안녕하세요! 오늘 날씨가 정말 좋네요. 한국어 토큰화 테스트입니다.\n"
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇰🇷 ❤️ — café, naïve, Ångström, jalapeño, façade, Straße, e\u0301 (combining).\n"
    "日本語と中文，Ελληνικά, русский, العربية, עברית, हिन्दी.\n"
    "Spaces: a\u00a0b c\u2003d e\u3000f g\u200bh\ttab\r\nCRLF   "
)
BRACES = json.dumps(
    {"agents": [{"name": "planner", "max_tokens": 512, "tools": ["search", "read"], "meta": {"x": [1, 2.5, None]}},
     {"name": "writer", "budget": {"prompt": 2048, "answer": 256}, "ok": True}]}, indent=2
) + "\n{{ not a template }} {% raw %} ${var} f\"{x!r:>10}\" [[1,2],[3,4]] <tag attr='v'/>"
MENTIONS = (
    "Ping @alice and @bob-the-builder (cc: @team/infra). Mail jane.doe+filter@example.co.uk, "
    "ops@squad.dev or <root@localhost>; see https://example.com/a?b=1&c=%20#frag and "
    "user@[192.168.0.1]. @@double @ alone, email@ no-domain, 1234567890 3.14159 -42 1e-9 0x1F."
)
WHITESPACE = "\n\n\nleading newlines\n    indented 4\n\t\ttabs\n  \n trailing spaces    \n\n\n  "
SPECIAL_TEXT = "Can you explain <|im_start|> and <|im_end|> and <|endoftext|> tokens? <repo_name>x</repo_name>"

SYSTEM = "You are a careful reviewer. Answer briefly."

TOOLS = [
    {"type": "function", "function": {
        "name": "search_docs", "description": "Search the project documentation.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to look for"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 20}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _sys_user(text: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def chats() -> dict[str, tuple[list[dict], list[dict] | None]]:
    code = _source("engine/launcher.py", 600)
    long_doc = "\n\n".join([PROSE, code, NON_ASCII, BRACES, MENTIONS] * 4)
    history = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Summarize this:\n" + PROSE},
        {"role": "assistant", "content": "A committee postponed a decision to March; it was raining."},
        {"role": "user", "content": "Now in Korean, please. 한국어로 부탁해요 🙏"},
        {"role": "assistant", "content": "위원회는 결정을 3월로 미뤘습니다. 비가 내리고 있었습니다."},
        {"role": "user", "content": "Thanks! Reply to @alice at alice@example.com with {\"ok\": true}."},
    ]
    tool_turns = [
        {"role": "user", "content": "Find the docs about slots."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "search_docs", "arguments": "{\"query\": \"slots\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "search_docs", "content": "slots: -np N, --kv-unified"},
        {"role": "user", "content": "And what does that mean?"},
    ]
    return {
        "python_source": (_user("Review this code:\n\n" + code), None),
        "python_source_system": (_sys_user(code), None),
        "prose": (_user(PROSE), None),
        "prose_system": (_sys_user(PROSE), None),
        "non_ascii": (_user(NON_ASCII), None),
        "korean_only": (_user("오늘은 월요일입니다. 회의는 오후 3시에 시작합니다."), None),
        "emoji_only": (_user("🎉🎉🎉 👍🏽👍🏿 🇯🇵🇩🇪 🧑‍💻"), None),
        "accents": (_user("Ça va? Où est la bibliothèque? Niño, São Paulo, Zürich, Øresund, Łódź."), None),
        "braces_json": (_user(BRACES), None),
        "mentions_emails": (_user(MENTIONS), None),
        "whitespace": (_user(WHITESPACE), None),
        "digits": (_user("0 00 000 1234 12345678901234567890 ٣٤٥ ⅷ ½ ²"), None),
        "special_token_text": (_user(SPECIAL_TEXT), None),
        "empty_user": (_user(""), None),
        "single_char": (_user("x"), None),
        "multi_turn": (history, None),
        "multi_turn_no_system": (history[1:], None),
        "two_systems": ([{"role": "system", "content": "A"}, {"role": "system", "content": "B"},
                         {"role": "user", "content": "C"}], None),
        "developer_role": ([{"role": "developer", "content": SYSTEM}, {"role": "user", "content": "hi"}], None),
        "only_system": ([{"role": "system", "content": SYSTEM}], None),
        "long_document": (_sys_user("Read this document and list its sections.\n\n" + long_doc), None),
        "tools_simple": (_user("What is in the docs about admission?"), TOOLS),
        "tools_history": (tool_turns, TOOLS),
        "tool_turns_without_tools": (tool_turns, None),
        "tools_system": (_sys_user(MENTIONS), TOOLS[:1]),
        "user_name_field": ([{"role": "user", "name": "alice", "content": "hello from alice"}], None),
        "markdown": (_user("# Title\n\n- item *one*\n- item **two**\n\n```python\nprint('hi')\n```\n\n| a | b "
                           "|\n|---|---|\n| 1 | 2 |"), None),
        "url_heavy": (_user("https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md#L10-L20 "
                            "and ftp://x.y/z?q=a%2Fb&r=%E2%9C%93"), None),
        "repeated_chars": (_user("a" * 300 + " " + "=" * 120 + "\n" + "-" * 80 + "!!!???..."), None),
        "contractions": (_user("I'm sure you'll see they've done it; we'd've known. IT'S DONE'S 'quoted'"), None),
        "mixed_scripts_no_spaces": (_user("abc한국어def日本語ghi😀jkl123ñ"), None),
        "control_chars": (_user("bell\x07 null-ish\x01 esc\x1b[31mred\x1b[0m form\x0cfeed vt\x0b."), None),
        "pinned_mixed": ([{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "안녕하세요 😀 café @alice a@b.io {\"k\": [1, 2]}"}], None),
        "pinned_hello": (_user("Hello there! 12345 <|im_end|> x"), None),
        "twenty_turns": ([{"role": "system", "content": SYSTEM}] + [
            {"role": ("user", "assistant")[i % 2], "content": f"turn {i}: " + (PROSE, NON_ASCII, MENTIONS)[i % 3]}
            for i in range(19)], None),
        "padded_content": (_user("   \n  padded both sides \r\n\t  "), None),
        "prefill": ([{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi"}], None),
        "prefill_history": (history + [{"role": "assistant", "content": "Sure — 알겠습니다! {\"ok\""}], None),
        "prefill_empty": (_sys_user("Start your answer.") + [{"role": "assistant", "content": ""}], None),
        "latex": (_user(r"$$\int_0^\infty e^{-x^2}\,dx = \frac{\sqrt{\pi}}{2}$$ and \(a_{i,j}\)"), None),
    }


def texts() -> dict[str, str]:
    return {
        "code": _source("engine/launcher.py", 300),
        "prose": PROSE, "non_ascii": NON_ASCII, "braces": BRACES, "mentions": MENTIONS,
        "whitespace": WHITESPACE, "special": SPECIAL_TEXT, "empty": "", "space": " ", "newline": "\n",
        "two_spaces_word": "  word", "crlf": "a\r\n\r\nb", "digits": "2024-06-01T12:34:56Z 1,000,000.00",
        "korean": "한국어 텍스트", "emoji_zwj": "👨‍👩‍👧‍👦", "nbsp": "a\u00a0\u00a0b",
        "ideographic_space": "x\u3000\u3000y",
        "tabs": "\t\tx\t", "trailing_ws": "end   ", "apostrophes": "don't 'quote' ’curly’",
        "json_compact": '{"a":[1,2,{"b":null}],"c":"d"}', "mention": "@alice: ping @bob",
        "email": "first.last+tag@sub.example.org", "im_end_only": "<|im_end|>",
    }
