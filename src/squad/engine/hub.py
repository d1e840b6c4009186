"""``hf:`` model references: GGUF files in the Hugging Face cache, downloaded through ``huggingface_hub``.

- ``hf:ORG/REPO`` → the repository's only GGUF, else its ``Q4_K_M`` one;
- ``hf:ORG/REPO:QUANT`` → the GGUF of that quantization (``Q4_K_M``, ``Q8_0``, ``IQ4_XS``…);
- ``hf:ORG/REPO/PATH/FILE.gguf`` → that file.
A split model (``…-00001-of-0000N.gguf``) brings all its parts.

Everything goes through ``huggingface_hub`` (2.x), so its settings hold: the cache is
``HF_HUB_CACHE`` (default ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``), shared with
``llama-server -hf``, transformers and the ``hf`` CLI; ``HF_ENDPOINT`` picks the hub;
``HF_HUB_OFFLINE=1`` forbids the network; ``HF_TOKEN`` opens gated repositories. The cache
layout is the hub's documented one (huggingface.co/docs/hub/local-cache):
``models--ORG--REPO/{blobs,refs,snapshots}``; squad reads it only through
``scan_cache_dir`` and ``try_to_load_from_cache``.

Resolution is cache first: a reference whose file is in the cache resolves with no network
call at all (a model pulled yesterday runs on a train). Only a file missing from the cache is
downloaded (``hf_hub_download``), its progress reported through the caller's callback. A
transfer cut off mid-way (connection dropped, read timeout) resumes where it stopped with an
HTTP ``Range`` request (huggingface_hub 2.x ``http_get``: up to 5 tries in a row without new
bytes). huggingface_hub 2.x downloads into a temporary file private to the process and deletes
it on failure, so a download whose process was stopped starts that file over next time.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from squad.engine.stores import StoredModel, is_model_file, model_bytes, part_paths, pick_gguf, quant_of
from squad.errors import ModelError, UnknownModel

__all__ = ["HfRef", "parse_hf", "resolve_hf", "list_hf", "hf_cache_dir"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class HfRef:
    """A parsed ``hf:`` reference: ``repo_id`` (``ORG/REPO``) and at most one of ``filename``
    (a path inside the repository) and ``quant``."""

    repo_id: str
    filename: str | None = None
    quant: str | None = None

    @property
    def base(self) -> str:
        return f"hf:{self.repo_id}"

    def __str__(self) -> str:
        return self.base + (f"/{self.filename}" if self.filename else f":{self.quant}" if self.quant else "")


def parse_hf(spec: str) -> HfRef:
    """Parse the part after ``hf:``. Raises :class:`UnknownModel` for a malformed reference."""
    path, quant = spec, None
    if not spec.lower().endswith(".gguf") and ":" in spec:
        path, _, quant = spec.rpartition(":")
    pieces = path.split("/")
    if len(pieces) < 2 or not all(pieces) or ".." in pieces or (len(pieces) > 2 and quant) or not (quant is None
                                                                                                   or quant):
        raise UnknownModel(f"hf:{spec} is not a Hugging Face reference; write hf:ORG/REPO, hf:ORG/REPO:QUANT "
                           "(e.g. hf:bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M) or hf:ORG/REPO/FILE.gguf")
    if len(pieces) > 2 and not pieces[-1].lower().endswith(".gguf"):
        raise UnknownModel(f"hf:{spec}: a file inside a repository must be a .gguf file "
                           f"(or write hf:{'/'.join(pieces[:2])}:QUANT to pick one by quantization)")
    return HfRef("/".join(pieces[:2]), "/".join(pieces[2:]) or None, quant)


def hf_cache_dir() -> Path:
    """The Hugging Face cache squad reads and downloads into (``huggingface_hub.constants.HF_HUB_CACHE``)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def resolve_hf(spec: str, *, pull: bool = True, progress: Progress | None = None) -> StoredModel:
    """The GGUF ``hf:<spec>`` names, from the cache, else downloaded (when ``pull``).

    Raises :class:`UnknownModel` (malformed, no such repository or file, no such quantization)
    or :class:`ModelError` (not cached and ``pull`` False or offline; a network failure),
    each naming the cache it searched."""
    ref = parse_hf(spec)
    cached = _cached(ref)
    if cached is not None:
        return cached
    where = f"the Hugging Face cache ({hf_cache_dir()})"
    if not pull:
        held = _cached_choices(ref)
        raise ModelError(f"{ref} is not in {where}; download it with `squad models pull {ref}`"
                         + (f", or {held}" if held else ""))
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        held = _cached_choices(ref)
        raise ModelError(f"{ref} is not in {where} and HF_HUB_OFFLINE is set, so squad may not download it; "
                         + (f"{held}, or unset HF_HUB_OFFLINE to download this one" if held else
                            "unset HF_HUB_OFFLINE (or download it where there is a network)"))
    return _download(ref, progress or (lambda _msg: None))


