"""Resumable runs (issue 32, item 3): every finished call of a recipe run is in its journal as it
finishes; a run stopped part-way (cancelled as Ctrl-C cancels it, SIGTERM, a crash, a lost engine)
is resumed with only the calls that did not finish sent again, and refused when the recipe, a
parameter or the model changed.

The recipe is the shipped ``recipes/review.yaml`` with its ``agents/reviewers.yaml``, its chunks
made small (``chunk_tokens: 7000`` → 120) so a short text is 5 chunks; the fake engine counts the
requests it was sent. The real engine's proof is ``tests/engine/test_resume_real.py``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_support import engine, squad, state  # noqa: F401 - fixtures
from squad.errors import AgentRunError, UserError
from squad.events import AgentFinished, AgentResumed
from squad.events.summary import summarize
from squad.recipes import load_recipe, run_recipe
from squad.recipes.resume import recipe_journal, runs_dir
from squad.runtime.journal import RunJournal, call_key, read_journal
from squad.runtime.results import AgentResult
from squad.testing import FakeEngine, Reply

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
CODE = "\n".join(f"def f{i}(x):  # part {i}\n" + "    y = x + 1  # add one to the value\n" * 6 +
                 "    return y\n" for i in range(5))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def review(tmp_path, monkeypatch) -> Path:
    """The shipped review recipe in ``tmp_path`` (with its agents file), chunks of 120 tokens."""
    monkeypatch.setenv("SQUAD_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "reviewers.yaml").write_text((ROOT / "recipes/agents/reviewers.yaml").read_text())
    path = tmp_path / "review.yaml"
    path.write_text((ROOT / "recipes/review.yaml").read_text().replace("chunk_tokens: 7000", "chunk_tokens: 120"))
    return path


def load(path: Path, code: str = CODE, **kw):
    return load_recipe(path, {"code": code}, **kw)


def calls_of(journal_path: Path) -> list[dict]:
    return [line for held in read_journal(journal_path)[1].values() for line in held]


async def _interrupted_run(path: Path, fe: FakeEngine, after: int = 2) -> tuple[Path, int]:
    """Run ``path`` and cancel it (as Ctrl-C does) when reviewer 'security' has finished ``after``
    chunks: returns (its journal, the requests the engine got)."""
    recipe = load(path)
    assert len(recipe.items(recipe.flow[0].steps[0], {})) == 5  # the review's 5 chunks
    journal = recipe_journal(recipe)
    with anyio.CancelScope() as scope:
        def stop(event) -> None:
            if isinstance(event, AgentFinished) and event.agent == "security":
                stop.seen += 1  # type: ignore[attr-defined]
                if stop.seen == after:  # type: ignore[attr-defined]
                    scope.cancel()
        stop.seen = 0  # type: ignore[attr-defined]
        await run_recipe(recipe, engine=fe.info, on_event=stop, journal=journal)
    assert scope.cancelled_caught
    return journal.path, len(fe.requests)


async def test_a_review_stopped_after_2_of_5_chunks_resumes_sending_only_the_rest(review):
    async with FakeEngine(slots=3, n_ctx=8192) as fe:
        whole = await run_recipe(load(review), engine=fe.info)
        everything = [r["messages"][-1]["content"] for r in fe.requests]
        fe.requests.clear()
        journal_path, _ = await _interrupted_run(review, fe)
        recorded = calls_of(journal_path)
        security = [c for c in recorded if c["label"].startswith("security[")]
        assert len(security) == 2 and len(recorded) < len(everything)
        fe.requests.clear()
        events: list = []
        run = await run_recipe(load(review), engine=fe.info, on_event=events.append,
                               journal=recipe_journal(load(review), "last"))
    resent = [r["messages"][-1]["content"] for r in fe.requests]
    # the engine got exactly the calls the journal did not hold: none twice, none missing
    assert len(resent) == len(everything) - len(recorded), (len(resent), len(everything), len(recorded))
    assert not Counter(resent) - Counter(everything)  # each one a call of the run, and none sent twice
    assert run.output == whole.output and run.steps == whole.steps  # the same answer as a run never stopped
    assert sorted(label for _, label in run.resumed) == sorted(c["label"] for c in recorded)
    said = [e for e in events if isinstance(e, AgentResumed)]
    assert len(said) == len(recorded) and all(e.run == journal_path.stem for e in said)
    assert run.journal is not None and run.journal.path == journal_path  # the same journal, appended
    assert len(calls_of(journal_path)) == len(everything)  # now every call of the run is in it
    assert {(e.agent, e.item) for e in said} >= {("security", 0), ("security", 1)}
    assert any("resumed" in n for a in summarize(events).agents.values() for n in a.notes)


async def test_a_second_resume_of_a_finished_run_sends_nothing(review):
    async with FakeEngine(slots=3, n_ctx=8192) as fe:
        journal_path, _ = await _interrupted_run(review, fe)
        await run_recipe(load(review), engine=fe.info, journal=recipe_journal(load(review), "last"))
        fe.requests.clear()
        again = await run_recipe(load(review), engine=fe.info, journal=recipe_journal(load(review), journal_path.stem))
    assert fe.requests == [] and len(again.resumed) == len(again.results)


async def test_only_answers_are_recorded_a_failed_call_runs_again(review):
    """A call that failed (here: the engine answered 500) is not in the journal: the resume sends it."""
    from squad.testing import Reply

    async with FakeEngine(slots=3, n_ctx=8192) as fe:
        fe.responder = lambda body: (Reply(status=500, error_message="boom") if "part 3" in json.dumps(body)
                                     else Reply())
        recipe = load(review)
        journal = recipe_journal(recipe)
        first = await run_recipe(recipe, engine=fe.info, journal=journal)
        assert first.errors  # policy collect: the failed items are errors, the run went on
        failed = {sid for sid, _ in first.errors}
        fe.responder = None
        fe.requests.clear()
        await run_recipe(load(review), engine=fe.info, journal=recipe_journal(load(review), "last"))
    assert fe.requests and all("part 3" in json.dumps(r["messages"]) or r["messages"][-1]["content"].startswith(
        "Security notes") for r in fe.requests), failed  # the 3 failed items and the lead (its input changed)


def test_a_resume_refuses_a_changed_recipe_parameter_or_model_naming_it(review):
    recipe_journal(load(review))
    with pytest.raises(UserError, match="parameter 'code' changed since it ran"):
        recipe_journal(load(review, code=CODE + "# more\n"), "last")
    with pytest.raises(UserError, match="the model changed"):
        recipe_journal(load(review, model="/models/other.gguf"), "last")
    review.write_text(review.read_text().replace("concurrency: 1", "concurrency: 2", 1))
    with pytest.raises(UserError, match="the recipe changed since it ran"):
        recipe_journal(load(review), "last")


def test_a_resume_names_what_is_missing(review):
    with pytest.raises(UserError, match="no run of recipe 'parallel-review' to resume"):
        recipe_journal(load(review), "last")
    recipe_journal(load(review))
    with pytest.raises(UserError, match="--resume nope: no such run of recipe 'parallel-review'"):
        recipe_journal(load(review), "nope")


def test_the_journal_is_private_and_its_folder_too(review):
    journal = recipe_journal(load(review))
    journal.record(call_key("agent", "a", "p"), AgentResult(agent="a", output="x", finish_reason="stop"))
    journal.close()
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(runs_dir("parallel-review").stat().st_mode) == 0o700


@settings(max_examples=40, deadline=None)
@given(outputs=st.lists(st.text(max_size=30), min_size=1, max_size=6), cut=st.integers(0, 10_000),
       prompts=st.lists(st.sampled_from(["a", "b", "a\n", "é"]), min_size=1, max_size=6))
def test_a_torn_journal_gives_back_exactly_the_whole_records_in_order(tmp_path_factory, outputs, cut, prompts):
    """A crash mid-write leaves a torn last line: reading gives every whole record before it, each
    key's records in the order they were written (two calls with one key are answered in turn)."""
    folder = tmp_path_factory.mktemp("runs")
    journal = RunJournal.create(folder, {"recipe": "r"})
    keys = [call_key("map", "w", prompts[i % len(prompts)]) for i in range(len(outputs))]
    for key, text in zip(keys, outputs):
        journal.record(key, AgentResult(agent="w", output=text, finish_reason="stop"))
    journal.close()
    data = journal.path.read_bytes()
    header_end = data.index(b"\n") + 1
    torn = data[:max(header_end, len(data) - cut)]
    journal.path.write_bytes(torn)
    ends = [i for i, byte in enumerate(data) if byte == ord("\n")][1:]  # each record's line end
    whole = sum(1 for end in ends if end <= len(torn))  # records whose JSON is all there (a newline may be cut)
    replay = RunJournal.resume(journal.path, {"recipe": "r"})
    for key, text in list(zip(keys, outputs))[:whole]:  # every whole record, each key's in writing order
        result = replay.take(key)
        assert result is not None and result.output == text and result.resumed == journal.run
    assert all(replay.take(k) is None for k in set(keys))  # and nothing else
    replay.record(keys[0], AgentResult(agent="w", output="after", finish_reason="stop"))  # appends on a line of its own
    replay.close()
    again = RunJournal.resume(journal.path, {"recipe": "r"})
    assert sum(len(v) for v in again.held.values()) == whole + 1


