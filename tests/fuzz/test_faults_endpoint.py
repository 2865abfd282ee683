"""Fault injection at the endpoint: ``run --endpoint`` against a closed port and against servers
that do not speak HTTP properly (a non-HTTP greeting, a 2 MiB header line, a thousand headers, bad
chunking, a silent close). Each run ends without a traceback, says what went wrong, is stored,
and is never stored or reported as ``completed``."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.store import RunStore
from tests.fuzz.hostile import REPLIES, cli, closed_port, raw_server

PROFILE = """name = "fault injection"
[workload]
kind = "random"
num_requests = 4
model_name = "fake"
[workload.input_len]
mean = 16
[workload.output_len]
mean = 4
[load]
pattern = "closed"
concurrency = 2
request_timeout_s = 10
"""


def _run_against(url: str, tmp_path: Path) -> None:
    profile, db = tmp_path / "p.toml", tmp_path / "runs.db"
    profile.write_text(PROFILE)
    outcome = cli("run", str(profile), "--endpoint", url, "--db", str(db), "--no-telemetry")
    assert "Traceback" not in outcome.err + outcome.out, outcome
    assert outcome.code != 0, outcome
    with RunStore(db) as store:
        runs = store.list_runs()
    assert [r.status for r in runs] not in ([], ["completed"]), (runs, outcome)
    assert runs[0].status in ("failed", "interrupted"), runs
    assert "run completed" not in outcome.out


def test_a_dead_endpoint_fails_the_run(tmp_path: Path) -> None:
    _run_against(f"http://127.0.0.1:{closed_port()}", tmp_path)


@pytest.mark.parametrize("mode", sorted(REPLIES))
def test_a_server_that_is_not_http_fails_the_run_in_words(mode: str, tmp_path: Path) -> None:
    with raw_server(REPLIES[mode]) as url:
        _run_against(url, tmp_path)
