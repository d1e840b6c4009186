"""Model stores people already have: Ollama's and LM Studio's folders, and split GGUF files.

A model reference names a model in a store (:mod:`squad.engine.registry` dispatches on the
prefix; the Hugging Face cache, ``hf:``, is :mod:`squad.engine.hub`):

- ``ollama:NAME[:TAG]`` (also ``ollama:NAMESPACE/NAME:TAG``, ``ollama:HOST/NAMESPACE/NAME:TAG``):
  the GGUF blob an Ollama manifest points to. Read only; squad never writes Ollama's store.
- ``lmstudio:PUBLISHER/MODEL[:QUANT]`` or ``lmstudio:PUBLISHER/MODEL/FILE.gguf``: a GGUF in
  LM Studio's models folder.
- A split GGUF (``NAME-00001-of-00003.gguf``) is passed by its first part wherever a model is
  asked for; the other parts must lie beside it (llama-server opens them itself).

On-disk layouts, as read from the stores' own sources and documentation:

- **Ollama** (ollama/ollama, ``envconfig/config.go`` ``Models()``: ``$OLLAMA_MODELS``, else
  ``~/.ollama/models``; its FAQ adds ``/usr/share/ollama/.ollama/models`` for the Linux service
  install): ``manifests/HOST/NAMESPACE/MODEL/TAG`` is a Docker v2 manifest (JSON) whose layer
  with ``mediaType`` ``application/vnd.ollama.image.model`` has the GGUF's ``digest``
  ``sha256:HEX``, stored as ``blobs/sha256-HEX``; an ``application/vnd.ollama.image.license``
  layer holds the license text. Names parse as in ``types/model/name.go`` (``ParseName``):
  ``[host/][namespace/]model[:tag]``, defaults ``registry.ollama.ai``, ``library``, ``latest``.
- **LM Studio** (lmstudio.ai/docs, "Import Models", LM Studio 0.3): ``~/.lmstudio/models/
  PUBLISHER/MODEL/FILE.gguf``; releases before 0.3 used ``~/.cache/lm-studio/models``.
  A models folder moved in LM Studio's settings is given to squad with ``SQUAD_LMSTUDIO_MODELS``.
- **Split GGUF** (llama.cpp b11434, ``llama_split_path``: ``PREFIX-%05d-of-%05d.gguf``, parts
  numbered from 1; the loader opens parts 2..N from the first part's name).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from squad.errors import ModelError, UnknownModel

__all__ = [
    "StoredModel",
    "part_paths",
    "split_parts",
    "is_model_file",
    "model_bytes",
    "pick_gguf",
    "quant_of",
    "ollama_dirs",
    "resolve_ollama",
    "list_ollama",
    "lmstudio_dirs",
    "resolve_lmstudio",
    "list_lmstudio",
]


@dataclass(frozen=True)
class StoredModel:
    """A GGUF model found in a store.

    ``ref``: the reference that resolves to it (``ollama:qwen2.5:0.5b``); ``store``: ``squad``,
    ``hf``, ``ollama`` or ``lmstudio``; ``path``: the GGUF (the first part of a split model);
    ``size``: bytes of all parts; ``license``: what the store says about it (None: it says
    nothing; the GGUF's ``general.license`` may still say)."""

    ref: str
    store: str
    path: Path
    size: int
    license: str | None = None


# --- split GGUF files --------------------------------------------------------------------

_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def part_paths(path: Path) -> tuple[Path, ...]:
    """The paths of all parts of ``path`` from its name alone (no disk access): ``(path,)`` for
    a whole file, every part in order for the first part of a split model. Raises
    :class:`ModelError` for a later part (pass the first one)."""
    match = _SPLIT.match(path.name)
    if match is None:
        return (path,)
    no, count = int(match["no"]), int(match["count"])
    parts = tuple(path.with_name(f"{match['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1))
    if no != 1:
        raise UnknownModel(f"{path} is part {no} of a split model; pass its first part, {parts[0]}")
    return parts


def split_parts(path: Path) -> tuple[Path, ...]:
    """All parts of the GGUF ``path`` (:func:`part_paths`), checked to be on disk. Raises
    :class:`ModelError` when ``path`` is a later part or a part is missing (it names them)."""
    parts = part_paths(path)
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise ModelError(f"{path} is split into {len(parts)} parts but {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} missing from {path.parent}; "
                         "put every part in the same folder")
    return parts


def is_model_file(name: str) -> bool:
    """True for a GGUF model file name: ``.gguf``, not a projector (``mmproj``), and for a
    split model only its first part."""
    base = Path(name).name
    if not base.lower().endswith(".gguf") or "mmproj" in base.lower():
        return False
    split = _SPLIT.match(base)
    return split is None or split["no"] == "00001"


def model_bytes(path: str | Path) -> int:
    """Bytes of the model at ``path``: the file, or the sum of all parts of a split model."""
    return sum(p.stat().st_size for p in split_parts(Path(path)))


# --- choosing a file by quantization -------------------------------------------------------

_QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE)
DEFAULT_QUANT = "Q4_K_M"
"""The quantization picked when a reference names none and several files exist (llama.cpp's
``-hf`` picks the same one)."""


def quant_of(name: str) -> str | None:
    """The quantization named in a GGUF file name (``Q4_K_M``, ``IQ4_XS``, ``F16``), upper case."""
    found = _QUANT.findall(Path(name).name)
    return found[-1].upper() if found else None


def pick_gguf(names: list[str], quant: str | None, *, ref: str) -> str:
    """The GGUF among ``names`` (paths inside a repo or folder) that ``quant`` picks: the one
    whose name carries that quantization (case-insensitive), only first parts of split models
    counted, projector files (``mmproj``) skipped. Without ``quant``: the only GGUF, else the
    :data:`DEFAULT_QUANT` one. ``ref`` is the reference without its quant, for messages.
    Raises :class:`ModelError` naming the quantizations there are."""
    ggufs = sorted(n for n in names if is_model_file(n))
    if not ggufs:
        raise UnknownModel(f"{ref}: no .gguf model file there ({len(names)} other files); squad runs GGUF "
                         "models only: look for a repository with GGUF in its name")
    wanted = quant or (None if len(ggufs) == 1 else DEFAULT_QUANT)
    matches = ggufs if wanted is None else [n for n in ggufs if quant_of(n) == wanted.upper()]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UnknownModel(f"{ref}: {len(matches)} files are {wanted}: {', '.join(matches[:6])}; "
                         f"name the file, e.g. {ref}/{matches[0]}")
    quants = sorted({q for n in ggufs if (q := quant_of(n))})
    what = f"has no {quant.upper()} file" if quant else f"has {len(ggufs)} GGUF files and none is {DEFAULT_QUANT}"
    example = f"{ref}:{quants[0]}" if quants else f"{ref}/{ggufs[0]}"
    raise UnknownModel(f"{ref} {what}; pick a quantization it has ({', '.join(quants) or 'none named'}) or a file "
                     f"({', '.join(ggufs[:6])}), e.g. {example}")


# --- Ollama ------------------------------------------------------------------------------

_OLLAMA_MODEL = "application/vnd.ollama.image.model"
_OLLAMA_LICENSE = "application/vnd.ollama.image.license"
_OLLAMA_HOST, _OLLAMA_NAMESPACE, _OLLAMA_TAG = "registry.ollama.ai", "library", "latest"


def ollama_dirs() -> list[Path]:
    """Where Ollama keeps models: ``$OLLAMA_MODELS`` alone when set; else ``~/.ollama/models``
    and, on Linux, the service install's ``/usr/share/ollama/.ollama/models``."""
    if os.environ.get("OLLAMA_MODELS", "").strip():
        return [Path(os.environ["OLLAMA_MODELS"].strip().strip("\"'")).expanduser()]
    dirs = [Path.home() / ".ollama" / "models"]
    if sys.platform.startswith("linux"):
        dirs.append(Path("/usr/share/ollama/.ollama/models"))
    return dirs


def _ollama_parts(name: str) -> tuple[str, str, str, str]:
    """``(host, namespace, model, tag)`` of an Ollama model name, Ollama's defaults filled in."""
    rest, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "")
    pieces = rest.split("/")
    if not 1 <= len(pieces) <= 3 or not all(pieces) or not re.fullmatch(r"[\w.-]*", tag):
        raise UnknownModel(f"ollama:{name} is not an Ollama model name; write ollama:NAME[:TAG], e.g. "
                           "ollama:qwen2.5:0.5b")
    host = pieces[0] if len(pieces) == 3 else _OLLAMA_HOST
    namespace = pieces[-2] if len(pieces) >= 2 else _OLLAMA_NAMESPACE
    return host, namespace, pieces[-1], tag or _OLLAMA_TAG


def _ollama_short(host: str, namespace: str, model: str, tag: str) -> str:
    """The shortest name that finds the manifest again (defaults left out, as ``ollama list``)."""
    head = "" if host == _OLLAMA_HOST else f"{host}/"
    if head or namespace != _OLLAMA_NAMESPACE:
        head += f"{namespace}/"
    return f"{head}{model}:{tag}"


def resolve_ollama(name: str) -> StoredModel:
    """The GGUF blob of Ollama model ``name`` (``NAME[:TAG]``, tag ``latest`` when left out).

    Raises :class:`UnknownModel` naming the folders searched and the models there, or
    :class:`ModelError` for a manifest without a GGUF layer or a missing blob."""
    host, namespace, model, tag = _ollama_parts(name)
    ref = f"ollama:{name}"
    for root in ollama_dirs():
        manifests = root / "manifests" / host / namespace
        # names are case-insensitive in Ollama (Name.EqualFold); folders keep the case pulled with
        found = _casefold_child(_casefold_child(manifests, model), tag)
        if found is not None and found.is_file():
            return _ollama_model(root, found, ref)
    searched = ", ".join(str(d) for d in ollama_dirs())
    have = [m.ref for m in list_ollama()]
    hint = f"; Ollama has {', '.join(have[:8])}" if have else "; no Ollama models there"
    raise UnknownModel(f"no Ollama model {_ollama_short(host, namespace, model, tag)!r} in {searched} "
                       f"(set OLLAMA_MODELS if Ollama keeps models elsewhere){hint}")


def list_ollama() -> list[StoredModel]:
    """Every model in Ollama's store(s) whose manifest has a GGUF layer with its blob present."""
    found: list[StoredModel] = []
    for root in ollama_dirs():
        manifests = root / "manifests"
        for manifest in sorted(manifests.glob("*/*/*/*")) if manifests.is_dir() else []:
            host, namespace, model, tag = manifest.relative_to(manifests).parts
            if not manifest.is_file() or tag.startswith("."):
                continue
            try:
                found.append(_ollama_model(root, manifest, "ollama:" + _ollama_short(host, namespace, model, tag)))
            except ModelError:
                continue  # a manifest without a GGUF (e.g. a safetensors model) or a missing blob
    return found


def _ollama_model(root: Path, manifest: Path, ref: str) -> StoredModel:
    try:
        layers = json.loads(manifest.read_text())["layers"]
        by_type = {layer["mediaType"]: layer["digest"] for layer in reversed(layers)}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{ref}: cannot read Ollama's manifest {manifest} ({exc})") from None
    digest = by_type.get(_OLLAMA_MODEL)
    if digest is None:
        raise ModelError(f"{ref}: the manifest {manifest} has no GGUF model layer")
    blob = _blob(root, digest)
    if not blob.is_file():
        raise ModelError(f"{ref}: Ollama's manifest names {digest} but {blob} is missing; "
                         f"run `ollama pull {ref.removeprefix('ollama:')}`")
    license_text = None
    if _OLLAMA_LICENSE in by_type:
        try:
            license_text = _blob(root, by_type[_OLLAMA_LICENSE]).read_text(errors="replace")
        except OSError:
            pass
    return StoredModel(ref, "ollama", blob, blob.stat().st_size, _license_line(license_text))


def _blob(root: Path, digest: str) -> Path:
    return root / "blobs" / digest.replace(":", "-")


def _license_line(text: str | None) -> str | None:
    """The first non-empty line of a license text, at most 100 characters."""
    for line in (text or "").splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= 100 else line[:99] + "…"
    return None


def _casefold_child(folder: Path | None, name: str) -> Path | None:
    if folder is None:
        return None
    exact = folder / name
    if exact.exists():
        return exact
    if folder.is_dir():
        return next((p for p in folder.iterdir() if p.name.casefold() == name.casefold()), None)
    return None


# --- LM Studio ---------------------------------------------------------------------------


def lmstudio_dirs() -> list[Path]:
    """LM Studio's models folders: ``$SQUAD_LMSTUDIO_MODELS`` alone when set; else
    ``~/.lmstudio/models`` and the older ``~/.cache/lm-studio/models``."""
    if os.environ.get("SQUAD_LMSTUDIO_MODELS", "").strip():
        return [Path(os.environ["SQUAD_LMSTUDIO_MODELS"].strip()).expanduser()]
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def resolve_lmstudio(spec: str) -> StoredModel:
    """The GGUF ``lmstudio:PUBLISHER/MODEL[:QUANT]`` or ``lmstudio:PUBLISHER/MODEL/FILE.gguf``
    names. Raises :class:`UnknownModel` naming the folders searched and what is there."""
    ref = f"lmstudio:{spec}"
    repo, quant = spec, None
    if not spec.lower().endswith(".gguf") and ":" in spec:
        repo, _, quant = spec.rpartition(":")
    pieces = repo.split("/")
    if len(pieces) < 2 or not all(pieces) or ".." in pieces:
        raise UnknownModel(f"{ref}: write lmstudio:PUBLISHER/MODEL[:QUANT] or lmstudio:PUBLISHER/MODEL/FILE.gguf, "
                           "as the folders under LM Studio's models folder are named")
    for root in lmstudio_dirs():
        folder = root / pieces[0] / pieces[1]
        if not folder.is_dir():
            continue
        if len(pieces) > 2:
            path = root.joinpath(*pieces)
            if path.is_file():
                return _lmstudio_model(root, path)
            continue
        names = [p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf")]
        return _lmstudio_model(root, folder / pick_gguf(names, quant, ref=f"lmstudio:{repo}"))
    have = [m.ref for m in list_lmstudio()]
    hint = f"; LM Studio has {', '.join(have[:8])}" if have else "; no models there"
    raise UnknownModel(f"no {repo} in LM Studio's models folder ({', '.join(map(str, lmstudio_dirs()))}; "
                       f"set SQUAD_LMSTUDIO_MODELS if you moved it){hint}")


def list_lmstudio() -> list[StoredModel]:
    """Every GGUF model in LM Studio's models folder(s) (first parts of split models only,
    projector files left out)."""
    found: list[StoredModel] = []
    for root in lmstudio_dirs():
        for path in sorted(root.glob("*/*/**/*.gguf")) if root.is_dir() else []:
            if not is_model_file(path.name):
                continue
            try:
                found.append(_lmstudio_model(root, path))
            except ModelError:
                continue
    return found


def _lmstudio_model(root: Path, path: Path) -> StoredModel:
    ref = "lmstudio:" + path.relative_to(root).as_posix()
    return StoredModel(ref, "lmstudio", path, model_bytes(path))
