"""The @mention parser as a table: input -> dispatches (agent, text), unknown, remainder."""

import pytest

from squad.errors import MentionError
from squad.mention import parse_mentions

KNOWN = ["security", "style", "Lead-Dev", "qa_2"]

DIFF = "```diff\n+ x = @style\n```"

CASES = [
    # one sentence, two agents: each gets the sentence, mention tokens stripped
    ("@security @style review this diff", [("security", "review this diff"), ("style", "review this diff")], [], ""),
    # shared context (the code block) goes to both; mentions inside the fence are not mentions
    (
        f"@security @style review this diff:\n{DIFF}",
        [("security", f"review this diff:\n{DIFF}"), ("style", f"review this diff:\n{DIFF}")],
        [],
        DIFF,
    ),
    # sentences addressed to one agent do not reach the other
    (
        "Please look. @security check auth. @style check names!",
        [("security", "Please look. check auth."), ("style", "Please look. check names!")],
        [],
        "Please look.",
    ),
    # lines are units too
    ("@security line one\n@style line two\nshared", [("security", "line one\nshared"), ("style", "line two\nshared")], [], "shared"),
    # leading mentions with separators are dropped
    ("@security, @style: go", [("security", "go"), ("style", "go")], [], ""),
    ("@security and @style check", [("security", "check"), ("style", "check")], [], ""),
    # a mid-sentence mention becomes the bare name; case-insensitive match, declared name returned
    ("ask @SECURITY about it", [("security", "ask SECURITY about it")], [], ""),
    # trailing punctuation is not part of the name
    ("thanks @style.", [("style", "thanks style.")], [], ""),
    ("(@security) and [@qa_2]?", [("security", "(security) and [qa_2]?"), ("qa_2", "(security) and [qa_2]?")], [], ""),
    ('"@lead-dev", please', [("Lead-Dev", '"lead-dev", please')], [], ""),
    # duplicates dispatched once
    ("@style one. @style two.", [("style", "one. two.")], [], ""),
    # not mentions: e-mail, address-like, inline code, mid-word, fenced code
    ("mail a@security.com or @security.com now", [], [], "mail a@security.com or @security.com now"),
    ("use `@style` here", [], [], "use `@style` here"),
    ("foo@style bar", [], [], "foo@style bar"),
    ("~~~\n@security\n~~~", [], [], "~~~\n@security\n~~~"),
    # whole-name match only: @styles is unknown, with a suggestion
    ("@styles fix it", [], [("styles", ("style",))], "@styles fix it"),
    ("@stlye and @nobody-here", [], [("stlye", ("style",)), ("nobody-here", ())], "@stlye and @nobody-here"),
    # no mention at all
    ("plain text {\"a\": 1}", [], [], 'plain text {"a": 1}'),
]


@pytest.mark.parametrize(("text", "dispatches", "unknown", "remainder"), CASES)
def test_mention_table(text, dispatches, unknown, remainder):
    parsed = parse_mentions(text, KNOWN)
    assert [(d.agent, d.text) for d in parsed.dispatches] == dispatches
    assert [(u.name, u.suggestions) for u in parsed.unknown] == unknown
    assert parsed.remainder == remainder


def test_check_raises_mention_error_with_suggestion():
    parsed = parse_mentions("@reviwer look", ["reviewer", "lead"])
    with pytest.raises(MentionError) as info:
        parsed.check(["reviewer", "lead"])
    assert str(info.value) == "unknown agent '@reviwer'; did you mean 'reviewer'? (known agents: lead, reviewer)"


def test_check_passes_when_all_known():
    parsed = parse_mentions("@lead go", ["lead"])
    assert parsed.check() is parsed
    assert parsed.agents == ["lead"]
