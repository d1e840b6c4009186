"""The typer application and the error boundary shared by every command module."""

from __future__ import annotations

import inspect
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from squad._version import __version__
from squad.errors import EngineStartError, SquadError, UserError, leaf_errors

if TYPE_CHECKING:
    from squad.engine.session import EngineSpec

app = typer.Typer(
    name="squad",
    help=(
        "Run agents that share one local llama-server: squad plans slots and context for "
        "the work, launches the engine, and never sends it more than it can hold."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

console = Console()
err_console = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"squad {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print squad's version and exit.")) -> None:
    """Run agents that share one local llama-server: squad plans slots and context for the work,
    launches the engine, and never sends it more than it can hold."""


def unwrap_help(typer_app: typer.Typer) -> None:
    """Give every command and group of ``typer_app`` its help as prose: paragraphs kept, the
    line breaks inside a paragraph (docstring wrapping) dropped, so the terminal rewraps the
    text at its own width instead of breaking lines mid-sentence. Called once, after every
    command module registered its commands."""
    for command in typer_app.registered_commands:
        text = command.help or inspect.getdoc(command.callback)
        if text:
            command.help = _prose(text)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            unwrap_help(group.typer_instance)
    if isinstance(typer_app.info.help, str):
        typer_app.info.help = _prose(typer_app.info.help)


def _prose(text: str) -> str:
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


class Stopped(KeyboardInterrupt):
    """Raised by a command that handled SIGINT or SIGTERM itself and stopped in order (squad serve): exit 130
    after SIGINT, 143 after SIGTERM, with ``done`` after the line saying so."""

    def __init__(self, signum: int, done: str = "") -> None:
        super().__init__(signum)
        self.signum, self.done = signum, done


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``squad`` console script.

    Exit codes: 0 ok, 1 failure, 2 bad input (usage or a user mistake), 130 interrupted
    (SIGINT, Ctrl-C), 143 terminated (SIGTERM). SIGTERM is handled exactly like Ctrl-C:
    agents cancelled, the engine stopped, the trace closed. User mistakes print one clear
    message, never a traceback.
    """
    terminated: list[int] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        terminated.append(signum)
        interrupt = signal.getsignal(signal.SIGINT)  # Ctrl-C's handler (asyncio's while a loop runs)
        if callable(interrupt):
            interrupt(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
        if getattr(previous, "squad_early", False):
            previous = signal.SIG_DFL
    except ValueError:  # not the main thread (an embedding caller): signals stay theirs
        previous = on_sigterm
    try:
        if getattr(signal.getsignal(signal.SIGINT), "squad_early", False):  # squad._entry's, during imports
            signal.signal(signal.SIGINT, signal.default_int_handler)  # from here Ctrl-C is KeyboardInterrupt
        app(args=_optional_values(sys.argv[1:] if argv is None else list(argv)))  # typer exits on usage errors
    except KeyboardInterrupt as exc:
        if (stopped := _stopped(exc)) is not None:
            sys.exit(_interrupted([stopped.signum] if stopped.signum == signal.SIGTERM else [], stopped.done))
        sys.exit(_interrupted(terminated, ""))
    except SystemExit as exc:  # typer turns Ctrl-C into exit 130 after the engine was stopped
        if (stopped := _stopped(exc)) is not None:
            sys.exit(_interrupted([stopped.signum] if stopped.signum == signal.SIGTERM else [], stopped.done))
        if exc.code == 130:
            sys.exit(_interrupted(terminated, ": agents cancelled, engine stopped"))
        raise
    except SquadError as exc:
        sys.exit(_report(exc))
    except BaseExceptionGroup as group:  # a task group that let several errors out
        first = next((e for e in leaf_errors(group) if isinstance(e, SquadError)), None)
        if first is None:
            raise
        sys.exit(_report(first))
    finally:
        if previous is not on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _stopped(exc: BaseException) -> Stopped | None:
    """The :class:`Stopped` that ``exc`` is or was raised from (typer turns it into exit 130), else None."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None or isinstance(seen, Stopped):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


OPTIONAL_VALUES = {"--ray": "default", "--resume": "last"}
"""Options whose value may be left out (``squad run RECIPE --ray``), and the word that stands for
it: typer has no option with an optional value, so :func:`_optional_values` fills it in."""


