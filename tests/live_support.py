"""Helpers for the tests of squad serve's live page and metrics: headless Chromium (Debian's ``chromium`` package,
or ``$SQUAD_CHROMIUM``) driven from its command line, and Prometheus text parsed into ``{(name, labels): value}``."""

from __future__ import annotations

import os
import shutil
from html.parser import HTMLParser
from pathlib import Path

import anyio
from prometheus_client.parser import text_string_to_metric_families

CHROMIUM_TIMEOUT_S = 120
"""Seconds one Chromium run may take (a shared, loaded machine)."""


def chromium() -> str | None:
    """The Chromium to run: ``$SQUAD_CHROMIUM``, else ``chromium`` / ``chromium-browser`` on the PATH, else None."""
    return os.environ.get("SQUAD_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def _flags(profile: Path, budget_ms: int, size: tuple[int, int]) -> list[str]:
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start; --virtual-time-budget: the page's
    # timers run until that much virtual time has passed (network waits pause it), then the DOM or picture is taken
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}", f"--virtual-time-budget={budget_ms}"]


async def dump_dom(url: str, profile: Path, *, budget_ms: int = 4000, size: tuple[int, int] = (1400, 1100)) -> str:
    """The page at ``url`` as Chromium rendered it (its DOM serialized after ``budget_ms`` of virtual time)."""
    exe = chromium()
    assert exe is not None
    with anyio.fail_after(CHROMIUM_TIMEOUT_S):
        done = await anyio.run_process([exe, *_flags(profile, budget_ms, size), "--dump-dom", url], check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode()


async def screenshot(url: str, profile: Path, out: Path, *, budget_ms: int = 4000,
                     size: tuple[int, int] = (1400, 1100)) -> Path:
    """A PNG of the page at ``url`` written to ``out``."""
    exe = chromium()
    assert exe is not None
    with anyio.fail_after(CHROMIUM_TIMEOUT_S):
        done = await anyio.run_process([exe, *_flags(profile, budget_ms, size), f"--screenshot={out}", url],
                                       check=False)
    assert done.returncode == 0 and out.exists(), done.stderr.decode(errors="replace")[-2000:]
    return out


class Dom(HTMLParser):
    """A rendered page, parsed: ``texts[id]`` is the text under the element with that id; ``attrs`` every
    element's attributes, in document order."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.texts: dict[str, str] = {}
        self.attrs: list[dict[str, str]] = []
        self._open: list[tuple[str, str | None]] = []
        self.feed(html)

    _VOID = {"meta", "link", "br", "img", "input", "hr", "source", "col", "area", "base", "wbr"}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        self.attrs.append(found)
        if tag in self._VOID:
            return
        self._open.append((tag, found.get("id")))
        if found.get("id"):
            self.texts.setdefault(found["id"], "")

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for _, ident in self._open:
            if ident:
                self.texts[ident] += data

    def having(self, name: str, value: str | None = None) -> list[dict[str, str]]:
        """The elements with attribute ``name`` (equal to ``value`` when given)."""
        return [a for a in self.attrs if name in a and (value is None or a[name] == value)]


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus' text format as ``{(sample name, frozenset(labels.items())): value}``."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))