def list_hf() -> list[StoredModel]:
    """Every GGUF model in the Hugging Face cache (one row per file, first parts of split models)."""
    found: list[StoredModel] = []
    for repo_id, files in sorted(_cached_repos().items()):
        license_ = _card_license(repo_id)  # one model card per repository, not per file
        for name in sorted(files):
            if is_model_file(name):
                try:
                    found.append(_stored(HfRef(repo_id, name), Path(files[name]), license_))
                except ModelError:
                    continue  # a split model with a part not downloaded
    return found


# --- the cache ------------------------------------------------------------------------------


def _cached_repos() -> dict[str, dict[str, str]]:
    """``{repo_id: {path in repo: snapshot path}}`` of the cached model repositories, each at
    the revision ``main`` points to (else its newest cached revision)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound, CorruptedCacheException

    try:
        info = scan_cache_dir(hf_cache_dir())
    except (CacheNotFound, CorruptedCacheException, OSError):
        return {}
    repos: dict[str, dict[str, str]] = {}
    for repo in info.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = max(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
        repos[repo.repo_id] = {f.file_path.relative_to(revision.snapshot_path).as_posix(): str(f.file_path)
                               for f in revision.files}
    return repos


def _cached(ref: HfRef) -> StoredModel | None:
    """The cached model ``ref`` names, or None when it (or a part of it) is not cached."""
    from huggingface_hub import try_to_load_from_cache

    name = ref.filename
    if name is None:
        files = _cached_repos().get(ref.repo_id)
        if not files:
            return None
        try:
            name = pick_gguf(list(files), ref.quant, ref=ref.base)
        except ModelError:
            return None  # the cache holds other files of the repo: ask the hub
    found = try_to_load_from_cache(ref.repo_id, name, cache_dir=hf_cache_dir())
    if not isinstance(found, str):
        return None
    try:
        return _stored(HfRef(ref.repo_id, name), Path(found), _card_license(ref.repo_id))
    except ModelError:
        return None  # a part of a split model is not cached yet


def _cached_choices(ref: HfRef) -> str:
    """What the cache does hold of ``ref``'s repository, for "not in the cache": its cached GGUF
    models, the reference that picks each and how to run one (empty when the cache has none of
    the repository's models)."""
    files = _cached_repos().get(ref.repo_id) or {}
    ggufs = sorted(n for n in files if is_model_file(n))
    usable = []
    for name in ggufs:
        try:
            model_bytes(Path(files[name]))
        except ModelError:
            continue  # a split model with a part not cached
        usable.append(name)
    if not usable:
        return ""
    picks = []
    for name in usable:
        quant = quant_of(name)
        same = [n for n in usable if quant_of(n) == quant] if quant else []
        picks.append(f"{ref.base}:{quant}" if quant and len(same) == 1 else f"{ref.base}/{name}")
    shown = ", ".join(f"{name} ({pick})" for name, pick in zip(usable[:6], picks[:6]))
    more = f" and {len(usable) - 6} more" if len(usable) > 6 else ""
    return (f"run one the cache does hold of {ref.repo_id} ({shown}{more}) by naming it, e.g. `-m {picks[0]}` "
            "(or model: in the recipe)")


def _stored(ref: HfRef, path: Path, license_: str | None) -> StoredModel:
    """The model at ``path`` under ``license_`` (its size over all parts:
    :func:`~squad.engine.stores.model_bytes` raises for a missing part)."""
    return StoredModel(str(ref), "hf", path, model_bytes(path), license_)


def _card_license(repo_id: str) -> str | None:
    """The ``license`` (or ``license_name`` for ``other``) of the cached model card, if any."""
    from huggingface_hub import ModelCard, try_to_load_from_cache

    readme = try_to_load_from_cache(repo_id, "README.md", cache_dir=hf_cache_dir())
    if not isinstance(readme, str):
        return None
    try:
        data = ModelCard.load(readme).data
    except Exception:  # noqa: BLE001 - a card squad cannot parse only loses the license column
        return None
    value = data.get("license")
    if value == "other" and data.get("license_name"):
        value = f"other ({data.get('license_name')})"
    return str(value) if value else None


# --- downloading ------------------------------------------------------------------------------


def _download(ref: HfRef, say: Progress) -> StoredModel:
    from huggingface_hub import HfApi, hf_hub_download

    try:
        name = ref.filename
        if name is None:
            say(f"listing {ref.repo_id}")
            name = pick_gguf(HfApi().list_repo_files(ref.repo_id), ref.quant, ref=ref.base)
        names = [p.as_posix() for p in part_paths(Path(name))]
        first: Path | None = None
        for i, inside in enumerate(names, 1):
            label = f"{ref.repo_id}/{inside}" + (f" (part {i} of {len(names)})" if len(names) > 1 else "")
            path = Path(hf_hub_download(ref.repo_id, inside, tqdm_class=_progress_class(say, label)))
            first = first or path
        _fetch_card(ref.repo_id)
    except ModelError:
        raise
    except Exception as exc:  # huggingface_hub/httpx errors, said in squad's words
        raise _hub_error(ref, exc) from exc
    assert first is not None
    say(f"downloaded {first}")
    return _stored(HfRef(ref.repo_id, name), first, _card_license(ref.repo_id))


def _fetch_card(repo_id: str) -> None:
    """Download the model card too (a few KiB) so its license is known offline later."""
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download(repo_id, "README.md")
    except Exception:  # noqa: BLE001 - a repository without a card is fine
        pass


def _hub_error(ref: HfRef, exc: Exception) -> ModelError:
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    hub = constants.ENDPOINT
    if isinstance(exc, GatedRepoError):
        return ModelError(f"{ref}: the repository is gated; accept its terms on {hub}/{ref.repo_id} and set "
                          "HF_TOKEN (or run `hf auth login`)")
    if isinstance(exc, RepositoryNotFoundError):
        return UnknownModel(f"{ref}: no repository {ref.repo_id} on {hub} (nor in the Hugging Face cache "
                            f"{hf_cache_dir()}); check the name (a private one needs HF_TOKEN)")
    if isinstance(exc, (EntryNotFoundError, RevisionNotFoundError)):
        return UnknownModel(f"{ref}: {ref.repo_id} on {hub} has no such file; `squad models pull {ref.base}` "
                            "lists the quantizations it has")
    if isinstance(exc, OfflineModeIsEnabled):
        held = _cached_choices(ref)
        return ModelError(f"{ref} is not in the Hugging Face cache ({hf_cache_dir()}) and HF_HUB_OFFLINE is set"
                          + (f"; {held}" if held else ""))
    return ModelError(f"{ref}: download from {hub} failed ({type(exc).__name__}: {exc}); it is not in the "
                      f"Hugging Face cache ({hf_cache_dir()}); check the network and run the command again "
                      "(a partial download resumes)")


def _progress_class(say: Progress, label: str) -> type:
    """A ``tqdm`` class ``hf_hub_download`` drives that reports through ``say`` instead of
    drawing a bar: "downloading LABEL: 12.3 of 98.4 MB (12%)"."""
    from tqdm import tqdm

    class Report(tqdm):
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs.setdefault("file", io.StringIO())
            kwargs.setdefault("mininterval", 0.5)
            super().__init__(*args, **kwargs)

        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            total = self.total or 0
            share = f" ({self.n / total:.0%})" if total else ""
            say(f"downloading {label}: {self.n / 1e6:.1f} of {total / 1e6:.1f} MB{share}")
            return True

    return Report
