"""An engine's URL, checked once for every way it is given (``--url``, ``EngineSpec(url=)``, a
recipe's ``engines:``), so a malformed one is a clear error where it was written, never a
traceback from the HTTP client later."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["check_engine_url", "engine_key"]


def check_engine_url(url: object) -> str:
    """``url`` as given when it is ``http(s)://HOST[:PORT][/PATH]`` with a numeric port in
    1..65535 and a well-formed host (an IPv6 address in brackets). Raises ``ValueError`` saying
    what is wrong and how to write it."""
    text = str(url)
    if not text.lower().startswith(("http://", "https://")):
        bare = text.split("://", 1)[-1].removeprefix("//") or "127.0.0.1:8080"
        raise ValueError(f"url {text!r}: write the engine's address with its scheme, http://HOST:PORT, "
                         f"e.g. http://{bare}")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port could not be cast to integer value", out of range
        raise ValueError(f"url {text!r} is not a valid address ({exc}); write http://HOST:PORT, "
                         "e.g. http://127.0.0.1:8080 or http://[::1]:8080") from None
    if not parts.hostname:
        raise ValueError(f"url {text!r} names no host; write http://HOST:PORT, e.g. http://127.0.0.1:8080")
    if port == 0:
        raise ValueError(f"url {text!r}: port 0 is not a port an engine listens on; write 1..65535")
    if any(c.isspace() for c in text):
        raise ValueError(f"url {text!r} contains a space; write http://HOST:PORT")
    return text


_LOOPBACK = {"localhost", "localhost.localdomain", "127.0.0.1", "::1", "0:0:0:0:0:0:0:1"}
_DEFAULT_PORTS = {"http": 80, "https": 443}


def engine_key(url: str) -> str:
    """The form every URL of one engine shares: ``engine_key("HTTP://LocalHost:8080/v1/")`` is
    ``"http://127.0.0.1:8080"``. Scheme and host lower-cased; the scheme's default port written
    out; a trailing ``/`` and ``/v1`` removed (squad adds ``/v1`` itself); the loopback names
    (``localhost``, ``*.localhost``, ``127.0.0.1``, ``::1``) one host. No DNS look-up: another
    name stays as written. A URL that does not parse is returned stripped."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return url.strip()
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower().rstrip(".")
    if host in _LOOPBACK or host.endswith(".localhost") or _this_machine(host):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    port = port or _DEFAULT_PORTS.get(scheme)
    path = parts.path.rstrip("/").removesuffix("/v1").rstrip("/")
    return f"{scheme}://{host}{f':{port}' if port else ''}{path}"


def _this_machine(host: str) -> bool:
    """True for 127.0.0.1 whatever its spelling: shorthand (``127.1``), ``::1``, the IPv4-mapped
    form (``::ffff:127.0.0.1``), and ``0.0.0.0``/``::`` (a connection to them reaches this machine).
    Other 127.x addresses are other addresses (a server may bind each)."""
    import ipaddress
    import socket

    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.inet_aton(host))  # 127.1, 0x7f.1: inet_aton's IPv4 shorthand
        except OSError:
            return False
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return ip.is_unspecified or str(ip) in ("127.0.0.1", "::1")  # 127.0.0.2 is another address
