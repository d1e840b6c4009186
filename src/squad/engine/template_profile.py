"""What a model's chat template is, for people: family, tool-call style, reasoning, counting.

:func:`profile` reads a template's source (and, given the model file, its vocabulary) and says:

- ``family``: the chat format family, recognised by the marker text the template writes
  (``<|im_start|>`` ChatML, ``<|start_header_id|>`` Llama 3, ``[INST]`` Mistral, ``<|channel|>``
  gpt-oss harmony, ``<｜User｜>`` DeepSeek, ``<|start_of_role|>`` Granite, ``<|turn>`` Gemma 4,
  ``<start_of_turn>`` Gemma, ``<|user|>``/``<|end|>`` Phi-3);
- ``tool_calls``: how the model writes a call through that template (llama-server parses it into
  ``tool_calls``: llama.cpp b11434 ``common/chat.cpp``), or that the template carries no tools;
- ``reasoning``: how thinking is marked; llama-server's default ``--reasoning-format auto``
  returns it as ``reasoning_content``;
- ``counts``: whether squad counts prompts exactly offline (:mod:`squad.engine.tokens`) or asks
  the engine (``/v1/chat/completions/input_tokens``), and why;
- ``call_ids``: what the template demands of a tool call's id (Mistral's refuse any id but 9
  alphanumeric characters; squad rewrites ids to fit, :func:`fit_call_ids`);
- ``warnings``: a template whose marker tokens are not tokens of the model's vocabulary (another
  family's template, or the engine's ChatML fallback for a file without one): the model then
  reads its turn markers as plain text.

The table of facts below is measured with the family matrix (``tests/engine/test_families_real.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from squad.engine.chat_templates import ENGINE_FALLBACK, call_id_length, handles_tools, known_template, template_thinks
from squad.engine.tokens import offline_counting, special_tokens

__all__ = ["TemplateProfile", "profile", "template_markers", "call_id_length", "fit_call_id", "fit_call_ids",
           "RAW_MARKUP", "strip_raw_markup"]


@dataclass(frozen=True)
class TemplateProfile:
    """See the module docstring; every field is one line of text for people."""

    family: str
    tool_calls: str
    reasoning: str
    counts: str
    warnings: tuple[str, ...] = field(default=())
    call_ids: str = "any"

    def summary(self) -> str:
        """One line: ``family ...; tool calls ...; reasoning ...; counts ...``."""
        return (f"family {self.family}; tool calls: {self.tool_calls}; reasoning: {self.reasoning}; "
                f"counts: {self.counts}" + (f"; call ids: {self.call_ids}" if self.call_ids != "any" else ""))


# (marker in the source, family, tool-call style); first match wins
_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("<|channel|>", "gpt-oss (harmony)", "harmony: to=functions.NAME on the commentary channel"),
    ("[TOOL_CALLS]", "Mistral", "[TOOL_CALLS]name[ARGS]{json}"),
    ("<｜User｜>", "DeepSeek", "<｜tool▁calls▁begin｜> blocks with JSON arguments"),
    ("<|start_header_id|>", "Llama 3", "a JSON object {\"name\", \"parameters\"} (results in the ipython role)"),
    ("<|start_of_role|>", "Granite", "<|tool_call|> followed by a JSON list of calls"),
    ("<|turn>", "Gemma 4", "<|tool_call>call:NAME{...}"),
    ("<start_of_turn>", "Gemma", ""),
    ("<|assistant|>", "Phi-3", ""),
    ("<|im_start|>", "ChatML", ""),
)

_MARKER = re.compile(r"<\|[A-Za-z0-9_.:-]{1,40}\|>|<｜[^｜<>]{1,40}｜>|\[/?[A-Z][A-Z_]{2,30}\]|"
                     r"<(?:start|end)_of_turn>|<\|[a-z_]{2,20}>|<[a-z_]{2,20}\|>")


def template_markers(source: str) -> set[str]:
    """The special-token-looking marker strings a template writes (``<|im_start|>``, ``[INST]``,
    ``<｜User｜>``, ``<start_of_turn>``, ``<|turn>``...)."""
    return set(_MARKER.findall(source))


def _tool_style(source: str, family: str, style: str) -> str:
    shipped = known_template(source)
    if shipped is not None:
        opener = shipped.call_prefix.strip()
        form = "a JSON list of calls" if opener == "<|tool_call|>" else "a JSON object"
        return f"{shipped.name}: {form} after {opener}"
    if "<function=" in source:
        return "XML: <tool_call><function=NAME><parameter=...>"
    if "<tool_call>" in source:
        return "Hermes: a JSON object between <tool_call> and </tool_call>"
    if style:
        return style
    if handles_tools(source) or "tools" in source:
        return "the engine's generic JSON format (the template reads tools)"
    return "none in the template (squad supplies its own for ChatML, Phi-3 and Granite only)"


def _reasoning(source: str) -> str:
    if "<|channel|>" in source:
        return "harmony analysis channel → reasoning_content"
    for opener in ("<think>", "[THINK]", "<|think|>"):
        if opener in source:
            return f"{opener} → reasoning_content"
    if template_thinks(source):
        return "a thinking switch in the template → reasoning_content"
    return "none"


def profile(source: str | None, model_path: str | Path | None = None) -> TemplateProfile:
    """The profile of the chat template ``source`` (None: the file has none, llama-server's ChatML
    fallback is used) for the model at ``model_path`` (None: counting and vocabulary checks say
    what is known without the file)."""
    text = source or ENGINE_FALLBACK
    family, style = "unrecognised", ""
    for marker, name, tool_style in _FAMILIES:
        if marker in text:
            family, style = name, tool_style
            break
    if source is None:
        family += " (llama-server's fallback: the file has no template)"
    warnings: list[str] = []
    counts = "asked of the engine (the model file is not on this machine)"
    if model_path is not None:
        counts = _counts(Path(model_path), source)
        warnings += _vocab_warnings(Path(model_path), text, source is None)
    n = call_id_length(text)
    ids = f"{n} alphanumeric characters (squad rewrites the ids it sends to fit)" if n else "any"
    return TemplateProfile(family=family, tool_calls=_tool_style(text, family, style), reasoning=_reasoning(text),
                           counts=counts, warnings=tuple(warnings), call_ids=ids)


def _counts(path: Path, source: str | None) -> str:
    exact, why = offline_counting(path, template=source)
    return f"exact offline{'; ' + why if why else ''}" if exact else f"asked of the engine ({why})"


def _vocab_warnings(path: Path, text: str, fallback: bool) -> list[str]:
    markers = template_markers(text)
    try:
        specials = special_tokens(path)
    except Exception:  # noqa: BLE001 -- an unreadable file is reported elsewhere
        return []
    if not markers or not specials or markers & specials:
        return []
    shown = ", ".join(sorted(markers)[:4])
    whose = ("llama-server's ChatML fallback (the file has no chat template)" if fallback
             else "the chat template")
    return [f"{path.name}: none of the turn markers {whose} writes ({shown}) is a token of the model's "
            "vocabulary: the template is probably another model family's, so the model reads its turn markers as "
            "plain text (counts stay exact: squad counts what the engine renders); pass the family's own template "
            "(--chat-template-file) or a model file that carries it"]


_ALNUM = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def fit_call_id(call_id: str, length: int) -> str:
    """``call_id`` as a template demanding ``length`` alphanumeric characters accepts it: itself
    when it already is such, else a stable digest of it (the same id always gives the same one, so
    a call and its result stay paired across turns and processes)."""
    if len(call_id) == length and call_id.isascii() and call_id.isalnum():
        return call_id
    import hashlib

    n = int.from_bytes(hashlib.blake2b(call_id.encode("utf-8", "surrogatepass"), digest_size=16).digest(), "big")
    out = []
    for _ in range(length):
        n, r = divmod(n, len(_ALNUM))
        out.append(_ALNUM[r])
    return "".join(out)


def fit_call_ids(messages: list[dict], length: int | None) -> list[dict]:
    """``messages`` with every ``tool_calls[].id`` and ``tool_call_id`` fitted to ``length``
    (:func:`fit_call_id`); ``messages`` itself when ``length`` is None or nothing changes."""
    if not length:
        return messages
    out, changed = [], False
    for m in messages:
        if isinstance(m, dict):
            new = m
            calls = m.get("tool_calls")
            if isinstance(calls, list) and any(isinstance(c, dict) and isinstance(c.get("id"), str) for c in calls):
                fixed = [{**c, "id": fit_call_id(c["id"], length)} if isinstance(c, dict)
                         and isinstance(c.get("id"), str) else c for c in calls]
                if fixed != calls:
                    new = {**m, "tool_calls": fixed}
            if isinstance(m.get("tool_call_id"), str):
                fitted = fit_call_id(m["tool_call_id"], length)
                if fitted != m["tool_call_id"]:
                    new = {**new, "tool_call_id": fitted}
            changed |= new is not m
            m = new
        out.append(m)
    return out if changed else messages


RAW_MARKUP: tuple[str, ...] = (
    "<tool_call>", "</tool_call>", "<function=", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>",
    "<|tool_call|>", "<|tool_call>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<|channel|>", "<|message|>",
    "<|start|>", "<|constrain|>", "<|call|>", "<tool_response>", "</tool_response>", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "<|eom_id|>",
)
"""Text that opens (or belongs to) a tool call or a harmony channel in the families squad knows
(:data:`_FAMILIES`): llama-server turns it into ``tool_calls`` / ``reasoning_content`` only when
its parser matched; a call cut by ``max_tokens``, or one the parser did not take, stays in the
content as raw text."""

_THINK = (("<think>", "</think>"), ("[THINK]", "[/THINK]"), ("<|think|>", "<|/think|>"))


def _is_result_tag(marker: str) -> bool:
    return any(w in marker.lower() for w in ("response", "result"))


def strip_raw_markup(text: str, source: str | None = None) -> tuple[str, str | None]:
    """``text`` as an answer may be handed on: thinking left in the content (``<think>…</think>``
    the engine did not parse, or a ``…</think>`` whose opener was in the prompt) removed, and
    everything from the first raw call/channel marker on removed; a tool result's wrapper tags
    (``<tool_response>``, ``[TOOL_RESULTS]``) removed with their content kept (a small model
    echoes the result it was given as its answer). The markers are those of
    :data:`RAW_MARKUP` and the tool-call markers that the engine's template ``source`` writes (an
    answer that merely discusses another family's markup is left alone); ``source`` None (not
    reported): all of :data:`RAW_MARKUP`. Returns ``(clean, first marker removed)``; the marker is
    None when nothing was removed."""
    def written(marker: str) -> bool:
        return source is None or marker in source

    removed = None
    for opener, closer in _THINK:
        if not (written(opener) or written(closer)):
            continue
        if closer in text:
            text, removed = text.rpartition(closer)[2].lstrip(), removed or closer
        elif opener in text:
            text, removed = text[:text.index(opener)], removed or opener
    markers = {m for m in RAW_MARKUP if written(m)}
    if source:
        markers |= {m for m in template_markers(source) if any(w in m.lower() for w in ("tool", "call", "channel"))}
    if "<|channel|>" in markers and any(m in text for m in ("<|channel|>", "<|message|>", "<|constrain|>")):
        markers.add("to=functions.")  # harmony's recipient, written before the channel marker
    # a tool result's wrapper (``<tool_response>``, ``[TOOL_RESULTS]``): a small model imitating the
    # prompt echoes the result inside it, which is its answer: the tags go, their content stays
    for tag in sorted((m for m in markers if _is_result_tag(m) and m in text), key=len, reverse=True):
        text, removed = text.replace(tag, "").strip(), removed or tag
    cuts = [(text.find(m), m) for m in markers if m in text and not _is_result_tag(m)]
    if cuts:
        at, marker = min(cuts)
        text, removed = text[:at].rstrip(), removed or marker
    return text, removed
