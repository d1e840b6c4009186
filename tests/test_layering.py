"""The data path goes one way: recipe → workload → plan → engine → runtime → events → result.
Pin the layering so a change cannot quietly send data back and forth between modules."""

from __future__ import annotations

import ast
from pathlib import Path

import squad

SRC = Path(squad.__file__).parent

# module (or package prefix) -> squad modules it must never import, even lazily
NEVER = {
    # the engine's own modules know llama-server, not who plans or calls it; the session (which composes
    # engine, plan, admission and client) and verify (which runs a squad on it) sit above them
    "squad.engine": ["squad.sched.planner", "squad.sched.admission", "squad.sched.workload", "squad.chat",
                     "squad.runtime", "squad.recipes", "squad.cli", "squad.events"],
    "squad.sched.planner": ["squad.engine.session", "squad.runtime", "squad.chat", "squad.sched.admission",
                            "squad.recipes", "squad.cli", "squad.engine.launcher", "squad.engine.process"],
    "squad.sched.workload": ["squad.sched.planner", "squad.engine.session", "squad.runtime", "squad.recipes",
                             "squad.engine"],
    "squad.sched.admission": ["squad.sched.planner", "squad.chat.client", "squad.runtime", "squad.engine.session"],
    "squad.chat.client": ["squad.sched.planner", "squad.runtime", "squad.engine.session", "squad.recipes"],
    "squad.recipes.spec": ["squad.sched.planner", "squad.runtime", "squad.engine.session"],
    "squad.events": ["squad.runtime", "squad.chat.client", "squad.sched.admission"],
    "squad.events.view": ["squad.events.jsonl", "squad.events.summary", "squad.runtime"],
    "squad.events.view_state": ["squad.events.jsonl", "squad.events.summary", "squad.runtime"],
}
EXEMPT = ("squad.engine.session", "squad.engine.verify",  # the engine's composition root and its end-to-end check
          "squad.engine.provider", "squad.engine.launched", "squad.engine.attached",  # providers: admission + client
          "squad.engine.planning")  # spec + workload -> plan


def imports_of(path: Path) -> set[str]:
    """squad modules ``path`` imports at run time (``if TYPE_CHECKING:`` blocks are for type
    checkers only and do not count)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # drop TYPE_CHECKING blocks
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("squad")}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_back_up_the_data_path():
    bad = []
    for path in SRC.rglob("*.py"):
        name = module_name(path)
        for owner, banned in NEVER.items():
            if name in EXEMPT or (owner == "squad.events" and name != "squad.events"):
                continue  # events' readers and sinks (jsonl, summary, view, otel) have rules of their own
            if name == owner or name.startswith(owner + "."):
                bad += [f"{name} imports {m}" for m in imports_of(path)
                        if any(m == b or m.startswith(b + ".") for b in banned)]
    assert not bad, "\n".join(bad)


FLAGS = {"--kv-unified", "--no-kv-unified", "-np", "--parallel", "-ctk", "-ctv", "-c", "--ctx-size", "-to", "--metrics",
         "--jinja", "--chat-template-file", "--chat-template"}


def test_llama_facts_are_written_once():
    """The server flags and KV element sizes are written only in squad.engine.llama (bench and
    tests may spell argv out; the package may not; squad's own CLI options are not server flags; the
    prebuilt engine's entry point is a server that takes those flags)."""
    bad = []
    for path in SRC.rglob("*.py"):
        if path.name == "llama.py" or path.parent.name == "cli":
            continue
        if path.name == "prebuilt_server.py":  # the engine's side of the argv: it parses llama-server's flags
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in FLAGS:
                bad.append(f"{path.name}:{node.lineno}: {node.value!r}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Fraction":
                bad.append(f"{path.name}:{node.lineno}: Fraction(...)")
    assert not bad, "\n".join(bad)
