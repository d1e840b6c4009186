"""How views name the engines of a run: :func:`short_url` for one, :func:`engine_labels` for a
table column, :func:`engine_legend` saying which label is which engine."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

__all__ = ["short_url", "engine_labels", "engine_legend"]


def short_url(url: str | None) -> str:
    """``127.0.0.1:8080`` for ``http://127.0.0.1:8080`` (how views name an engine)."""
    return (url or "-").split("://", 1)[-1]


def engine_labels(urls: Iterable[str | None]) -> dict[str, str]:
    """Names for the engines of one run short enough for a table column (never cut): ``:PORT``
    when every engine is on one host (``http://127.0.0.1:18401`` -> ``:18401``), else ``e1``,
    ``e2``, ... in the order given (:func:`engine_legend` says which is which)."""
    given = list(dict.fromkeys(u for u in urls if u))
    parts = [urlsplit(u) for u in given]
    try:
        ports = [p.port for p in parts]
    except ValueError:
        ports = [None]
    one_host = len({(p.scheme, p.hostname) for p in parts}) == 1 and not any(p.path.strip("/") for p in parts)
    if given and one_host and None not in ports and len(set(ports)) == len(ports):
        return {u: f":{port}" for u, port in zip(given, ports)}
    return {u: f"e{i}" for i, u in enumerate(given, start=1)}


def engine_legend(labels: Mapping[str, str]) -> str | None:
    """``engines: e1 = 10.0.0.5:8080, e2 = 10.0.0.6:8080`` when the labels are not the URLs'
    own ports (:func:`engine_labels`), else None."""
    if all(label.startswith(":") for label in labels.values()):
        return None
    return "engines: " + ", ".join(f"{label} = {short_url(url)}" for url, label in labels.items())
