"""An engine's URL is checked where it is written (``--url``, ``EngineSpec(url=)``, a recipe's
``engines:``): a malformed one is a clear error, never a traceback from the HTTP client."""

from __future__ import annotations

import pytest

from cli_support import squad
from squad.engine.session import EngineSpec
from squad.engine.urls import check_engine_url
from squad.errors import UserError

BAD = [
    ("http://[::1", "Invalid IPv6 URL"),
    ("http://127.0.0.1:abc", "not a valid address"),
    ("http://127.0.0.1:99999", "not a valid address"),
    ("http://127.0.0.1:0", "port 0"),
    ("http://", "names no host"),
    ("htp:/x", "with its scheme"),
    ("127.0.0.1:8080", "e.g. http://127.0.0.1:8080"),
    ("http://127.0.0.1:80 80", "not a valid address"),
]


@pytest.mark.parametrize("url, says", BAD)
def test_a_malformed_url_is_a_clear_error_everywhere(url, says, capsys):
    with pytest.raises(ValueError, match="url "):
        check_engine_url(url)
    with pytest.raises(UserError) as exc:
        EngineSpec(url=url)
    assert says in str(exc.value)
    for argv in (("engine", "info", "--url", url), ("engine", "status", "--url", url)):
        code, out, err = squad(capsys, *argv)
        assert code == 2 and "Traceback" not in err and says in " ".join(err.replace("│", " ").split()), err


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "https://gpu-box", "http://[::1]:8080/v1",
                                 "http://localhost:11434/"])
def test_good_urls_pass_as_written(url):
    assert check_engine_url(url) == url
    assert EngineSpec(url=url).url == url


@pytest.mark.parametrize("a, b", [
    ("http://127.0.0.1:8080", "http://127.1:8080"),
    ("http://127.0.0.1:8080", "http://0.0.0.0:8080"),
    ("http://127.0.0.1:8080", "http://[::ffff:127.0.0.1]:8080"),
    ("http://127.0.0.1:8080", "HTTP://LocalHost:8080/v1/"),
    ("http://[::1]:8080", "http://localhost:8080"),
])
def test_spellings_of_this_machine_are_one_engine(a, b):
    from squad.engine.urls import engine_key

    assert engine_key(a) == engine_key(b)


def test_other_addresses_stay_other_engines():
    from squad.engine.urls import engine_key

    assert engine_key("http://127.0.0.2:8080") != engine_key("http://127.0.0.1:8080")
    assert engine_key("http://10.0.0.1:8080") != engine_key("http://127.0.0.1:8080")


def test_the_scheme_may_be_upper_case_and_another_scheme_gets_a_sound_hint():
    assert check_engine_url("HTTP://127.0.0.1:8080") == "HTTP://127.0.0.1:8080"
    with pytest.raises(ValueError, match=r"e\.g\. http://127\.0\.0\.1:1'?$"):
        check_engine_url("ftp://127.0.0.1:1")
