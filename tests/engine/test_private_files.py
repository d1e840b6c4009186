"""squad's logs and state are the owner's only (I5): every folder squad makes for them is 0700, every file 0600,
whatever mode a file or folder had before (an older squad made them 0644 / 0755) and whatever the umask. The whole
path on the real engine (`squad engine start`, its serve log, the key in no file):
tests/serve/test_serve_lifecycle_real.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from squad.dirs import ENGINE_STATE, check_state_dirs, open_private, private_dir, state_dir
from squad.events.jsonl import JsonlTrace, default_trace_path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@settings(max_examples=40, deadline=None)
@given(before=st.integers(min_value=0o600, max_value=0o777), umask=st.sampled_from([0o000, 0o002, 0o022, 0o077]),
       how=st.sampled_from(["a", "ab", "w", "wb"]), existed=st.booleans())
def test_open_private_leaves_a_0600_file_whatever_it_was(tmp_path_factory, before, umask, how, existed):
    path = tmp_path_factory.mktemp("f") / "log"
    if existed:
        path.write_bytes(b"old\n")
        path.chmod(before)
    old = os.umask(umask)
    try:
        with open_private(path, how) as out:
            out.write(b"x" if "b" in how else "x")
    finally:
        os.umask(old)
    assert mode(path) == 0o600
    assert path.read_bytes() == ((b"old\nx" if existed else b"x") if how.startswith("a") else b"x")


@settings(max_examples=30, deadline=None)
@given(before=st.integers(min_value=0o700, max_value=0o777), existed=st.booleans(),
       umask=st.sampled_from([0o000, 0o022]))
def test_private_dir_leaves_a_0700_folder_whatever_it_was(tmp_path_factory, before, existed, umask):
    path = tmp_path_factory.mktemp("d") / "logs"
    if existed:
        path.mkdir()
        path.chmod(before)
    old = os.umask(umask)
    try:
        private_dir(path)
    finally:
        os.umask(old)
    assert mode(path) == 0o700


def test_state_folders_traces_pid_files_and_engine_json_are_private(tmp_path, monkeypatch):
    """What squad writes in its state folder, by each writer: the folders 0700, the files 0600 (engine.json also
    when it was 0644 before)."""
    from squad.engine.process import write_pidfile
    from squad.engine.saved import SavedEngine, SavedPlan, save_engine, saved_engine_path

    monkeypatch.setenv("SQUAD_STATE_DIR", str(tmp_path / "state"))
    old = os.umask(0o022)
    root = check_state_dirs(*ENGINE_STATE, "traces")
    assert root == state_dir() and mode(root) == 0o700
    assert all(mode(root / d) == 0o700 for d in (*ENGINE_STATE, "traces"))
    trace = default_trace_path()
    with JsonlTrace(trace):
        pass
    assert mode(trace) == 0o600
    named = tmp_path / "mine.jsonl"  # a --trace path the user made keeps its mode
    named.write_text("")
    named.chmod(0o644)
    with JsonlTrace(named):
        pass
    assert mode(named) == 0o644
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pidfile = write_pidfile(proc, "http://127.0.0.1:1", root / "logs" / "x.log", "id")
    finally:
        proc.kill()
        proc.wait()
    assert mode(pidfile) == 0o600 and mode(pidfile.parent) == 0o700
    saved_engine_path().write_text("{}")
    saved_engine_path().chmod(0o644)
    save_engine(SavedEngine(url="http://127.0.0.1:1", api_key="k" * 24, pid=1, create_time=0.0, log_path="x",
                            plan=SavedPlan(model="m.gguf", slots=1, n_ctx=512, kv_unified=True)))
    assert mode(saved_engine_path()) == 0o600
    os.umask(old)
