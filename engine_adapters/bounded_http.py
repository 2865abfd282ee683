"""One HTTP exchange with an endpoint that may be slow, endless or hostile, bounded three ways: an
overall deadline (not urllib's per-read timeout, which a server that dribbles or streams forever
never trips), a cap on the bytes read, and a cancel flag (Ctrl-C or SIGTERM of the run, set on
another thread). Every probe and scrape tunebench makes of an endpoint goes through :func:`fetch`.

Failures are :class:`FetchError`, a ``urllib.error.URLError``: callers that handled urllib's
errors handle these unchanged.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
import urllib.error
import urllib.parse
from dataclasses import dataclass
from typing import Protocol

from engine_adapters.secrets import mask_url

READ_CHUNK_BYTES = 64 * 1024
WATCH_INTERVAL_S = 0.05
"""How often the watcher looks at the deadline and the cancel flag: cancel acts within this."""


class CancelFlag(Protocol):
    """A threading.Event, or a multiprocessing one shared with a client process."""

    def is_set(self) -> bool: ...


class FetchError(urllib.error.URLError):
    """The exchange failed: refused, not HTTP, too large, past its deadline or cancelled."""


class FetchTimeout(FetchError):
    """No complete reply within the deadline."""


class FetchTooLarge(FetchError):
    """The reply was larger than the cap."""


class FetchCancelled(FetchError):
    """The run was cancelled while waiting."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def fetch(url: str, *, deadline_s: float, max_bytes: int, method: str = "GET", body: bytes | None = None,
          headers: dict[str, str] | None = None, cancel: CancelFlag | None = None) -> Reply:
    """The reply to one request (any status), read whole within ``deadline_s`` and ``max_bytes``.

    A watcher thread shuts the socket down at the deadline or on cancel, which ends a blocked
    read at once, whatever phase the exchange is in (status line, headers or body)."""
    shown = mask_url(url)  # messages may reach the user, a log or the store: no credentials in them
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"not an http(s) URL: {shown}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    end_s = time.monotonic() + deadline_s
    connection_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    try:
        conn = connection_type(parts.hostname, parts.port, timeout=max(deadline_s, 0.001))
    except ValueError as exc:  # a bad port
        raise FetchError(f"bad URL {shown}: {exc}") from None
    done = threading.Event()
    fired: list[str] = []

    def watch() -> None:
        while not done.wait(WATCH_INTERVAL_S):
            if cancel is not None and cancel.is_set():
                fired.append("cancelled")
            elif time.monotonic() >= end_s:
                fired.append("deadline")
            else:
                continue
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            return

    watcher = threading.Thread(target=watch, name="fetch-deadline", daemon=True)
    watcher.start()
    try:
        conn.request(method, target, body=body, headers=headers or {})
        resp = conn.getresponse()
        chunks: list[bytes] = []
        size_bytes = 0
        while chunk := resp.read1(READ_CHUNK_BYTES):
            size_bytes += len(chunk)
            if size_bytes > max_bytes:
                raise FetchTooLarge(f"the reply from {shown} is larger than {max_bytes:,} bytes")
            chunks.append(chunk)
        if fired:  # the socket was shut down between two reads: the body may be cut short
            raise OSError("shut down")
        if resp.length:  # read1 ends quietly at EOF short of Content-Length
            raise http.client.IncompleteRead(b"".join(chunks), resp.length)
        return Reply(int(resp.status), b"".join(chunks))
    except FetchError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if fired and fired[0] == "cancelled":
            raise FetchCancelled(f"cancelled while waiting for {shown}") from None
        if fired or isinstance(exc, TimeoutError):
            raise FetchTimeout(f"no complete reply from {shown} within {deadline_s:g} s") from None
        if isinstance(exc, http.client.HTTPException):
            raise FetchError(f"not a valid HTTP reply from {shown}: {type(exc).__name__}: {exc}"[:300]) from None
        raise FetchError(f"{shown}: {exc}") from None
    finally:
        done.set()
        conn.close()
