"""What a secret is, in one place: every record, export, log view and error message that leaves
tunebench goes through these functions, so a token typed into a profile never reaches the run
database, a JSON or CSV file, a report, a script, a screen or a screenshot.

A secret is:

- the value of an environment variable, dict key, header or flag whose *name* says so
  (:func:`is_secret_name`): ``OPENAI_API_KEY``, ``HF_TOKEN``, ``MY_PASSWORD``, ``X_AUTH``,
  ``SOME_CREDENTIAL``, ``Authorization``, ``X-Api-Key``, ``--api-key``, ``--hf-token``;
- the password in a URL's ``user:password@`` (the user and host stay readable);
- a ``Bearer``/``Basic`` credential in free text, and ``name=value`` / ``name: value`` /
  ``--flag value`` whose name is a secret name (after ``:`` or a space, a lowercase word of at
  most five letters is read as prose: "--api-key is set by tunebench");
- any value this process has masked before (remembered, so a log line that echoes a planted
  token is masked too, whatever its format).

Names are matched on word components (``_``, ``-``, ``.``, camelCase), never on substrings of
other words, so ``max_tokens``, ``tokens_per_s``, ``num_tokens``, ``tokenizer``,
``inter_token_latency_ms``, ``kv_cache``, ``author`` and ``monkey`` are not secrets. ``KEY``
and ``TOKEN`` count only as the *last* component (``HF_TOKEN``, ``OPENAI_API_KEY``; not
``HF_TOKEN_PATH``, ``API_KEY_ENV`` or ``first_token_ms``: those name a file, another variable,
a figure). ``SECRET``, ``PASSWORD``/``PASSWD``, ``CREDENTIAL`` and ``AUTH``/``Authorization``
count anywhere.

Only string values are masked: ``require_api_key = true`` or a token count stays what it is.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, overload
from urllib.parse import parse_qsl, urlsplit, urlunsplit

MASK = "***"

_LAST_WORDS = frozenset({"key", "keys", "token", "apikey", "secret", "secrets", "password", "passwd",
                         "credential", "credentials", "auth", "authorization", "cookie"})
"""A name whose last component is one of these names a secret (``HF_TOKEN``, ``--api-key``)."""
_ANYWHERE = ("password", "passwd", "passphrase", "secret", "credential")
"""Components containing these name a secret wherever they stand (``DBPASSWORD_FILE`` too)."""
_ENDINGS = ("key", "token")
"""Run-together last components: ``APIKEY``, ``HFTOKEN``, ``accessToken`` (camel case is split)."""
_NOT_SECRET_WORDS = frozenset({"monkey", "donkey", "turkey", "hockey", "jockey", "whiskey", "hotkey"})
_PLAIN_BEFORE = {
    "token": frozenset({"bos", "eos", "pad", "unk", "sep", "cls", "mask", "first", "last", "next", "end", "start",
                        "special", "new", "output", "input", "prompt", "per", "each", "stop", "added", "image",
                        "video", "audio", "think", "reasoning", "generated", "decode"}),
    "key": frozenset({"sort", "cache", "hash", "primary", "foreign", "dict", "group", "partition", "lookup", "index",
                      "map", "kv", "order", "unique", "composite", "dedup", "row", "column", "field", "metric",
                      "series", "config", "item", "public", "prefix"}),
}
"""``eos_token``, ``first_token``, ``sort_key``, ``public_key``: a language-model token or a lookup
key, not a credential."""
_PARTS_RE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")

_KNOWN_MIN_CHARS = 6
"""Masked values at least this long are remembered and masked wherever they appear again
(shorter ones would mask ordinary words and numbers)."""
_KNOWN_MAX = 4096
_known: set[str] = set()
_known_re: re.Pattern[str] | None = None
_known_lock = threading.Lock()


def _parts(name: str) -> list[str]:
    return [p.lower() for p in _PARTS_RE.findall(name)]


def _is_auth(part: str) -> bool:
    """``auth``, ``oauth``, ``authz``, ``authentication``, ``authorization``; not ``author``."""
    if part.endswith("auth"):
        return True
    return part.startswith("auth") and (not part.startswith("author") or part.startswith("authoriz"))


def is_secret_name(name: str) -> bool:
    """Whether a variable, key, header or flag called ``name`` holds a secret (module docstring)."""
    return _is_secret_name(str(name))


@functools.lru_cache(maxsize=8192)  # the same few names come back in every record and log line
def _is_secret_name(name: str) -> bool:
    parts = _parts(name)
    while parts and parts[-1].isdigit():  # OPENAI_API_KEY_2
        parts.pop()
    if not parts:
        return False
    last = parts[-1]
    if len(parts) > 1 and parts[-2] in _PLAIN_BEFORE.get(last, ()):
        return any(_is_auth(p) or any(w in p for w in _ANYWHERE) for p in parts)
    if len(parts) == 1 and last in ("key", "keys"):  # a record's generic "key" field (a feature's name), not a key
        return False
    if last in _LAST_WORDS:
        return True
    if last not in _NOT_SECRET_WORDS and last.endswith(_ENDINGS):
        return True
    return any(_is_auth(p) or any(w in p for w in _ANYWHERE) for p in parts)


def is_secret_flag(flag: str) -> bool:
    """``--api-key``, ``--hf-token``, ``--db-password``: an option whose value is a secret."""
    return flag.startswith("-") and is_secret_name(flag.lstrip("-").split("=", 1)[0])


# --- remembered values -------------------------------------------------------------------------

def remember_secret(value: Any) -> None:
    """Mask ``value`` wherever it appears in text from now on (in this process)."""
    global _known_re
    text = str(value).strip() if value is not None else ""
    if len(text) < _KNOWN_MIN_CHARS or text == MASK:
        return
    with _known_lock:
        if text in _known or len(_known) >= _KNOWN_MAX:
            return
        _known.add(text)
        _known_re = re.compile("|".join(re.escape(v) for v in sorted(_known, key=len, reverse=True)))


def forget_secrets() -> None:
    """Drop the remembered values (tests check the rules on their own)."""
    global _known_re
    with _known_lock:
        _known.clear()
        _known_re = None


def _mask_value(value: str) -> str:
    remember_secret(value)
    return MASK


# --- text ----------------------------------------------------------------------------------------

_URL_USERINFO_RE = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:\"'<>]*):(?P<pw>[^\s/?#\"'<>]*)@")
"""``scheme://user:password@``; like ``urlsplit``, the userinfo ends at the netloc's last ``@``."""
_AUTH_HEADER_RE = re.compile(
    r"(?P<head>\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic|token|digest|apikey)\s+)?)"
    r"(?P<value>[^\s\"',;}\]]+)", re.IGNORECASE)
