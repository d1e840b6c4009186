"""One squad process asking for a cache entry, for tests/engine/test_cache_fill.py: ``python cache_fill_child.py
JOB`` where JOB is a JSON object:

- ``what``: ``download`` (a pinned file of a stand-in index into ``dest``), ``model`` (``pull_model`` of a known
  model given as ``known``, the fields of ``KnownModel``), ``tiny`` (``tiny_model`` of a family whose vocabulary
  and template come from a stand-in llama.cpp sdist, ``sdist``: its filename, sha256 and size), ``build``
  (``build_llama_server`` from that sdist, with whatever ``cmake`` is on PATH), ``records`` (the facts, the
  tokenizer and the special tokens of the GGUF file ``gguf``);
- ``index``: the stand-in index's URL pattern (``pypi.INDEX_URL``); ``note_after_s``: when a waiter speaks;
- ``go``: a file to wait for before asking (so that every process asks at once), after writing ``go.<pid>.ready``;
- ``runs``: a file each producer run appends a line to (the vocabulary extraction, the tiny model's build).

Prints ``{"pid", "path"}`` on stdout; a waiter's note goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _counted(module: object, name: str, runs: Path) -> None:
    real = getattr(module, name)

    def wrapper(*args: object, **kwargs: object) -> object:
        with runs.open("a") as f:
            f.write(f"{name} {os.getpid()}\n")
        return real(*args, **kwargs)

    setattr(module, name, wrapper)


def _wait_for(go: Path) -> None:
    Path(f"{go}.{os.getpid()}.ready").touch()
    deadline = time.monotonic() + 60
    while not go.exists():
        if time.monotonic() > deadline:
            sys.exit("no go signal within 60 s")
        time.sleep(0.01)


def main(job: dict) -> Path:
    from squad.engine import build, cache_fill, pypi, registry
    from squad.errors import EngineBuildError

    pypi.INDEX_URL = job["index"]
    cache_fill.NOTE_AFTER_S = job.get("note_after_s", cache_fill.NOTE_AFTER_S)
    what = job["what"]
    if what == "model":
        known = registry.KnownModel(**job["known"])
        registry._REGISTRY = {known.name: known}
    if what in ("tiny", "build"):
        from squad.testing import tiny_models

        build.SDIST_FILENAME, build.SDIST_SHA256, build.SDIST_SIZE = job["sdist"]
        for name in ("_extract_models", "_write"):
            _counted(tiny_models, name, Path(job["runs"]))
    if what == "records":
        from squad.engine import facts, tokens, vocab

        for module, name in ((facts, "_parse_facts"), (vocab, "build_record"), (tokens, "read_fields")):
            _counted(module, name, Path(job["runs"]))
    if job.get("go"):
        _wait_for(Path(job["go"]))
    if what == "download":
        return pypi.fetch_pinned(job["project"], job["filename"], Path(job["dest"]), sha256=job["sha256"],
                                 size=job["size"], say=None, error=EngineBuildError)
    if what == "model":
        return registry.pull_model(known.name)
    if what == "build":
        return build.build_llama_server(jobs=1)
    if what == "records":
        facts.read_model_facts(job["gguf"])
        tokens.counter_for_model(job["gguf"])
        tokens.special_tokens(job["gguf"])
        return Path(job["gguf"])
    family = tiny_models.Family("stand-in", job["vocab"], job["template"])
    return tiny_models.tiny_model(family)


if __name__ == "__main__":
    path = main(json.loads(sys.argv[1]))
    print(json.dumps({"pid": os.getpid(), "path": str(path)}), flush=True)
