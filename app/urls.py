"""The one check of an endpoint URL a user gives (``run --endpoint``, ``monitor --endpoint``) and of
an API key sent with it. A URL that passes can be joined with ``/v1/...`` or ``/metrics`` and handed
to urllib and aiohttp without either raising on it; anything else is refused with one line that
says what is wrong, before any connection or engine launch."""

from __future__ import annotations

from urllib.parse import urlsplit

from app.errors import UserError

SCHEMES = ("http", "https")
MAX_URL_CHARS = 2048
MAX_API_KEY_CHARS = 4096
EXAMPLE = "e.g. http://127.0.0.1:8000"


class BadEndpoint(UserError):
    """An endpoint URL or API key that cannot be used, with the reason."""


def _control_or_space(text: str) -> str | None:
    for char in text:
        if char.isspace() or ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0:
            return "a space" if char == " " else f"the control character {char!r}"
    return None


def check_endpoint(url: str) -> str:
    """``url`` without a trailing ``/``, or :class:`BadEndpoint`. Accepts ``http(s)://host[:port][/path]``
    (a path for servers behind a prefix, or a ``/metrics`` URL); refuses an empty string, text that
    is not a URL, other schemes, a missing host, a bad port, spaces, control characters, non-ASCII
    text, a query or a fragment."""
    if not url:
        raise BadEndpoint(f"the endpoint URL is empty ({EXAMPLE})")
    if len(url) > MAX_URL_CHARS:
        raise BadEndpoint(f"the endpoint URL is {len(url):,} characters long; at most {MAX_URL_CHARS:,}")
    bad = _control_or_space(url)
    if bad:
        raise BadEndpoint(f"the endpoint URL {url!r} contains {bad}")
    if not url.isascii():
        raise BadEndpoint(f"the endpoint URL {url!r} is not ASCII (write an international host name as xn--...)")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number or out of range
        host = parts.hostname
    except ValueError as exc:
        raise BadEndpoint(f"the endpoint URL {url!r} is not a valid URL: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise BadEndpoint(f"the endpoint URL {url!r} is not an http(s) URL ({EXAMPLE})")
    if not host:
        raise BadEndpoint(f"the endpoint URL {url!r} has no host ({EXAMPLE})")
    if port == 0:
        raise BadEndpoint(f"the endpoint URL {url!r} has port 0")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise BadEndpoint(f"the endpoint URL {url!r} has a query or fragment; give the server's base URL")
    return url.rstrip("/")


def check_api_key(key: str) -> str:
    """An API key that can go into an ``Authorization: Bearer`` header: no spaces, no control
    characters (a newline would end the header and start another), ASCII, of a sane length."""
    if not key:
        raise BadEndpoint("the API key is empty")
    if len(key) > MAX_API_KEY_CHARS:
        raise BadEndpoint(f"the API key is {len(key):,} characters long; at most {MAX_API_KEY_CHARS:,}")
    if _control_or_space(key) or not key.isascii():
        raise BadEndpoint("the API key contains a space, a control character or non-ASCII text")
    return key
