"""The options commands share, defined once: one name, one short form, one type and range
for each meaning, whichever command it is on. Help texts that mention a default take it from
the command (``default=``), so each says what happens in the command it is in.

:data:`OPTION_NAMES` is the table of every option name the CLI may use and its short form;
``tests/cli/test_cli_consistency.py`` walks every command and holds them to it.
"""

from __future__ import annotations

from typing import Any

import typer

from squad.engine.llama import MAX_SLOTS

__all__ = ["OPTION_NAMES", "model", "param", "slots", "ctx", "ctk", "ctv", "llama_server", "threads", "port", "url",
           "api_key", "as_json", "out", "load_timeout", "request_timeout", "check_mcp", "gpu_layers", "queue",
           "parse_gpu_layers"]

OPTION_NAMES: dict[str, str | None] = {
    # the engine: the same names as far as possible as llama-server's own short flags
    "--model": "-m", "--slots": "-np", "--ctx": "-c", "--ctk": None, "--ctv": None, "--threads": "-t",
    "--llama-server": None, "--port": None, "--url": None, "--api-key": None, "--load-timeout": None,
    "--request-timeout": None, "--gpu-layers": "-ngl", "--queue": None,
    # serve
    "--host": None, "--engine-api-key": None, "--default-max-tokens": None, "--replan-interval": None,
    "--max-body": None, "--watch": None, "--cors-origin": None, "--client-key": None, "--max-restarts": None,
    "--hung-after": None, "--client-limit": None, "--max-queue-wait": None, "--keepalive": None,
    # recipes and runs
    "--param": "-p", "--out": "-o", "--trace": None, "--quiet": "-q", "--json": None,
    "--recipe": None, "--agent-file": None, "--main": None, "--replan": None, "--check-mcp": None, "--otel": None,
    "--ray": None, "--ray-workers": None, "--resume": None,
    # plan
    "--backend": None, "--mlx-batch": None, "--agents": None, "--parallel": None,
    # verify, engine install, models, trace
    "--max-tokens": None, "--force": None, "--build": None, "--jobs": "-j", "--calls": None,
    "--help": None, "--version": None,
}
"""Every long option name the CLI may use -> its one short form (None: no short form)."""


def model(default: str) -> Any:
    """``--model/-m``: a known model name, a .gguf path or a store reference (``hf:``, ``ollama:``,
    ``lmstudio:``)."""
    return typer.Option("--model", "-m", show_default=False,
                        help="A known model name, a .gguf path, or hf:ORG/REPO[:QUANT], ollama:NAME[:TAG], "
                             f"lmstudio:PUBLISHER/MODEL (default: the config file's model, else {default}).")


def param(what: str = "Recipe parameter") -> Any:
    """``--param/-p NAME=VALUE`` (repeatable)."""
    return typer.Option("--param", "-p", show_default=False,
                        help=f"{what} NAME=VALUE (repeat a NAME for a list); NAME=@FILE reads the file's text, "
                             "@@ escapes a literal @.")


def number_or_auto(low: int, high: int | None = None) -> Any:
    """A parser for a whole number in ``[low, high]`` or ``auto`` (returned as None: the command
    plans it, or uses its default); a bad value is a usage error (exit 2)."""

    def parse(value: Any) -> int | None:
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            number = value
        elif str(value).strip().lower() == "auto":
            return None
        else:
            try:
                number = int(str(value).strip())
            except ValueError:
                raise typer.BadParameter(f"{value!r} is neither a whole number nor auto") from None
        if number is not None and (number < low or (high is not None and number > high)):
            top = f"..{high}" if high is not None else " or more"
            raise typer.BadParameter(f"{number} is not in {low}{top} (or auto)")
        return number

    return parse


def slots(default: str | None = None) -> Any:
    """``--slots/-np``: parallel slots, 1..MAX_SLOTS, or ``auto`` (None: planned). ``default``:
    what happens without it, in words (None: the command's own default value is shown)."""
    return typer.Option("--slots", "-np", parser=number_or_auto(1, MAX_SLOTS), metavar=f"1..{MAX_SLOTS}|auto",
                        show_default=default is None,
                        help="Parallel slots, or auto" + _default(default))


def ctx(default: str | None = None) -> Any:
    """``--ctx/-c``: the context in tokens (the slots' shared pool), or ``auto`` (None: planned);
    ``default`` as for :func:`slots`."""
    return typer.Option("--ctx", "-c", parser=number_or_auto(256), metavar="TOKENS|auto", show_default=default is None,
                        help="Context in tokens, shared by the slots as one pool; rounded up to a multiple "
                             "of 256; or auto" + _default(default))


def ctk(default: str = "the recipe's cache_type, else f16") -> Any:
    """``--ctk``: KV cache type for K."""
    return typer.Option("--ctk", show_default=False,
                        help=f"KV cache type for K: f16, q8_0, q4_0, ... (default: {default}).")


