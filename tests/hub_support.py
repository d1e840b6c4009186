"""A small stand-in for the Hugging Face Hub, served on 127.0.0.1, for the real ``huggingface_hub``
client (pointed at it with ``HF_ENDPOINT``).

It answers the requests ``huggingface_hub`` 2.x makes for ``list_repo_files`` and
``hf_hub_download``, with the headers its ``get_hf_file_metadata`` reads:

- ``GET /api/models/ORG/REPO/tree/REV`` → ``[{"type": "file", "path", "size", "oid"}]``;
- ``HEAD|GET /ORG/REPO/resolve/REV/PATH`` → ``X-Repo-Commit``, ``ETag`` (the file's sha256 for
  an LFS file, as the hub sends it in ``X-Linked-Etag``), ``Content-Length``; ``GET`` honours
  ``Range: bytes=N-`` with a 206.

``stall_after[path] = n``: the next GET of ``path`` sends ``n`` bytes and then hangs (until the
hub stops), as a connection that dies mid-transfer (``stalled`` is set then); ``requests``
records every request. ``drop_after[path] = n``: the next GET sends ``n`` bytes, then the
connection is closed before the body is complete.
"""

from __future__ import annotations

import hashlib
import io
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Request:
    method: str
    path: str
    range: str | None


@dataclass
class StandInHub:
    repos: dict[str, dict[str, Path | bytes]]  # repo id -> {path in repo: file on disk or bytes}
    stall_after: dict[str, int] = field(default_factory=dict)
    drop_after: dict[str, int] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> StandInHub:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._stop = threading.Event()
        self.stalled = threading.Event()
        config = uvicorn.Config(self._app(), log_level="critical", lifespan="off", access_log=False,
                                timeout_graceful_shutdown=0.2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        while not self._server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._server.should_exit = True
        self._thread.join(10)

    def gets(self, name: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + name)]

    # --- the app --------------------------------------------------------------------------

    def _data(self, repo: str, name: str) -> bytes | Path | None:
        return self.repos.get(repo, {}).get(name)

    def _size(self, data: bytes | Path) -> int:
        return len(data) if isinstance(data, bytes) else data.stat().st_size

    def _sha(self, data: bytes | Path) -> str:
        if isinstance(data, bytes):
            return hashlib.sha256(data).hexdigest()
        if not hasattr(self, "_shas"):
            self._shas: dict[Path, str] = {}
        if data not in self._shas:
            digest = hashlib.sha256()
            with data.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            self._shas[data] = digest.hexdigest()
        return self._shas[data]

    def _app(self):
        import anyio
        from starlette.applications import Starlette
        from starlette.requests import Request as HttpRequest
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        hub = self

        async def tree(request: HttpRequest) -> Response:
            repo = f"{request.path_params['org']}/{request.path_params['repo']}"
            hub.requests.append(Request("GET", request.url.path, None))
            if repo not in hub.repos:
                return JSONResponse({"error": "Repository not found"}, status_code=404,
                                    headers={"X-Error-Code": "RepoNotFound"})
            return JSONResponse([{"type": "file", "path": name, "size": hub._size(data), "oid": hub._sha(data)[:40]}
                                 for name, data in hub.repos[repo].items()])

        async def resolve(request: HttpRequest) -> Response:
            repo = f"{request.path_params['org']}/{request.path_params['repo']}"
            name = request.path_params["path"]
            hub.requests.append(Request(request.method, request.url.path, request.headers.get("range")))
            data = hub._data(repo, name)
            if data is None:
                code = "RepoNotFound" if repo not in hub.repos else "EntryNotFound"
                return Response(status_code=404, headers={"X-Error-Code": code})
            size, sha = hub._size(data), hub._sha(data)
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{sha}"', "Accept-Ranges": "bytes"}
            if request.method == "HEAD":
                return Response(status_code=200, headers={**headers, "Content-Length": str(size)})
            start = 0
            if request.headers.get("range", "").startswith("bytes="):
                start = int(request.headers["range"][6:].split("-")[0])
            stall = hub.stall_after.pop(name, None)
            drop = hub.drop_after.pop(name, None)

            async def body():
                sent = start
                with (data.open("rb") if isinstance(data, Path) else io.BytesIO(data)) as f:
                    f.seek(start)
                    while chunk := f.read(1 << 16):
                        if stall is not None and sent + len(chunk) > stall:
                            yield chunk[: max(0, stall - sent)]
                            hub.stalled.set()
                            while not hub._stop.is_set():  # a transfer that stops moving
                                await anyio.sleep(0.05)
                            return
                        if drop is not None and sent + len(chunk) > drop:
                            yield chunk[: max(0, drop - sent)]
                            raise ConnectionAbortedError("the stand-in hub drops the connection")
                        sent += len(chunk)
                        yield chunk

            status = 206 if start else 200
            headers["Content-Length"] = str(size - start)
            if start:
                headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
            return StreamingResponse(body(), status_code=status, headers=headers,
                                     media_type="application/octet-stream")

        return Starlette(routes=[
            Route("/api/models/{org}/{repo}/tree/{rev}", tree),
            Route("/{org}/{repo}/resolve/{rev}/{path:path}", resolve, methods=["GET", "HEAD"]),
        ])
