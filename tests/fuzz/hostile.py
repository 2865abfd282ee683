"""What the fuzz suite throws at tunebench, and how it runs a command: hostile values, URLs and
profile mutations (hypothesis strategies), the CLI run in-process with its output captured, and
small servers on loopback that do not speak HTTP properly."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from app.cli import main
from app.store import RunStore
from app.urls import BadEndpoint
from engine_adapters.launcher import free_port

# --- running the CLI -----------------------------------------------------------------------------


@dataclass
class Outcome:
    argv: list[str]
    code: int
    out: str
    err: str

    def check(self, *, allowed: tuple[int, ...] = (0, 2)) -> Outcome:
        """The rules for any command: an allowed exit code, no traceback, and every message on
        stderr one line of its own (``tunebench...: error: ...``, no usage block or continuation
        lines), with at most one error; exit 2 says something, on stderr or in a report on stdout."""
        assert "Traceback" not in self.err and "Traceback" not in self.out, self
        assert self.code in allowed, self
        lines = [line for line in self.err.splitlines() if line.strip()]
        assert all(line.startswith("tunebench") for line in lines), self
        assert sum("error:" in line for line in lines) <= 1, self
        if self.code == 2:
            assert lines or self.out.strip(), self
        return self


def checked_or_none(check: Callable[[str], str], value: str) -> str | None:
    """What ``check`` (``app.urls``: an endpoint, an API key) makes of ``value``; None where it
    refuses it, which it must do in one line."""
    try:
        return check(value)
    except BadEndpoint as exc:
        assert str(exc) and "\n" not in str(exc), repr(str(exc))
        return None


def cli(*argv: str) -> Outcome:
    """``tunebench ARGV`` in this process. An exception that escapes ``main`` is a traceback the
    user would see, so it is not caught here: the test fails with it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return Outcome(list(argv), code, out.getvalue(), err.getvalue())


def cli_within(deadline_s: float, *argv: str) -> Outcome:
    """:func:`cli`, failing instead of hanging when the command blocks (a named pipe, a device)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["outcome"] = cli(*argv)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(deadline_s)
    assert not thread.is_alive(), f"tunebench {argv} still running after {deadline_s} s: it blocked"
    if "error" in box:
        raise box["error"]
    return box["outcome"]


# --- hostile values ----------------------------------------------------------------------------

HUGE_INTS = [2**31, 2**40, 2**63 - 1, 2**63, 2**64, 2**70, 10**30, 10**400, -1, -(2**63), -(10**30), 0]
SPECIAL_FLOATS = [float("nan"), float("inf"), float("-inf"), -0.0, 1e308, -1e308, 5e-324, 1e-300]
NASTY_TEXT = ["", " ", "\x00", "\n", "\r\n", "\x1b[31mred\x1b[0m", "\x1b]0;title\x07", "a\rb", "\u202eevil",
              "ä" * 3, "😀", "'; DROP TABLE runs; --", "$(touch /tmp/pwned)", "`id`", "%s%n", "../../etc/passwd",
              "x" * 5000, "yes", "true", "2", "1e9", "nan", "inf", "-1", "0x10"]

hostile_int = st.sampled_from(HUGE_INTS) | st.integers()
hostile_float = st.sampled_from(SPECIAL_FLOATS) | st.floats()
hostile_text = st.sampled_from(NASTY_TEXT) | st.text(max_size=60)
hostile_scalar = hostile_int | hostile_float | hostile_text | st.booleans()


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


hostile_value = (hostile_scalar
                 | st.lists(hostile_scalar, max_size=5)
                 | st.dictionaries(st.text(max_size=8), hostile_scalar, max_size=3)
                 | st.sampled_from([_nested(60), {"a": {"b": {"c": {"d": 1}}}}, [[]], [{}], {}]))


def number_text() -> st.SearchStrategy[str]:
    """What a user might type where a number is expected."""
    return (st.sampled_from([str(v) for v in HUGE_INTS] + ["nan", "inf", "-inf", "1e308", "1e-300", "", " ", "1.5",
                                                          "0", "3", "1_000", "0x1f", "١٢", "²", "+5", "- 1"])
            | st.integers().map(str) | st.floats().map(str) | hostile_text)


# --- URLs --------------------------------------------------------------------------------------

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_SCHEMES = ["http", "https", "HTTP", "ftp", "file", "javascript", "", "http:", "h ttp"]
_HOSTS = ["127.0.0.1", "localhost", "[::1]", "[::1", "::1", "", " ", "a b", "\x00", "exa\nmple", "bücher.example",
          "256.256.256.256", "user:s3cret@127.0.0.1", "@", "[]", "%00", "127.0.0.1\r\nX-Evil: 1"]
_PORTS = ["", ":0", ":1", ":8000", ":65535", ":65536", ":-1", ":abc", ":", ":99999999999999999999", ": 80"]
_PATHS = ["", "/", "/v1", "/metrics", "/a b", "?q=1", "#frag", "/%00", "/\x1b[31m", "//", "/" + "p" * 3000]

hostile_url = (st.builds(lambda s, h, p, path: f"{s}://{h}{p}{path}", st.sampled_from(_SCHEMES),
                         st.sampled_from(_HOSTS), st.sampled_from(_PORTS), st.sampled_from(_PATHS))
               | st.sampled_from(["", "not a url", "http://[::1", "ftp://x", "http://", "http:///x", "://x",
                                  "http://a b", "127.0.0.1:8000", "localhost:8000", " http://127.0.0.1:8000",
                                  "http://127.0.0.1:8000\n", "http://127.0.0.1:8000?x#y"])
               | hostile_text)


# --- profiles ----------------------------------------------------------------------------------

def leaf_paths(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of a TOML document, tables included."""
    paths = []
    for key, value in data.items():
        paths.append((*prefix, key))
        if isinstance(value, dict):
            paths.extend(leaf_paths(value, (*prefix, key)))
    return paths


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


