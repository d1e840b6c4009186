"""GGUF facts: what a model file says about its KV cache, read once and cached.

``read_model_facts(path)`` → :class:`ModelFacts`, the GGUF keys that size the KV cache (read
with the ``gguf`` package, maintained with llama.cpp); ``ModelFacts.kv_bytes_per_token`` does
the arithmetic of ``docs/llama-facts.md`` ("KV memory per token").

Model facts are cached as JSON in ``cache_dir()/facts/`` keyed by the file's resolved path,
size and mtime (:mod:`squad.engine.model_cache`), so only the first read of a model parses the
GGUF; reading and checking GGUF files is :mod:`squad.engine.gguf` (both re-exported here).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from squad.engine.gguf import check_gguf, is_gguf, read_fields
from squad.engine.llama import kv_row_bytes, round_ctx
from squad.engine.model_cache import cache_entry, fill_entry, read_entry, write_entry
from squad.engine.stores import model_bytes
from squad.errors import ModelError

__all__ = [
    "ModelFacts",
    "read_model_facts",
    "is_gguf",
    "check_gguf",
    "read_fields",
    "cache_entry",
    "read_entry",
    "write_entry",
]


@dataclass(frozen=True)
class ModelFacts:
    """What a GGUF file says about its KV cache (keys ``{arch}.*``, see ``docs/llama-facts.md``).

    - ``n_ctx_train``: ``{arch}.context_length``, tokens.
    - ``n_head_kv``: one entry per layer (the key may be a scalar or a per-layer array;
      0 = a layer without KV, e.g. recurrent).
    - ``key_length``/``value_length``: head dims; default ``n_embd / n_head``.
    - ``sliding_window``: SWA window in tokens, or None.
    - ``sliding_window_pattern``: per layer, True = sliding-window layer; None when neither
      the file nor llama.cpp's default for the arch gives one (then every layer is counted as
      full attention: an upper bound).
    - ``file_size``: bytes (of all parts, for a split model passed by its first part).
    - ``key_length_swa``/``value_length_swa``: head dims of sliding-window layers when the
      file gives them (``{arch}.attention.key_length_swa``), else None = same as full layers.
    - ``chat_template``: ``tokenizer.chat_template`` (jinja source), or None;
      ``has_tool_use_template``: the file also has ``tokenizer.chat_template.tool_use``. The
      planner picks the engine's template from them (:mod:`squad.engine.chat_templates`).
    - ``license``: ``general.license`` (e.g. ``apache-2.0``), or None when the file names none.
    """

    path: Path
    name: str
    architecture: str
    n_ctx_train: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: tuple[int, ...]
    key_length: int
    value_length: int
    sliding_window: int | None
    sliding_window_pattern: tuple[bool, ...] | None
    file_size: int
    key_length_swa: int | None = None
    value_length_swa: int | None = None
    chat_template: str | None = None
    has_tool_use_template: bool = False
    license: str | None = None

    def kv_bytes_per_token(self, cache_type_k: str = "f16", cache_type_v: str = "f16") -> int:
        """KV bytes one cell (token) takes summed over all layers.

        Per layer: ``n_head_kv × key_length × bytes(k) + n_head_kv × value_length × bytes(v)``.
        SmolLM2-135M at f16: 30 × 3 × 64 × (2+2) = 23,040. Raises
        :class:`~squad.errors.PlanError` for a cache type llama-server does not take.
        """
        return sum(self._layer_bytes(i, cache_type_k, cache_type_v) for i in range(self.n_layer))

    def kv_bytes(
        self, n_ctx: int, cache_type_k: str = "f16", cache_type_v: str = "f16", *,
        slots: int = 1, n_ubatch: int = 512,
    ) -> int:
        """Approximate KV cache bytes for a unified pool of ``n_ctx`` cells shared by ``slots``.

        Full-attention layers hold ``pad256(n_ctx)`` cells. Sliding-window layers hold about
        ``pad256(sliding_window × slots + n_ubatch)`` cells, at most ``pad256(n_ctx)`` (the
        rule in ``docs/llama-facts.md``). Only an estimate: llama.cpp's exact sizing also depends on
        unified vs per-slot streams and on flash attention; compare with ``-lv 4`` output.
        """
        cells = round_ctx(n_ctx)
        swa_cells = cells
        if self.sliding_window:
            swa_cells = min(cells, round_ctx(self.sliding_window * slots + n_ubatch))
        total = 0
        for i in range(self.n_layer):
            is_swa = bool(self.sliding_window_pattern and self.sliding_window_pattern[i])
            total += self._layer_bytes(i, cache_type_k, cache_type_v) * (swa_cells if is_swa else cells)
        return total

    def _layer_bytes(self, layer: int, type_k: str, type_v: str) -> int:
        heads = self.n_head_kv[layer]
        k, v = self.key_length, self.value_length
        if self.sliding_window_pattern and self.sliding_window_pattern[layer]:
            k, v = self.key_length_swa or k, self.value_length_swa or v
        return kv_row_bytes(heads * k, type_k) + kv_row_bytes(heads * v, type_v)


def read_model_facts(path: str | Path) -> ModelFacts:
    """Read ``ModelFacts`` from a GGUF file. Raises ``ModelError`` if it is missing, not GGUF,
    or lacks a key squad needs (it names the key).

    Parsing takes ~2 s for the default model (the reader walks the whole vocabulary), so
    results are memoized per (path, size, mtime) for the life of the process and stored in
    ``cache_dir()/facts/<hash>.json`` for later processes. A cache entry that is unreadable,
    from another format version or for another (path, size, mtime) is ignored and rewritten;
    a cache dir that cannot be written only costs a re-parse next time.
    """
    path = Path(path).expanduser()
    try:
        stat = path.stat()
    except OSError:
        raise ModelError(f"{path}: no such model file") from None
    return _read_facts(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _read_facts(path: Path, size: int, mtime_ns: int) -> ModelFacts:
    key = {"path": str(path.resolve()), "size": size, "mtime_ns": mtime_ns}
    entry = cache_entry("facts", key)
    cached = _load_facts(entry, key, path)
    if cached is not None:
        return cached
    parsed: ModelFacts | None = None

    def record() -> dict[str, Any]:
        nonlocal parsed
        parsed = _parse_facts(path)
        return {"version": _FACTS_VERSION, "key": key, "facts": _fields(parsed)}

    fill_entry(entry, record, whole=lambda: _load_facts(entry, key, path) is not None,
               doing=f"reading the facts of {path.name}")
    if parsed is not None:
        return parsed
    cached = _load_facts(entry, key, path)
    return cached if cached is not None else _parse_facts(path)  # replaced meanwhile by another squad's


#: Bump when ModelFacts (or how it is read) changes: older cache entries are then re-parsed.
_FACTS_VERSION = 3


_CACHED_FIELDS = tuple(f for f in ModelFacts.__dataclass_fields__ if f != "path")


def _fields(facts: ModelFacts) -> dict[str, Any]:
    return {f: getattr(facts, f) for f in _CACHED_FIELDS}


def _load_facts(entry: Path, key: dict[str, object], path: Path) -> ModelFacts | None:
    """The cached facts in ``entry`` if it is intact and for ``key``, else None."""
    from pydantic import TypeAdapter, ValidationError

    record = read_entry(entry, key, _FACTS_VERSION)
    if record is None:
        return None
    try:
        facts = record["facts"]
        if set(facts) != set(_CACHED_FIELDS):
            return None
        return TypeAdapter(ModelFacts).validate_python({**facts, "path": path})
    except (ValueError, TypeError, KeyError, AttributeError, ValidationError):
        return None


def _parse_facts(path: Path) -> ModelFacts:
    check_gguf(path)
    fields = read_fields(path)

    def get(key: str, default: object = ModelError) -> Any:  # a GGUF value: str, int, float, bool, list
        field = fields.get(key)
        if field is None:
            if default is ModelError:
                raise ModelError(f"{path}: GGUF key {key!r} is missing")
            return default
        return field.contents()

    arch = str(get("general.architecture"))
    n_layer = int(get(f"{arch}.block_count"))
    n_embd = int(get(f"{arch}.embedding_length"))
    n_head = _first_nonzero(get(f"{arch}.attention.head_count"))
    n_head_kv = _per_layer(get(f"{arch}.attention.head_count_kv", n_head), n_layer, path)
    head_dim = n_embd // n_head if n_head else 0
    window = get(f"{arch}.attention.sliding_window", None)
    pattern = get(f"{arch}.attention.sliding_window_pattern", None)
    return ModelFacts(
        path=path,
        name=str(get("general.name", path.stem)),
        architecture=arch,
        n_ctx_train=int(get(f"{arch}.context_length")),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        key_length=int(get(f"{arch}.attention.key_length", head_dim)),
        value_length=int(get(f"{arch}.attention.value_length", head_dim)),
        sliding_window=int(window) if window else None,
        sliding_window_pattern=_swa_pattern(pattern, n_layer, arch) if window else None,
        file_size=model_bytes(path),
        key_length_swa=_opt_int(get(f"{arch}.attention.key_length_swa", None)),
        value_length_swa=_opt_int(get(f"{arch}.attention.value_length_swa", None)),
        chat_template=_opt_str(get("tokenizer.chat_template", None)),
        has_tool_use_template=get("tokenizer.chat_template.tool_use", None) is not None,
        license=_opt_str(get("general.license", None)),
    )


# --- reading a GGUF file ------------------------------------------------------------------


def _per_layer(value: Any, n_layer: int, path: Path) -> tuple[int, ...]:
    if isinstance(value, list):
        if len(value) != n_layer:
            raise ModelError(f"{path}: head_count_kv has {len(value)} entries for {n_layer} layers")
        return tuple(int(v) for v in value)
    return (int(value),) * n_layer


def _first_nonzero(value: Any) -> int:
    if isinstance(value, list):
        return next((int(v) for v in value if int(v)), 0)
    return int(value)


#: SWA pattern llama.cpp b11434 assumes when the GGUF has none (``load_swa_pattern(ml, N)``
#: in ``src/models/<arch>.cpp``).
_ARCH_SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "gpt-oss": 2}


def _swa_pattern(value: Any, n_layer: int, arch: str) -> tuple[bool, ...] | None:
    """Per-layer SWA flags as llama.cpp b11434 sets them: a bool array from
    ``sliding_window_pattern`` as is; an int N (from the key or the arch default) means
    ``set_swa_pattern(N)``: layer i is SWA when ``N == 0 or i % N < N - 1``."""
    if isinstance(value, list):
        flags = [bool(v) for v in value]
        return tuple(flags[:n_layer] + [False] * (n_layer - len(flags)))
    n = int(value) if value is not None else _ARCH_SWA_PATTERN.get(arch)
    if n is None:
        return None
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layer))


def _opt_int(value: Any) -> int | None:
    return int(value) if value else None


def _opt_str(value: object) -> str | None:
    return str(value) if value else None
