"""``squad config show|path``: the config file of defaults set once (:mod:`squad.config`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from squad.cli import options
from squad.cli._app import app, console

__all__ = ["config_app"]

config_app = typer.Typer(
    help=(
        "Defaults set once in squad's config file (TOML): model, llama_server, threads, gpu_layers, api_key. "
        "Command-line options and recipes override them. `show` prints them, `path` prints where the file is."
    ),
    no_args_is_help=True,
)
app.add_typer(config_app, name="config")

_BUILT_IN = {
    "model": "smollm2-135m (squad's built-in model)",
    "llama_server": "found: $SQUAD_LLAMA_SERVER, PATH, squad's cache (`squad engine info`)",
    "threads": "llama-server's choice",
    "gpu_layers": "llama-server's choice",
    "api_key": "none (the key `squad engine start` recorded, for that engine)",
}


@config_app.command("show")
def config_show(as_json: Annotated[bool, options.as_json()] = False) -> None:
    """Print each setting, its value and where it comes from (the config file or squad's default).
    A bad config file is reported with its file:line."""
    from squad.config import Config, config_path, load_config

    path = config_path()
    config = load_config(path)
    values = config.model_dump()
    if as_json:
        shown = {k: (_masked(v) if k == "api_key" and v else v) for k, v in values.items()}
        console.print_json(json.dumps({"path": str(path), "exists": path.is_file(), "settings": shown}))
        return
    console.print(f"config file  {path}"
                  + ("" if path.is_file() else "  (not there: every setting is squad's default)"),
                  highlight=False)
    for key in Config.model_fields:
        value = values[key]
        if value is None:
            console.print(f"{key:<13}[dim]default: {_BUILT_IN[key]}[/]", highlight=False)
        else:
            console.print(f"{key:<13}{_masked(value) if key == 'api_key' else value}  [dim](config file)[/]",
                          highlight=False)
    console.print("[dim]command-line options and recipes override these[/]")


@config_app.command("path")
def config_path_command() -> None:
    """Print the config file's path ($SQUAD_CONFIG, else the platform's config directory)."""
    from squad.config import config_path

    typer.echo(str(config_path()))


def _masked(key: str) -> str:
    return f"set (…{key[-4:]})" if len(key) > 8 else "set"