def _optional_values(argv: list[str]) -> list[str]:
    """``argv`` with the stand-in word after an option of :data:`OPTIONAL_VALUES` given without
    its value: last, before another option, or before a recipe file (``--ray recipe.yaml``)."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg in OPTIONAL_VALUES:
            following = argv[i + 1] if i + 1 < len(argv) else None
            if following is None or following.startswith("-") or following.endswith((".yaml", ".yml")):
                out.append(OPTIONAL_VALUES[arg])
    return out


def _interrupted(terminated: list[int], done: str) -> int:
    """Say that squad was stopped; return 143 after SIGTERM, 130 after Ctrl-C."""
    if terminated:
        err_console.print(f"[yellow]terminated (SIGTERM)[/]{done}")
        return 128 + signal.SIGTERM
    err_console.print(f"[yellow]interrupted[/]{done}")
    return 130


def _report(exc: SquadError) -> int:
    """Print a squad error for a person; return the exit code (2 = their input, 1 = failure)."""
    err_console.print("[red]error:[/] " + _escape(str(exc)), soft_wrap=True)  # one line, never rewrapped
    if isinstance(exc, EngineStartError) and exc.log_tail:
        err_console.print("[dim]--- engine log (last lines) ---[/]")
        err_console.print(_escape(exc.log_tail), highlight=False)
    return 2 if isinstance(exc, UserError) else 1


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def collect_params(items: list[str]) -> dict[str, str | list[str]]:
    """``-p`` values for every command: ``["topic=cats", "item=a", "item=b"]`` ->
    ``{"topic": "cats", "item": ["a", "b"]}`` (a repeated name becomes a list).
    ``NAME=@path`` reads the file's UTF-8 text as the value; ``NAME=@@text`` is the literal
    ``@text``. Raises :class:`UserError` for an item without ``=`` or a file it cannot read."""
    params: dict[str, str | list[str]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UserError(f"-p {item!r}: write parameters as NAME=VALUE, e.g. -p topic=cats")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # argv bytes that are not UTF-8 arrive as lone surrogates
            raise UserError(f"-p {name}=...: the value has bytes that are not UTF-8 text (at character "
                            f"{exc.start}); pass UTF-8 text, e.g. convert the file with iconv") from None
        value = _at_file(name, value)
        if name in params:
            before = params[name]
            params[name] = [*(before if isinstance(before, list) else [before]), value]
        else:
            params[name] = value
    return params


AT_FILE_LIMIT = 64 * 2**20
"""Bytes ``-p NAME=@FILE`` reads at most (64 MiB): far above any prompt, below any harm."""


def _at_file(name: str, value: str) -> str:
    """``@path`` -> the file's text; ``@@x`` -> ``@x``; anything else unchanged."""
    if value.startswith("@@"):
        return value[1:]
    if not value.startswith("@"):
        return value
    from pathlib import Path

    path = Path(value[1:]).expanduser()
    try:
        with path.open("rb") as f:  # bounded: /dev/zero or a huge file must not fill the memory
            data = f.read(AT_FILE_LIMIT + 1)
        if len(data) > AT_FILE_LIMIT:
            raise UserError(f"-p {name}=@{value[1:]}: the file is larger than {AT_FILE_LIMIT // 2**20} MiB; "
                            "give a smaller file (a long text is read in pieces by a map step with split: chunks)")
        return data.decode("utf-8-sig")
    except OSError as exc:
        raise UserError(f"-p {name}=@{value[1:]}: cannot read the file: {exc.strerror or exc} "
                        f"(write @@ for a value that starts with a literal @)") from None
    except UnicodeDecodeError:
        raise UserError(f"-p {name}=@{value[1:]}: the file is not UTF-8 text") from None


def config_model() -> str | None:
    """The config file's model (:mod:`squad.config`): a recipe that names no model, run without
    ``--model``, is counted with and run on it."""
    from squad.config import load_config

    return load_config().model


