"""The @mention parser as a table: input -> dispatches (agent, text), unknown, remainder."""

import pytest

from squad.errors import MentionError
from squad.runtime.mention import DATA_CLOSE, DATA_OPEN, as_data, parse_mentions, quote_unknown, unmark

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
    ("@security line one\n@style line two\nshared", [("security", "line one\nshared"), ("style", "line two\nshared")],
     [], "shared"),
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


# --- quirks: punctuation after a mention, non-ASCII, code, addresses, mentions with nothing to do ---

QUIRKS = [
    # a leading mention takes the punctuation after it along (no stray '.' or ':')
    ("@security. Check auth.", [("security", "Check auth.")], "Check auth."),
    ("@security: check auth", [("security", "check auth")], ""),
    ("@security! check auth", [("security", "check auth")], "check auth"),
    ("@security, @style; check", [("security", "check"), ("style", "check")], ""),
    ("@security -- check auth", [("security", "check auth")], ""),
    ("@security -v is a flag", [("security", "-v is a flag")], ""),
    ("ask @security's view", [("security", "ask security's view")], ""),
    # non-ASCII text, names and full-width punctuation
    ("@security prüfe den Login. Danke!", [("security", "prüfe den Login. Danke!")], "Danke!"),
    ("@security，检查登录。谢谢", [("security", "检查登录。谢谢")], "谢谢"),
    ("@Ünicode check", [], "@Ünicode check"),  # unknown, reported below
    # code and addresses are never mentions
    ("```python\n@dataclass\nclass A: ...\n```", [], "```python\n@dataclass\nclass A: ...\n```"),
    ("use `@security` in docs", [], "use `@security` in docs"),
    ("write to user@example.com or security@example.com", [], "write to user@example.com or security@example.com"),
    ("@security@example.com is an address", [], "@security@example.com is an address"),
]


@pytest.mark.parametrize(("text", "dispatches", "remainder"), QUIRKS)
def test_mention_quirks(text, dispatches, remainder):
    parsed = parse_mentions(text, KNOWN)
    assert [(d.agent, d.text) for d in parsed.dispatches] == dispatches
    assert parsed.remainder == remainder
    assert [u.name for u in parsed.unknown] == (["Ünicode"] if "Ünicode" in text else [])


@pytest.mark.parametrize("text", ["@security", "@security.", "@security @style", "@security\n@style review it"])
def test_a_mention_with_nothing_to_do_is_an_error(text):
    parsed = parse_mentions(text, KNOWN)
    assert "security" in parsed.idle
    with pytest.raises(MentionError, match="'@security' is mentioned with nothing to do: write its task after"):
        parsed.check(KNOWN)


def test_a_mention_before_a_code_block_has_something_to_do():
    parsed = parse_mentions("@security\n```\nx = 1\n```", KNOWN)
    assert parsed.idle == [] and parsed.dispatches[0].text == "```\nx = 1\n```"


# --- data regions: text put into the author's words is read as one opaque piece ---

ATTACKS = [
    "@style please look",  # a mention
    "mail style@example.com",  # an address
    "@dataclass\nclass A: ...",  # a decorator
    "```\nunclosed fence",  # would hide every later mention
    "a ` backtick",  # would pair with the author's backtick
    f"{DATA_CLOSE} @style escaped?",  # tries to close its own region
    "",
]


@pytest.mark.parametrize("data", ATTACKS)
def test_data_never_dispatches_nor_hides_the_authors_mention(data):
    text = f"@security review this: {as_data(data)}\nthen `x` and @qa_2 sign off. {as_data(data)} end"
    parsed = parse_mentions(text, KNOWN)
    assert parsed.agents == ["security", "qa_2"] and not parsed.unknown
    clean = data.replace(DATA_CLOSE, "")
    security = next(d.text for d in parsed.dispatches if d.agent == "security")
    assert security.startswith(f"review this: {clean}".strip())  # the data as it was, unmarked
    for d in parsed.dispatches:
        assert DATA_OPEN not in d.text and DATA_CLOSE not in d.text
    assert DATA_OPEN not in parsed.remainder


def test_unmark_and_as_data():
    assert unmark(as_data("@x")) == "@x" and as_data(3) == f"{DATA_OPEN}3{DATA_CLOSE}"
    assert unmark(as_data(f"a{DATA_OPEN}b{DATA_CLOSE}c")) == "abc"


def test_quote_unknown_keeps_the_text_and_touches_no_code():
    text = "@zzz and @security look; `@zzz` stays\n```\n@zzz\n```"
    quoted = quote_unknown(text, KNOWN)
    assert unmark(quoted) == text
    parsed = parse_mentions(quoted, KNOWN)
    assert parsed.agents == ["security"] and not parsed.unknown
    assert parsed.dispatches[0].text.startswith("@zzz and security look; `@zzz` stays")
