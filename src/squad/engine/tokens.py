"""Exact prompt token counts from the GGUF file alone, without a running engine.

``counter_for_model(path)`` gives a :class:`GGUFCounter` that returns the same number as
llama-server's ``POST /v1/chat/completions/input_tokens`` (llama.cpp b11434) for the same
``messages`` (+ ``tools``), or None when the file's tokenizer (byte-level BPE only) or chat
template is outside what is reproduced. A counter raises :class:`NotExact` for a request it
cannot count exactly; callers then ask the engine. Counts are ints >= 0; the built tokenizer is
cached as JSON in ``cache_dir()/tokenizers/``. Measured equal on 40 chat requests
(``tests/engine/test_tokens_real.py``).

Design (how the engine counts, what is not exact, speed): docs/design/token-counting.md.
The GGUF vocabulary becomes a tokenizer in :mod:`squad.engine.vocab`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from squad.engine import vocab
from squad.engine.chat_templates import known_template
from squad.engine.gguf import read_fields
from squad.engine.model_cache import cache_entry, fill_entry, read_entry
from squad.engine.vocab import CACHE_VERSION, SPECIAL_TEMPLATE_MARKERS, SPECIAL_TOKEN_TYPES, VocabMeta, load_entry
from squad.errors import ModelError, SquadError

__all__ = ["GGUFCounter", "NotExact", "TokenCounter", "counter_for_model", "offline_counting", "special_tokens"]


class NotExact(SquadError):
    """This request cannot be counted exactly from the model file; ask the engine instead."""


@runtime_checkable
class TokenCounter(Protocol):
    """The one counting seam: exact token counts as llama-server computes them."""

    def count_chat(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        """Prompt tokens of a chat request (template applied, BOS/EOS as the engine adds them)."""
        ...

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` alone: no template, no BOS/EOS, special-token text parsed."""
        ...


