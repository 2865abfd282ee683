"""The Runner's event contract and failure handling, its client in processes of its own, and
`tunebench run`, against a fake server (the real engine is exercised in tests/e2e/test_load_e2e.py)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.bus import Bus, Event, Item
from app.cli import main
from app.config import RunConfig
from app.events import LevelFinished, RequestDone, RunFinished, RunStarted
from app.load.client import ClientOptions
from app.load.datasets import build_dataset
from app.load.executor import LiveStats, StopRule
from app.load.patterns import LevelPlan
from app.load.procs import ClientPool
from app.load.tokens import load_token_counter
from app.runner import Runner, RunResult, mask_env
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from tests.fakes.fixed_reply import fixed_reply_server
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer
from tests.fuzz.hostile import cli
from tests.small_profile import write_small_profile


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeBehaviour(delay_s=0.003, api_key="k1")) as srv:
        yield srv


def config(**load: object) -> RunConfig:
    return RunConfig(name="unit", workload=WorkloadConfig(num_requests=6, input_len=LengthSpec(mean=16),
                                                          output_len=LengthSpec(mean=12)),
                     load=LoadConfig(**load))  # type: ignore[arg-type]


def events(bus_items: list[object]) -> list[Event]:
    return [i for i in bus_items if isinstance(i, Event)]


def test_event_order_and_result(server: FakeOpenAIServer) -> None:
    bus = Bus()
    sub = bus.subscribe()
    runner = Runner(config(pattern="sweep", levels=[1, 2], slo="ttft_ms<=1000", warmup_requests=2), bus,
                    endpoint=server.base_url, api_key="k1", telemetry=False)
    result = runner.run()
    assert result.status == "completed", result.reason
    evs = events(sub.drain())
    kinds = [e.kind for e in evs]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert kinds.index("engine_ready") < kinds.index("level_started")
    assert kinds.count("level_started") == kinds.count("level_finished") == 2
    assert kinds.count("request") == 12  # warm-up requests are not published
    assert all(getattr(e.payload, "run_id", runner.run_id) == runner.run_id for e in evs)
    started = evs[0].payload
    assert isinstance(started, RunStarted)
    assert started.endpoint == server.base_url and started.argv is None and started.config.name == "unit"
    first_level = kinds.index("level_started")
    assert all(k != "request" for k in kinds[:first_level])
    finished = evs[-1].payload
    assert isinstance(finished, RunFinished)
    assert finished.status == "completed" and len(finished.summary["levels"]) == 2
    req = next(e.payload.record for e in evs if isinstance(e.payload, RequestDone))
    assert req.ok and req.ttft_ms is not None and len(req.itl_ms) == req.output_tokens - 1 == 11
    assert isinstance(req.itl_ms, list)  # the record crossed from the client process as a compact tuple
    # The result: two levels, the fake's generation counter matches the client's count exactly.
    assert [lv.summary.completed for lv in result.levels] == [6, 6]
    assert all(lv.requests == [] for lv in result.levels)  # kept only when asked: the store has them
    assert all(lv.summary.tokens_match_engine for lv in result.levels)
    assert result.levels[0].summary.goodput_rps is not None and result.model == "fake-model"
    assert any("warm-up: 2 requests" in n for n in result.notes)
    assert RunResult.model_validate_json(result.model_dump_json()) == result


def test_unreachable_endpoint_fails_with_reason_and_keeps_records() -> None:
    bus = Bus()
    sub = bus.subscribe(kinds=[RunFinished, RequestDone])
    result = Runner(config(concurrency=2), bus, endpoint="http://127.0.0.1:9", telemetry=False).run()
    assert result.status == "failed" and "cannot connect" in (result.reason or "")
    assert result.levels and result.levels[0].summary.errors >= 5
    evs = events(sub.drain())
    assert evs[-1].kind == "run_finished" and evs[-1].payload.status == "failed"  # type: ignore[union-attr]


def test_bad_dataset_fails_cleanly(server: FakeOpenAIServer, tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{\"not\": \"sharegpt\"}")
    cfg = config()
    cfg.workload = WorkloadConfig(kind="sharegpt", dataset_path=str(bad))
    result = Runner(cfg, Bus(), endpoint=server.base_url, api_key="k1", telemetry=False).run()
    assert result.status == "failed" and "not a ShareGPT JSON file" in (result.reason or "")


class _CancelAfterRequests(Bus):
    """Sets ``cancel`` when the ``n``-th completed request is published: the cancel lands
    mid-level however slow the machine is (a timer armed before ``run`` can fire before the
    level starts)."""

    def __init__(self, cancel: threading.Event, n: int) -> None:
        super().__init__()
        self.cancel, self.n, self.completed = cancel, n, 0

    def publish(self, item: Item) -> None:
        super().publish(item)
        if isinstance(item, Event) and isinstance(item.payload, RequestDone) and item.payload.record.ok:
            self.completed += 1
            if self.completed >= self.n:
                self.cancel.set()


def test_cancel_mid_level() -> None:
    cfg = config(concurrency=2)
    cfg.workload.num_requests = 200
    cfg.workload.output_len = LengthSpec(mean=20)
    cancel = threading.Event()
    bus = _CancelAfterRequests(cancel, n=3)
    with FakeOpenAIServer(FakeBehaviour(mode="slow", delay_s=0.005)) as slow:
        result = Runner(cfg, bus, endpoint=slow.base_url, telemetry=False).run(cancel)
    assert cancel.is_set() and bus.completed >= 3
    assert result.status == "cancelled", result.reason
    summary = result.levels[0].summary
    assert 0 < summary.completed < 200 and 1 <= summary.cancelled <= 2  # cut mid-stream, kept


def test_workers_split_a_level_over_processes() -> None:
    """Two client processes share a level; each record reaches the bus (and so the store) as it
    completes, not in a burst at the level's end."""
    cfg = config(concurrency=4, workers=2)
    cfg.workload.num_requests = 24
    bus = Bus()
    sub = bus.subscribe(kinds=[RequestDone, LevelFinished])
    with FakeOpenAIServer(FakeBehaviour(mode="slow", delay_s=0.01)) as slow:  # ~0.12 s a request
        runner = Runner(cfg, bus, endpoint=slow.base_url, telemetry=False)
        result = runner.run()
    assert result.status == "completed", result.reason
    assert result.levels[0].summary.completed == 24 and result.levels[0].summary.tokens_match_engine
    assert len(runner.client_pids) == 2 and os.getpid() not in runner.client_pids
    events = [e for e in sub.drain() if isinstance(e, Event)]
    published = [e for e in events if e.kind == "request"]
    finished = next(e for e in events if e.kind == "level_finished")
    recs = [e.payload.record for e in published]  # type: ignore[union-attr]
    assert all(r.ok for r in recs) and sorted(r.index for r in recs) == list(range(24))
    ids = {r.request_id for r in recs}  # each process sends ids of its own: none is sent twice
    assert len(ids) == 24 and set(slow.request_ids) - {None} == ids  # (the cache probe sends none)
    assert {rid.split("-")[2] for rid in ids} == {"w0", "w1"}  # type: ignore[union-attr]
    assert all(e.t_mono < finished.t_mono for e in published)
    # 6 rounds of ~0.12 s requests per worker: streamed records span most of the level
    assert published[-1].t_mono - published[0].t_mono > 0.2, [round(e.t_mono - published[0].t_mono, 3) for e in published]


