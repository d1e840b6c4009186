"""squad's config file: defaults a person sets once instead of on every command line.

Where: ``$SQUAD_CONFIG`` (a file path) if set, else ``config.toml`` in the platform's config
directory (``platformdirs.user_config_dir("squad")``: ``~/.config/squad`` on Linux,
``~/Library/Application Support/squad`` on macOS, ``%LOCALAPPDATA%\\squad`` on Windows).
A missing file is no error: every setting then has squad's built-in default.

The file is TOML with these keys, all optional::

    model = "hf:bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M"   # any model reference
    llama_server = "/opt/llama.cpp/build/bin/llama-server"  # the binary to run
    threads = 8                                             # llama-server -t
    gpu_layers = 99                                         # layers offloaded to the GPU (-ngl)
    api_key = "sk-..."                                      # for engines given with --url

Precedence, highest first: the command line (and ``$LLAMA_API_KEY`` for the key), the recipe,
this file, squad's defaults. The API key is sent only to engines squad did not start itself
(an engine ``squad engine start`` left running keeps the key it was started with).

A file squad cannot use is a :class:`~squad.errors.UserError` naming ``file:line`` and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from squad.engine import saved
from squad.errors import UserError

if TYPE_CHECKING:
    from squad.engine.session import EngineSpec

__all__ = ["Config", "config_path", "load_config", "with_config", "api_key_for", "ENV_VAR"]

ENV_VAR = "SQUAD_CONFIG"


class Config(BaseModel):
    """The settings of the config file (None: not set there)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(None, min_length=1, description="model reference used when none is given")
    llama_server: str | None = Field(None, min_length=1, description="path of the llama-server binary")
    threads: StrictInt | None = Field(None, ge=1, description="llama-server CPU threads (-t)")
    gpu_layers: Annotated[StrictInt, Field(ge=0)] | Literal["all"] | None = Field(None,
                                                                                  description="model layers "
                                                                                              "offloaded to the GPU "
                                                             "(-ngl): a number (0 = none) or all")
    api_key: str | None = Field(None, min_length=1, description="bearer key for engines at --url")


def config_path() -> Path:
    """The config file squad reads: ``$SQUAD_CONFIG``, else ``<user config dir>/squad/config.toml``."""
    given = os.environ.get(ENV_VAR, "").strip()
    if given:
        return Path(given).expanduser()
    return Path(platformdirs.user_config_dir("squad", appauthor=False)) / "config.toml"


def load_config(path: Path | None = None) -> Config:
    """The settings in ``path`` (default :func:`config_path`); an absent file gives no settings.

    Raises :class:`UserError` ``"FILE:LINE: what is wrong; what to do"`` for a file that is not
    TOML, has a key squad does not know, or a value of the wrong kind."""
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
        raise UserError(f"{path}: cannot read squad's config file ({reason}); fix it or set {ENV_VAR} "
                        "to another file") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        where = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        line = where.group(1) if where else "1"
        what = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc)).rstrip(".")
        raise UserError(f"{path}:{line}: not valid TOML ({what}); write settings as KEY = VALUE, "
                        'e.g. model = "smollm2-135m"') from None
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise UserError(_explain(path, text, data, exc.errors()[0])) from None


def _explain(path: Path, text: str, data: dict[str, Any], error: Any) -> str:
    key = str(error["loc"][0]) if error["loc"] else ""
    where = f"{path}:{_line_of(text, key)}"
    known = list(Config.model_fields)
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{where}: unknown setting {key!r}; {hint}the settings are {', '.join(known)}"
    description = Config.model_fields[key].description
    return f"{where}: {key} = {data.get(key)!r}: {error['msg'].lower()} ({key} is the {description})"


def _line_of(text: str, key: str) -> int:
    """The line where ``key`` is set (1 when it cannot be found)."""
    name = re.escape(key)
    pattern = re.compile(rf"""^\s*(?:{name}|"{name}"|'{name}')\s*[=.\]]|^\s*\[\s*{name}\s*\]""")
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.search(line):
            return number
    return 1


def with_config(spec: EngineSpec, config: Config | None = None) -> EngineSpec:
    """``spec`` (a recipe's, with command-line overrides applied) with the config file's defaults
    in the launch settings nothing else set: model, binary, threads (and GPU layers where the
    spec has them). An engine at a URL takes none of them."""
    config = config if config is not None else load_config()
    if spec.url is not None:
        return spec
    defaults = {"model": config.model, "binary": config.llama_server, "threads": config.threads,
                "gpu_layers": config.gpu_layers}
    fields = {f.name for f in dataclasses.fields(spec)}
    given = {k: v for k, v in defaults.items() if v is not None and k in fields and getattr(spec, k) is None}
    return dataclasses.replace(spec, **given) if given else spec


def api_key_for(url: str, api_key: str | None, config: Config | None = None) -> str | None:
    """The key to send to the engine at ``url``: ``api_key`` (``--api-key``/``$LLAMA_API_KEY``) if
    given; else the config file's, unless ``url`` is the engine ``squad engine start`` recorded
    (that one keeps its own key); else None (the engine layer then finds the recorded key)."""
    if api_key:
        return api_key
    if os.environ.get("LLAMA_API_KEY"):
        return None  # the engine layer reads it
    if saved.saved_engine_at(url.rstrip("/").removesuffix("/v1")) is not None:
        return None
    config = config if config is not None else load_config()
    return config.api_key
