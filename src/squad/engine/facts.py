"""GGUF facts: what a model file says about its KV cache, read once and cached.

``read_model_facts(path)`` → :class:`ModelFacts`, the GGUF keys that size the KV cache (read
with the ``gguf`` package, maintained with llama.cpp); ``ModelFacts.kv_bytes_per_token`` does
the arithmetic of ``docs/llama-facts.md`` ("KV memory per token").

Model facts are cached as JSON in ``cache_dir()/facts/`` keyed by the file's resolved path,
size and mtime, so only the first read of a model parses the GGUF. The same per-file disk
cache (:func:`cache_entry`, :func:`read_entry`, :func:`write_entry`) and GGUF reading
(:func:`is_gguf`, :func:`read_fields`) serve the token counter (:mod:`squad.engine.tokens`).

:func:`check_gguf` says what is wrong with a file that is not a complete GGUF (a directory,
0 bytes, another format, cut short in its header or its tensor data) in squad's words, before
any reader meets it with a numpy error.
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from squad.dirs import cache_dir
from squad.engine.llama import kv_row_bytes, round_ctx
from squad.engine.stores import model_bytes
from squad.errors import BadModelFile, ModelError

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
    facts = _parse_facts(path)
    write_entry(entry, {"version": _FACTS_VERSION, "key": key, "facts": _fields(facts)})
    return facts


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


def is_gguf(path: Path) -> bool:
    """True if ``path`` starts with the GGUF magic ``b"GGUF"`` (False if unreadable)."""
    try:
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""Bytes of each GGUF scalar value type (``gguf.GGUFValueType``; 8 = string, 9 = array)."""

_FETCH_AGAIN = "fetch or copy the file again (squad models pull NAME --force for a known model)"


def check_gguf(path: Path) -> None:
    """Raise ``ModelError`` naming ``path`` and what is wrong unless it is a complete GGUF file:
    a directory, missing, empty, not starting with ``b"GGUF"``, an unknown GGUF version, or
    cut short (inside its metadata, or shorter than its tensors need). Reads only the header
    and metadata (GGUF v2/v3 layout from ggml's ``gguf.cpp``; tensor sizes from
    ``gguf.GGML_QUANT_SIZES``): milliseconds, no numpy."""
    path = Path(path)
    if path.is_dir():
        raise BadModelFile(f"{path} is a directory, not a model file; give the path of the .gguf file")
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ModelError(f"{path}: no such model file ({exc.strerror or exc})") from None
    if size == 0:
        raise BadModelFile(f"{path} is empty (0 bytes): the download or copy did not finish; {_FETCH_AGAIN}")
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            _walk_gguf(path, data, size)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read the file ({exc.strerror or exc})") from None


