"""The review recipe on the REAL engine with a file longer than one piece: reviewed in chunks.

The shipped recipe cuts pieces of 7,000 tokens, so proving the chunked path with it takes a
~2,000-line file and six minutes on 2 cores; that run is a benchmark now
(``bench/shared_input.py --big``, figures in bench/results.md). Here the same recipe, with its
pieces made 400 tokens, reviews 60 lines (three pieces): the same steps, maps, labels and plan, in seconds."""

import json
from pathlib import Path

import pytest

from launch_support import THREADS
from squad.cli import main as squad_main

ROOT = Path(__file__).resolve().parents[2]


def long_code(lines: int = 60) -> str:
    """About ``lines`` lines of squad's own source, in a stable order."""
    out: list[str] = []
    for path in sorted((ROOT / "src" / "squad").rglob("*.py")):
        out += [f"# file: {path.relative_to(ROOT)}\n", *path.read_text(encoding="utf-8").splitlines(keepends=True)]
        if len(out) >= lines:
            break
    return "".join(out[:lines])


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_review_recipe_reads_a_long_file_in_chunks(capsys, tmp_path, llama_server_path, default_model_path):
    from squad.recipes import load_recipe

    code = long_code()
    shipped = (ROOT / "recipes" / "review.yaml").read_text()
    assert shipped.count("chunk_tokens: 7000") == 3
    path = tmp_path / "review.yaml"
    path.write_text(shipped.replace("chunk_tokens: 7000", "chunk_tokens: 400"))
    (tmp_path / "agents").mkdir()
    for part in (ROOT / "recipes" / "agents").glob("*.yaml"):
        (tmp_path / "agents" / part.name).write_text(part.read_text())
    recipe = load_recipe(path, {"code": code})
    pieces = recipe.items(recipe.steps_by_id()["security"], {})
    assert len(pieces) >= 3  # more than one piece for a reviewer
    try:
        squad_main(["run", str(path), "-p", f"code={code}", "--json",
                    "--llama-server", str(llama_server_path), "-t", str(THREADS), "--trace", str(tmp_path / "t.jsonl"),
                    "--request-timeout", "900"])
        code_ = 0
    except SystemExit as exc:
        code_ = exc.code
    out, err = capsys.readouterr()
    if code_ not in (0, None):  # say why: the CLI's errors and the trace's last events
        trace = (tmp_path / "t.jsonl").read_text(errors="replace") if (tmp_path / "t.jsonl").exists() else ""
        pytest.fail(f"squad run exited {code_}\n{err[-3000:]}\n{trace[-3000:]}")
    data = json.loads(out)
    # errors are looked for where squad reports them, not as words in the answers: the file under
    # review is squad's own source, which the model may echo ("from squad.errors import AdmissionError")
    assert not data["errors"] and all(step.get("error") is None for step in data["steps"].values())
    assert data["output"].strip()
    n = len(pieces)
    for name in ("security", "style", "tests"):
        assert len(data["steps"][name]["outputs"]) == n
        labels = sorted(r["agent"] for r in data["agents"] if r["step"] == name)
        assert labels == sorted(f"{name}[{i}]" for i in range(n))
    assert data["engine"]["slots"] == 3  # one chunk per reviewer at a time
    from squad.events.jsonl import load_trace
    from squad.events.summary import summarize

    agents = summarize(load_trace(tmp_path / "t.jsonl")).agents
    assert {f"security[{i}]" for i in range(n)} <= set(agents)
