"""MCP servers in recipes: the mcp: block checked without starting anything, servers started
only by a run or --check-mcp, their tools checked against what the server lists (file:line),
their schemas counted into auto budgets, and a flow calling them (scripted model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from squad.chat import ChatResult, ToolCall
from squad.cli import app
from squad.errors import MCPServerError, RecipeError
from squad.recipes import budgets, load_recipe, recipe_mcp, run_recipe, validate_recipe
from squad.testing import ScriptedEngine, count_tokens

ROOT = Path(__file__).resolve().parents[2]
BAD = Path(__file__).resolve().parents[1] / "recipes_bad"
NOTES = ROOT / "recipes" / "notes.yaml"
SERVER = Path(__file__).resolve().parents[1] / "mcp_server.py"


def calls(*pairs: tuple[str, dict]) -> ChatResult:
    return ChatResult(content="", tool_calls=[ToolCall(f"c{i}", n, json.dumps(a)) for i, (n, a) in enumerate(pairs)],
                      finish_reason="tool_calls")


CASES = [
    ("mcp_template.yaml", 7, 23, "mcp.notes.args[1]",
     "'--db={{ params.db }}': a server's command, args and env are used as written, never rendered as templates"),
    ("mcp_unknown_server.yaml", 7, 24, "agents.a.tools[1]",
     "agent 'a' lists tool 'nots.list', but there is no MCP server 'nots' (MCP servers: notes)"),
    ("mcp_both.yaml", 4, 5, "mcp.notes", "give a command (a server squad starts) or a url"),
    ("mcp_unknown_key.yaml", 4, 5, "mcp.notes.comand", "unknown key 'comand'; did you mean 'command'?"),
]


@pytest.mark.parametrize(("name", "line", "column", "field", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_mcp_block_is_a_file_line_error(name, line, column, field, message):
    with pytest.raises(RecipeError) as info:
        validate_recipe(BAD / name)
    err = info.value
    assert (err.line, err.column, err.field) == (line, column, field)
    assert err.problem.startswith(message)


def _marker_recipe(tmp_path: Path) -> Path:
    """A recipe whose 'server' only leaves a marker file when it is started."""
    path = tmp_path / "marker.yaml"
    path.write_text(
        "name: marker\n"
        "mcp:\n  probe:\n    command: python\n    args: ['-c', \"open('started', 'w')\"]\n"
        "agents:\n  a: {tools: [probe.x]}\nmain: a\nflow:\n  - prompt: hi\n")
    return path


def test_validate_and_plan_start_no_server_unless_asked(tmp_path):
    recipe = _marker_recipe(tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["recipes", "validate", str(recipe)]).exit_code == 0
    planned = runner.invoke(app, ["plan", str(recipe)])
    assert planned.exit_code == 0, planned.output
    assert "MCP server(s) probe not started" in planned.output
    assert not (tmp_path / "started").exists()
    checked = runner.invoke(app, ["recipes", "validate", "--check-mcp", str(recipe)])
    assert (tmp_path / "started").exists()  # the server's cwd is the recipe's folder
    assert checked.exit_code == 1  # it started but speaks no MCP: not a mistake in the file
    assert "MCP server 'probe'" in checked.output and "did not start" in checked.output


def test_check_mcp_lists_each_servers_tools_and_their_users():
    result = CliRunner().invoke(app, ["recipes", "validate", "--check-mcp", str(NOTES)], terminal_width=300)
    assert result.exit_code == 0, result.output
    assert ("mcp notes: 4 tool(s) (add_note, list_notes, find_notes, count_lines); used by scribe: add_note, "
            "list_notes") in result.output


@pytest.mark.anyio
async def test_a_tool_the_server_lacks_is_an_error_at_the_agents_tools_entry(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(f"name: r\nmcp:\n  t:\n    command: python\n    args: [{SERVER}]\n"
                    "agents:\n  a:\n    tools:\n      - t.echo\n      - t.ecco\nmain: a\nflow:\n  - prompt: hi\n")
    recipe = load_recipe(path)
    with pytest.raises(RecipeError) as info:
        async with recipe_mcp(recipe):
            pass
    assert (info.value.line, info.value.field) == (10, "agents.a.tools[1]")
    assert "MCP server 't' has no tool 'ecco'; did you mean 't.echo'?" in info.value.problem


@pytest.mark.anyio
@pytest.mark.parametrize("tools", [
    "      - t.*\n      - u.echo\n",  # a whole server beside one tool of another
    "      - t.echo\n      - u.*\n",
    "      - t.dotted.name\n      - u.*\n",
])
async def test_two_tools_with_one_name_once_the_servers_list_them_are_an_error_at_the_line(tmp_path, tools):
    """Issue 19: what only the servers' lists show (``SERVER.*``) is checked when they start, at
    the line of the second entry; what the names show is found by validate (the corpus)."""
    path = tmp_path / "r.yaml"
    path.write_text(f"name: r\nmcp:\n  t:\n    command: python\n    args: [{SERVER}]\n"
                    f"  u:\n    command: python\n    args: [{SERVER}]\n"
                    f"agents:\n  a:\n    tools:\n{tools}main: a\nflow:\n  - prompt: hi\n")
    recipe = load_recipe(path)
    with pytest.raises(RecipeError) as info:
        async with recipe_mcp(recipe):
            pass
    assert "gets two tools named" in info.value.problem and "list only one of them" in info.value.problem
    assert info.value.line == 13 and info.value.field == "agents.a.tools[1]"


@pytest.fixture
def counted(monkeypatch):
    """Budgets counted with the fake's counter, which counts tool definitions (the built-in
    model's own template drops them, so its exact count has none to add)."""

    class Counter:
        def count_chat(self, messages, tools=None):
            return count_tokens(messages, tools)

        def count_text(self, text):
            return len(text.split())

    monkeypatch.setattr(budgets, "chat_counter", lambda model: Counter())
    monkeypatch.setattr(budgets, "n_ctx_train", lambda model: 8192)


