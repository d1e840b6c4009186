"""Answer quality, default vs every speed-up off (issue 29, invariant I2): the shipped review recipe's
shape (recipes/review.yaml: the three reviewers of recipes/agents/reviewers.yaml, each given
"Review this code:\\n<file>" / "Which tests does this code need:\\n<file>", one piece per file) over real
source files from the packages installed in the venv (not files we wrote), at temperature 0 with a
seed, one call at a time, each way on a fresh engine (batch composition and cached prefixes change
greedy answers).

Ways: ``off`` (every speed-up off: ``shared_input: off``), ``default`` (squad's defaults), and
``declared`` (the author puts the file first with ``shared=``, a layout change they ask for; judged
here to decide whether the shipped recipe should be written that way).

Reported: identical answers (default vs off), grounding rate (answers naming an identifier the file
defines: a function, class or module-level name of 4+ characters, read with ``ast``), engine-processed
prompt tokens (``/metrics``). Target: default grounding ≥ off's; where the layout is unchanged the
answers are identical.

    SQUAD_BENCH_BINARY=.venv/bin/squad-llama-server .venv/bin/python bench/quality.py [--files 20] [--max-tokens 40]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import sysconfig
from pathlib import Path

import anyio
import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BINARY, MODEL, THREADS, md_table
from squad.engine.session import EngineSpec
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = {"security": "Review this code:\n{code}", "style": "Review this code:\n{code}",
           "tests": "Which tests does this code need:\n{code}"}
DECLARED = {"security": "Review the code above.", "style": "Review the code above.",
            "tests": "Which tests does the code above need?"}


def real_files(n: int, lo: int = 30, hi: int = 70) -> list[Path]:
    """``n`` source files of ``lo``..``hi`` lines from installed packages, one per package, in a fixed order."""
    site = Path(sysconfig.get_paths()["purelib"])
    found: list[Path] = []
    for pkg in sorted(p for p in site.iterdir() if p.is_dir() and not p.name.endswith((".dist-info", "__pycache__"))):
        if pkg.name in ("squad", "_pytest", "pip", "setuptools"):
            continue
        for f in sorted(pkg.rglob("*.py")):
            if f.name == "__init__.py" or "test" in f.name:
                continue
            try:
                text = f.read_text()
                lines = text.count("\n")
                if lo <= lines <= hi and len(defined(text)) >= 3:
                    found.append(f)
                    break
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
                continue
        if len(found) == n:
            break
    return found


def defined(text: str) -> set[str]:
    """Names the file defines: functions, classes, module-level assignments (4+ characters)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return {n for n in names if len(n.strip("_")) >= 4}


def grounded(answer: str, names: set[str]) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\b", answer) for n in names)


def reviewers(max_tokens: int) -> list[Agent]:
    raw = yaml.safe_load((ROOT / "recipes" / "agents" / "reviewers.yaml").read_text())["agents"]
    return [Agent(name=n, instructions=a["instructions"], max_tokens=max_tokens,
                  sampling={"temperature": 0.0, "seed": 1}) for n, a in raw.items()]


async def erase_and_total(squad: Squad) -> float:
    headers = {"Authorization": f"Bearer {squad.info.api_key}"} if squad.info.api_key else {}
    async with httpx.AsyncClient(base_url=squad.info.base_url, headers=headers, timeout=60) as http:
        for slot in range(squad.info.slots):
            await http.post(f"/slots/{slot}", params={"action": "erase"})
        found = re.search(r"^llamacpp:prompt_tokens_total\s+(\S+)", (await http.get("/metrics")).text, re.MULTILINE)
        return float(found.group(1)) if found else float("nan")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--ways", default="off,default,declared", help="run only these ways (each on its own engine)")
    ap.add_argument("--save", help="write the answers as JSON here (runs of different ways merged with --merge)")
    ap.add_argument("--merge", nargs="*", help="JSON files of earlier runs: print their table, run nothing")
    args = ap.parse_args()
    if args.merge:
        table(*merged(args.merge))
        return
    files = real_files(args.files)
    spec = EngineSpec(model=MODEL, binary=BINARY, threads=THREADS, slots=3, ctx=8192)
    answers: dict[str, list[str]] = {"off": [], "default": [], "declared": []}
    ground: dict[str, list[bool]] = {k: [] for k in answers}
    tokens: dict[str, float] = dict.fromkeys(answers, 0.0)
    texts = [f.read_text() for f in files]
    # each way on a fresh engine: the host prompt cache outlives erased slots, and a prompt loaded from it
    # gives other greedy answers than one computed whole
    for way in [w for w in answers if w in args.ways.split(",")]:
        mode = "off" if way == "off" else "prefix"
        async with Squad(reviewers(args.max_tokens), engine=spec, shared_input=mode) as squad:
            for code in texts:
                names = defined(code)
                before = await erase_and_total(squad)
                if way == "declared":
                    calls = [(n, DECLARED[n]) for n in PROMPTS]
                    results = await squad.parallel(calls, check=True, max_concurrency=1, shared=code)
                else:
                    calls = [(n, p.format(code=code)) for n, p in PROMPTS.items()]
                    results = await squad.parallel(calls, check=True, max_concurrency=1)
                tokens[way] += await erase_and_total(squad) - before
                answers[way] += [r.output for r in results]
                ground[way] += [grounded(r.output, names) for r in results]
                print(f"{way}: {len(answers[way]) // 3}/{len(texts)}", file=sys.stderr, flush=True)
        print(f"{way}: done", file=sys.stderr, flush=True)
    if args.save:
        Path(args.save).write_text(json.dumps({"files": [str(f) for f in files], "max_tokens": args.max_tokens,
                                               "answers": answers, "ground": ground, "tokens": tokens}))
    table(files, args.max_tokens, answers, ground, tokens)


def merged(paths: list[str]) -> tuple[list[Path], int, dict, dict, dict]:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    answers: dict[str, list[str]] = {}
    ground: dict[str, list[bool]] = {}
    tokens: dict[str, float] = {}
    for run in runs:
        for way, got in run["answers"].items():
            if got:
                answers[way], ground[way], tokens[way] = got, run["ground"][way], run["tokens"][way]
    return [Path(f) for f in runs[0]["files"]], runs[0]["max_tokens"], answers, ground, tokens


def table(files: list[Path], max_tokens: int, answers: dict, ground: dict, tokens: dict) -> None:
    n = len(answers.get("off", []))
    rows = []
    for way in answers:
        same = sum(a == b for a, b in zip(answers[way], answers.get("off", [])))
        rows.append([way, f"{sum(ground[way])}/{len(ground[way])} ({sum(ground[way]) / max(1, len(ground[way])):.0%})",
                     f"{same}/{n}" if way != "off" else "-", f"{tokens[way]:,.0f}"])
    sources = ", ".join(f"{f.parent.name}/{f.name}" for f in files)
    print(f"{len(files)} files ({sources}); 3 reviewers each, max_tokens {max_tokens}, temperature 0, seed 1\n")
    print(md_table(["way", "grounded answers", "identical to off", "engine-processed prompt tokens"], rows))


if __name__ == "__main__":
    anyio.run(main)
