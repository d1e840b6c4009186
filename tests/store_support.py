"""Real model stores on disk, built around a GGUF file (the built-in model, hard-linked where the
file system allows, else copied): Ollama's manifests and blobs, LM Studio's folders, the Hugging
Face cache in its documented layout, and a split GGUF written with the ``gguf`` package.

Layouts as :mod:`squad.engine.stores` and :mod:`squad.engine.hub` cite them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import gguf

COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
SMOL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def link(src: Path, dest: Path) -> Path:
    """``dest`` as a hard link to ``src`` (a copy across file systems)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        return dest  # content-addressed: the same blob again
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)
    return dest


def sha256(path: Path) -> str:
    if path.stat().st_size == 98_362_432:  # the built-in model: its pinned digest, no re-hash
        return SMOL_SHA256
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def ollama_store(root: Path, model: Path, name: str = "smollm2", tag: str = "135m", *,
                 namespace: str = "library", host: str = "registry.ollama.ai",
                 license_text: str | None = "Apache License\nVersion 2.0, January 2004\n") -> Path:
    """Add ``model`` to the Ollama store at ``root`` as ``name:tag``; returns the manifest."""
    digest = sha256(model)
    link(model, root / "blobs" / f"sha256-{digest}")
    config = json.dumps({"model_format": "gguf", "model_family": "llama"}).encode()
    config_digest = hashlib.sha256(config).hexdigest()
    (root / "blobs" / f"sha256-{config_digest}").write_bytes(config)
    layers = [{"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
               "size": model.stat().st_size}]
    if license_text is not None:
        data = license_text.encode()
        license_digest = hashlib.sha256(data).hexdigest()
        (root / "blobs" / f"sha256-{license_digest}").write_bytes(data)
        layers.append({"mediaType": "application/vnd.ollama.image.license", "digest": f"sha256:{license_digest}",
                       "size": len(data)})
    manifest = root / "manifests" / host / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": f"sha256:{config_digest}", "size": len(config)},
        "layers": layers,
    }))
    return manifest


def hf_cache(cache: Path, repo_id: str, files: dict[str, Path | str]) -> Path:
    """Put ``files`` (path in repo → a file, or text) into the Hugging Face cache at ``cache`` in
    its documented layout (huggingface.co/docs/hub/local-cache): ``blobs/<etag>``, ``refs/main``
    holding the commit, ``snapshots/<commit>/<path>`` a relative symlink to the blob. Returns the
    snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    for name, content in files.items():
        if isinstance(content, str):
            data = content.encode()
            etag = hashlib.sha1(data).hexdigest()  # a git blob's etag in the hub's cache
            blob = repo / "blobs" / etag
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
        else:
            blob = link(content, repo / "blobs" / sha256(content))
        target = snapshot / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(os.path.relpath(blob, target.parent))
    return snapshot


def split_gguf(src: Path, dest: Path, parts: int = 2) -> list[Path]:
    """Write ``src`` as a split model ``dest.stem-0000i-of-0000N.gguf`` (``gguf.GGUFWriter`` with
    ``split_max_tensors``: llama.cpp's split naming and ``split.*`` keys); returns the parts."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(src)
    per_part = -(-len(reader.tensors) // parts)
    writer = gguf.GGUFWriter(dest, str(reader.fields["general.architecture"].contents()),
                             split_max_tensors=per_part)
    for f in reader.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        kind = f.types[0]
        writer.add_key_value(f.name, f.contents(), kind,
                             sub_type=f.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return [dest.with_name(f"{dest.stem}-{i:05d}-of-{parts:05d}.gguf") for i in range(1, parts + 1)]


CARD = "---\nlicense: apache-2.0\nlibrary_name: gguf\n---\n# SmolLM2 135M Instruct, GGUF\n"
GEMMA_CARD = "---\nlicense: gemma\n---\n# a model under Gemma's own terms\n"
