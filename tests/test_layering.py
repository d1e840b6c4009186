"""The data path goes one way: recipe → workload → plan → engine → runtime → events → result.
Pin the layering so a change cannot quietly send data back and forth between modules.

- Layers: every squad module sits in one layer of :data:`LAYERS`; an import may go down or
  sideways, never up (:data:`EXCEPTIONS` lists the few that do, each with its reason), and
  :data:`NARROW` keeps a few modules apart inside their layer.
- No import cycle (a strongly connected component of the import graph), lazy imports included.
- Function-local imports of squad modules only where start-up speed asks for them: ``squad.cli``
  and :data:`LAZY_ALLOWED`.

The import graph: one edge per ``import`` / ``from ... import`` of a squad module, at module level
or inside a function (``if TYPE_CHECKING:`` blocks are for type checkers and do not count), and
per ``importlib.import_module`` of one. ``from a.b import c`` is an edge to ``a.b.c`` when that is
a module, else to ``a.b``. A parent package's ``__init__`` also runs on import, but is no edge
(a package that re-exports its own modules would otherwise be a cycle with each of them).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import squad

SRC = Path(squad.__file__).parent

# The layers, lowest first: a module is in the layer of the longest name that is it or its package.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # what every layer may use: errors, directories, child processes, prompt templates, the event kinds, names
    ("foundations", ("squad._version", "squad.errors", "squad.dirs", "squad.children", "squad._guard",
                     "squad.templates", "squad.events", "squad.names")),
    # llama-server and the other servers: binary, process, launcher, probe, kinds, models, tokens
    ("engine", ("squad.engine",)),
    # admission, queue policy, workload, planner, plan, memory
    ("sched", ("squad.sched",)),
    # the ChatEngine seam and its layers (transport, counting, streaming, routing)
    ("chat", ("squad.chat",)),
    # the composition root: engine, plan, admission and client put together (the session, the engine
    # providers, the spec and spec + workload -> plan); verify runs one
    ("engine.session", ("squad.engine.session", "squad.engine.provider", "squad.engine.launched",
                        "squad.engine.attached", "squad.engine.providers", "squad.engine.spec", "squad.engine.planning",
                        "squad.engine.verify")),
    # the routing layer over several engines: a ChatEngine that opens one session per engine
    ("chat.routing", ("squad.chat.routing",)),
    # the tool seam (Tool, @tool, running tool calls): what the runtime calls and MCP tools are
    ("tools", ("squad.tools",)),
    # Squad, agents, turns, blocks, hand-back, mentions, MCP
    ("runtime", ("squad.runtime", "squad.mcp")),
    ("recipes", ("squad.recipes",)),
    # what runs squads: fan-out and Ray, squad serve, the fakes; the event sinks and readers
    ("cluster, serve, testing", ("squad.cluster", "squad.serve", "squad.testing", "squad.events.jsonl",
                                 "squad.events.summary", "squad.events.collect", "squad.events.view",
                                 "squad.events.view_state", "squad.events.otel")),
    # the command line and what only it reads (the config file); the package's lazy public API and
    # the flat layout's import paths (squad._moved), which name modules of every layer
    ("cli", ("squad.cli", "squad.config", "squad._entry", "squad.__main__", "squad._moved", "squad")),
]

# (importer, imported) -> why this import may go up
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("squad.engine.launcher", "squad.sched.plan"):
        "the launcher starts llama-server as the plan says (a frozen data class built from squad.engine.llama alone)",
}

# issue 20: imports up the layers that the helpers who own these modules are taking out (the lead empties it)
PENDING: dict[tuple[str, str], str] = {}

# Folders whose imports still run both ways (issue 33: a folder holds one layer, so folder-level imports run one
# way), each pair once (sorted) with why; the lead empties it as the folders are split.
FOLDERS_BOTH_WAYS: dict[tuple[str, str], str] = {
    ("chat", "engine"): "the composition root (engine.session, provider, launched, attached, spec, planning, verify) "
                        "still lives in engine/ and builds the chat client; chat reads engine facts (not moved yet)",
    ("engine", "sched"): "the same composition root plans and admits; sched reads llama-server facts and GGUF "
                         "stores (and engine.launcher reads sched.plan, EXCEPTIONS)",
    ("engine", "events"): "events/ holds the event kinds (foundations) and the sinks (a higher layer): the "
                          "OpenTelemetry sink names the default model (engine.registry)",
    ("events", "runtime"): "events/ holds the event kinds and the sinks: the summary sink ranks outcomes "
                           "(runtime.outcome)",
}

# module (or package) -> squad modules it must never import, though the layers would allow it
NARROW: dict[str, list[str]] = {
    "squad.sched.workload": ["squad.engine", "squad.sched.planner"],  # what the recipe asks, before any plan
    "squad.sched.planner": ["squad.engine.launcher", "squad.engine.process", "squad.sched.admission"],  # pure
    "squad.sched.admission": ["squad.sched.planner"],
    "squad.chat.client": ["squad.sched.planner"],
    "squad.recipes.spec": ["squad.sched.planner", "squad.runtime", "squad.engine.session"],  # data only
    "squad.events.view": ["squad.events.jsonl", "squad.events.summary", "squad.runtime"],  # events as they come
    "squad.events.view_state": ["squad.events.jsonl", "squad.events.summary", "squad.runtime"],
}

# modules that may import squad modules inside functions, besides squad.cli (start-up speed)
LAZY_ALLOWED = {
    "squad": "PEP 562: the public API is imported on first use, so `import squad` stays fast",
    "squad.runtime": "`from squad.runtime import Squad` (the flat layout's path) for one release",
    "squad._entry": "the command line is imported after the early Ctrl-C/SIGTERM handlers are in place",
    "squad._moved": "the flat layout's import paths resolve to the moved modules on first use",
    "squad.testing": "FakeEngine and the other servers' fakes need the testing extra (starlette, uvicorn)",
}


@dataclass(frozen=True)
class Import:
    target: str  # the squad module imported
    line: int
    local: bool  # inside a function


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(SRC.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The squad module ``name`` is or is in (``squad.errors.UserError`` -> ``squad.errors``)."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


def _type_checking(test: ast.expr) -> bool:
    return getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING"


@cache
def imports_of(name: str) -> tuple[Import, ...]:
    """The squad modules module ``name`` imports at run time, at module level or in a function."""
    path = modules()[name]
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, local: bool) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                visit(child, local)
            return
        local = local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(node, ast.Import):
            found.extend(Import(t, node.lineno, local) for a in node.names if (t := _resolve(a.name)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if target := (sub if sub in modules() else _resolve(base)):
                    found.append(Import(target, node.lineno, local))
        for child in ast.iter_child_nodes(node):
            visit(child, local)

    visit(tree, False)
    for node in ast.walk(tree):  # importlib.import_module("squad.x"), or of a name: every module named here
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                if target := _resolve(arg.value):
                    found.append(Import(target, node.lineno, True))
            else:
                found.extend(Import(c.value, c.lineno, True) for c in ast.walk(tree)
                             if isinstance(c, ast.Constant) and c.value in modules() and c.value != name)
    return tuple(dict.fromkeys(i for i in found if i.target.startswith("squad")))  # one per line and module


@cache
def type_only_imports_of(name: str) -> tuple[Import, ...]:
    """The squad modules module ``name`` imports only for type checkers (in ``if TYPE_CHECKING:`` blocks)."""
    path = modules()[name]
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []
    for block in ast.walk(tree):
        if not (isinstance(block, ast.If) and _type_checking(block.test)):
            continue
        for node in (n for stmt in block.body for n in ast.walk(stmt)):
            if isinstance(node, ast.Import):
                found.extend(Import(t, node.lineno, False) for a in node.names if (t := _resolve(a.name)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if target := (sub if sub in modules() else _resolve(base)):
                        found.append(Import(target, node.lineno, False))
    return tuple(dict.fromkeys(i for i in found if i.target.startswith("squad")))


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_of(name: str) -> int:
    """The index in :data:`LAYERS` of ``name``'s layer (the longest matching name wins)."""
    best = max(((len(p), rank) for rank, (_, names) in enumerate(LAYERS) for p in names
                if name == p or (p != "squad" and name.startswith(p + "."))), default=None)
    assert best is not None, f"{name} is in no layer: add it to LAYERS in tests/test_layering.py"
    return best[1]


