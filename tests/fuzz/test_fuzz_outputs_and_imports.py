"""Bad output paths and wrongly shaped imports, as a user gives them: each is one line and exit
code 2, and nothing half-runs. A GuideLLM file with a list (or a number, or text) where an object
belongs is refused by the field's name, storing nothing; ``--json`` of ``run``, ``ladder`` and
``tune`` is checked before anything runs, so a run is never measured and stored only to end in
"cannot write"; and a failed ``export -o`` says what really went wrong, "does not exist" only when
the folder does not."""

from __future__ import annotations

import copy
import errno
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.errors import UserError
from app.export import files
from app.store import RunStore
from tests.fuzz.hostile import cli, db_snapshot

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


def _stored_runs(db: Path) -> list[int]:
    """The ids of the runs in ``db`` (none when the file was never created)."""
    if not db.exists():
        return []
    with RunStore(db) as store:
        return [r.id for r in store.list_runs()]


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tunebench: error: "), err
    return lines[0]


# --- GuideLLM imports ------------------------------------------------------------------------------

def _distribution(mean: float) -> dict[str, Any]:
    return {"successful": {"mean": mean, "median": mean, "percentiles": {"p90": mean * 1.5, "p99": mean * 2}}}


def _guidellm() -> dict[str, Any]:
    """A GuideLLM ``benchmarks.json`` with one benchmark, as GuideLLM writes it."""
    return {"benchmarks": [{
        "start_time": 1.9e9, "end_time": 1.9e9 + 10,
        "args": {"profile": {"type_": "constant", "rate": 1.0}},
        "worker": {"backend_model": "Qwen/Qwen3-8B"},
        "metrics": {"time_to_first_token_ms": _distribution(50.0), "inter_token_latency_ms": _distribution(8.0),
                    "request_latency": _distribution(1.5), "output_tokens_per_second": _distribution(400.0),
                    "requests_per_second": _distribution(1.0), "request_totals": {"successful": 2, "errored": 0}},
        "requests": {"successful": [{"start_time": 1.9e9 + i, "time_to_first_token_ms": 50.0, "request_latency": 1.5,
                                     "prompt_tokens": 64, "output_tokens": 32} for i in range(2)],
                     "errored": [], "incomplete": []},
    }]}


OBJECT_PARTS: list[tuple[str | int, ...]] = [
    ("benchmarks", 0),
    ("benchmarks", 0, "metrics"),
    ("benchmarks", 0, "metrics", "time_to_first_token_ms"),
    ("benchmarks", 0, "metrics", "time_to_first_token_ms", "successful"),
    ("benchmarks", 0, "metrics", "time_to_first_token_ms", "successful", "percentiles"),
    ("benchmarks", 0, "metrics", "request_latency"),
    ("benchmarks", 0, "metrics", "output_tokens_per_second", "successful"),
    ("benchmarks", 0, "metrics", "request_totals"),
    ("benchmarks", 0, "requests"),
    ("benchmarks", 0, "requests", "successful", 1),
    ("benchmarks", 0, "args"),
    ("benchmarks", 0, "args", "profile"),
]
"""Every part of the GuideLLM structure the importer reads that must be an object."""


def _field(path: tuple[str | int, ...]) -> str:
    """A part's name as the import's message writes it (``benchmarks[0].metrics``)."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _replaced(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node: Any = out
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return out


def _import(tmp_path: Path, doc: dict[str, Any]) -> tuple[Any, Path]:
    path, db = tmp_path / "benchmarks.json", tmp_path / "import.db"
    path.write_text(json.dumps(doc))
    return cli("import", str(path), "--db", str(db)), db


def test_a_well_formed_guidellm_file_imports_with_its_figures(tmp_path: Path) -> None:
    """The baseline of the test below: the unchanged file is taken, so what is refused there is the change."""
    outcome, db = _import(tmp_path, _guidellm())
    outcome.check(allowed=(0,))
    (run_id,) = _stored_runs(db)
    with RunStore(db) as store:
        summary = store.get_run(run_id).levels[0].summary
    assert summary is not None and summary["ttft_ms_p50"] == 50.0


def test_guidellm_metrics_as_a_list_is_refused_by_name(tmp_path: Path) -> None:
    """The case a user hit: ``benchmarks[0].metrics`` a list was taken, a level without figures."""
    doc = _replaced(_guidellm(), ("benchmarks", 0, "metrics"), [{"time_to_first_token_ms": 50.0}])
    outcome, db = _import(tmp_path, doc)
    outcome.check(allowed=(2,))
    assert "benchmarks[0].metrics: expected an object, got a list" in _one_error_line(outcome.err)
    assert _stored_runs(db) == []


@given(part=st.sampled_from(OBJECT_PARTS),
       value=st.sampled_from([[], [{"mean": 1.0}], 0, 2.5, "constant", True, False]))
@FUZZ
def test_any_wrongly_typed_part_of_a_guidellm_file_is_refused_by_name(part: tuple[str | int, ...], value: Any,
                                                                      tmp_path_factory: pytest.TempPathFactory
                                                                      ) -> None:
    tmp_path = tmp_path_factory.mktemp("guidellm")
    outcome, db = _import(tmp_path, _replaced(_guidellm(), part, value))
    outcome.check(allowed=(2,))
    line = _one_error_line(outcome.err)
    assert f"{_field(part)}: expected an object, got" in line, line
    assert _stored_runs(db) == []


# --- --json FILE before anything runs ----------------------------------------------------------------

@pytest.fixture()
def refused_endpoint() -> Iterator[str]:
    """A loopback URL whose port is held but not listening: a run against it would be refused at
    once (and measured, and stored as failed), so a test that it never started ends fast either way."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{holder.getsockname()[1]}"
    finally:
        holder.close()


