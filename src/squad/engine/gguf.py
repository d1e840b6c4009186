"""Reading GGUF files: the magic, a whole-file check in squad's words, the metadata fields.

:func:`is_gguf` (the ``b"GGUF"`` magic), :func:`check_gguf` (what is wrong with a file that is not
a complete GGUF: a directory, 0 bytes, another format, cut short in its header or tensor data;
raises :class:`~squad.errors.BadModelFile` before any reader meets it with a numpy error) and
:func:`read_fields` (the metadata by key, read with the ``gguf`` package, maintained with llama.cpp).
"""

from __future__ import annotations

import functools
import mmap
import struct
from pathlib import Path
from typing import Any

from squad.errors import BadModelFile, ModelError

__all__ = ["check_gguf", "is_gguf", "read_fields"]


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
    """The GGUF metadata fields of ``path`` by key (``gguf.GGUFReader(...).fields``); the caller must not change them.

    Raises ``ModelError`` when the reader fails (damaged or truncated file). The reader walks the whole vocabulary:
    ~2 s for the default model (49k tokens), ~8 s for Qwen3's (151k) on one core of this 2-core machine. So a file is
    read once per version (path, size, mtime) in a process: the model's facts, its special tokens and its tokenizer
    each need the fields the first time squad meets a model (three reads, 26 s for a Qwen3 vocabulary, before).
    """
    p = Path(path)
    try:
        stat = p.stat()
    except OSError as exc:
        raise BadModelFile(f"{path}: cannot read GGUF metadata ({exc}); is the file complete?") from exc
    return _read_fields(str(p.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _read_fields(resolved: str, size: int, mtime_ns: int) -> dict[str, Any]:
    """:func:`read_fields` of one file version (``size`` and ``mtime_ns`` only key the cache)."""
    from gguf import GGUFReader  # numpy-heavy; import when needed

    try:
        return GGUFReader(resolved, "r").fields
    except Exception as exc:  # the reader raises bare ValueErrors etc. for damaged files
        raise BadModelFile(f"{resolved}: cannot read GGUF metadata ({exc}); is the file complete?") from exc
