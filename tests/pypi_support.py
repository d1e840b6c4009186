"""A fake PyPI for tests: PEP 691 JSON index + file downloads over httpx.MockTransport."""

from __future__ import annotations

import hashlib

import httpx


def fake_pypi(files: dict[str, bytes], *, listed_sha: dict[str, str] | None = None) -> httpx.Client:
    """An httpx client whose transport serves a PEP 691 index and the files in it."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/simple/"):
            assert request.headers["accept"] == "application/vnd.pypi.simple.v1+json"
            entries = [
                {
                    "filename": name,
                    "url": f"https://files.example/{name}",
                    "hashes": {"sha256": (listed_sha or {}).get(name, hashlib.sha256(data).hexdigest())},
                    "size": len(data),
                }
                for name, data in files.items()
            ]
            return httpx.Response(200, json={"meta": {"api-version": "1.1"}, "files": entries})
        name = request.url.path.rsplit("/", 1)[-1]
        return httpx.Response(200, content=files[name]) if name in files else httpx.Response(404)

    return httpx.Client(transport=httpx.MockTransport(handler))
