"""Run every benchmark and write ``bench/results.md`` (machine info, exact commands, tables).

Each benchmark runs as its own process, one after another.

    .venv/bin/python bench/run_all.py [--quick] [--only fanout,overhead] [-o bench/results.md] [--note TEXT]
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import machine_info  # noqa: E402

BENCHES = ["fanout", "oversubscribe", "overhead", "reload", "ray_fanout"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    parser.add_argument("--only", default=",".join(BENCHES))
    parser.add_argument("-o", "--output", type=Path, default=HERE / "results.md")
    parser.add_argument("--note", default="", help="a line to add under the machine info")
    args = parser.parse_args(argv)
    python = Path(sys.executable)
    try:
        shown_python = python.relative_to(Path.cwd())
    except ValueError:
        shown_python = python
    info = machine_info()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    parts = [
        "# squad benchmarks",
        "",
        f"Run {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} at commit `{commit or 'unknown'}`"
        f"{' (quick mode)' if args.quick else ''}.",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in info.items()],
        "",
    ]
    if args.note:
        parts += [args.note, ""]
    failed = 0
    for name in [b for b in args.only.split(",") if b]:
        cmd = [str(shown_python), f"bench/{name}.py"] + (["--quick"] if args.quick else [])
        print(f"running: {' '.join(cmd)}", file=sys.stderr, flush=True)
        started = time.monotonic()
        proc = subprocess.run([str(python), str(HERE / f"{name}.py")] + cmd[2:], capture_output=True, text=True,
                              cwd=HERE.parent)
        took = time.monotonic() - started
        parts.append(f"## {name}\n\nCommand: `{' '.join(cmd)}` ({took:.0f} s)\n")
        if proc.returncode == 0:
            parts.append(proc.stdout.strip() + "\n")
        else:
            failed += 1
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            parts.append(f"**failed** (exit {proc.returncode}):\n\n```\n{tail}\n```\n")
        args.output.write_text("\n".join(parts) + "\n")  # keep what we have if a later one hangs
    print(f"wrote {args.output}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
