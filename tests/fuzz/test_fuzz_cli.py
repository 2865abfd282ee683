"""The command line as a hostile user drives it: random and absurd arguments for the commands that
read or edit the run store, check profiles or take an endpoint, in-process against a seeded
database (and a sample as real subprocesses). Each command ends with an allowed exit code, no
traceback, one-line errors, and the seeded runs exactly as they were.

No generated command can launch an engine or reach beyond loopback: ``run`` only gets endpoints
that are refused, ``monitor`` only loopback ones with a short ``--duration``, ``engine start`` and
``gui`` are never generated, and options that write files are never generated at random."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from app.urls import check_endpoint
from db.models import RUN_STATUSES
from tests.fuzz.conftest import EVIL_NAME, SEEDED_NAMES
from tests.fuzz.hostile import (
    LOOPBACK_HOSTS,
    checked_or_none,
    cli,
    db_snapshot,
    hostile_text,
    hostile_url,
    number_text,
)

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])
REPO = Path(__file__).resolve().parents[2]


def _no_option(text: str) -> bool:
    return not text.startswith("-")


positional = (hostile_text | number_text()).filter(_no_option)
# A reference that names none of the seeded runs: not their ids, not their names, and not a hex
# prefix of a uid (4+ characters of 0-9a-f).
unknown_ref = (st.sampled_from(["0", "4", "999", "1180591620717411303424", str(2**63), str(10**400)[:4000], "-1",
                                "1.0", " 1", "１", "²", "uid-nope", "%", "_", "'", '"', "\x1b[31m", ""])
               | positional).filter(lambda t: t.strip() not in {"1", "2", "3", *SEEDED_NAMES}
                                    and not (len(t.strip()) >= 4 and all(c in "0123456789abcdef-" for c in t.strip())))
seeded_ref = st.sampled_from(["1", "2", "3", "baseline", "prefix on"])


def _opt(flag: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.lists(values.map(lambda v: [flag, v]), max_size=1).map(lambda xs: xs[0] if xs else [])


def _join(*parts: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
    return st.tuples(*parts).map(lambda ps: [token for p in ps for token in p])


flag = st.sampled_from(["--json", ""]).map(lambda f: [f] if f else [])
runs_list = _join(st.just(["runs", "list"]), _opt("--limit", number_text()), _opt("--since", hostile_text | number_text()),
                  _opt("--until", hostile_text), _opt("--status", st.sampled_from([*RUN_STATUSES, "bogus", ""])),
                  _opt("--name", hostile_text), _opt("--model", hostile_text), _opt("--tag", hostile_text),
                  _opt("--engine", hostile_text), flag)
runs_show = _join(st.just(["runs", "show"]), (unknown_ref | seeded_ref).map(lambda r: [r]),
                  st.sampled_from([[], ["--log"]]), flag)
# Editing commands get references that match nothing: they must refuse and change nothing.
runs_edit = st.one_of(
    _join(st.just(["runs", "delete"]), st.lists(unknown_ref, min_size=1, max_size=3)),
    _join(st.just(["runs", "tag"]), unknown_ref.map(lambda r: [r]), st.lists(positional, min_size=1, max_size=3),
          st.sampled_from([[], ["--remove"]])),
    _join(st.just(["runs", "rename"]), unknown_ref.map(lambda r: [r]), positional.map(lambda n: [n]),
          _opt("--notes", hostile_text)),
    # a blank new name is refused before anything is looked up, even for a real run
    _join(st.just(["runs", "rename"]), seeded_ref.map(lambda r: [r]), st.sampled_from([[""], [" "], ["\t\n"]])),
)
compare = _join(st.just(["compare"]), st.lists(unknown_ref | seeded_ref, min_size=1, max_size=3),
                _opt("--baseline", unknown_ref | seeded_ref), flag)
export = _join(st.just(["export"]), st.lists(unknown_ref | seeded_ref, min_size=1, max_size=2),
               _opt("--format", st.sampled_from(["bash", "docker", "compose", "k8s", "html", "json", "csv", "pdf", ""])))
profile_check = _join(st.just(["profile", "check"]), positional.map(lambda p: [p]), st.just(["--no-discover"]))
garbage = _join(st.sampled_from([["runs"], ["runs", "list"], ["runs", "show"], ["compare"], ["profile"],
                                 ["plan"], ["import"], ["export"], ["bogus"], []]),  # never "engine", "run", "gui"
                st.lists(positional, max_size=4))


def _loopback_or_refused(url: str) -> bool:
    checked = checked_or_none(check_endpoint, url)
    if checked is None:
        return True
    from urllib.parse import urlsplit

    return f"[{urlsplit(checked).hostname}]" in LOOPBACK_HOSTS or urlsplit(checked).hostname in LOOPBACK_HOSTS


def _refused(url: str) -> bool:
    return checked_or_none(check_endpoint, url) is None


@given(argv=st.one_of(runs_list, runs_show, runs_edit, compare, export, profile_check, garbage))
@FUZZ
def test_store_and_profile_commands_never_trace_and_never_lose_runs(argv: list[str], seeded_db: Path,
                                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                    ) -> None:
    monkeypatch.chdir(tmp_path)  # nothing generated writes files, but if it did, it writes here
    before = db_snapshot(seeded_db)
    needs_db = argv[:1] in (["runs"], ["compare"], ["export"], ["import"]) and len(argv) > 1
    cli(*argv, *(["--db", str(seeded_db)] if needs_db else [])).check()
    assert db_snapshot(seeded_db) == before


@given(url=hostile_url.filter(_refused), key=st.none() | hostile_text)
@settings(FUZZ, max_examples=40)
def test_run_refuses_bad_endpoints_before_starting_anything(url: str, key: str | None, seeded_db: Path) -> None:
    before = db_snapshot(seeded_db)
    extra = [] if key is None or key.startswith("-") else ["--api-key", key]
    outcome = cli("run", "cpu-demo", "--endpoint", url, *extra, "--db", str(seeded_db)).check(allowed=(2,))
    assert "engine" not in outcome.out.lower()  # nothing was launched
    assert db_snapshot(seeded_db) == before


@given(url=hostile_url.filter(_loopback_or_refused), interval=number_text())
@settings(max_examples=40, deadline=None)
def test_monitor_takes_only_good_urls_and_numbers(url: str, interval: str) -> None:
    assume(not interval.startswith("-"))
    cli("monitor", "--endpoint", url, "--interval", interval, "--duration", "0.05").check()


ISSUE_CASES = [
    (["runs", "show", "1180591620717411303424"], "no run"),
    (["runs", "list", "--limit", str(10**30)], "--limit"),
    (["runs", "list", "--limit", "-1"], "--limit"),
    (["runs", "list", "--since", ""], "--since"),
    (["run", "cpu-demo", "--endpoint", ""], "empty"),
    (["run", "cpu-demo", "--endpoint", "not a url"], "not a url"),
    (["run", "cpu-demo", "--endpoint", "http://[::1"], "not a valid URL"),
    (["run", "cpu-demo", "--endpoint", "http://a b:8000"], "space"),
    (["run", "cpu-demo", "--endpoint", "ftp://127.0.0.1/x"], "http"),
    (["run", "cpu-demo", "--endpoint", "http://127.0.0.1:9", "--api-key", "k\nInjected: 1"], "API key"),
    (["monitor", "--endpoint", "http://[::1", "--duration", "1"], "not a valid URL"),
    (["engine", "start", "cpu-demo", "--port", str(2**70)], "--port"),
    (["monitor", "--interval", "inf"], "--interval"),
    (["monitor", "--engine-pid", str(10**30)], "--engine-pid"),
]


@pytest.mark.parametrize(("argv", "expected"), ISSUE_CASES, ids=[" ".join(a)[:50] for a, _ in ISSUE_CASES])
def test_issue_cases_are_one_line_errors(argv: list[str], expected: str, seeded_db: Path) -> None:
    before = db_snapshot(seeded_db)
    with_db = [*argv, "--db", str(seeded_db)] if argv[0] in ("runs", "run") else argv
    outcome = cli(*with_db).check(allowed=(2,))
    assert expected in outcome.err
    assert db_snapshot(seeded_db) == before


def test_the_same_as_real_processes(seeded_db: Path, tmp_path: Path) -> None:
    """A sample through the console entry point, as a user's shell runs it."""
    env = {**os.environ, "TUNEBENCH_STATE_DIR": str(tmp_path / "state")}
    for argv, expected in [ISSUE_CASES[i] for i in (0, 4, 6)]:
        with_db = [*argv, "--db", str(seeded_db)] if argv[0] in ("runs", "run") else argv
        done = subprocess.run([sys.executable, "-m", "app.cli", *with_db], capture_output=True, text=True,
                              timeout=120, env=env, cwd=REPO, stdin=subprocess.DEVNULL, check=False)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (argv, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and expected in done.stderr, (argv, done.stderr)


def test_control_characters_in_names_are_escaped_on_the_terminal(seeded_db: Path) -> None:
    """A run name with ESC, CR and a newline is shown escaped by every printer, never raw."""
    evil_id = str(SEEDED_NAMES.index(EVIL_NAME) + 1)
    outputs = [cli("runs", "list", "--db", str(seeded_db)).check().out,
               cli("runs", "show", evil_id, "--db", str(seeded_db), "--log").check().out,
               cli("runs", "tag", evil_id, "x\x1b[2Jy", "--db", str(seeded_db)).check().out,
               cli("compare", "1", evil_id, "--db", str(seeded_db)).check().out]
    cli("runs", "tag", evil_id, "x\x1b[2Jy", "--remove", "--db", str(seeded_db)).check()
    for out in outputs:
        assert "\x1b" not in out and "\r" not in out, out
        assert "forged line" not in "".join(line for line in out.splitlines() if line.startswith("forged"))
    assert "evil\\x1b[31mred\\r\\nforged line" in outputs[1]
    assert "evil\\x1b[31mred" in outputs[0]


def test_an_unusable_state_directory_degrades_to_one_warning(tmp_path: Path, seeded_db: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TUNEBENCH_STATE_DIR", str(blocker / "state"))  # under a regular file: cannot exist
    listed = cli("runs", "list", "--db", str(seeded_db)).check(allowed=(0,))
    assert "baseline" in listed.out and listed.err.count("\n") == 1 and "TUNEBENCH_STATE_DIR" in listed.err
    stopped = cli("engine", "stop").check(allowed=(2,))  # stopping engines needs the registry
    assert "TUNEBENCH_STATE_DIR" in stopped.err
    monkeypatch.setenv("TUNEBENCH_DATA_DIR", str(blocker / "data"))
    monkeypatch.delenv("TUNEBENCH_DB", raising=False)
    assert "TUNEBENCH_DATA_DIR" in cli("runs", "list").check(allowed=(2,)).err


def _wait_for_output(proc: subprocess.Popen[bytes], deadline_s: float) -> bytes:
    """The first output of ``proc`` (polled until the deadline), or b"" if it printed nothing."""
    assert proc.stdout is not None
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            return os.read(proc.stdout.fileno(), 65536)
    return b""


def test_ctrl_c_stops_a_command_that_inherited_sigint_ignored(tmp_path: Path) -> None:
    """A background job of a script starts with SIGINT ignored; tunebench restores Ctrl-C."""
    env = {**os.environ, "TUNEBENCH_STATE_DIR": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "monitor", "--interval", "0.2", "--duration", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO,
                            stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert _wait_for_output(proc, 60).strip(), "monitor printed nothing"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)  # ignored, it would run for its full 120 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0
    assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
