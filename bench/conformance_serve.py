"""Started by llama.cpp's server tests in place of llama-server (bench/conformance.py): maps the
suite's llama-server command line onto ``squad serve`` and execs it.

Flags squad serve plans or has an option for are mapped (``--port``, ``--host``, ``--model``,
``--ctx-size``, ``--parallel``, ``--threads``, ``-ctk``/``-ctv``, ``--api-key``, ``--n-predict`` N >= 1 as
``--default-max-tokens``); every other flag is handed to squad serve after ``--`` when it takes
llama-server flags that way (``squad serve --help`` mentions ``-- [llama-server flags]``), else
dropped, and the dropped ones are printed on stderr so that the suite's log says what did not reach
the engine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

MAPPED = {"--port": "--port", "--host": "--host", "--model": "--model", "-m": "--model",
          "--ctx-size": "--ctx", "-c": "--ctx", "--parallel": "--slots", "-np": "--slots",
          "--threads": "--threads", "-t": "--threads", "-ctk": "--ctk", "--cache-type-k": "--ctk",
          "-ctv": "--ctv", "--cache-type-v": "--ctv", "--api-key": "--api-key"}
VALUED = {"--temp", "--seed", "--batch-size", "-b", "--ubatch-size", "-ub", "--n-gpu-layers", "-ngl",
          "--pooling", "--alias", "--tags", "--chat-template", "--chat-template-file", "--reasoning-format",
          "--reasoning", "--cors-origins", "--slot-save-path", "--grp-attn-n", "--grp-attn-w", "--lora",
          "-fa", "--flash-attn", "--n-predict", "-n", "--cache-ram", "--sleep-idle-seconds", "--media-path",
          "--spec-type", "--spec-draft-n-max", "--spec-draft-n-min", "--model-draft", "--hf-repo", "--hf-file",
          "--models-dir", "--models-max", "--models-preset", "--tools", "--tools-runtime", "--mmproj-url",
          "--mcp-servers-config", "--mcp-servers-json", "--model-url"}
"""llama-server flags of the suite that take a value (so the value is not read as a flag)."""


def squad_command() -> list[str]:
    exe = Path(sys.executable).with_name("squad")
    return [str(exe)] if exe.exists() else [shutil.which("squad") or "squad"]


def takes_passthrough(cmd: list[str]) -> bool:
    out = subprocess.run([*cmd, "serve", "--help"], capture_output=True, text=True, check=False).stdout
    return "llama-server flags" in out


def translate(argv: list[str], key: str | None) -> tuple[list[str], list[str]]:
    """``(squad serve options, other llama-server flags)`` for the suite's ``argv``."""
    ours: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        flag = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        if flag in MAPPED and value is not None:
            ours += [MAPPED[flag], value]
            i += 2
        elif flag in ("--n-predict", "-n") and value is not None:
            if int(value) >= 1:
                ours += ["--default-max-tokens", value]
            else:
                rest += [flag, value]
            i += 2
        elif flag in VALUED and value is not None:
            rest += [flag, value]
            i += 2
        else:
            rest.append(flag)
            i += 1
    if "--api-key" not in ours and key:
        ours += ["--api-key", key]
    return ours, rest


def main() -> None:
    cmd = squad_command()
    ours, rest = translate(sys.argv[1:], os.environ.get("SQUAD_CONFORMANCE_KEY"))
    engine = os.environ.get("SQUAD_CONFORMANCE_ENGINE")
    full = [*cmd, "serve", *ours, *(["--llama-server", engine] if engine else [])]
    if rest and takes_passthrough(cmd):
        full += ["--", *rest]
    elif rest:
        print(f"conformance_serve: not passed to squad serve: {' '.join(rest)}", file=sys.stderr, flush=True)
    print(f"conformance_serve: {' '.join(full)}", file=sys.stderr, flush=True)
    os.execv(full[0], full)


if __name__ == "__main__":
    main()