def _bad_json_targets(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Output paths a result cannot be written to, each with what its message must say."""
    (tmp_path / "a-file").write_text("")
    fifo = tmp_path / "a-pipe"
    os.mkfifo(fifo)
    targets = {
        "directory": (tmp_path, "is a directory: give a file name"),
        "missing folder": (tmp_path / "nowhere" / "r.json", "does not exist"),
        "under a file": (tmp_path / "a-file" / "r.json", "a part of the path is a file"),
        "named pipe": (fifo, "is a named pipe, not a regular file"),
    }
    if Path("/proc/version").is_file():  # a folder that exists and takes no files, even for root
        targets["proc"] = (Path("/proc/tunebench-result.json"), "/proc")
    return targets


@pytest.mark.parametrize("kind", ["directory", "missing folder", "under a file", "named pipe", "proc"])
def test_run_refuses_an_unwritable_json_path_before_anything_runs(kind: str, tmp_path: Path, refused_endpoint: str
                                                                  ) -> None:
    targets = _bad_json_targets(tmp_path)
    if kind not in targets:
        pytest.skip("no /proc here")
    target, expected = targets[kind]
    db = tmp_path / "runs.db"
    outcome = cli("run", "cpu-demo", "--endpoint", refused_endpoint, "--no-telemetry", "--json", str(target),
                  "--db", str(db))
    outcome.check(allowed=(2,))
    line = _one_error_line(outcome.err)
    assert line.startswith("tunebench: error: --json: ") and str(target) in line and expected in line, line
    assert outcome.out == ""  # no phase, level or table: nothing started
    assert _stored_runs(db) == []  # and nothing was measured or stored


@pytest.mark.parametrize("command", [["ladder", "cpu-ladder", "--dry-run"],
                                     ["tune", "cpu-demo", "--slo", "ttft_ms<=500", "--dry-run"]], ids=["ladder", "tune"])
def test_ladder_and_tune_refuse_a_directory_as_json_before_planning(command: list[str], tmp_path: Path) -> None:
    """The same check as ``run``'s: even a dry run prints no plan it then cannot write."""
    db = tmp_path / "runs.db"
    outcome = cli(*command, "--json", str(tmp_path), "--db", str(db))
    outcome.check(allowed=(2,))
    assert f"--json: {tmp_path} is a directory: give a file name" in _one_error_line(outcome.err)
    assert outcome.out == ""
    assert _stored_runs(db) == []


# --- export -o: the message says what went wrong -----------------------------------------------------

@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="no /proc here")
def test_export_onto_proc_version_does_not_claim_proc_is_missing(seeded_db: Path) -> None:
    before = db_snapshot(seeded_db)
    outcome = cli("export", "1", "--format", "json", "-o", "/proc/version", "--db", str(seeded_db))
    outcome.check(allowed=(2,))
    line = _one_error_line(outcome.err)
    assert "cannot write /proc/version: " in line and "does not exist" not in line, line
    assert db_snapshot(seeded_db) == before


@pytest.mark.parametrize(("code", "expected"), [
    (errno.ENOENT, "does not take new files"),  # the folder exists: its file system refused (/proc)
    (errno.EISDIR, "is a directory; give a file name"),
    (errno.EROFS, "is on a read-only file system"),
    (errno.EACCES, "permission denied"),
    (errno.EIO, os.strerror(errno.EIO)),
])
def test_a_failed_write_is_named_by_its_errno(code: int, expected: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(files.tempfile, "mkstemp", refuse)
    target = tmp_path / "report.html"
    with pytest.raises(UserError) as info:
        files.write_atomic(target, "<html></html>")
    message = str(info.value)
    assert message.startswith(f"cannot write {target}: ") and expected in message, message
    assert "does not exist" not in message and "\n" not in message
    assert not target.exists()