@pytest.mark.anyio
async def test_auto_budgets_count_the_mcp_tool_schemas_once_the_servers_are_up(counted):
    recipe = load_recipe(NOTES)
    before = {(r.step, r.agent): r.prompt for r in recipe.budgets}
    async with recipe_mcp(recipe) as servers:
        specs = [t.spec() for t in servers.tools_for(recipe.agents["scribe"]).values()]
    after = {(r.step, r.agent): r.prompt for r in recipe.budgets}
    schema_tokens = count_tokens([], specs) - count_tokens([])
    assert schema_tokens > 40
    assert all(after[k] - before[k] == schema_tokens for k in before)
    assert recipe.agents["scribe"].budget >= max(after.values()) + recipe.agents["scribe"].max_tokens
    assert not all(r.fixed for r in recipe.budgets)  # counted again from auto, not frozen by the first count


@pytest.mark.anyio
async def test_the_notes_recipe_calls_its_mcp_tools_in_a_flow(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the server's path is relative to the recipe, not to here
    engine = ScriptedEngine(calls(("add_note", {"text": "Tea is a drink."})), "Tea is a drink.",
                            calls(("list_notes", {})), "I noted that tea is a drink.")
    recipe = load_recipe(NOTES, {"topic": "tea"})
    run = await run_recipe(recipe, engine=engine)
    assert run.output == "I noted that tea is a drink."
    tool_texts = [m["content"] for r in engine.requests for m in r.messages if m["role"] == "tool"]
    assert tool_texts == ["saved note 1: Tea is a drink.", "1. Tea is a drink."]
    assert {t["function"]["name"] for t in engine.requests[0].tools} == {"add_note", "list_notes"}


@pytest.mark.anyio
async def test_a_recipe_server_that_fails_names_it_with_its_stderr(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(f"name: r\nmcp:\n  t:\n    command: python\n    args: [{SERVER}, --fail]\n"
                    "agents:\n  a: {tools: [t.echo]}\nmain: a\nflow:\n  - prompt: hi\n")
    engine = ScriptedEngine()
    with pytest.raises(MCPServerError, match="cannot open the database"):
        await run_recipe(load_recipe(path), engine=engine)
    assert engine.requests == []


def test_the_shipped_server_file_is_where_the_recipe_says():
    assert (NOTES.parent / "../examples/mcp_notes.py").resolve().is_file()
