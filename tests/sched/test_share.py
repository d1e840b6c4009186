"""squad.sched.share without an engine: sharing never changes a prompt (I2), groups are only what
members really begin with (any subset), and every failure of the save/restore path falls back to an
unpinned call and says why (httpx.MockTransport as the engine)."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from squad.engine.llama import slot_save_args
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.sched.share import (
    MIN_SHARED_CHARS,
    SEPARATOR,
    CommonPrefix,
    ShareGroup,
    board_group,
    common_prefixes,
    share_mode,
    sharing,
    with_shared,
)
from squad.testing import ScriptedEngine

FILE = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(60))


def messages(system: str, prompt: str) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


# --- what is common -------------------------------------------------------------------------

def test_the_same_prompt_to_agents_with_the_same_instructions_is_common_whole():
    found = common_prefixes([("Review.", "Review:\n" + FILE)] * 3)
    assert found == [([0, 1, 2], CommonPrefix("Review.", "Review:\n" + FILE, whole=True))]


def test_a_file_after_different_instructions_is_not_common():
    """The issue's case: reviewers with their own instructions, then the same file: they part at
    once, so nothing is shared and nothing is moved."""
    members = [(f"You review for {n}.", "Review:\n" + FILE) for n in ("security", "style", "tests")]
    assert common_prefixes(members) == []


def test_two_of_three_share_among_the_two():
    members = [("Review.", "Review:\n" + FILE), ("Review.", "Other text entirely"), ("Review.", "Review:\n" + FILE)]
    assert common_prefixes(members) == [([0, 2], CommonPrefix("Review.", "Review:\n" + FILE, whole=True))]


def test_a_declared_shared_context_is_a_common_system_start():
    members = [(with_shared(FILE, f"You review for {n}."), "Review the code above.") for n in ("a", "bb")]
    [(who, prefix)] = common_prefixes(members)
    assert who == [0, 1] and not prefix.whole and prefix.system.startswith(FILE + SEPARATOR)


def test_a_short_common_part_is_left_alone():
    assert common_prefixes([("", "x" * (MIN_SHARED_CHARS - 1) + "1"), ("", "x" * (MIN_SHARED_CHARS - 1) + "2")]) == []


text = st.text(alphabet="ab\n", max_size=40)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["", "S", "S" * 30, "T" * 30]), text, text), min_size=0, max_size=7),
       st.sampled_from(["", "a" * 40, "b\n" * 20]), st.integers(min_value=1, max_value=60))
def test_every_group_is_a_prefix_its_members_really_hold(rows, common, min_chars):
    """For any fan-out: groups are disjoint, of two or more, at least ``min_chars`` long, and every
    member's messages as sent begin with its group's prefix (so restoring it changes nothing)."""
    members = [(system, head + common + tail) for system, head, tail in rows]
    found = common_prefixes(members, min_chars=min_chars)
    seen: set[int] = set()
    for who, prefix in found:
        assert len(who) >= 2 and not seen & set(who)
        seen |= set(who)
        assert len(prefix.system.strip()) + len(prefix.user.strip()) >= min_chars
        for i in who:
            assert prefix.held_by(messages(*members[i])), (members[i], prefix)
    # an identical pair long enough is never left out
    for i in range(len(members)):
        for j in range(i + 1, len(members)):
            if members[i] == members[j] and len(members[i][0].strip()) + len(members[i][1].strip()) >= min_chars:
                assert i in seen and j in seen


# --- the messages the engine receives -------------------------------------------------------

fanout = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]),
                            st.sampled_from(["", "Review:\n", "Which tests:\n"]),
                            st.sampled_from(["", FILE, FILE[:700], "short"])), min_size=1, max_size=5)


def own(agent: str) -> str:
    return f"You are reviewer {agent}." if agent != "c" else ""


async def sent(mode: str, calls: list[tuple[str, str]], shared: str | None) -> list[str]:
    agents = [Agent(name=n, instructions=own(n), max_tokens=8) for n in ("a", "b", "c")]
    engine = ScriptedEngine(responder=lambda req: "ok", slots=3, n_ctx=65536)
    async with Squad(agents, engine=engine, shared_input=mode) as sq:
        await sq.parallel(calls, check=True, shared=shared)
    return sorted(json.dumps(r.messages) for r in engine.requests)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fanout, st.sampled_from([None, FILE]))
def test_the_engine_gets_the_same_messages_with_sharing_on_or_off(rows, shared):
    """I2: for any fan-out, sharing on and off send the same messages, and they are the author's:
    the prompt as written in the user message, the declared ``shared`` context (if any) first in
    the system message."""
    calls = [(agent, head + body) for agent, head, body in rows]

    async def both() -> tuple[list, list]:
        return await sent("prefix", calls, shared), await sent("off", calls, shared)

    on, off = anyio.run(both)
    assert on == off == sorted(json.dumps(messages(with_shared(shared, own(a)), p)) for a, p in calls)


def test_share_modes_old_names_map_to_the_new_ones():
    assert [share_mode(m) for m in ("prefix", "first", "off", "order")] == ["prefix", "prefix", "off", "off"]
    with pytest.raises(ValueError):
        share_mode("moved")


def test_a_board_gives_a_member_the_group_of_the_declared_text_its_system_starts_with():
    with sharing([FILE, "tiny"], "prefix"):
        assert board_group(with_shared(FILE, "You review.")) is not None
        assert board_group("You review.\n" + FILE) is None  # held, but not first: nothing is shared
        assert board_group("tiny prompt") is None  # under MIN_SHARED_CHARS: not on the board
    assert board_group(with_shared(FILE, "x")) is None
    with sharing([FILE], "off"):
        assert board_group(FILE) is None


def test_slot_save_args_end_the_directory_with_a_slash(tmp_path):
    assert slot_save_args(tmp_path) == ["--slot-save-path", f"{tmp_path}/", "--no-cache-idle-slots"]


# --- prefill once, and its fallbacks ---------------------------------------------------------

def engine(save_status: int = 200, restore_status: int = 200, seen: list | None = None,
           prefill_s: float = 0.0) -> httpx.AsyncClient:
    async def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if seen is not None:
            seen.append((path, request.url.params.get("action"), json.loads(request.content or b"{}")))
        if path == "/apply-template":
            msgs = json.loads(request.content)["messages"]
            return httpx.Response(200, json={"prompt": "<s>" + "|".join(m["content"] for m in msgs)})
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": [ord(c) for c in json.loads(request.content)["content"]]})
        if path == "/completion":
            await anyio.sleep(prefill_s)
            return httpx.Response(200, json={"content": "x"})
        if path.startswith("/slots/"):
            status = save_status if request.url.params.get("action") == "save" else restore_status
            return httpx.Response(status, json={} if status == 200 else {"error": {"message": "no"}})
        return httpx.Response(404)

    return httpx.AsyncClient(transport=httpx.MockTransport(handle), base_url="http://engine")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


PREFIX = CommonPrefix(FILE, whole=False)


@pytest.mark.anyio
async def test_first_member_saves_the_others_restore(tmp_path):
    seen: list = []
    group = ShareGroup(PREFIX)
    async with engine(seen=seen) as http:
        assert await group.probe(http) == len("<s>" + FILE) - 2
        results = []
        async with anyio.create_task_group() as tg:
            for slot in range(3):
                async def one(slot: int = slot) -> None:
                    results.append((slot, await group.enter(http, slot, str(tmp_path))))
                tg.start_soon(one)
    assert all(ok for _, ok in results)
    actions = [(p, a) for p, a, _ in seen if p.startswith("/slots/")]
    assert [x for x in actions if x[1] == "save"] == [("/slots/0", "save")]  # one save: the first member's slot
    assert sum(a == "restore" for _, a in actions) == 2
    warm = next(body for p, _, body in seen if p == "/completion")
    assert warm["id_slot"] == 0 and warm["n_predict"] == 1 and len(warm["prompt"]) == len(group.tokens or [])


@pytest.mark.anyio
async def test_the_probe_renders_the_members_tools():
    seen: list = []
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    async with engine(seen=seen) as http:
        await ShareGroup(PREFIX).probe(http, tools)
    assert all(body.get("tools") == tools for p, _, body in seen if p == "/apply-template")


@pytest.mark.anyio
@pytest.mark.parametrize("save, restore", [(501, 200), (200, 400)])
async def test_a_refused_save_or_restore_sends_the_call_unpinned_and_says_why(tmp_path, save, restore):
    group = ShareGroup(PREFIX)
    told: list[str] = []
    async with engine(save, restore) as http:
        await group.probe(http)
        first = await group.enter(http, 0, str(tmp_path), skip=told.append)
        second = await group.enter(http, 1, str(tmp_path), skip=told.append)
    assert first is (save == 200)
    assert second is False
    assert len(told) == 1 and ("save" in told[0] if save != 200 else "restore" in told[0])


@pytest.mark.anyio
async def test_a_prefill_past_its_deadline_falls_back_and_says_so(tmp_path):
    group = ShareGroup(PREFIX)
    told: list[str] = []
    async with engine(prefill_s=5.0) as http:
        await group.probe(http)
        assert await group.enter(http, 0, str(tmp_path), deadline_s=0.01, skip=told.append) is False
        assert await group.enter(http, 1, str(tmp_path), deadline_s=0.01, skip=told.append) is False
    assert len(told) == 1 and "deadline" in told[0]
    assert group.file is None


@pytest.mark.anyio
async def test_no_slot_save_directory_means_no_sharing():
    group = ShareGroup(PREFIX)
    async with engine() as http:
        await group.probe(http)
        assert await group.enter(http, 0, None) is False


def test_a_member_claims_only_a_call_that_holds_the_prefix():
    group = ShareGroup(CommonPrefix("sys", "Review:\n" + FILE))
    group.join("a#1")
    group.join("a#2")
    assert not group.claim("a#1", messages("sys", "Changed:\n" + FILE))
    assert not group.claim("a#1", messages("sys", "Review:\n" + FILE))  # once per member
    assert group.claim("a#2", messages("sys", "Review:\n" + FILE + "\nmore"))
    assert not ShareGroup(PREFIX, mode="off").claim("x")


def test_squad_plan_says_prompts_go_as_written_and_what_a_shared_context_does(tmp_path):
    from pathlib import Path

    from squad.cli.plan import sharing_lines
    from squad.recipes import load_recipe

    root = Path(__file__).resolve().parents[2]
    recipe = load_recipe(root / "recipes" / "review.yaml", {"code": FILE})
    launched = sharing_lines(recipe)
    assert "prompts sent as written" in launched[0] and "prefilled once" in launched[1]
    assert "--slot-save-path" in sharing_lines(recipe, attached=True)[1]
    (tmp_path / "r.yaml").write_text(SHARED_RECIPE)
    declared = sharing_lines(load_recipe(tmp_path / "r.yaml", {"code": FILE}))
    assert "system = [shared context]" in declared[0]


SHARED_RECIPE = """\
name: shared-first
params:
  code: {type: string}
agents:
  lead: {instructions: "Merge."}
  a: {instructions: "You review for security."}
  b: {instructions: "You review for style."}
main: lead
flow:
  - id: reviews
    parallel:
      - {id: a, agent: a, shared: "{{ params.code }}", prompt: "Review the code above."}
      - {id: b, agent: b, shared: "{{ params.code }}", prompt: "Review the code above."}
"""
