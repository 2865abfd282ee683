"""The run store on the real vLLM CPU engine: real runs (prefix caching off vs on) recorded,
listed, compared and exported; the exported bash script starts the same engine with the same
flags; a run whose process is SIGKILLed mid-load is `interrupted` with its samples up to the last
second. Short runs on the shared engines."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from app.bus import Bus
from app.cli import main
from app.config import RunConfig
from app.export import render_launch, spec_from_profile
from app.profiles import load_profile, resolve_profile
from app.recording import RunRecorder
from app.runner import Runner
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import Features
from engine_adapters.launcher import EngineProcess, free_port, group_members, stop_group
from engine_adapters.vllm import parse_non_default_args
from tests.e2e.cli_io import wait_health
from tests.unit.test_export_scripts import shellcheck_bin

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def _short_config(engine: EngineProcess, name: str, num_requests: int = 12, output_tokens: int = 16) -> RunConfig:
    config = load_profile(resolve_profile("cpu-demo"))
    return config.model_copy(update={
        "name": name, "tags": ["e2e", "store"], "engine": engine.engine, "features": engine.features,
        "workload": WorkloadConfig(kind="shared_prefix", num_requests=num_requests, shared_prefix_tokens=1024,
                                   input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=output_tokens)),
        "load": LoadConfig(concurrency=4)})


def _record_pair(engine_pool, demo_engine: EngineProcess, db: Path, tmp_path: Path, tag: str) -> list[int]:  # type: ignore[no-untyped-def]
    """Prefix caching off, then on: two short runs recorded in ``db`` under ``tag``."""
    ids = []
    for label, engine in (("prefix off", engine_pool.get(Features(prefix_caching=False))), ("prefix on", demo_engine)):
        bus = Bus()
        config = _short_config(engine, label)
        config = config.model_copy(update={"tags": [*config.tags, tag]})
        with RunStore(db) as store:
            recorder = RunRecorder(bus, store)
            result = Runner(config, bus, engine=engine).run()
            recorder.close()
            assert result.status == "completed", result.reason
            assert not recorder.errors
            run = store.get_run(recorder.run_id)
        assert (run.name, run.status, run.engine_version) == (label, "completed", "0.32.0")
        assert run.n_requests == 12 and run.metrics["requests_failed"] == 0
        assert run.n_samples > 0 and run.argv and "--port" in run.argv
        assert run.env.get("VLLM_API_KEY") == "***"  # recorded (the engine has one), and masked
        assert engine.api_key and not any(engine.api_key.encode() in f.read_bytes() for f in tmp_path.glob("runs.db*"))
        assert run.engine_info["base_url"] == engine.base_url and run.levels[0].summary
        assert run.config["features"]["prefix_caching"] is (label == "prefix on")
        ids.append(run.id)
    return ids


def test_real_runs_are_recorded_listed_compared_and_exported(engine_pool, demo_engine: EngineProcess,  # type: ignore[no-untyped-def]
                                                             tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"
    # The A/B must come out the right way round. One pair of 12-request runs on this 2-core
    # machine can be disturbed as a whole by another process (a second engine starting); the
    # mechanism (the hit rate) is checked on every pair, the direction on a second pair if the
    # first was turned around.
    for attempt in (1, 2):
        ids = _record_pair(engine_pool, demo_engine, db, tmp_path, f"pair{attempt}")
        assert main(["runs", "list", "--db", str(db), "--tag", f"pair{attempt}", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [r["id"] for r in listed] == ids[::-1]

        assert main(["compare", str(ids[0]), str(ids[1]), "--db", str(db), "--json"]) == 0
        comparison = json.loads(capsys.readouterr().out)
        diff = {d["key"]: d["values"] for d in comparison["config_diff"]}
        assert diff["features.prefix_caching"] == [False, True]
        metrics = {m["name"]: m for m in comparison["metrics"]}
        assert metrics["ttft_ms_p50"]["values"][0] > 0 and metrics["ttft_ms_p50"]["delta_pct"][1] is not None
        # 11 of 12 requests (each level cold, with its own cache salt) hit the 1,024-token prefix
        hit = metrics["prefix_cache_hit_rate"]["values"]
        assert not hit[0] and hit[1] is not None and hit[1] > 0.8, hit
        assert any(s["source"] == "client" for s in comparison["series"]["items"])
        ttft = metrics["engine_ttft_ms_mean"]  # and TTFT falls with it, in the engine's own figure
        if ttft["values"][1] < ttft["values"][0]:
            assert ttft["verdict"][1] == "better", ttft
            break
        assert ttft["verdict"][1] != "better", ttft  # never called better when it is not
    else:
        raise AssertionError(f"prefix caching did not lower the engine's TTFT in two pairs of runs: {ttft}")

    script, report = tmp_path / "winner.sh", tmp_path / "report.html"
    assert main(["export", str(ids[1]), "-f", "bash", "-o", str(script), "--db", str(db)]) == 0
    assert "--enable-prefix-caching" in script.read_text() and "0.32.0" in script.read_text()
    subprocess.run([shellcheck_bin(), str(script)], check=True)
    assert main(["export", str(ids[0]), str(ids[1]), "-f", "html", "-o", str(report), "--db", str(db)]) == 0
    assert "features.prefix_caching" in report.read_text()


def test_exported_bash_script_starts_the_same_engine_with_the_same_flags(demo_engine: EngineProcess,
                                                                         tmp_path: Path) -> None:
    """The demo engine was launched by tunebench from the cpu-demo configuration; the script
    exported from the cpu-demo profile, run as is, must make vLLM parse the same arguments."""
    script = tmp_path / "cpu-demo.sh"
    script.write_text(render_launch(spec_from_profile(resolve_profile("cpu-demo")), "bash"))
    port = free_port()
    log_path = tmp_path / "engine.log"
    api_key = secrets.token_urlsafe(16)
    env = {**os.environ, "PORT": str(port), "VLLM_API_KEY": api_key}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["bash", str(script)], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        wait_health(f"http://127.0.0.1:{port}/health", proc, 400)
        deadline = time.monotonic() + 10
        while "engine ready at" not in log_path.read_text(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.2)  # the script's own health wait reports too
        lines = log_path.read_text(errors="replace").splitlines()
        assert any("engine ready at" in line for line in lines)
        exported = parse_non_default_args(lines)
        launched = parse_non_default_args(demo_engine.snapshot_log())
        assert exported and launched
        assert exported.pop("port") == port and launched.pop("port") == demo_engine.port
        # the one addition: clients ask for the profile's model name, not this machine's cache path
        assert exported.pop("served_model_name") in (["tunebench:demo"], "tunebench:demo")
        launched.pop("served_model_name", None)
        assert exported == launched
        models = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                        headers={"Authorization": f"Bearer {api_key}"})
        with urllib.request.urlopen(models, timeout=30) as resp:
            assert [m["id"] for m in json.load(resp)["data"]] == ["tunebench:demo"]
        assert exported["enable_prefix_caching"] is True
    finally:
        how = stop_group(proc.pid, leader=None)
        proc.wait(timeout=30)
    assert not group_members(proc.pid), how


_RUN_AND_RECORD = """
import os, sys
from app.bus import Bus
from app.profiles import load_profile, resolve_profile
from app.recording import record_to_default_store
from app.runner import Runner
from app.workload import LengthSpec, LoadConfig, WorkloadConfig