def ctv() -> Any:
    """``--ctv``: KV cache type for V."""
    return typer.Option("--ctv", show_default=False, help="KV cache type for V (default: the same as --ctk).")


def llama_server(help: str = "The llama-server binary to run (default: the one `squad engine info` shows).") -> Any:
    """``--llama-server PATH``: the binary to run."""
    return typer.Option("--llama-server", show_default=False, help=help)


def threads() -> Any:
    """``--threads/-t``: llama-server's CPU threads."""
    return typer.Option("--threads", "-t", min=1, show_default=False,
                        help="CPU threads of llama-server, its -t (default: llama-server's choice).")


def gpu_layers() -> Any:
    """``--gpu-layers/-ngl``: model layers in GPU memory (llama-server's -ngl), a number or ``all``."""
    return typer.Option("--gpu-layers", "-ngl", show_default=False,
                        help="Model layers in GPU memory, llama-server's -ngl: a number or all (default: all when "
                             "a GPU is found through NVML, else none). KV is then planned against GPU memory.")


def parse_gpu_layers(value: str | None) -> int | str | None:
    """``--gpu-layers`` text → a count, ``"all"`` or None. Raises :class:`UserError` otherwise."""
    from squad.errors import UserError

    if value is None or value == "all":
        return value
    if value.isdigit():
        return int(value)
    raise UserError(f"--gpu-layers {value!r}: give a number of layers (0 = none) or all")


def load_timeout() -> Any:
    """``--load-timeout SECONDS``: how long a launched engine may take to load the model."""
    return typer.Option("--load-timeout", min=1, show_default=False,
                        help="Seconds the engine may take to load the model (default: 60 s + 60 s per GiB of "
                             "model file).")


def request_timeout() -> Any:
    """``--request-timeout SECONDS``: how long one model call may take end to end."""
    return typer.Option("--request-timeout", min=1, show_default=False,
                        help="A fixed deadline in seconds for every model call, queueing excluded. Default: "
                             "derived per call from its prompt, max_tokens and the engine's measured speed; a "
                             "call is stopped only when no progress arrives or it far exceeds that estimate.")


def queue() -> Any:
    """``--queue POLICY``: the order of calls waiting for admission (:mod:`squad.sched.policy`)."""
    return typer.Option("--queue", show_default=False, metavar="POLICY", callback=_check_queue,
                        help="Order of calls waiting for a slot or pool room: program (default: the program that has "
                             "held the engine least goes first, then the smaller call; a call that fits passes one "
                             "that does not, a bounded number of times), fifo (priority, then arrival, no call passes "
                             "the head) or backfill (fifo, but a call that fits may pass a head that does not, a "
                             "bounded number of times), or a policy registered in squad.sched.policy.QUEUE_POLICIES.")


def _check_queue(value: str | None) -> str | None:
    from squad.sched.policy import QUEUE_POLICIES

    if value is None or value.lower() in QUEUE_POLICIES:
        return None if value is None else value.lower()
    raise typer.BadParameter(f"{value!r} is not a queue policy: use one of {', '.join(QUEUE_POLICIES)}")


def port(help: str) -> Any:
    """``--port``: a TCP port on this machine, 1..65535."""
    return typer.Option("--port", min=1, max=65535, show_default=False, help=help)


def url(help: str) -> Any:
    """``--url``: an engine's root URL; checked to be http(s)://HOST[:PORT] when parsed."""
    return typer.Option("--url", help=help, show_default=False, callback=_check_url)


def api_key(help: str = "Bearer key of the engine at --url (default: the key `squad engine start` "
                        "recorded for that URL, else the config file's api_key).") -> Any:
    """``--api-key`` (also from ``$LLAMA_API_KEY``)."""
    return typer.Option("--api-key", envvar="LLAMA_API_KEY", show_default=False, help=help)


def as_json(help: str = "Print JSON instead of text.") -> Any:
    """``--json``."""
    return typer.Option("--json", help=help)


def out(help: str) -> Any:
    """``--out/-o FILE``: a file the command writes (checked before any work starts)."""
    return typer.Option("--out", "-o", help=help, show_default=False)


def _default(words: str | None) -> str:
    return "." if words is None else f" (default: {words})."


def _check_url(value: Any) -> Any:
    from squad.engine.urls import check_engine_url

    if isinstance(value, list):  # a repeatable --url (squad run: several engines)
        return [_check_url(v) for v in value]
    if value is None:
        return None
    try:
        return check_engine_url(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def check_mcp(what: str) -> Any:
    """``--check-mcp``: start a recipe's MCP servers (they are never started otherwise)."""
    return typer.Option("--check-mcp", show_default=False,
                        help=f"Start the recipe's MCP servers to {what}, then stop them (without it no server starts).")
