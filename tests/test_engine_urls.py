"""An engine's URL is checked where it is written (``--url``, ``EngineSpec(url=)``, a recipe's
``engines:``): a malformed one is a clear error, never a traceback from the HTTP client."""

from __future__ import annotations

import pytest
from cli_support import squad

from squad.engine.urls import check_engine_url
from squad.errors import UserError
from squad.session import EngineSpec

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