@settings(max_examples=50, deadline=None)
@given(a=st.tuples(st.sampled_from(["run", "agent", "map"]), st.text(max_size=8), st.text(max_size=40)),
       b=st.tuples(st.sampled_from(["run", "agent", "map"]), st.text(max_size=8), st.text(max_size=40)))
def test_a_call_key_is_its_inputs(a, b):
    assert (call_key(*a) == call_key(*b)) == (a == b)
    assert call_key(*a, {"type": "object"}) != call_key(*a)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_squad_run_stopped_by_a_signal_is_resumed_by_the_cli_sending_only_the_rest(review, engine, state, capsys,
                                                                                   tmp_path, sig):
    """``squad run`` (a process) is stopped by SIGTERM, or killed by SIGKILL (no handler runs, the journal's last
    line may be torn, the lock is the kernel's to drop), while the review's map runs; ``squad run --resume``
    sends only the calls its journal does not hold and says which it did not send."""
    engine.token_delay = 0.05  # long enough to stop it mid-run
    env = {**os.environ, "SQUAD_STATE_DIR": str(state), "PYTHONPATH": str(ROOT / "src")}
    code = tmp_path / "code.py"
    code.write_text(CODE)
    argv = [sys.executable, "-m", "squad", "run", str(review), "-p", f"code=@{code}", "--url", engine.base_url,
            "--quiet"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        folder = state / "runs" / "parallel-review"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # bounded: until the journal holds two calls
            found = list(folder.glob("*.jsonl")) if folder.is_dir() else []
            if found and len(calls_of(found[0])) >= 2:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the run recorded no 2 calls in 120 s")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it left in its group (nothing, if all is well)
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, err.decode()
        assert b"--resume" in err, err.decode()
    else:
        assert proc.returncode == -signal.SIGKILL
    recorded = calls_of(found[0])
    total = 3 * 5 + 1
    engine.requests.clear()
    engine.token_delay = 0.0
    code_, out, err2 = squad(capsys, "run", review, "-p", f"code=@{code}", "--url", engine.base_url, "--resume",
                             "--json")
    assert code_ == 0, err2
    data = json.loads(out)
    assert len(engine.requests) == total - len(recorded)
    assert data["run"] == found[0].stem and len(data["resumed"]) == len(recorded)


async def test_a_squad_of_ones_own_resumes_a_map_through_resumable(tmp_path):
    """Python without a recipe: ``Resumable(squad, journal)`` records each map item as it ends; a map
    stopped after 2 of 5 items sends only the other 3 when run again on the resumed journal, under
    their own item numbers."""
    from squad.runtime.agent import Agent
    from squad.runtime.journal import Resumable
    from squad.runtime.squad import Squad

    prompts = [f"summarize part {i}" for i in range(5)]
    identity = {"model": "fake", "input": "parts"}
    async with FakeEngine(slots=1) as fe:
        journal = RunJournal.create(tmp_path, identity, name="mine")
        async with Squad([Agent(name="w", max_tokens=8)], engine=fe.info) as sq:
            with anyio.CancelScope() as scope:
                def stop(i, result) -> None:
                    if len([1 for held in read_journal(journal.path)[1].values() for _ in held]) == 2:
                        scope.cancel()
                await Resumable(sq, journal).map("w", prompts, max_concurrency=1,
                                                 on_result=stop)
        assert scope.cancelled_caught
        with pytest.raises(UserError, match="open for writing in this process .*close"):
            RunJournal.resume(journal.path, identity)  # one writer at a time, even in one process
        journal.close()
        fe.requests.clear()
        again = RunJournal.resume(journal.path, identity)
        async with Squad([Agent(name="w", max_tokens=8)], engine=fe.info) as sq:
            ops = Resumable(sq, again)
            results = await ops.map("w", prompts, max_concurrency=1)
    assert [r["messages"][-1]["content"] for r in fe.requests] == prompts[2:]
    assert [r.item for r in results] == [0, 1, 2, 3, 4] and ops.resumed == ["w[0]", "w[1]"]
    assert [bool(r.resumed) for r in results] == [True, True, False, False, False]
    with pytest.raises(UserError, match="the input changed"):
        RunJournal.resume(journal.path, {"model": "fake", "input": "other parts"})


def test_a_recipe_keeps_its_last_runs_journals_only(review, monkeypatch):
    import squad.recipes.resume as resume

    monkeypatch.setattr(resume, "KEEP_RUNS", 3)
    made = []
    for i in range(5):
        made.append(recipe_journal(load(review)).path)
        os.utime(made[-1], (1000 + i, 1000 + i))  # each older than the next
    kept = sorted(runs_dir("parallel-review").glob("*.jsonl"))
    assert set(kept) == set(made[-3:])


def test_resume_last_takes_this_recipe_files_run_when_another_recipe_shares_its_name(review, tmp_path):
    """Two recipe files with one ``name:`` share a runs folder: ``--resume`` (last) resumes this
    file's newest run, not the other file's newer one refused as 'the recipe changed'."""
    other = tmp_path / "other" / "review.yaml"
    other.parent.mkdir()
    (other.parent / "agents").mkdir()
    (other.parent / "agents" / "reviewers.yaml").write_text((review.parent / "agents" / "reviewers.yaml").read_text())
    other.write_text(review.read_text().replace("concurrency: 1", "concurrency: 2", 1))
    mine = recipe_journal(load(review)).path
    theirs = recipe_journal(load(other)).path
    os.utime(mine, (1000, 1000))  # the other recipe's run is the newer
    assert recipe_journal(load(review), "last").path == mine
    assert recipe_journal(load(other), "last").path == theirs
    review.write_text(review.read_text().replace("concurrency: 1", "concurrency: 3", 1))
    with pytest.raises(UserError, match="the recipe changed since it ran"):  # no run of it as it is now
        recipe_journal(load(review), "last")


NON_ANSWER_FAILS = """\
name: strict
params:
  xs: {type: list, default: ["one", "CUT two", "three"]}
agents:
  lead: {instructions: Lead., max_tokens: 64}
  w: {instructions: Work., max_tokens: 64}
main: lead
flow:
  - id: first
    agent: w
    non_answers: {truncated: fail}
    prompt: "CUT {{ params.xs | join(' ') }}"
"""


@pytest.mark.parametrize("flow", [
    "",  # the single call above
    "  - id: each\n    agent: w\n    map: params.xs\n    non_answers: {truncated: fail}\n    prompt: '{{ item }}'\n",
], ids=["step", "map"])
async def test_an_answer_its_step_fails_on_is_not_reused_by_a_resume(tmp_path, monkeypatch, flow):
    """``non_answers: {truncated: fail}`` makes a cut answer a failure: like any failed call, a resume sends it
    again (the engine may answer in full this time) instead of replaying the failure from the journal."""
    monkeypatch.setenv("SQUAD_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "strict.yaml"
    text = NON_ANSWER_FAILS if not flow else NON_ANSWER_FAILS.replace(
        "    prompt: \"CUT {{ params.xs | join(' ') }}\"\n", "    prompt: \"{{ params.xs | length }} items\"\n") + flow
    path.write_text(text)
    cut = {"on": True}

    def reply(body: dict) -> Reply:
        asked = body["messages"][-1]["content"]
        return Reply(content="part", finish_reason="length") if "CUT" in asked and cut["on"] else Reply(content="all")

    async with FakeEngine(slots=3, n_ctx=4096) as fe:
        fe.responder = reply
        try:  # the single step raises; the map's collect policy lets the run finish with the item failed
            first = await run_recipe(load_recipe(path, {}), engine=fe.info,
                                     journal=recipe_journal(load_recipe(path, {})))
            assert first.errors
        except AgentRunError:
            pass
        cut["on"] = False
        sent = len(fe.requests)
        run = await run_recipe(load_recipe(path, {}), engine=fe.info, journal=recipe_journal(load_recipe(path, {}),
                                                                                                "last"))
    again = [r["messages"][-1]["content"] for r in fe.requests[sent:]]
    assert len(again) == 1 and "CUT" in again[0]  # only the call that failed, sent again
    assert all(r.outcome == "ok" for _, r in run.results)


# --- one writer at a time ------------------------------------------------------------------------------------

_HOLD = """
import sys
from pathlib import Path
from squad.runtime.journal import RunJournal
journal = RunJournal.resume(Path(sys.argv[1]), {"recipe": "r"})
print("holding", flush=True)
sys.stdin.readline()
journal.close()
print("let go", flush=True)
sys.stdin.readline()
"""


def _holder(path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding", proc.stderr
    return proc


def test_two_resumes_of_one_run_at_once_the_second_is_refused_naming_the_first(tmp_path):
    """A run resumed by one process cannot be resumed by another until the first lets go: the second gets a
    clear error naming the first's pid, and writes nothing to the journal."""
    journal = RunJournal.create(tmp_path / "runs", {"recipe": "r"})
    journal.record(call_key("map", "w", "p"), AgentResult(agent="w", output="x", finish_reason="stop"))
    journal.close()
    proc = _holder(journal.path)
    try:
        before = journal.path.read_bytes()
        with pytest.raises(UserError, match=rf"being written by process {proc.pid} .*kill {proc.pid}"):
            RunJournal.resume(journal.path, {"recipe": "r"})
        assert journal.path.read_bytes() == before  # the refused one wrote nothing
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "let go"
        again = RunJournal.resume(journal.path, {"recipe": "r"})  # the first let go: this one may
        assert again.recorded == 1
        again.close()
    finally:
        proc.kill()
        proc.wait()


def test_a_holder_killed_mid_run_does_not_lock_its_run_forever(tmp_path):
    """SIGKILL leaves no chance to clean up: the kernel drops the lock with the process, so the run resumes."""
    journal = RunJournal.create(tmp_path / "runs", {"recipe": "r"})
    journal.close()
    proc = _holder(journal.path)
    proc.kill()
    proc.wait()
    again = RunJournal.resume(journal.path, {"recipe": "r"})
    assert again.resumed
    again.close()


def test_a_run_still_going_cannot_be_resumed_beside_it(tmp_path):
    """The process that created the journal holds it until it closes: a resume meanwhile names that process;
    a resume with a changed recipe still says what changed (that check needs no lock)."""
    journal = RunJournal.create(tmp_path / "runs", {"recipe": "r"})
    with pytest.raises(UserError, match=rf"open for writing in this process \(pid {os.getpid()}\)"):
        RunJournal.resume(journal.path, {"recipe": "r"})
    with pytest.raises(UserError, match="the recipe changed since it ran"):
        RunJournal.resume(journal.path, {"recipe": "other"})
    journal.close()
    with RunJournal.resume(journal.path, {"recipe": "r"}) as again:
        assert again.resumed


def test_squad_run_resume_beside_the_run_still_going_is_refused_before_any_call(review, engine, state, capsys,
                                                                                tmp_path):
    """``squad run`` is going (a process); ``squad run --resume`` in another terminal exits 2 with an error
    naming that process and leaves the journal as the first writes it."""
    engine.token_delay = 0.05
    env = {**os.environ, "SQUAD_STATE_DIR": str(state), "PYTHONPATH": str(ROOT / "src")}
    code = tmp_path / "code.py"
    code.write_text(CODE)
    argv = [sys.executable, "-m", "squad", "run", str(review), "-p", f"code=@{code}", "--url", engine.base_url,
            "--quiet"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        folder = state / "runs" / "parallel-review"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # bounded: until the run has recorded a call
            found = list(folder.glob("*.jsonl")) if folder.is_dir() else []
            if found and calls_of(found[0]):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the run recorded no call in 120 s")
        writer = json.loads(found[0].read_text().splitlines()[0])["pid"]
        code_, _, err = squad(capsys, "run", review, "-p", f"code=@{code}", "--url", engine.base_url, "--resume")
        assert code_ == 2 and "Traceback" not in err
        assert f"being written by process {writer}" in " ".join(err.split()), err
        assert not [line for line in found[0].read_text().splitlines() if '"resume"' in line]  # it wrote nothing
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
