"""split: chunks — the chunker, its recipe keys, and map items told apart (agent[i])."""

from pathlib import Path

import pytest

from squad.errors import RecipeError
from squad.events.summary import summarize
from squad.events.view import ViewState
from squad.recipes import load_recipe, run_recipe, step_table
from squad.recipes.chunks import estimate_tokens, split_chunks
from squad.testing import FakeEngine, Reply


def words(text: str) -> int:
    """A toy tokenizer: one token per word."""
    return len(text.split())


def numbered(n: int, per_line: int = 3) -> str:
    return "".join(" ".join(f"w{i}" for _ in range(per_line)) + "\n" for i in range(n))


def test_empty_and_small_text():
    assert split_chunks("", 10, words) == []
    assert split_chunks("  \n\n", 10, words) == []
    assert split_chunks("a b c\nd e\n", 10, words) == ["a b c\nd e\n"]


def test_cut_between_lines_and_the_bound_is_exact():
    text = numbered(20)  # 60 tokens, 3 per line
    chunks = split_chunks(text, 10, words)
    assert "".join(chunks) == text
    assert all(words(c) <= 10 for c in chunks)
    assert all(c.endswith("\n") for c in chunks)  # whole lines
    assert [words(c) for c in chunks] == [9] * 6 + [6]


def test_prefers_a_paragraph_boundary():
    text = "a b\nc d\n\ne f\ng h\ni j\n"  # blank line after 4 tokens, limit 8
    chunks = split_chunks(text, 8, words)
    assert chunks[0] == "a b\nc d\n\n"
    assert "".join(chunks) == text


def test_a_long_line_is_cut_inside():
    line = " ".join(f"x{i}" for i in range(25)) + "\n"
    chunks = split_chunks("short\n" + line, 10, words)
    assert all(words(c) <= 10 for c in chunks)
    assert "".join(chunks) == "short\n" + line


def test_overlap_repeats_whole_lines():
    text = numbered(12)  # 3 tokens per line
    chunks = split_chunks(text, 9, words, overlap=3)
    assert all(words(c) <= 9 for c in chunks)
    for prev, nxt in zip(chunks, chunks[1:]):
        assert nxt.splitlines()[0] == prev.splitlines()[-1]
    # without the repeated first line, the chunks give the text back
    assert chunks[0] + "".join(c.split("\n", 1)[1] for c in chunks[1:]) == text


def test_overlap_must_leave_room():
    with pytest.raises(ValueError, match="overlap"):
        split_chunks("a", 5, words, overlap=5)
    with pytest.raises(ValueError, match="max_tokens"):
        split_chunks("a", 0, words)


def test_non_ascii_with_the_byte_estimate():
    text = "".join(f"ligne {i}: éàü 日本語 🙂\n" for i in range(200))
    chunks = split_chunks(text, 64)  # default count: UTF-8 bytes / 2
    assert len(chunks) > 1 and "".join(chunks) == text
    assert all(estimate_tokens(c) <= 64 for c in chunks)
    assert estimate_tokens("日") == 2  # 3 bytes -> 2 tokens, rounded up


# --- recipe keys ----------------------------------------------------------------------------

RECIPE = """\
name: t
params:
  code: {type: string, default: "x"}
  xs: {type: list, default: [a]}
agents:
  lead: {instructions: "You are lead.", budget: 2048, max_tokens: 32}
  rev: {instructions: "You review.", budget: 1024, max_tokens: 16}
main: lead
flow:
  - id: parts
    agent: rev
    map: MAP
    split: chunks
    EXTRA
    prompt: "part {{ index }} of {{ chunks }}: {{ item }}"
  - id: merge
    prompt: "{{ steps.parts.output }} {{ params.code }} {{ params.xs }}"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("map_, extra, message", [
    ("params.code", "concurrency: 1", "split: chunks needs chunk_tokens"),
    ("params.code", "chunk_tokens: 0", "must be at least 1, got 0"),
    ("params.code", "{chunk_tokens: 10, overlap: 10}".replace("{", "").replace("}", "").replace(", ", "\n    "),
     "overlap (10) must be below chunk_tokens (10)"),
    ("params.xs", "chunk_tokens: 10", "split: chunks cuts a text, but parameter 'xs' is a list"),
])
def test_chunk_keys_are_checked(tmp_path, map_, extra, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        load_recipe(write(tmp_path, RECIPE.replace("MAP", map_).replace("EXTRA", extra)))
    assert info.value.file and info.value.line is not None


def test_chunk_keys_need_split_chunks(tmp_path):
    text = RECIPE.replace("MAP", "params.code").replace("split: chunks", "split: lines").replace("EXTRA",
                                                                                                 "chunk_tokens: 5")
    with pytest.raises(RecipeError, match="chunk_tokens and overlap apply only to a map step with split: chunks"):
        load_recipe(write(tmp_path, text.replace("of {{ chunks }}", "")))


def test_chunks_variable_only_with_split_chunks(tmp_path):
    text = RECIPE.replace("MAP", "params.xs").replace("    split: chunks\n", "").replace("    EXTRA\n", "")
    with pytest.raises(RecipeError, match="chunks exists only in a map step with split: chunks"):
        load_recipe(write(tmp_path, text))


@pytest.mark.anyio
async def test_map_over_chunks_one_item_per_chunk_labelled(tmp_path):
    code = "".join(f"line {i} " + "word " * 20 + "\n" for i in range(30))  # ~130 bytes a line
    path = write(tmp_path,
                 RECIPE.replace("MAP", "params.code").replace("EXTRA", "chunk_tokens: 150\n    concurrency: 2"))
    recipe = load_recipe(path, {"code": code})
    expected = recipe.items(recipe.steps_by_id()["parts"], {})
    assert len(expected) >= 2 and "".join(expected) == code
    events = []
    async with FakeEngine(slots=4, n_ctx=8192) as fe:
        fe.responder = lambda body: Reply(content="note " + body["messages"][-1]["content"].split(":")[0])
        run = await run_recipe(recipe, engine=fe.info, on_event=events.append)
    n = len(expected)
    assert run.steps["parts"]["outputs"] == [f"note part {i} of {n}" for i in range(n)]
    labels = [row["agent"] for row in step_table(run) if row["step"] == "parts"]
    assert sorted(labels) == sorted(f"rev[{i}]" for i in range(n))
    assert [row["agent"] for row in step_table(run) if row["step"] == "merge"] == ["lead"]
    summary = summarize(events)
    assert {f"rev[{i}]" for i in range(n)} | {"lead"} == set(summary.agents)
    assert all(s.agent.startswith("rev[") for s in summary.calls if s.agent != "lead")
    view = ViewState()
    for ev in events:
        view.apply(ev)
    assert set(view.agents) == {f"rev[{i}]" for i in range(n)} | {"lead"}
    assert all(row.state == "done" for name, row in view.agents.items() if name != "lead")  # lead: 32 tokens, cut


def test_a_small_text_is_one_chunk_with_the_models_tokenizer():
    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "review.yaml")
    step = recipe.steps_by_id()["security"]
    assert recipe.items(step, {}) == [recipe.params["code"]]
