"""Agent definitions: validation errors a user can act on, squad consistency, instructions."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from squad.errors import RecipeError, UserError
from squad.runtime.agent import Agent, Sampling, check_squad


def test_defaults_and_sampling_params() -> None:
    a = Agent(name="lead", sampling={"temperature": 0.2, "seed": 7})
    assert (a.budget, a.max_tokens, a.fixed_budget) == ("auto", 256, None)
    assert a.sampling.as_params() == {"temperature": 0.2, "seed": 7}
    assert Sampling().as_params() == {}


@pytest.mark.parametrize("name", ["a", "security", "code-review", "w_2", "ü", "리뷰어", "レビュー", "समीक्षक"])
def test_good_names(name: str) -> None:
    assert Agent(name=name).name == name


@pytest.mark.parametrize("name", ["", "2x", "has space", "@x", "a.b", "x-", "리뷰어!"])
def test_bad_names_say_what_is_allowed(name: str) -> None:
    with pytest.raises(UserError, match="letters, digits"):
        Agent.build(name=name)


def test_max_tokens_must_leave_room_for_the_prompt() -> None:
    with pytest.raises(UserError, match=r"max_tokens \(512\) must be below budget \(512\)"):
        Agent.build(name="x", budget=512, max_tokens=512)


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(ValidationError, match="extra"):
        Agent(name="x", budgett=10)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        Sampling(temprature=0.1)  # type: ignore[call-arg]


def test_agent_cannot_list_itself() -> None:
    with pytest.raises(UserError, match="lists itself"):
        Agent.build(name="x", agents=["x"])


def test_squad_checks_names_sub_agents_tools_and_cycles() -> None:
    lead = Agent(name="lead", agents=["a"])
    a = Agent(name="a")
    assert set(check_squad([lead, a])) == {"lead", "a"}
    with pytest.raises(UserError, match="two agents are named 'a'"):
        check_squad([a, Agent(name="a")])
    with pytest.raises(UserError, match="sub-agent 'b', which is not in the squad"):
        check_squad([Agent(name="lead", agents=["b"]), a])
    with pytest.raises(UserError, match="tool 'grep', which is not registered"):
        check_squad([Agent(name="x", tools=["grep"])])
    with pytest.raises(UserError, match="cycle: a -> b -> a"):
        check_squad([Agent(name="a", agents=["b"]), Agent(name="b", agents=["a"])])


def test_instructions_are_a_sandboxed_strict_template() -> None:
    sub = Agent(name="style", description="checks style")
    lead = Agent(name="lead", instructions="I am {{ name }}. Helpers: {% for a in agents %}@{{ a.name }} ({{ "
                                           "a.description }}){% endfor %}. Topic {{ topic }}. JSON {\"k\": 1}")
    text = lead.system_prompt([sub], {"topic": "diffs"})
    assert text == 'I am lead. Helpers: @style (checks style). Topic diffs. JSON {"k": 1}'
    with pytest.raises(RecipeError, match="topic"):
        lead.system_prompt([sub], {})
