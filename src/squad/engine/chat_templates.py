"""Chat templates squad ships, and which one an engine gets.

llama-server renders ``tools`` and parses tool calls only through the model's jinja template
(llama.cpp b11434, ``common/chat.cpp``). For a model whose template ignores ``tools`` (or has
none: llama-server's ChatML fallback, :data:`ENGINE_FALLBACK`) squad starts the engine with a
tool-capable template of its own for the same chat format (:data:`CHATML_TOOLS`,
:data:`PHI3_TOOLS`, :data:`GRANITE_TOOLS`), chosen by :func:`tool_template_for`;
:func:`handles_tools` is the probe. A forced turn starts inside a call
(:attr:`ChatTemplate.call_prefix`); a named ``tool_choice`` is sent as ``required`` with one tool.

Design: docs/design/tool-templates.md
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["ChatTemplate", "CHATML_TOOLS", "PHI3_TOOLS", "GRANITE_TOOLS",
           "ENGINE_FALLBACK", "chat_format", "handles_tools", "tool_template_for", "known_template",
           "describe", "call_prefix", "call_id_length", "THINK_MARKS", "template_thinks"]


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template squad ships.

    - ``name``: how plans and ``squad engine info`` show it (``squad:chatml-tools``);
    - ``chat_format``: the chat format it is written for (``chatml``);
    - ``path``: the ``.jinja`` file inside the installed package (passed to
      ``--chat-template-file``);
    - ``call_prefix``: the text that opens one tool call in this template; the client prefills it
      for a forced tool choice;
    - ``over_calls_unrendered``: it also replaces a model's template that lists tool definitions
      but renders no assistant tool call (Granite 3.3's: b11434 then derives no call parser and
      returns every call as text); ChatML's does not (LFM2 and SmolLM3 pass calls their own way).
    """

    name: str
    chat_format: str
    path: Path
    call_prefix: str
    over_calls_unrendered: bool = False

    @property
    def text(self) -> str:
        """The template's source."""
        return _read(self.path)


def _package_file(name: str) -> Path:
    return Path(str(resources.files("squad.engine") / "chat_templates" / name))


CHATML_TOOLS = ChatTemplate(name="squad:chatml-tools", chat_format="chatml",
                            path=_package_file("chatml-tools.jinja"), call_prefix="<tool_call>\n")
"""ChatML with Hermes-style ``<tool_call>`` JSON calls and ``<tool_response>`` results."""

PHI3_TOOLS = ChatTemplate(name="squad:phi3-tools", chat_format="phi3", path=_package_file("phi3-tools.jinja"),
                          call_prefix="<tool_call>\n")
"""Phi-3 turns (``<|user|>`` … ``<|end|>``) with the same ``<tool_call>`` JSON calls (Phi-3.5's
own template has no tools section)."""

GRANITE_TOOLS = ChatTemplate(name="squad:granite-tools", chat_format="granite",
                             path=_package_file("granite-tools.jinja"), call_prefix="<|tool_call|>",
                             over_calls_unrendered=True)
"""Granite 3.x turns with ``<|tool_call|>`` JSON-list calls rendered (Granite 3.3's own template
lists tools but never renders a call)."""

_SHIPPED = {t.chat_format: t for t in (CHATML_TOOLS, PHI3_TOOLS, GRANITE_TOOLS)}

ENGINE_FALLBACK = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)
"""The template llama-server b11434 applies to a model file that has none (ChatML without tools;
``/props`` ``chat_template`` for the Gemma 3 270M base model)."""


@functools.lru_cache(maxsize=8)
def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def chat_format(source: str | None) -> str | None:
    """The chat format a template writes (``"chatml"``: ``<|im_start|>role ... <|im_end|>``;
    ``"granite"``: ``<|start_of_role|>``; ``"phi3"``: ``<|user|>`` … ``<|end|>``), or None when it
    is none squad ships a template for."""
    if not source:
        return None
    if "<|im_start|>" in source and "<|im_end|>" in source:
        return "chatml"
    if "<|start_of_role|>" in source and "<|end_of_role|>" in source:
        return "granite"
    if "<|assistant|>" in source and "<|end|>" in source:
        return "phi3"
    return None


_PROBE_TOOL = "squad_probe_tool_f1"
_PROBE_CALL = "squad_probe_call_f2"


THINK_MARKS = ("<|channel|>", "<think>", "[THINK]", "<|think|>")
"""What a chat template that thinks writes or reads: gpt-oss's harmony channels, Qwen3 / DeepSeek-R1's
``<think>``, Mistral's ``[THINK]``, ``<|think|>``."""


def template_thinks(source: str | None) -> bool | None:
    """Whether a model with the chat template ``source`` can think: the template marks thinking
    (:data:`THINK_MARKS`) or has a thinking switch (``enable_thinking``, ``reasoning_effort``, ...);
    None when no template is known (nothing can be said)."""
    if not source:
        return None
    low = source.lower()
    return any(mark in source for mark in THINK_MARKS) or "thinking" in low or "reasoning" in low


