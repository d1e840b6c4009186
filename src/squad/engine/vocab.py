"""A GGUF file's vocabulary as an HF ``tokenizers`` tokenizer that splits text as llama.cpp does.

What :class:`~squad.engine.tokens.GGUFCounter` counts with. :func:`build_record` reads the file
(``tokenizer.ggml.*``) into a cache record: the tokenizer as JSON and its :class:`VocabMeta`, or why
the file is not supported.

Mapped: byte-level BPE (``tokenizer.ggml.model == "gpt2"``) with the GPT-2, digit-splitting
StarCoder/SmolLM, Llama 3, Qwen2 and Qwen3.5 pre-tokenizers (llama.cpp ``src/llama-vocab.cpp``
``llm_tokenizer_bpe``); built with the HF ``tokenizers`` library; the record is cached as JSON in
``cache_dir()/tokenizers/`` keyed by the file's resolved path, size and mtime (reading the
vocabulary takes ~2 s). Design: docs/design/token-counting.md
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from squad.engine.gguf import read_fields
from squad.engine.model_cache import read_entry

__all__ = ["CACHE_VERSION", "FULL_REGEX", "PRE_SPLITS", "SPECIAL_TEMPLATE_MARKERS", "SPECIAL_TOKEN_TYPES", "VocabMeta",
           "build_record", "build_tokenizer", "load_entry"]

CACHE_VERSION = 2
"""The version of the records cached in ``cache_dir()/tokenizers/`` and ``special-tokens/``."""

# llama.cpp src/llama-vocab.cpp, llm_tokenizer_bpe: regexes applied one after another, each
# splitting the pieces of the previous one. The GPT-2 regex is the one HF's ByteLevel applies
# (llama.cpp runs it through unicode_regex_split_custom_gpt2, which also keeps \s+ runs).
_DIGITS = r"\p{N}"
PRE_SPLITS: dict[str, tuple[str, ...]] = {
    **{p: () for p in ("gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4")},
    **{p: (_DIGITS,) for p in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                                "minerva-7b", "mellum2")},
}

# Pre-tokenizers whose one regex replaces GPT-2's (llm_tokenizer_bpe): the regex, whether whole
# pieces found in the vocabulary skip the merges (llama.cpp ``ignore_merges``), and llama.cpp's
# add_bos default when the file has no ``tokenizer.ggml.add_bos_token`` (src/llama-vocab.cpp).
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + (r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                           r"|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_QWEN35 = _CONTRACTIONS + (r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
FULL_REGEX: dict[str, tuple[str, bool, bool]] = {
    **{p: (_LLAMA3, True, True) for p in ("llama3", "llama-v3", "llama-bpe")},
    **{p: (_QWEN2, False, False) for p in ("qwen2", "deepseek-r1-qwen")},
    "qwen35": (_QWEN35, False, False),
}

# Substrings by which common_chat_try_specialized_template (common/chat.cpp) picks a hand-written
# format, or that make the server's prompt depend on its reasoning analysis.
SPECIAL_TEMPLATE_MARKERS = (
    "<|channel|>", "[TOOL_CALLS]", "chat_format=llm-jp-harmony-v1", "<atem:function_calls>",
    ">>>all", "<|tool_calls_section_begin|>", "<|open|>", "<role>ASSISTANT</role>",
    "<|START_TEXT|>", "<|tool_list_start|>", "List of tools: [", "<|role_sep|>",
    "]<]minimax[>[", "dsml_token", "'<|tool_call>call:'", "Tool usage guidelines:",
    "<function=", "You have access to the following functions in JSONSchema format",
    "enable_thinking", "reasoning_effort", "preserve_reasoning",
)

SPECIAL_TOKEN_TYPES = (2, 3, 4)  # unknown, control, user-defined (llama_token_type)


@dataclass(frozen=True)
class VocabMeta:
    """What the counter needs besides the tokenizer: the chat template, the BOS/EOS tokens (text
    and id) and whether the engine adds them, and whether the file has a ``tool_use`` template."""

    template: str
    bos_token: str
    eos_token: str
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    has_tool_use_template: bool


def build_record(path: Path, key: dict) -> dict:
    """The cache record for a GGUF file: ``{"version", "key", "tokenizer": <HF JSON>, "meta":
    <VocabMeta>}``, or ``{"version", "key", "unsupported": <why>}`` for a tokenizer or chat template
    not reproduced here. Reads the whole vocabulary (~2 s for SmolLM2)."""
    fields = read_fields(path)

    def get(name: str, default: Any = None) -> Any:
        field = fields.get(name)
        return default if field is None else field.contents()

    base = {"version": CACHE_VERSION, "key": key}
    model, pre = get("tokenizer.ggml.model"), get("tokenizer.ggml.pre", "default")
    template = get("tokenizer.chat_template")
    why = None
    if model != "gpt2" or (pre not in PRE_SPLITS and pre not in FULL_REGEX):
        why = f"tokenizer {model!r}/{pre!r} is not mapped"
    elif not template or template == "chatml":
        why = "no chat template in the file (the engine falls back to its built-in chatml)"
    elif any(marker in template for marker in SPECIAL_TEMPLATE_MARKERS):
        why = "the engine special-cases this chat template"
    if why:
        return {**base, "unsupported": why}
    full = FULL_REGEX.get(pre)
    tok = build_tokenizer(get("tokenizer.ggml.tokens"), get("tokenizer.ggml.token_type"),
                           get("tokenizer.ggml.merges"), PRE_SPLITS.get(pre, ()), full=full)
    bos_id, eos_id = get("tokenizer.ggml.bos_token_id"), get("tokenizer.ggml.eos_token_id")

    def piece(token_id: int | None) -> str:
        return "" if token_id is None else tok.decode([int(token_id)], skip_special_tokens=False)

    meta = VocabMeta(
        template=template, bos_token=piece(bos_id), eos_token=piece(eos_id),
        bos_id=None if bos_id is None else int(bos_id), eos_id=None if eos_id is None else int(eos_id),
        # llama.cpp's defaults when the keys are absent: no EOS; BOS only for the Llama 3 family
        add_bos=bool(get("tokenizer.ggml.add_bos_token", bool(full and full[2]))),
        add_eos=bool(get("tokenizer.ggml.add_eos_token", False)),
        has_tool_use_template=get("tokenizer.chat_template.tool_use") is not None,
    )
    return {**base, "tokenizer": tok.to_str(), "meta": asdict(meta)}


def build_tokenizer(tokens: list[str], types: list[int], merges: list[str], splits: tuple[str, ...],
                     full: tuple[str, bool, bool] | None = None) -> Any:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
    )

    vocab = {text: i for i, text in enumerate(tokens)}
    pairs = []
    for merge in merges:  # llama.cpp splits at the first space after position 0
        cut = merge.find(" ", 1)
        pairs.append((merge[:cut], merge[cut + 1:]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                               ignore_merges=bool(full and full[1])))
    if full is not None:  # one regex instead of GPT-2's, then the byte mapping alone
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(full[0]), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(text, special=True, normalized=False)
                            for text, kind in zip(tokens, types) if kind in SPECIAL_TOKEN_TYPES])
    return tok


def load_entry(entry: Path, key: dict) -> dict | None:
    """The cached record at ``entry`` for ``key`` (a file version), or None when absent, stale or incomplete."""
    record = read_entry(entry, key, CACHE_VERSION)
    if record is None:
        return None
    if not record.get("unsupported") and not {"tokenizer", "meta"} <= set(record):
        return None
    return record