class GGUFCounter:
    """Counts tokens exactly as llama-server b11434 does, from one GGUF file's vocabulary.

    Build it with :func:`counter_for_model`. Thread-safe (the tokenizer and the compiled template
    are read-only). ``count_chat`` raises :class:`NotExact` for the request classes listed in the
    module docstring; both methods return a token count (int >= 0).
    """

    def __init__(self, path: Path, tokenizer: Any, meta: VocabMeta) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.path = path
        self._tok = tokenizer
        self._meta = meta
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: _dt.datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        self._template = env.from_string(meta.template)
        self._src = meta.template
        # a template squad ships renders tools and tool calls with expressions only and its own
        # tojson, which this counter reproduces (measured equal to the engine's counts, below)
        self._exact_tools = _shipped(meta.template)
        try:  # as llama.cpp's caps probe (common/jinja/caps.cpp): is a system message used?
            probe = self._render([{"role": "system", "content": "System message"},
                                  {"role": "user", "content": "User message"}], None)
        except NotExact:
            probe = ""
        self.supports_system_role = "System message" in probe

    # -- counting --------------------------------------------------------------------------

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` as the engine tokenizes prompt text (``parse_special=true``), no BOS/EOS.

        Counts do not add up: ``count_text(a + b)`` may differ from ``count_text(a) +
        count_text(b)`` by a token or two at the seam.

        Encoded through ``encode_batch``, which lets go of the GIL while it works (``encode`` holds it:
        ~2.5 s per MB of text on a 2-core machine, during which no other thread of the process runs):
        a large prompt counted in a worker thread then holds up no one (``squad serve``, issue 28).
        """
        return len(self._tok.encode_batch([text], add_special_tokens=False)[0].ids)

    def count_chat(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        """Exact ``input_tokens`` of a chat request with ``messages`` (+ ``tools``).

        Raises :class:`NotExact` when this request is outside what is reproduced (see the module
        docstring); the caller should then ask the engine.
        """
        return self._count_prompt(self.render(messages, tools))

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The prompt text the engine would tokenize (before BOS/EOS). Raises :class:`NotExact`.

        A final assistant message is continued, as the server does by default (``prefill_assistant``,
        ``common/chat-auto-parser-generator.cpp``): the history before it is rendered without the
        generation prompt, then the generation prompt (the text ``add_generation_prompt`` adds) and
        the message's content are appended; an empty final message adds nothing (measured).
        """
        if tools:
            if self._meta.has_tool_use_template:
                raise NotExact("the model has a separate tool_use chat template")
            if "tools" in self._src and not self._exact_tools:
                raise NotExact("the chat template renders tools; the engine formats them in C++")
        if not messages:
            raise NotExact("no messages")
        prefill = self._prefill(messages)
        msgs = self._normalize(messages if prefill is None else messages[:-1])
        if prefill is None:
            return self._prompt(msgs, tools, generation_prompt=True)
        without = self._prompt(msgs, tools, generation_prompt=False)
        if not prefill:  # an empty final message is dropped, and no generation prompt is added
            return without
        with_gen = self._prompt(msgs, tools, generation_prompt=True)
        common = 0
        while common < min(len(without), len(with_gen)) and without[common] == with_gen[common]:
            common += 1
        return without + with_gen[common:] + prefill

    def _prefill(self, messages: list[dict]) -> str | None:
        if not messages or messages[-1].get("role") != "assistant":
            return None
        last = messages[-1]
        if len(messages) >= 2 and messages[-2].get("role") == "assistant":
            raise NotExact("two final assistant messages (the engine refuses them)")
        if last.get("tool_calls") or last.get("reasoning_content"):
            raise NotExact("a final assistant message with tool calls or reasoning")
        lowered = self._src.lower()
        if "think" in lowered or "reasoning" in lowered:
            raise NotExact("prefill with a reasoning template (the engine's reasoning markers are not reproduced)")
        content = last.get("content")
        if content is not None and not isinstance(content, str):
            raise NotExact("typed (array) message content")
        return content or ""

    def _prompt(self, msgs: list[dict], tools: list[dict] | None, *, generation_prompt: bool) -> str:
        prompt = self._render(msgs, tools or None, generation_prompt=generation_prompt)
        if self._meta.add_bos and self._meta.bos_token and prompt.startswith(self._meta.bos_token):
            prompt = prompt[len(self._meta.bos_token):]
        if self._meta.add_eos and self._meta.eos_token and prompt.endswith(self._meta.eos_token):
            prompt = prompt[: -len(self._meta.eos_token)]
        return prompt

    def _count_prompt(self, prompt: str) -> int:
        return self.count_text(prompt) + int(self._meta.add_bos and self._meta.bos_id is not None) + int(
            self._meta.add_eos and self._meta.eos_id is not None)

    def _normalize(self, messages: list[dict]) -> list[dict]:
        out: list[dict] = []
        for m in messages:
            role, content = m.get("role"), m.get("content")
            if not isinstance(role, str):
                raise NotExact(f"message without a string role: {m!r:.80}")
            if content is not None and not isinstance(content, str):
                raise NotExact("typed (array) message content")
            msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                   "content": content or ""}
            for key in ("name", "tool_call_id"):
                if isinstance(m.get(key), str) and m[key]:
                    msg[key] = m[key]
            for key in ("tool_calls", "reasoning_content"):
                if m.get(key) and key in self._src and not (key == "tool_calls" and self._exact_tools):
                    raise NotExact(f"the chat template renders {key}")
            if m.get("tool_calls") and self._exact_tools:
                # llama.cpp's caps probe finds that squad's template reads an object's arguments
                # (``supports_object_arguments``), so the server parses each call's argument text
                # and the template re-serializes it (workaround::func_args_not_string):
                # '{"q":"x"}' is rendered as '{"q": "x"}'
                msg["tool_calls"] = [_call_json(c, object_arguments=True) for c in m["tool_calls"]]
            out.append(msg)
        if not self.supports_system_role and out and out[0]["role"] == "system":
            first = out.pop(0)
            if out:
                out[0] = {**out[0], "content": first["content"] + "\n" + out[0]["content"]}
        return out

    def _render(self, messages: list[dict], tools: list[dict] | None, *, generation_prompt: bool = True) -> str:
        now = _dt.datetime.now()
        ctx: dict[str, Any] = {
            "messages": messages, "bos_token": self._meta.bos_token, "eos_token": self._meta.eos_token,
            "enable_thinking": False,
            "datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y"),
        }
        if tools:
            ctx["tools"] = tools
        if generation_prompt:  # the engine sets it only when true
            ctx["add_generation_prompt"] = True
        try:
            return self._template.render(ctx)
        except Exception as exc:  # jinja2 errors, raise_exception(), type errors in templates
            raise NotExact(f"the chat template failed to render here: {exc}") from exc


def counter_for_model(path: str | Path, *, template: str | None = None) -> GGUFCounter | None:
    """The exact counter for a GGUF file, or None when its tokenizer/template is not supported.

    ``template``: the chat template the engine applies when it is not the file's own (an engine
    started with ``--chat-template-file``, ``/props`` ``chat_template``); the same rules apply
    to it (None when the engine special-cases it), and the file's ``tool_use`` variant no longer
    counts. Memoized per (resolved path, size, mtime) for the life of the process; the built
    tokenizer is also cached on disk in ``cache_dir()/tokenizers/``. Raises ``ModelError`` when
    the file is missing or not readable GGUF.
    """
    path = Path(path).expanduser()
    try:
        stat = path.stat()
    except OSError:
        raise ModelError(f"{path}: no such model file") from None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _lock:
        counter = _counter(*key)
        if counter is None or template is None or template == counter._meta.template:  # noqa: SLF001 - same module
            return counter
        return _with_template(counter, template)


def offline_counting(path: str | Path, *, template: str | None = None) -> tuple[bool, str]:
    """``(exact, why)``: whether prompts for this model (and engine template) are counted exactly
    offline, and what is asked of the engine instead (``why``: the reason when not exact; for an
    exact counter, the request classes that still go to the engine, or ``""``). Raises
    ``ModelError`` like :func:`counter_for_model`."""
    counter = counter_for_model(path, template=template)
    if counter is None:
        p = Path(path).expanduser()
        stat = p.stat()
        key = {"path": str(p.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        record = load_entry(cache_entry("tokenizers", key), key) or {}
        why = record.get("unsupported")
        if not why and template is not None and any(marker in template for marker in SPECIAL_TEMPLATE_MARKERS):
            why = "the engine special-cases this chat template"
        return False, str(why or "the chat template cannot be rendered here")
    src = counter._src  # noqa: SLF001 - same module
    if counter._exact_tools:  # noqa: SLF001 - same module
        return True, ""
    asked = [what for what, word in (("tools", "tools"), ("tool calls", "tool_calls"),
                                     ("reasoning in the history", "reasoning_content")) if word in src]
    return True, (f"requests with {', '.join(asked)} are asked of the engine" if asked else "")


def special_tokens(path: str | Path) -> frozenset[str]:
    """The text of every control, user-defined or unknown token of the model's vocabulary (the
    tokens special-token text in a prompt becomes). Cached per file version in
    ``cache_dir()/special-tokens/``. Raises ``ModelError`` for a missing or unreadable file."""
    p = Path(path).expanduser()
    try:
        stat = p.stat()
    except OSError:
        raise ModelError(f"{p}: no such model file") from None
    key = {"path": str(p.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    entry = cache_entry("special-tokens", key)

    def load() -> dict | None:
        record = read_entry(entry, key, CACHE_VERSION)
        return record if record is not None and isinstance(record.get("tokens"), list) else None

    def build() -> dict:
        fields = read_fields(p)
        tokens, types = fields.get("tokenizer.ggml.tokens"), fields.get("tokenizer.ggml.token_type")
        found = [] if tokens is None or types is None else [
            t for t, kind in zip(tokens.contents(), types.contents()) if kind in SPECIAL_TOKEN_TYPES]
        return {"version": CACHE_VERSION, "key": key, "tokens": found}

    record = load()
    if record is None:
        record = fill_entry(entry, build, whole=lambda: load() is not None,
                            doing=f"listing the special tokens of {p.name}") or load() or build()
    return frozenset(record["tokens"])


@functools.lru_cache(maxsize=8)
def _with_template(counter: GGUFCounter, template: str) -> GGUFCounter | None:
    if any(marker in template for marker in SPECIAL_TEMPLATE_MARKERS):
        return None
    from dataclasses import replace

    try:
        meta = replace(counter._meta, template=template, has_tool_use_template=False)  # noqa: SLF001 - same module
        return GGUFCounter(counter.path, counter._tok, meta)  # noqa: SLF001 - same module
    except Exception:  # noqa: BLE001 -- a template jinja2 cannot compile
        return None


_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _counter(resolved: str, size: int, mtime_ns: int) -> GGUFCounter | None:
    path = Path(resolved)
    key = {"path": resolved, "size": size, "mtime_ns": mtime_ns}
    entry = cache_entry("tokenizers", key)
    record = load_entry(entry, key)
    if record is not None:
        with contextlib.suppress(Exception):  # a damaged cache entry: rebuild it from the GGUF
            return _from_record(path, record)
    built = fill_entry(entry, lambda: vocab.build_record(path, key), whole=lambda: load_entry(entry, key) is not None,
                       doing=f"reading the vocabulary of {path.name}", force=record is not None)
    record = built or load_entry(entry, key) or vocab.build_record(path, key)
    try:
        return _from_record(path, record)
    except Exception:  # noqa: BLE001 -- e.g. a template jinja2 cannot compile
        return None


def _from_record(path: Path, record: dict) -> GGUFCounter | None:
    from tokenizers import Tokenizer

    if record.get("unsupported"):
        return None
    return GGUFCounter(path, Tokenizer.from_str(record["tokenizer"]), VocabMeta(**record["meta"]))


def _call_json(call: Any, *, object_arguments: bool = False) -> dict[str, Any]:
    """A tool call as the server passes it to the template: name and the arguments' text, or
    (``object_arguments``, a template llama.cpp finds reading them as an object) the parsed
    arguments. Raises :class:`NotExact` for arguments that are not a JSON string (the server
    refuses text it cannot parse)."""
    fn = call.get("function", call) if isinstance(call, dict) else {}
    args: Any = fn.get("arguments", "")
    if not isinstance(args, str):
        raise NotExact("tool call arguments that are not a JSON string")
    if object_arguments:
        try:
            args = json.loads(args)
        except ValueError:
            raise NotExact("tool call arguments that are not JSON (the engine refuses them)") from None
        if isinstance(args, float) or _has_float(args):
            raise NotExact("tool call arguments with a real number (the engine's number formatting is not reproduced)")
    out: dict[str, Any] = {"type": "function", "function": {"name": fn.get("name", ""), "arguments": args}}
    if call.get("id"):
        out["id"] = call["id"]
    return out


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    return False


def _shipped(template: str) -> bool:
    """Whether ``template`` is one squad ships (:mod:`squad.engine.chat_templates`)."""
    return known_template(template) is not None


def _raise_exception(message: str) -> None:
    raise NotExact(f"the chat template raised: {message}")


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)