def _walk_gguf(path: Path, data: Any, size: int) -> None:
    if data[:4] != b"GGUF":
        raise BadModelFile(f"{path} is not a GGUF file: it starts with {bytes(data[:4])!r}, a GGUF file with "
                           "b'GGUF'; give the path of a .gguf model")
    walk = _GgufWalk(path, data, size)
    version = walk.take("<I")
    if version not in (2, 3):
        raise BadModelFile(f"{path}: GGUF version {version} is not supported (llama.cpp reads versions 2 and 3); "
                           "convert the model again with a current llama.cpp")
    n_tensors, n_kv = walk.take("<Q"), walk.take("<Q")
    if n_tensors > size or n_kv > size:
        raise BadModelFile(f"{path} is damaged: its header claims {n_tensors:,} tensors and {n_kv:,} metadata keys; "
                           f"{_FETCH_AGAIN}")
    alignment = walk.metadata(n_kv)
    end = walk.tensors(n_tensors)
    data_start = -(-walk.pos // alignment) * alignment
    if data_start + end > size:
        raise BadModelFile(f"{path} is truncated: its tensors need {data_start + end:,} bytes, the file has {size:,}; "
                           f"{_FETCH_AGAIN}")


class _GgufWalk:
    """A bounds-checked cursor over the ``size`` bytes of a GGUF file (``data``: bytes or an mmap);
    ``pos`` starts after the magic. A read past the end raises :class:`BadModelFile` naming
    ``where``, the part of the file being read."""

    def __init__(self, path: Path, data: Any, size: int) -> None:
        self.path, self.data, self.size = path, data, size
        self.pos = 4
        self.where = "its header"

    def _truncated(self) -> BadModelFile:
        return BadModelFile(f"{self.path} is truncated: it ends at byte {self.size:,}, inside {self.where}; "
                            f"{_FETCH_AGAIN}")

    def take(self, fmt: str) -> Any:
        """One ``struct`` format read at ``pos`` (a tuple when ``fmt`` has several fields)."""
        need = struct.calcsize(fmt)
        if self.pos + need > self.size:
            raise self._truncated()
        value = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += need
        return value[0] if len(value) == 1 else value

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self._truncated()
        self.pos += n

    def text(self) -> str:
        n = self.take("<Q")
        self.skip(n)
        return bytes(self.data[self.pos - n:self.pos]).decode("utf-8", "replace")

    def value(self, kind: int, depth: int = 0) -> Any:
        """A metadata value of GGUF value type ``kind``: the integer for uint32 and uint64, else None
        (strings, arrays and other scalars are only skipped; arrays of arrays one level deep)."""
        if kind in _SCALAR_SIZES:
            start = self.pos
            self.skip(_SCALAR_SIZES[kind])
            return int.from_bytes(self.data[start:self.pos], "little") if kind in (4, 10) else None
        if kind == 8:
            self.text()
        elif kind == 9 and depth == 0:
            item, count = self.take("<I"), self.take("<Q")
            if item in _SCALAR_SIZES:
                self.skip(_SCALAR_SIZES[item] * count)
            else:
                for _ in range(count):
                    self.value(item, depth + 1)
        else:
            raise BadModelFile(f"{self.path} is damaged: unknown GGUF value type {kind} in {self.where}; "
                               f"{_FETCH_AGAIN}")
        return None

    def metadata(self, n_kv: int) -> int:
        """Walk the ``n_kv`` metadata pairs; the tensor data alignment in bytes (``general.alignment``)."""
        from gguf.constants import GGUF_DEFAULT_ALIGNMENT

        alignment = GGUF_DEFAULT_ALIGNMENT
        for i in range(n_kv):
            self.where = f"metadata key {i + 1} of {n_kv}"
            key = self.text()
            self.where = f"the value of metadata key {key!r}"
            found = self.value(self.take("<I"))
            if key == "general.alignment" and found:
                alignment = found
        return alignment

    def tensors(self, n_tensors: int) -> int:
        """Walk the ``n_tensors`` tensor infos; where the last tensor ends, in bytes from the start of
        the tensor data. Raises :class:`ModelError` for a tensor type the gguf package does not know."""
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        end = 0
        for i in range(n_tensors):
            self.where = f"tensor info {i + 1} of {n_tensors}"
            name = self.text()
            dims = [self.take("<Q") for _ in range(self.take("<I"))]
            kind, offset = self.take("<I"), self.take("<Q")
            try:
                block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            except (ValueError, KeyError):
                raise ModelError(f"{self.path}: tensor {name!r} has tensor type {kind}, unknown to this gguf package; "
                                 "upgrade squad's gguf dependency or use another model") from None
            elements = 1
            for d in dims:
                elements *= d
            end = max(end, offset + elements // block * block_bytes)
        return end


def read_fields(path: Path) -> dict[str, Any]:
    """The GGUF metadata fields of ``path`` by key (``gguf.GGUFReader(...).fields``).

    Raises ``ModelError`` when the reader fails (damaged or truncated file). The reader walks
    the whole vocabulary: ~2 s for the default model.
    """
    from gguf import GGUFReader  # numpy-heavy; import when needed

    try:
        return GGUFReader(path, "r").fields
    except Exception as exc:  # the reader raises bare ValueErrors etc. for damaged files
        raise BadModelFile(f"{path}: cannot read GGUF metadata ({exc}); is the file complete?") from exc


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


# --- the per-file disk cache --------------------------------------------------------------


def cache_entry(kind: str, key: dict[str, object]) -> Path:
    """``cache_dir()/<kind>/<hash of key>.json``: where data derived from one model file is kept.
    ``key`` names the file's version: ``{"path": resolved, "size": bytes, "mtime_ns": ns}``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir() / kind / f"{digest}.json"


def read_entry(entry: Path, key: dict[str, object], version: int) -> dict[str, Any] | None:
    """The JSON object in ``entry`` if it is readable and for ``key`` and format ``version``,
    else None (the caller rebuilds and rewrites it)."""
    try:
        record = json.loads(entry.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != version or record.get("key") != key:
        return None
    return record


def write_entry(entry: Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``entry`` atomically (a concurrent reader sees the old or the new file).
    A cache that cannot be written is not an error: it only costs a rebuild next time."""
    tmp: Path | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
        tmp = Path(name)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(record) + "\n")
        os.replace(tmp, entry)
    except OSError:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
