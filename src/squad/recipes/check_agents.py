"""A recipe's agents and MCP servers, checked and built: includes, names, sub-agents, tools.

:class:`AgentChecks` reads the ``agents:`` of a recipe or agents file and its ``include:`` files
(no cycles, no name twice), builds each :class:`~squad.runtime.agent.Agent` and checks what they
name: sub-agents that exist and form no cycle, MCP tools of a declared server (``SERVER.TOOL``),
no two tools one agent sees under one name, ``tool_choice``. :meth:`AgentChecks.build_mcp`
builds the ``mcp:`` servers, never started here. Each problem is a
:class:`~squad.errors.RecipeError` at its file, line and field.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from squad.errors import RecipeError, UserError
from squad.mcp import MCPServer, is_mcp_ref, model_name, resolve_cwd, split_ref, unknown_server
from squad.names import NAME_RULE, name_problem, normalize
from squad.recipes.load import Located, Path_, field_path, pydantic_error, read_yaml
from squad.recipes.spec import AgentFileSpec
from squad.runtime.agent import Agent, check_squad, check_tool_choice, find_cycle

__all__ = ["AgentChecks", "RawAgents", "unknown_agent", "tool_locs"]

RawAgents = dict[str, tuple[dict, Located, Path_]]
"""Agents as read: name -> (its mapping, the file it is in, its path in that file)."""


class AgentChecks:
    """Reading and checking agents for a loader of the recipe or agents file at ``path``
    (``located``: that file as read); ``reads`` collects the included files."""

    path: Path
    located: Located
    reads: list[tuple[str, str]]
    mcp_servers: tuple[MCPServer, ...]

    def collect_agents(self, located: Located, stack: list[Path]) -> RawAgents:
        """Agents defined in ``located`` and (first) its includes: name -> (data, file, path)."""
        found: RawAgents = {}
        here = Path(located.file).parent
        for i, rel in enumerate(located.data.get("include") or []):
            target = (here / rel).resolve()
            if target in stack:
                chain = " -> ".join(p.name for p in [*stack[stack.index(target):], target])
                raise located.error(f"include cycle: {chain}; remove one of these includes", ("include", i))
            if target.is_dir():
                raise located.error(f"included path {here / rel} is a directory; give the path of an agents file "
                                    f"(.yaml) in it (paths are relative to {Path(located.file).name})",
                                    ("include", i))
            if not target.is_file():
                raise located.error(f"included file not found: {here / rel}; fix the path (relative to "
                                    f"{Path(located.file).name})", ("include", i))
            sub = read_yaml(target, shown=str(Path(located.file).parent / rel))
            self.reads.append((str(target), f"agents included by {Path(located.file).name}"))
            try:
                AgentFileSpec.model_validate(sub.data)
            except ValidationError as exc:
                raise pydantic_error(exc, sub, (), AgentFileSpec) from None
            for name, entry in self.collect_agents(sub, [*stack, target]).items():
                self._add_agent(found, name, entry)
        for name, data in (located.data.get("agents") or {}).items():
            self._add_agent(found, name, (data, located, ("agents", name)))
        return found

    def _add_agent(self, found: dict, name: str, entry: tuple[dict, Located, Path_]) -> None:
        name = normalize(name) if isinstance(name, str) else name  # one agent whatever the file's normal form
        if name in found:
            first = found[name][1]
            line, _ = first.where(found[name][2], key=True)
            raise entry[1].error(f"agent '{name}' is already defined in {first.file}:{line}; rename one",
                                 entry[2], key=True)
        found[name] = entry

    def build_agents(self, raw: RawAgents) -> dict[str, Agent]:
        """Each agent of ``raw`` built and checked (names, sub-agents, tools, cycles, tool_choice)."""
        agents: dict[str, Agent] = {}
        for name, (data, src, base) in raw.items():
            if (problem := name_problem(name)) is not None:
                raise src.error(f"agent name '{name}' is not a name: {problem}; rename it ({NAME_RULE})",
                                base, key=True)
            if "name" in data:
                raise src.error("an agent's name is its key; remove 'name:'", (*base, "name"), key=True)
            try:
                agents[name] = Agent(name=name, **data)
            except ValidationError as exc:
                raise pydantic_error(exc, src, base, Agent) from None
        for name, agent in agents.items():
            data, src, base = raw[name]
            for i, sub in enumerate(agent.agents):
                if sub not in agents:
                    raise unknown_agent(sub, agents, (*base, "agents", i), src)
        servers = [s.name for s in self.mcp_servers]
        for name, agent in agents.items():
            self._check_tools(agent, raw[name], servers)
            self._distinct_tool_names(agent, raw[name])
        _check_calls(agents, raw)
        try:
            check_squad(list(agents.values()), tool_names=[t for a in agents.values() for t in a.tools],
                        mcp_servers=servers)
        except UserError as exc:
            raise RecipeError(str(exc), file=str(self.path)) from None
        return agents

    @staticmethod
    def _check_tools(agent: Agent, entry: tuple[dict, Located, Path_], servers: list[str]) -> None:
        """Every tool ``agent`` lists is ``SERVER.TOOL`` of a declared MCP server."""
        _, src, base = entry
        for i, tool in enumerate(agent.tools):
            if not is_mcp_ref(tool):
                raise src.error(
                    f"agent '{agent.name}' lists tool '{tool}', but a recipe cannot register function tools; remove it "
                    "(tools are registered in Python: Squad(..., tools=[...])), or name an MCP tool as "
                    "SERVER.TOOL", (*base, "tools", i))
            if split_ref(tool)[0] not in servers:
                raise src.error(unknown_server(agent.name, tool, servers), (*base, "tools", i))

    @staticmethod
    def _distinct_tool_names(agent: Agent, entry: tuple[dict, Located, Path_]) -> None:
        """Two tools of ``agent`` the model would see under one name, found without starting a
        server: ``a.search`` and ``b.search``, ``x.get-item`` and ``y.get_item``, an MCP tool named
        like one of its ``ask_<name>`` sub-agent tools. An error at the second one's line
        (``SERVER.*`` is checked once the server lists its tools)."""
        _, src, base = entry
        seen: dict[str, str] = {f"ask_{n}": f"its sub-agent tool for '{n}'" for n in agent.agents} \
            if agent.sub_agent_tools else {}
        for i, ref in enumerate(agent.tools):
            if not is_mcp_ref(ref) or split_ref(ref)[1] == "*":
                continue
            shown = model_name(split_ref(ref)[1])
            if shown in seen and seen[shown] != ref:
                raise src.error(f"agent '{agent.name}' gets two tools named '{shown}': {seen[shown]} and {ref} (the "
                                "model sees a tool by its own name, without the server); keep only one of them in its "
                                "tools", (*base, "tools", i))
            seen.setdefault(shown, ref)

    def build_mcp(self, raw: Mapping[str, dict[str, Any]]) -> tuple[MCPServer, ...]:
        """The ``mcp:`` servers, checked (a stdio server's ``cwd`` is relative to the recipe,
        which is also its default). Never started here."""
        servers = []
        for name, data in raw.items():
            base: Path_ = ("mcp", name)
            if not isinstance(data, dict):
                raise self.located.error("an MCP server is a mapping: command (+ args, env, cwd) or url", base)
            if "name" in data:
                raise self.located.error("an MCP server's name is its key; remove 'name:'", (*base, "name"), key=True)
            try:
                server = MCPServer(name=name, **data)
            except ValidationError as exc:
                raise pydantic_error(exc, self.located, base, MCPServer) from None
            servers.append(resolve_cwd(server, self.path.parent))
        return tuple(servers)


def _check_calls(agents: Mapping[str, Agent], raw: RawAgents) -> None:
    """No sub-agent cycle (an error at the agent that closes it), and each ``tool_choice`` one
    its agent can follow (at that line)."""
    cycle = find_cycle(agents)
    if cycle:
        last, closing = cycle[-2], cycle[-1]
        _, src, base = raw[last]
        raise src.error(
            f"sub-agents form a cycle: {' -> '.join(cycle)}; an agent cannot (indirectly) call itself: "
            f"remove '{closing}' from agents.{last}.agents", (*base, "agents", agents[last].agents.index(closing)))
    for name, agent in agents.items():  # at the agent's tool_choice line
        try:
            check_tool_choice(agent, agents)
        except UserError as exc:
            _, src, base = raw[name]
            raise src.error(str(exc), (*base, "tool_choice")) from None


def unknown_agent(name: str, agents: Mapping[str, Agent], path: Path_, src: Located) -> RecipeError:
    """An unknown agent ``name`` at ``path`` of ``src``, with a "did you mean" or the agents there are."""
    hint = difflib.get_close_matches(name, list(agents), n=1)
    did = f"; did you mean '{hint[0]}'?" if hint else f" (agents: {', '.join(sorted(agents)) or 'none'})"
    return src.error(f"unknown agent '{name}'{did}", path)


def tool_locs(raw: Mapping[str, tuple[dict, Located, Path_]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Where each agent lists each MCP tool: ``(agent, "server.tool")`` -> file, line, column, field."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for name, (data, src, base) in raw.items():
        for i, tool in enumerate(data.get("tools") or ()):
            if isinstance(tool, str) and is_mcp_ref(tool):
                path = (*base, "tools", i)
                line, column = src.where(path)
                out[(name, tool)] = {"file": src.file, "line": line, "column": column, "field": field_path(path)}
    return out