def test_imports_go_down_the_layers():
    bad = []
    for name in modules():
        low = layer_of(name)
        for imp in imports_of(name):
            high = layer_of(imp.target)
            if high > low and (name, imp.target) not in EXCEPTIONS | PENDING:
                bad.append(f"{name}:{imp.line} ({LAYERS[low][0]}) imports {imp.target} ({LAYERS[high][0]})")
    assert not bad, "an import goes up the layers:\n" + "\n".join(sorted(set(bad)))


def folder_of(name: str) -> str:
    """The folder of module ``name`` under squad (``squad.chat.client`` -> ``chat``); a top-level module is its own."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else name


def folder_edges() -> dict[tuple[str, str], list[str]]:
    """(importer folder, imported folder) -> the imports that make the edge (``module:line -> target``)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for name in modules():
        for imp in imports_of(name):
            pair = (folder_of(name), folder_of(imp.target))
            if pair[0] != pair[1]:
                edges.setdefault(pair, []).append(f"{name}:{imp.line} -> {imp.target}")
    return edges


def test_folder_imports_run_one_way():
    """Between two folders imports go one way only (a folder is a layer, or part of one), except the pairs
    :data:`FOLDERS_BOTH_WAYS` lists with their reason; each import that makes a new pair go both ways is shown."""
    edges = folder_edges()
    both = {tuple(sorted(pair)) for pair in edges if (pair[1], pair[0]) in edges}
    bad = [f"{a} <-> {b}:\n  " + "\n  ".join(edges[(a, b)] + edges[(b, a)])
           for a, b in sorted(both) if (a, b) not in FOLDERS_BOTH_WAYS]
    assert not bad, "folders import each other:\n" + "\n".join(bad)
    stale = [f"{a} <-> {b}" for a, b in FOLDERS_BOTH_WAYS if (a, b) not in both]
    assert not stale, "these folders import one way now: remove them from FOLDERS_BOTH_WAYS:\n" + "\n".join(stale)


