"""Tiny synthetic GGUF models for tests that must run without the built-in model: a byte-level
BPE vocabulary (every byte a token, plus "he", "hel", "hell", "hello") and the facts squad reads."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def byte_chars() -> list[str]:
    """GPT-2's byte → printable character table (the alphabet of byte-level BPE vocabularies)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    missing = [b for b in range(256) if b not in keep]
    return [chr(b) if b in keep else chr(256 + missing.index(b)) for b in range(256)]


def tiny_gguf(path: Path, *, template: str | None, n_ctx_train: int = 128, model: str = "gpt2",
              pre: str = "gpt-2", add_bos: bool | None = None) -> Path:
    """Write the tiny model to ``path`` (``template`` None: no chat template) and return it."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(8)
    w.add_head_count(1)
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    toks = ["<s>", "</s>", *byte_chars(), "he", "hel", "hell", "hello"]
    w.add_token_list(toks)
    w.add_token_types([3, 3] + [1] * (len(toks) - 2))
    w.add_token_merges(["h e", "he l", "hel l", "hell o"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if template is not None:
        w.add_chat_template(template)
    w.add_tensor("dummy", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