_BEARER_RE = re.compile(r"(?P<head>\bbearer\s+)(?P<value>[A-Za-z0-9._~+/=-]+)", re.IGNORECASE)
_STEMS = r"(?:key|token|secret|passw|passphrase|credential|auth|cookie)"
"""Every secret name contains one of these (checked by the tests): text without them is skipped."""
_STEM_RE = re.compile(_STEMS, re.IGNORECASE)
_NAMED = rf"(?=[A-Za-z0-9_.-]*?{_STEMS})"  # only names that can be secret are tried: log lines are many
_FLAG_RE = re.compile(rf"(?P<head>(?<![\w-])--?{_NAMED}(?P<name>[A-Za-z][A-Za-z0-9_.-]*)(?:\s+|=))"
                      r"(?P<value>\"[^\"]*\"|'[^']*'|(?!-)[^\s\"',;]+)", re.IGNORECASE)
_PAIR_RE = re.compile(
    rf"(?P<head>(?<![\w.-])(?P<q>[\"']?){_NAMED}(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P=q)\s*(?:=|:(?!//))\s*)"
    r"(?P<value>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|\[[^\]]*\]|[^\s\"',;&}\])]+)", re.IGNORECASE)
_PROSE_WORD_RE = re.compile(r"[a-z]{1,5}")
"""After ``name:`` or ``--flag `` (not ``=``), a short lowercase word is prose; a token is longer or
has digits, capitals or symbols. ``name=value`` is always a value."""
_SPACE_THEN_MASK = re.compile(r"\s+" + re.escape(MASK))
_SCHEMES = frozenset({"bearer", "basic", "token", "digest", "apikey"})