def test_runtime_and_mcp_do_not_import_each_other():
    """MCP tools are :class:`squad.tools.Tool` (the tool seam, below both): the runtime uses MCP, never the reverse."""
    edges = folder_edges()
    assert ("mcp", "runtime") not in edges and ("runtime", "mcp") in edges


def test_exceptions_are_still_needed():
    """An exception nothing uses any more is taken out, so the list stays the few that are real."""
    used = {(name, imp.target) for name in modules() for imp in imports_of(name)}
    stale = [f"{a} -> {b}" for a, b in EXCEPTIONS if (a, b) not in used]
    assert not stale, "remove from EXCEPTIONS:\n" + "\n".join(stale)


def test_narrow_rules():
    bad = []
    for name in modules():
        for owner, banned in NARROW.items():
            if _within(name, owner):
                bad += [f"{name}:{imp.line} imports {imp.target}" for imp in imports_of(name)
                        if any(_within(imp.target, b) for b in banned)]
    assert not bad, "\n".join(bad)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components of more than one module (a module importing itself is none)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_strongly_connected_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    """No strongly connected component, lazy and type-only imports included (a type-only back-edge is a
    dependency the reader must hold in mind too: it becomes a protocol of the lower module): each edge of a cycle
    found is shown with the line that makes it."""
    def edges(name: str) -> list[tuple[Import, str]]:
        return ([(i, " (in a function)" if i.local else "") for i in imports_of(name)]
                + [(i, " (for type checkers)") for i in type_only_imports_of(name)])

    graph = {name: {i.target for i, _ in edges(name) if i.target != name} for name in modules()}
    lines = []
    for component in strongly_connected(graph):
        members = set(component)
        lines.append("cycle: " + ", ".join(component))
        lines += [f"  {name}:{imp.line} -> {imp.target}{how}"
                  for name in component for imp, how in edges(name) if imp.target in members and imp.target != name]
    assert not lines, "\n".join(lines)


def test_lazy_imports_only_for_start_up():
    """squad modules are imported at module level, except in the CLI (start-up speed) and
    :data:`LAZY_ALLOWED`: a function-local import hides a dependency (and often a cycle)."""
    bad = [f"{name}:{imp.line} imports {imp.target} inside a function"
           for name in modules() if not _within(name, "squad.cli") and name not in LAZY_ALLOWED
           for imp in imports_of(name) if imp.local]
    assert not bad, "hoist these to module level (or move the shared piece down a layer):\n" + "\n".join(bad)


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


def test_a_new_engine_provider_module_may_use_the_session():
    """ARCHITECTURE.md's "where does X go": a provider module added in ``squad/engine/providers/`` sits with the
    session and the providers squad ships, so importing ``EngineHandle`` is not an import up."""
    assert layer_of("squad.engine.providers.mine") == layer_of("squad.engine.launched") == layer_of(
        "squad.engine.provider")
    assert layer_of("squad.engine.providers.mine") > layer_of("squad.chat.client") > layer_of("squad.engine.llama")