@functools.lru_cache(maxsize=32)
def handles_tools(source: str | None) -> bool | None:
    """Whether a template renders tool definitions *and* assistant tool calls (None: no
    template, or it cannot be rendered here, so nothing is known)."""
    if not source:
        return None
    tools = [{"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe",
                                               "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call00001", "type": "function",
                     "function": {"name": _PROBE_CALL, "arguments": {"arg": "value"}}}]},
                {"role": "tool", "tool_call_id": "call00001", "content": "ok"},
                {"role": "user", "content": "thanks"}]
    try:
        text = _render(source, messages=messages, tools=tools)
    except Exception:  # noqa: BLE001 - a template jinja2 cannot run here: unknown
        return None
    return _PROBE_TOOL in text and _PROBE_CALL in text


def _lists_tools(source: str) -> bool:
    """Whether rendering ``source`` with a tool definition shows the tool (it lists tools)."""
    tools = [{"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe",
                                               "parameters": {"type": "object", "properties": {}}}}]
    try:
        return _PROBE_TOOL in _render(source, messages=[{"role": "user", "content": "hi"}], tools=tools)
    except Exception:  # noqa: BLE001 - a template jinja2 cannot run here
        return False


def _render(source: str, **context: Any) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(value, ensure_ascii=False, indent=indent)

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = time.strftime  # llama.cpp's jinja gives templates the date this way
    return env.from_string(source).render(bos_token="", eos_token="", add_generation_prompt=True, **context)


def tool_template_for(source: str | None, *, has_tool_use_template: bool = False) -> ChatTemplate | None:
    """The template squad starts the engine with for a model whose own template is ``source``:
    squad's template for its chat format when the model's cannot carry tools, else None (the
    model's own template is used). Never one for a model with a ``tool_use`` template, or whose
    template mentions tools at all (it may handle them in a way the render probe does not see:
    SmolLM3 and LFM2 pass tools through their own variables), and never when the chat format
    is not one squad ships. ``source`` None (the file has no template) is the engine's
    :data:`ENGINE_FALLBACK`."""
    source = source or ENGINE_FALLBACK
    shipped = _SHIPPED.get(chat_format(source) or "")
    if shipped is None or has_tool_use_template or handles_tools(source) is not False:
        return None
    if "tool" in source.lower() and not (shipped.over_calls_unrendered and _lists_tools(source)):
        return None
    return shipped


# The text that opens a tool call in a family's own template, by a marker of that template
# (first match wins). b11434's ``tool_choice: required`` lets a model write text before a call
# (measured with the family matrix, tests/engine/test_families_real.py: Qwen3, Qwen3.5, Llama 3.1,
# Mistral Small 3.2 and DeepSeek-R1-distill stand-ins wrote only text or thinking); continuing an assistant message
# holding this prefix makes the engine's grammar and parser start inside a call (measured: a parsed call).
_FAMILY_CALL_PREFIXES: tuple[tuple[str, str], ...] = (
    ("[TOOL_CALLS]", "[TOOL_CALLS]"),
    ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"),
    ("<|start_header_id|>", '{"name": "'),
    ("<function=", "<tool_call>\n<function="),
    ("<tool_call>", "<tool_call>\n"),
)


def call_prefix(source: str | None) -> str | None:
    """The prefix a forced tool choice is prefilled with for an engine applying ``source``:
    squad's own template's :attr:`ChatTemplate.call_prefix`, a measured family's call opener
    (Hermes/Qwen ``<tool_call>``, Qwen3.5's XML form, Llama 3's JSON call, Mistral's
    ``[TOOL_CALLS]``), else None (the request is sent as it is)."""
    shipped = known_template(source)
    if shipped is not None:
        return shipped.call_prefix
    if not source:
        return None
    return next((prefix for marker, prefix in _FAMILY_CALL_PREFIXES if marker in source), None)


_ID_LENGTH = re.compile(r"tool_call(?:\.id|_id'?\]?)\s*\|\s*length\s*!=\s*(\d{1,3})")


@functools.lru_cache(maxsize=16)
def call_id_length(source: str | None) -> int | None:
    """The length a template demands of tool call ids (``tool_call.id|length != 9`` raises in
    Mistral Small 3.x / Nemo templates), or None when any id renders. llama-server b11434 makes
    32-character ids and renders the template as it is: such a template refuses every history
    holding one (HTTP 400, counting included)."""
    found = _ID_LENGTH.search(source or "")
    return int(found.group(1)) if found else None


def known_template(source: str | None) -> ChatTemplate | None:
    """The shipped template ``source`` is (what ``/props`` ``chat_template`` reads back), or None."""
    if not source:
        return None
    return next((t for t in _SHIPPED.values() if t.text.strip() == source.strip()), None)


def describe(source: str | None) -> str:
    """One line for people: which template an engine applies and whether it carries tools."""
    if not source:
        return "unknown (the engine did not report one)"
    shipped = known_template(source)
    if shipped is not None:
        return f"{shipped.name} (squad's {shipped.chat_format} template with tools)"
    tools = handles_tools(source)
    fmt = chat_format(source)
    kind = f"the model's own{' ' + fmt if fmt else ''} template"
    return kind + {True: " (carries tools)", False: " (no tools: tool definitions are dropped)",
                   None: ""}[tools]