config = load_profile(resolve_profile("cpu-demo")).model_copy(update={
    "name": "doomed", "workload": WorkloadConfig(num_requests=400, input_len=LengthSpec(mean=32),
                                                 output_len=LengthSpec(mean=48)),
    "load": LoadConfig(pattern="constant", rate_rps=10, max_concurrency=4)})
bus = Bus()
recorder = record_to_default_store(bus)  # TUNEBENCH_DB
Runner(config, bus, endpoint=sys.argv[1], api_key=sys.argv[2]).run()
recorder.close()
"""


def _kill_mid_load(argv: list[str], db: Path, min_requests: int = 8) -> tuple[int, float, int]:
    """Start a recording run, SIGKILL its process group once it has stored some requests; return
    (run id, wall time of the kill, samples stored 3 s before the kill)."""
    env = {**os.environ, "TUNEBENCH_DB": str(db)}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        run_id = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            if db.exists():
                with RunStore(db) as store:  # opening while the writer lives must not interrupt its run
                    runs = store.list_runs()
                    if runs and runs[0].status == "running" and store.get_run(runs[0].id).n_requests >= min_requests:
                        run_id = runs[0].id
                        break
            time.sleep(0.5)
        assert run_id is not None, "the run did not store requests in time"
        with RunStore(db) as store:
            samples_before = store.get_run(run_id).n_samples
        time.sleep(3.0)  # mid-load: requests and samples are flowing
        killed_at = time.time()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        return run_id, killed_at, samples_before
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _check_interrupted(db: Path, run_id: int, killed_at: float, samples_before: int) -> None:
    with RunStore(db) as store:
        run = store.get_run(run_id)
        assert run.status == "interrupted" and "ended before the run finished" in (run.reason or "")
        assert run.n_requests >= 8 and run.n_samples > 0
        last_sample = max(float(b.t_wall.max()) for b in store.samples(run_id).values())
        # Flushed while the run went on (every 0.5 s by design): samples stored during the 3 s
        # before the kill, and the newest within a few flushes of it (the writer thread shares 2
        # cores with the engine and can run late; the guarantee is "as it goes", not "at the end").
        assert run.n_samples > samples_before, (run.n_samples, samples_before)
        assert killed_at - last_sample <= 5.0, (killed_at, last_sample)
        assert run.finished_at is not None and run.finished_at <= killed_at
        assert run.metrics["requests_total"] == run.n_requests
    with RunStore(db) as store:  # opens cleanly again, nothing left to repair
        assert store.interrupted_on_open == []


def test_sigkill_mid_load_leaves_an_interrupted_run_with_its_samples(demo_engine: EngineProcess, tmp_path: Path) -> None:
    db = tmp_path / "killed.db"
    argv = [sys.executable, "-c", _RUN_AND_RECORD, demo_engine.base_url, demo_engine.api_key or ""]
    run_id, killed_at, samples_before = _kill_mid_load(argv, db)
    _check_interrupted(db, run_id, killed_at, samples_before)


def test_sigkill_of_the_cli_run_mid_load(demo_engine: EngineProcess, tmp_path: Path) -> None:
    """`tunebench run` records through app.recording; SIGKILL leaves an interrupted run."""
    profile = tmp_path / "long.toml"
    config = load_profile(resolve_profile("cpu-demo")).model_copy(update={
        "name": "cli doomed", "workload": WorkloadConfig(num_requests=400, input_len=LengthSpec(mean=32),
                                                          output_len=LengthSpec(mean=48)),
        # Paced (400 requests take 40 s at least), so a fast machine cannot finish before the kill.
        "load": LoadConfig(pattern="constant", rate_rps=10, max_concurrency=4)})
    from app.profiles import save_profile

    save_profile(config, profile)
    db = tmp_path / "cli.db"
    argv = [sys.executable, "-m", "app.cli", "run", str(profile), "--endpoint", demo_engine.base_url,
            "--api-key", demo_engine.api_key or ""]
    run_id, killed_at, samples_before = _kill_mid_load(argv, db)
    _check_interrupted(db, run_id, killed_at, samples_before)


def test_engine_death_mid_run_is_stored_as_failed_with_partial_data(tmp_path: Path) -> None:
    """The runner's own engine is SIGKILLed mid-load: the stored run ends `failed` with the
    runner's reason, word for word, and keeps the requests, samples and log recorded before."""
    import threading
    from urllib.parse import urlparse

    from engine_adapters.launcher import registered_engines

    config = load_profile(resolve_profile("cpu-demo")).model_copy(update={
        "name": "engine dies", "workload": WorkloadConfig(num_requests=400, input_len=LengthSpec(mean=32),
                                                           output_len=LengthSpec(mean=48)),
        "load": LoadConfig(pattern="constant", rate_rps=10, max_concurrency=4)})
    db = tmp_path / "died.db"
    bus = Bus()
    store = RunStore(db)
    recorder = RunRecorder(bus, store)
    runner = Runner(config, bus)
    box: dict[str, object] = {}
    thread = threading.Thread(target=lambda: box.update(result=runner.run()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 400
        run = None
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if recorder.run_id is not None:
                run = store.get_run(recorder.run_id)
                if run.n_requests >= 8:
                    break
        assert run is not None and run.n_requests >= 8 and run.endpoint, "the run did not get going"
        port = urlparse(run.endpoint).port
        (record,) = [r for r in registered_engines() if r.port == port]
        os.killpg(record.pgid, signal.SIGKILL)
        thread.join(120)
        assert not thread.is_alive(), "the runner did not notice the engine's death"
    finally:
        recorder.close()
    try:
        run = store.get_run(recorder.run_id)
        result = box["result"]
        assert run.status == "failed" == result.status  # type: ignore[attr-defined]
        assert run.reason and run.reason == result.reason  # type: ignore[attr-defined]
        assert run.reason == ("the engine exited: The engine was killed by SIGKILL from outside (another process, "
                              "or the kernel's out-of-memory killer: check `dmesg`).")
        assert run.n_requests >= 8 and run.n_samples > 0 and run.n_log_lines > 0
        assert run.metrics["requests_total"] == run.n_requests
    finally:
        store.close()
        assert not group_members(record.pgid)