def test_mask_env() -> None:
    assert mask_env({"VLLM_API_KEY": "x", "HF_TOKEN": "y", "VLLM_CPU_KVCACHE_SPACE": "1"}) == {
        "VLLM_API_KEY": "***", "HF_TOKEN": "***", "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_cli_run_writes_json_and_prints_table(server: FakeOpenAIServer, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    profile = write_small_profile(tmp_path / "p.toml", "cli", 4, 5, "concurrency = 2")
    out = tmp_path / "r.json"
    code = main(["run", str(profile), "--endpoint", server.base_url, "--api-key", "k1", "--json", str(out),
                 "--no-telemetry", "--db", str(tmp_path / "runs.db")])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "concurrency 2" in text and "out tok/s" in text and "engine 20: equal" in text
    data = json.loads(out.read_text())
    assert data["status"] == "completed" and data["levels"][0]["requests"] == []  # only with --json-requests
    # ... and the run is in the database, under the runner's id, with its requests.
    assert "stored as run" in text
    from app.store import RunStore

    with RunStore(tmp_path / "runs.db") as store:
        run = store.get_run(data["run_id"])
        assert run.status == "completed"
        assert len(store.request_records(data["run_id"])) == 4


def test_cli_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text('[load]\nslo = "fast please"\n')
    assert main(["run", str(profile), "--endpoint", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not like" in err and "Traceback" not in err
    assert main(["run", "no-such-profile.toml"]) == 2
    good = tmp_path / "g.toml"
    good.write_text("name = 'x'\n")
    assert main(["run", str(good), "--json", str(tmp_path / "missing" / "r.json")]) == 2
    assert "folder does not exist" in capsys.readouterr().err


def test_the_profile_example_in_docs_is_valid(repo_root: Path) -> None:
    import re
    import tomllib

    text = (repo_root / "docs" / "metrics.md").read_text()
    (block,) = re.findall(r"```toml\n(.*?)```", text, re.S)
    config = RunConfig.model_validate(tomllib.loads(block))
    assert config.workload.kind == "shared_prefix" and config.load.levels == [1, 4, 16, 64]


def test_cli_json_requests_on_request(server: FakeOpenAIServer, tmp_path: Path) -> None:
    profile = write_small_profile(tmp_path / "p.toml", "cli", 3, 4)
    out = tmp_path / "r.json"
    assert main(["run", str(profile), "--endpoint", server.base_url, "--api-key", "k1", "--json", str(out),
                 "--json-requests", "--no-telemetry", "--no-store"]) == 0
    requests = json.loads(out.read_text())["levels"][0]["requests"]
    assert len(requests) == 3 and all(r["ok"] and len(r["itl_ms"]) == 3 for r in requests)


def test_client_runs_in_its_own_process_bound_to_its_cores(server: FakeOpenAIServer) -> None:
    """Every thread of the client process is bound to the cores it was given (Linux binds per
    thread), and records come back whole from it."""
    core = max(os.sched_getaffinity(0))
    cfg = config()
    counter = load_token_counter(None, None, None, "fake-model")
    dataset = build_dataset(cfg.workload, counter, variant=0)
    opts = ClientOptions(base_url=server.base_url, model="fake-model", headers={"Authorization": "Bearer k1"})
    got: list[object] = []
    with ClientPool(1) as pool:
        pool.bind([core])
        out = pool.run_level(LevelPlan(0, "c=2", "closed", concurrency=2), dataset, opts, StopRule(), live=LiveStats(None),
                             cancel=threading.Event(), seed=0, on_record=got.append)
        (pid,) = pool.pids
        assert pid != os.getpid()
        tids = os.listdir(f"/proc/{pid}/task")
        assert len(tids) >= 2  # the event loop and the queue's feeder thread at least
        for tid in tids:
            assert os.sched_getaffinity(int(tid)) == {core}, tid
    assert out.stop_reason == "completed" and len(got) == 6 and out.output_tokens == 6 * 12
    assert sorted(r.index for r in got) == list(range(6)) and all(len(r.itl_ms) == 11 for r in got)  # type: ignore[attr-defined]
    # The lag probe wakes every 5 ms: a level this short may end before its first sample.
    assert out.client_lag_ms.dtype == np.float32 and out.client_lag_ms.size <= out.duration_s / 0.005 + 1


@pytest.mark.parametrize("server_kind", ["closed port", "HTTP 500", "HTTP 401", "not SSE"])
def test_a_run_with_no_success_fails_however_small(server_kind: str) -> None:
    """Four requests, all failed: below the error budget's minimum of five, but still no success."""
    cfg = config(concurrency=2)
    cfg.workload.num_requests = 4
    if server_kind == "closed port":
        result = Runner(cfg, Bus(), endpoint="http://127.0.0.1:9", telemetry=False).run()
    elif server_kind == "not SSE":
        with fixed_reply_server(b'{"object": "list", "data": []}', "application/json") as not_sse:
            result = Runner(cfg, Bus(), endpoint=not_sse, telemetry=False).run()
    else:
        mode, key = ("http_500", None) if server_kind == "HTTP 500" else ("ok", "the-right-key")
        with FakeOpenAIServer(FakeBehaviour(mode=mode, api_key=key)) as bad:
            result = Runner(cfg, Bus(), endpoint=bad.base_url, api_key="a-wrong-key" if key else None,
                            telemetry=False).run()
    assert result.status == "failed", (server_kind, result.reason)
    assert "no request succeeded (4 failed)" in (result.reason or ""), result.reason
    assert result.levels[0].summary.errors == 4


def test_cli_refuses_an_empty_endpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import app.runner

    def no_launch(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("an engine was launched")

    monkeypatch.setattr(app.runner, "launch_engine", no_launch)
    profile = tmp_path / "p.toml"
    profile.write_text("name = 'x'\n")
    assert main(["run", str(profile), "--endpoint", "", "--db", str(tmp_path / "runs.db")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "empty" in err and "Traceback" not in err
    with pytest.raises(Exception, match="empty"):
        Runner(RunConfig(), Bus(), endpoint="")


def test_cli_run_on_a_full_disk_is_not_completed(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """``ulimit -f`` one page above the database's size: the run cannot be stored, so it must
    not end ``completed`` with exit code 0."""
    from app.store import RunStore

    db = tmp_path / "runs.db"
    with RunStore(db):
        pass
    limit = db.stat().st_size + 4096
    profile = tmp_path / "p.toml"
    profile.write_text('name = "full"\n[workload]\nnum_requests = 2000\n[workload.input_len]\nmean = 8\n'
                       '[workload.output_len]\nmean = 40\n[load]\nconcurrency = 8\n')

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "TUNEBENCH_API_KEY": "k1"}
    proc = subprocess.run([sys.executable, "-m", "app.cli", "run", str(profile), "--endpoint", server.base_url,
                           "--no-telemetry", "--db", str(db)], capture_output=True, text=True, timeout=300,
                          preexec_fn=limit_file_size, env=env, check=False)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "could not be stored" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    with RunStore(db) as store:
        assert all(run.status != "completed" for run in store.list_runs())


def test_each_request_carries_an_id_of_its_own_that_its_record_keeps(tmp_path: Path) -> None:
    """``X-Request-Id: tb-<run>-L<level>-<index>`` on every request, the same id in its stored
    record, and ``runs show RUN --request ID`` prints that request's timeline."""
    from app.store import RunStore

    with FakeOpenAIServer(FakeBehaviour(delay_s=0.003)) as srv:
        profile = write_small_profile(tmp_path / "p.toml", "ids", 4, 5, 'pattern = "sweep"\nlevels = [1, 2]')
        out = tmp_path / "r.json"
        db = str(tmp_path / "runs.db")
        assert main(["run", str(profile), "--endpoint", srv.base_url, "--json", str(out), "--no-telemetry",
                     "--db", db]) == 0
        sent = [rid for rid in srv.request_ids if rid is not None]
    run_uid = json.loads(out.read_text())["run_id"]
    assert len(sent) == 8 and len(set(sent)) == 8  # two levels of four, each id its own
    assert set(sent) == {f"tb-{run_uid[:12]}-L{level}-{i}" for level in (0, 1) for i in range(4)}
    with RunStore(db) as store:
        records = store.request_records(run_uid)
    kept = {r["extra"]["request_id"]: r for r in records}
    assert set(kept) == set(sent)
    wanted = f"tb-{run_uid[:12]}-L1-2"
    shown = cli("runs", "show", run_uid, "--db", db, "--request", wanted).check()
    assert shown.code == 0, shown
    lines = shown.out.splitlines()
    assert lines[0] == f"request {wanted} (level 1, the run's request {kept[wanted]['extra']['index']})"
    ttft = kept[wanted]["ttft_ms"]
    assert any(line.startswith("  first token  +") and f"(TTFT {ttft:,.1f} ms)" in line for line in lines), lines
    assert lines[-1] == "  HTTP 200, completed"
    as_json = json.loads(cli("runs", "show", run_uid, "--db", db, "--request", wanted, "--json").check().out)
    assert as_json["extra"]["request_id"] == wanted and as_json["ttft_ms"] == ttft
    unknown = cli("runs", "show", run_uid, "--db", db, "--request", "tb-nope").check()
    assert unknown.code == 2 and f"has no request 'tb-nope': its 8 ids run from tb-{run_uid[:12]}-L0-0" in unknown.err


def test_a_crashed_client_says_what_failed_and_where() -> None:
    """A bare assertion in a worker is one line naming the check's place, not just its type."""
    from app.load.procs import crash_line

    formatted = ('Traceback (most recent call last):\n  File "/x/app/load/executor.py", line 40, in run\n    go()\n'
                 '  File "/x/app/load/patterns.py", line 98, in arrival_offsets_s\n'
                 '    assert plan.rate_rps is not None\nAssertionError\n')
    assert crash_line(formatted) == 'AssertionError (File "/x/app/load/patterns.py", line 98, in arrival_offsets_s)'
    assert crash_line("") == "no traceback"
