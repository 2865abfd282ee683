"""The one endpoint-URL validator (app.urls) and the terminal escaper (app.cli.terminal): whatever it accepts, every consumer (urllib, aiohttp's
yarl, the /metrics URL builder) takes without raising; whatever it refuses, it refuses with one
line. And the issue's cases by name."""

from __future__ import annotations

import unicodedata
import urllib.request
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from yarl import URL

from app.cli.terminal import safe
from app.telemetry.engine_metrics import metrics_url_from
from app.urls import BadEndpoint, check_api_key, check_endpoint
from tests.fuzz.hostile import checked_or_none, hostile_text, hostile_url


@given(url=hostile_url | st.text())
@settings(max_examples=400, deadline=None)
def test_accepted_urls_work_everywhere_and_refusals_are_one_line(url: str) -> None:
    checked = checked_or_none(check_endpoint, url)
    if checked is None:
        return
    parts = urlsplit(checked)
    assert parts.scheme in ("http", "https") and parts.hostname
    assert parts.port is None or 0 < parts.port < 65536
    assert not parts.query and not parts.fragment and not checked.endswith("/")
    assert checked.isascii() and not any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in checked)
    for path in ("/v1/models", "/v1/completions", "/version"):
        urllib.request.Request(checked + path)
        assert URL(checked + path).host
    URL(metrics_url_from(checked))


@given(key=hostile_text | st.text())
@settings(max_examples=200, deadline=None)
def test_api_keys_are_header_safe_or_refused(key: str) -> None:
    header = f"Bearer {checked_or_none(check_api_key, key) or ''}"  # a refused key: refused in one line
    assert "\n" not in header and "\r" not in header and header.isascii()


@pytest.mark.parametrize("url", ["", "not a url", "http://[::1", "http://a b", "ftp://127.0.0.1", "http://",
                                 "http:///v1", "127.0.0.1:8000", "localhost:8000", "http://127.0.0.1:8000\n",
                                 "http://127.0.0.1:8000\x1b[31m", "http://127.0.0.1:65536", "http://127.0.0.1:abc",
                                 "http://127.0.0.1:0", "http://127.0.0.1:8000/?x=1", "http://127.0.0.1:8000#f",
                                 "http://bücher.example", " http://127.0.0.1:8000", "http://h" + "x" * 3000])
def test_the_issue_urls_are_refused(url: str) -> None:
    with pytest.raises(BadEndpoint):
        check_endpoint(url)


@pytest.mark.parametrize(("url", "expected"), [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"), ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
    ("https://gpu-box.example:443/vllm/", "https://gpu-box.example:443/vllm"), ("http://[::1]:8000", "http://[::1]:8000"),
    ("http://localhost:8000/metrics", "http://localhost:8000/metrics"),
    ("http://user:s3cret@127.0.0.1:8000", "http://user:s3cret@127.0.0.1:8000"),
])
def test_real_endpoints_are_accepted(url: str, expected: str) -> None:
    assert check_endpoint(url) == expected


@given(text=st.text() | hostile_text)
@settings(max_examples=300, deadline=None)
def test_terminal_text_has_no_control_characters_left(text: str) -> None:
    shown = safe(text)
    assert not any(unicodedata.category(c) == "Cc" or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
                   for c in shown)
    if text.isprintable() and not any("\u202a" <= c <= "\u202e" or "\u2066" <= c <= "\u2069" for c in text):
        assert shown == text  # ordinary text, accents and emoji included, is shown as it is
