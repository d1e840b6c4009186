"""squad.sched.share without an engine: the arrangement rule, group membership, and that every failure
of the save/restore path falls back to an unpinned call (httpx.MockTransport as the engine)."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from squad.engine.llama import slot_save_args
from squad.sched.share import (
    MIN_SHARED_CHARS,
    SHARED_MARK,
    Arrangement,
    ShareGroup,
    arrange,
    board_group,
    current_group,
    joined,
    sharing,
)

FILE = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(60))


def test_the_same_prompt_to_several_agents_is_shared_whole():
    found = arrange(["Review:\n" + FILE] * 3)
    assert found is not None and found.shared == "Review:\n" + FILE
    assert found.system("You review style.") == found.shared + "\n\n---\n\nYou review style."
    assert found.prompt("Review:\n" + FILE) == SHARED_MARK


def test_a_common_end_is_shared_from_a_line_start():
    found = arrange(["Review for security:\n" + FILE, "Which tests does this need:\n" + FILE])
    assert found is not None and found.shared == FILE
    assert found.prompt("Review for security:\n" + FILE) == "Review for security:\n" + SHARED_MARK


def test_short_or_single_prompts_are_sent_as_written():
    assert arrange(["Review:\n" + FILE]) is None
    assert arrange(["short a", "short a"]) is None
    assert arrange(["x" * MIN_SHARED_CHARS + "1", "y" * MIN_SHARED_CHARS + "1"]) is None


def test_only_a_members_first_call_goes_through_its_group():
    group = ShareGroup(Arrangement(FILE))
    with joined(group, "security#1"):
        assert current_group() is group
        assert group.claim("security#1") and not group.claim("security#1")
        assert not group.claim("helper#9")  # a sub-agent the member started is not a member
    assert current_group() is None
    assert not ShareGroup(Arrangement(FILE), mode="order").claim("x")


def test_a_board_gives_a_prompt_the_group_of_the_chunk_it_holds():
    chunk = FILE
    with sharing([chunk, "tiny"], "first"):
        assert board_group("part 1:\n" + chunk) is not None
        assert board_group("tiny prompt") is None  # under MIN_SHARED_CHARS: not on the board
    assert board_group("part 1:\n" + chunk) is None
    with sharing([chunk], "off"):
        assert board_group(chunk) is None


def test_slot_save_args_end_the_directory_with_a_slash(tmp_path):
    assert slot_save_args(tmp_path) == ["--slot-save-path", f"{tmp_path}/", "--no-cache-idle-slots"]


def engine(save_status: int = 200, restore_status: int = 200, seen: list | None = None) -> httpx.AsyncClient:
    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if seen is not None:
            seen.append((path, request.url.params.get("action"), json.loads(request.content or b"{}")))
        if path == "/apply-template":
            messages = json.loads(request.content)["messages"]
            return httpx.Response(200, json={"prompt": "<s>" + messages[0]["content"] + "|" + messages[1]["content"]})
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": [ord(c) for c in json.loads(request.content)["content"]]})
        if path == "/completion":
            return httpx.Response(200, json={"content": "x"})
        if path.startswith("/slots/"):
            status = save_status if request.url.params.get("action") == "save" else restore_status
            return httpx.Response(status, json={} if status == 200 else {"error": {"message": "no"}})
        return httpx.Response(404)

    return httpx.AsyncClient(transport=httpx.MockTransport(handle), base_url="http://engine")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_first_member_saves_the_others_restore(tmp_path):
    seen: list = []
    group = ShareGroup(Arrangement(FILE))
    async with engine(seen=seen) as http:
        assert await group.probe(http) == len("<s>" + FILE + "\n\n---\n\n") - 2
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
@pytest.mark.parametrize("save, restore", [(501, 200), (200, 400)])
async def test_a_refused_save_or_restore_sends_the_call_unpinned(tmp_path, save, restore):
    group = ShareGroup(Arrangement(FILE))
    async with engine(save, restore) as http:
        await group.probe(http)
        first = await group.enter(http, 0, str(tmp_path))
        second = await group.enter(http, 1, str(tmp_path))
    assert first is (save == 200)
    assert second is False
    if save != 200:
        assert group.failed and "save" in group.failed


@pytest.mark.anyio
async def test_no_slot_save_directory_means_no_sharing():
    group = ShareGroup(Arrangement(FILE))
    async with engine() as http:
        await group.probe(http)
        assert await group.enter(http, 0, None) is False


def test_squad_plan_states_the_order_and_the_attached_fallback():
    from pathlib import Path

    from squad.cli.plan import sharing_lines
    from squad.recipes import load_recipe

    root = Path(__file__).resolve().parents[2]
    recipe = load_recipe(root / "recipes" / "review.yaml", {"code": FILE})
    launched = sharing_lines(recipe)
    assert "system = [shared text]" in launched[0] and "prefilled once" in launched[1]
    assert "--slot-save-path" in sharing_lines(recipe, attached=True)[1]
