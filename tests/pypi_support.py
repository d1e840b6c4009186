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


class StandInIndex:
    """A stand-in PyPI on 127.0.0.1 for other processes (``pypi.INDEX_URL = index.index_url``): the PEP 691 JSON
    index at ``/simple/<project>/`` listing ``files[project]`` (filename -> bytes), each served at ``/files/<name>``.

    ``hits[name]``: GETs of a file. ``delay_s``: the pause between the 8 pieces of a body (a download that takes a
    while). ``stall_after[name] = n``: the next GET of ``name`` sends ``n`` bytes and then nothing (``stalled`` is
    set then) until ``resume`` is set (then the rest) or the index stops, as a transfer that stops moving;
    ``drop_after[name] = n``: the next GET sends ``n`` bytes and closes the connection."""

    def __init__(self, files: dict[str, dict[str, bytes]], *, delay_s: float = 0.0) -> None:
        import http.server
        import threading

        self.files = files
        self.delay_s = delay_s
        self.hits: dict[str, int] = {}
        self.stall_after: dict[str, int] = {}
        self.drop_after: dict[str, int] = {}
        self.stalled = threading.Event()
        self.resume = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                index._get(self)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def index_url(self) -> str:
        return self.url + "/simple/{project}/"

    def __enter__(self) -> StandInIndex:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def _get(self, request) -> None:
        import json
        import time

        path = request.path
        if path.startswith("/simple/"):
            project = path.split("/")[2]
            entries = [{"filename": name, "url": f"{self.url}/files/{name}", "size": len(data),
                        "hashes": {"sha256": hashlib.sha256(data).hexdigest()}}
                       for name, data in self.files.get(project, {}).items()]
            self._send(request, 200 if entries else 404, json.dumps({"meta": {"api-version": "1.1"},
                                                                       "files": entries}).encode())
            return
        name = path.rsplit("/", 1)[-1]
        data = next((files[name] for files in self.files.values() if name in files), None)
        if data is None:
            self._send(request, 404, b"")
            return
        with self._lock:
            self.hits[name] = self.hits.get(name, 0) + 1
            stall = self.stall_after.pop(name, None)
            drop = self.drop_after.pop(name, None)
        request.send_response(200)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        try:
            if stall is not None:
                request.wfile.write(data[:stall])
                request.wfile.flush()
                self.stalled.set()
                for _ in range(2400):  # a transfer that stops moving, until resumed or the index stops (120 s)
                    if self.resume.is_set() or self._stop.is_set():
                        break
                    self._stop.wait(0.05)
                if self.resume.is_set():
                    request.wfile.write(data[stall:])
                return
            if drop is not None:
                request.wfile.write(data[:drop])
                request.close_connection = True
                return
            piece = max(1, -(-len(data) // 8))
            for start in range(0, len(data), piece):
                request.wfile.write(data[start:start + piece])
                request.wfile.flush()
                time.sleep(self.delay_s)
        except OSError:  # the client died mid-body
            pass

    @staticmethod
    def _send(request, status: int, body: bytes) -> None:
        request.send_response(status)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