def _quoted_mask(value: str) -> str:
    """``MASK`` in the value's own quotes (JSON and Python reprs stay well-formed)."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        inner = value[1:-1]
        if inner and inner != MASK:
            remember_secret(inner)
        return value[0] + MASK + value[0]
    if value.startswith("[") and value.endswith("]"):  # 'api_key': ['abc'] in vLLM's argument dump
        for item in re.findall(r"[\"']([^\"']*)[\"']", value):
            remember_secret(item)
        return "[" + MASK + "]"
    return _mask_value(value)


def _secret_pair(m: re.Match[str]) -> bool:
    """A secret name with a value not masked yet (``Authorization: Bearer ***`` is done: its
    value is the scheme word, followed by the masked credential)."""
    value = m.group("value")
    bare = value.strip("\"'[]")
    if not bare or bare.endswith(MASK) or not is_secret_name(m.group("name")):
        return False
    if not m.group("head").rstrip().endswith("=") and _PROSE_WORD_RE.fullmatch(value):
        return False  # "--api-key is set by tunebench", "HF_TOKEN: not set": prose, not a value
    return not (bare.lower() in _SCHEMES and _SPACE_THEN_MASK.match(m.string, m.end("value")))


def _sub_named(pattern: re.Pattern[str], text: str) -> str:
    """Mask the values of secret ``name=value`` (or ``--name value``) pairs. A pair that is not
    secret gives up only its name, so a secret inside its would-be value (``host:1/v1?api_key=x``)
    is still found."""
    out, pos = [], 0
    while (m := pattern.search(text, pos)) is not None:
        if _secret_pair(m):
            out.append(text[pos:m.start("value")] + _quoted_mask(m.group("value")))
            pos = m.end("value")
        else:
            out.append(text[pos:m.end("head")])
            pos = m.end("head")
    out.append(text[pos:])
    return "".join(out)


def _sub_userinfo(m: re.Match[str]) -> str:
    if not m.group("pw") or m.group("pw") == MASK:
        return m.group(0)
    remember_secret(m.group("pw"))
    return m.group("head") + ":" + MASK + "@"


def _sub_credential(m: re.Match[str]) -> str:
    if m.group("value") == MASK:
        return m.group(0)
    return m.group("head") + _mask_value(m.group("value"))


def mask_text(text: str) -> str:
    """Free text (a log line, an error message, a command line) with its secrets masked."""
    if not isinstance(text, str):
        text = str(text)
    if not text:
        return text
    out = text
    if "@" in out:
        out = _URL_USERINFO_RE.sub(_sub_userinfo, out)
    if _STEM_RE.search(out) or "bearer" in out.lower():  # most log lines have neither
        out = _AUTH_HEADER_RE.sub(_sub_credential, out)
        out = _BEARER_RE.sub(_sub_credential, out)
        out = _sub_named(_PAIR_RE, out)
        out = _sub_named(_FLAG_RE, out)
    known = _known_re
    if known is not None:
        out = known.sub(MASK, out)
    return out


def mask_url(url: str) -> str:
    """A URL with the password of ``user:password@`` and secret query parameters masked."""
    if not isinstance(url, str):
        url = str(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        return mask_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, password = userinfo.partition(":")
        if colon and password and password != MASK:
            remember_secret(password)
            netloc = f"{user}:{MASK}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_name(k) and v not in ("", MASK) for k, v in pairs):
            query = "&".join(f"{k}={_mask_value(v) if is_secret_name(k) and v not in ('', MASK) else v}"
                             if (k or v) else "" for k, v in pairs)
    return mask_text(urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)))


# --- structures ----------------------------------------------------------------------------------

def mask_env(env: Mapping[str, Any] | None) -> dict[str, str]:
    """An environment with secret-named values masked (and the others' text checked too)."""
    out: dict[str, str] = {}
    for key, value in (env or {}).items():
        name, text = str(key), "" if value is None else str(value)
        out[name] = _mask_value(text) if is_secret_name(name) and text not in ("", MASK) else mask_text(text)
    return out


@overload
def mask_argv(argv: None) -> None: ...
@overload
def mask_argv(argv: Sequence[Any]) -> list[str]: ...
def mask_argv(argv: Sequence[Any] | None) -> list[str] | None:
    """A command line with the values of secret options masked: ``--api-key X`` and
    ``--api-key=X`` (also ``-e HF_TOKEN=X``, ``-H 'Authorization: Bearer X'`` and URLs)."""
    if argv is None:
        return None
    out: list[str] = []
    hide_next = False
    for token in (str(t) for t in argv):
        if hide_next and not token.startswith("-"):
            out.append(_mask_value(token) if token not in ("", MASK) else token)
            hide_next = False
            continue
        hide_next = False
        if is_secret_flag(token):
            flag, eq, value = token.partition("=")
            if eq:
                out.append(flag + "=" + (_mask_value(value) if value not in ("", MASK) else value))
            else:
                out.append(token)
                hide_next = True
            continue
        out.append(mask_text(token))
    return out


_PLAIN_TYPES = frozenset({int, float, bool, type(None)})


def _argv_like(items: Sequence[Any]) -> bool:
    return bool(items) and all(isinstance(x, str) for x in items) and any(x.startswith("-") for x in items)


def mask_obj(obj: Any) -> Any:
    """A copy of a JSON-like structure with every secret masked: values under secret-named keys
    (strings, or lists of strings), command lines (lists with options), and all other text."""
    if isinstance(obj, Mapping):
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            if isinstance(key, str) and is_secret_name(key):
                if isinstance(value, str):
                    out[key] = _mask_value(value) if value not in ("", MASK) else value
                    continue
                if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
                    out[key] = [_mask_value(v) if v not in ("", MASK) else v for v in value]
                    continue
            out[key] = mask_obj(value)
        return out
    if isinstance(obj, list | tuple):
        if all(v.__class__ in _PLAIN_TYPES for v in obj):  # numbers: ITLs, samples (the bulk of a run)
            return list(obj) if isinstance(obj, list) else tuple(obj)
        items = mask_argv(obj) if _argv_like(obj) else [mask_obj(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, str):
        return mask_text(obj)
    return obj


def mask_lines(lines: Iterable[str]) -> list[str]:
    """Log lines, each masked."""
    return [mask_text(line) for line in lines]