def engine_spec(base: EngineSpec | None = None, *, url: str | None = None, api_key: str | None = None,
                **overrides: Any) -> EngineSpec:
    """The :class:`~squad.engine.session.EngineSpec` a command runs on: ``base`` (a recipe's
    :meth:`~squad.recipes.Recipe.engine_spec`, or the default) with the command-line
    ``overrides`` that were given (model, slots, ctx, cache types, binary, threads), then the
    config file's defaults for what neither set (:mod:`squad.config`); with ``url`` a server to
    attach to instead: ``--slots``/``--ctx`` are then capacity pins for it (used where it reports
    nothing, never above what it reports, :mod:`squad.engine.kinds`); other launch options are
    an error."""
    from squad.config import api_key_for, with_config
    from squad.engine.session import EngineSpec

    if url is not None:
        pins = {k: overrides.pop(k, None) for k in ("slots", "ctx")}
        given = [k for k, v in overrides.items() if v is not None]
        if given:
            flag = {"binary": "--llama-server", "cache_type_k": "--ctk", "cache_type_v": "--ctv"}
            options = ", ".join(flag.get(k, "--" + k.replace("_", "-")) for k in given)
            what = "sizes or starts" if len(given) == 1 else "size or start"
            raise UserError(f"{options} {what} an engine squad launches, but --url attaches to a running one: "
                            f"drop {options} (the engine at the URL runs as it was started)")
        return EngineSpec(url=url, api_key=api_key_for(url, api_key), **pins)
    given = {k: (str(v) if isinstance(v, Path) else v) for k, v in overrides.items()}
    return with_config((base or EngineSpec()).but(**given))


_FLAGS = {"binary": "--llama-server", "cache_type_k": "--ctk", "cache_type_v": "--ctv"}
_PER_ENGINE = {"slots": "slots", "ctx": "ctx", "cache_type_k": "cache_type", "cache_type_v": "cache_type",
               "threads": "threads", "gpu_layers": "gpu_layers"}
"""Overrides an item of a recipe's ``engines:`` sets for itself (the option -> the item's key)."""


def _flag(key: str) -> str:
    return _FLAGS.get(key, "--" + key.replace("_", "-"))


def recipe_engine_specs(recipe: Any, **overrides: Any) -> list[EngineSpec]:
    """The engines a command runs a recipe on (``squad run``, ``squad plan``): its one engine with
    the command-line ``overrides`` (:func:`engine_spec`), or, for an ``engines:`` list, one spec
    per item where an option means one thing for all of them:

    - ``--slots``, ``--ctx``, ``--ctk``/``--ctv``, ``--threads``, ``--gpu-layers``: refused (each
      item sets its own: ``slots:``, ``ctx:``, ``cache_type:``, ``threads:``, ``gpu_layers:``);
    - ``--model``: the recipe's ``model:``, which the launched items that name no model run
      (``load_recipe(model=...)`` already set it); refused when an item names its own model or
      none is launched;
    - ``--llama-server``, ``--load-timeout`` (and ``squad plan``'s backend settings): every
      launched item; refused when none is launched.

    Raises :class:`UserError` saying which option and where to set it instead."""
    if not recipe.engines:
        return [engine_spec(recipe.engine_spec(), **overrides)]
    given = {k: v for k, v in overrides.items() if v is not None}
    own = [k for k in given if k in _PER_ENGINE]
    if own:
        flags = ", ".join(dict.fromkeys(_flag(k) for k in own if not (k == "cache_type_v" and "cache_type_k" in own)))
        keys = ", ".join(dict.fromkeys(_PER_ENGINE[k] for k in own))
        raise UserError(f"{flags}: the recipe lists its engines (engines:), each with its own settings; set {keys} "
                        f"per engine in the recipe's engines: list, or drop {flags}")
    launched = [e for e in recipe.engines if e.url is None]
    named = [i for i, e in enumerate(recipe.engines) if e.url is None and e.model is not None]
    if "model" in given and named:
        raise UserError(f"--model: item {named[0] + 1} of the recipe's engines: list names its own model, which "
                        "--model would not change; set the model per engine in the engines: list, or drop --model")
    rest = {k: v for k, v in given.items() if k not in ("model", "backend", "mlx_max_batch")}
    if not launched and (rest or "model" in given):
        flags = ", ".join(_flag(k) for k in (*rest, *(("model",) if "model" in given else ())))
        raise UserError(f"{flags}: every engine in the recipe's engines: list is at a URL (it runs as it was "
                        f"started); drop {flags}")
    return [engine_spec(base) if base.url is not None else engine_spec(base, **{k: v for k, v in given.items()
                                                                               if k != "model"})
            for base in recipe.engine_specs()]