def _delete(data: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = data
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(path[-1], None)


# Keys of the configuration models, so mutations hit real fields more often than typos do.
KNOWN_KEYS = [
    ("workload", "seed"), ("workload", "num_requests"), ("workload", "input_len", "mean"),
    ("workload", "output_len", "mean"), ("workload", "input_len", "spread"), ("workload", "turns"),
    ("workload", "shared_prefix_tokens"), ("workload", "temperature"), ("workload", "kind"),
    ("workload", "dataset_path"), ("load", "pattern"), ("load", "concurrency"), ("load", "rate_rps"),
    ("load", "levels"), ("load", "duration_s"), ("load", "max_concurrency"), ("load", "burstiness"),
    ("load", "request_timeout_s"), ("load", "slo"), ("load", "workers"), ("load", "warmup_requests"),
    ("load", "max_requests"), ("engine", "startup_timeout_s"), ("engine", "port"), ("engine", "model"),
    ("engine", "host"), ("engine", "runtime", "env"), ("features", "prefix_caching"),
    ("features", "max_num_seqs"), ("features", "max_model_len"), ("features", "gpu_memory_utilization"),
    ("features", "cpu_offload_gib"), ("features", "extra_args"), ("features", "speculative", "method"),
    ("features", "speculative", "num_speculative_tokens"), ("name",), ("tags",),
]


@st.composite
def mutated_profile(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """A shipped profile with one to three hostile edits: a value replaced, a key removed, an
    unknown key added, a table replaced by a scalar."""
    import copy

    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = leaf_paths(data) or [("name",)]
        path = draw(st.sampled_from(paths) | st.sampled_from(KNOWN_KEYS))
        action = draw(st.sampled_from(["set", "set", "set", "delete", "unknown"]))
        if action == "set":
            _set(data, path, copy.deepcopy(draw(hostile_value)))  # sampled values are shared objects
        elif action == "delete":
            _delete(data, path)
        else:
            _set(data, (*path[:-1], draw(st.text(min_size=1, max_size=12))), draw(hostile_scalar))
    return data


# --- the run store -----------------------------------------------------------------------------

def db_snapshot(path: Path) -> list[dict[str, Any]]:
    """Everything a command must not lose or change, read through the store: every run with its
    identity, status, tags, notes, metrics, and how many requests, samples and log lines it holds."""
    with RunStore(path) as store:
        return [store.get_run(info.id).model_dump(mode="json") for info in store.list_runs()]


# --- servers that misbehave ---------------------------------------------------------------------

REPLIES = {
    "not_http": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "huge_header": b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (2 * 2**20) + b"\r\nContent-Length: 2\r\n\r\n{}",
    "many_headers": b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(1000))
                    + b"Content-Length: 2\r\n\r\n{}",
    "bad_chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\nzz\r\n",
    "silent_close": b"",
    "deep_json": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n" + b"[" * 100_000,
    "deep_sse": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: " + b"[" * 100_000 + b"\n\n",
}


@contextlib.contextmanager
def loopback_server(answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[str]:
    """A loopback TCP server that hands each connection, in a thread of its own, to ``answer`` (with
    the event set once the server stops), then closes it; yields its ``http://`` address."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.settimeout(0.1)
    stop = threading.Event()

    def one(conn: socket.socket) -> None:
        with conn:
            try:
                answer(conn, stop)
            except OSError:
                pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        sock.close()


@contextlib.contextmanager
def raw_server(reply: bytes) -> Iterator[str]:
    """A loopback TCP server that answers every connection with ``reply`` and closes it."""

    def answer(conn: socket.socket, _stop: threading.Event) -> None:
        conn.settimeout(2)
        conn.recv(65536)
        conn.sendall(reply)

    with loopback_server(answer) as url:
        yield url


def closed_port() -> int:
    """A loopback port nothing listens on, picked below the ephemeral range: a port there is never
    an outgoing connection's source, so a connect to it cannot connect to itself."""
    return free_port()
