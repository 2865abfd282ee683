"""The real vLLM CPU engine's whole life: ready, a streamed completion, feature verification,
a diagnosed startup failure, Ctrl-C from the CLI, and the engine stopped by its watchdog when tunebench is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from engine_adapters.config import EngineConfig, Features, RuntimeConfig
from engine_adapters.hardware import probe_hardware
from engine_adapters.launcher import EngineProcess, EngineStartError, group_members, registry_dir, stop_group
from tests.e2e.cli_io import read_until

pytestmark = pytest.mark.e2e
TUNEBENCH = [sys.executable, "-m", "app.cli"]


def stream_completion(base_url: str, api_key: str | None, max_tokens: int = 12) -> list[dict]:
    """A streamed completion; returns the parsed SSE chunks."""
    models = json.loads(urllib.request.urlopen(urllib.request.Request(
        base_url + "/v1/models", headers={"Authorization": f"Bearer {api_key}"}), timeout=30).read())
    body = {"model": models["data"][0]["id"], "prompt": "def add(a, b):", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    request = urllib.request.Request(base_url + "/v1/completions", data=json.dumps(body).encode(), headers={
        "Authorization": f"Bearer {api_key}", "Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(request, timeout=120) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_demo_engine_serves_a_streamed_completion(demo_engine: EngineProcess) -> None:
    chunks = stream_completion(demo_engine.base_url, demo_engine.api_key, max_tokens=12)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts[-1] == 12
    assert counts == sorted(counts) and counts[0] >= 1  # cumulative per chunk: a chunk may carry several tokens
    assert any(c["choices"] and c["choices"][0]["text"] for c in chunks)
    assert demo_engine.ready_info is not None and demo_engine.ready_info.kv_cache["kv_cache_tokens"] > 0


def test_demo_engine_requires_its_api_key_and_listens_on_loopback(demo_engine: EngineProcess) -> None:
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(demo_engine.base_url + "/v1/models", timeout=10)
    assert info.value.code == 401
    listening = set()
    for proc in group_members(demo_engine.pid or 0):
        for conn in proc.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == demo_engine.port:
                listening.add(conn.laddr.ip)
    assert listening == {"127.0.0.1"}


def test_prefix_caching_verified_by_hits(demo_engine: EngineProcess) -> None:
    """Active means it worked: the probe's repeated 528-token prompt hits the cache for its four
    whole 128-token blocks (the echo of the flag alone would only be "accepted")."""
    check = {c.key: c for c in demo_engine.verify_features()}["prefix_caching"]
    assert check.status == "verified", check
    assert check.evidence == "prefix-cache hits on 512 of 528 tokens of a repeated prompt"
    again = {c.key: c for c in demo_engine.verify_features()}["prefix_caching"]
    assert again == check  # the probe's salt is new each time: no hits left over from the last probe


def _expect_diagnosed_failure(engine: EngineProcess, code: str) -> EngineStartError:
    engine.start()
    with pytest.raises(EngineStartError) as info:
        engine.wait_ready(timeout_s=600)
    assert engine.exited_monotonic is not None
    noticed_after_s = time.monotonic() - engine.exited_monotonic
    assert noticed_after_s < 10, f"the failure was reported {noticed_after_s:.1f} s after the engine exited"
    assert info.value.diagnosis is not None and info.value.diagnosis.code == code, engine.snapshot_log()[-10:]
    assert group_members(engine.pid or 0) == []
    return info.value


def test_fp8_kv_cache_outcome_matches_this_cpu() -> None:
    """vLLM's CPU build stores an FP8 KV cache only with AVX-512 or AMX (it asks torch): on a
    CPU without them the start fails and must be explained; with them it must verifiably work."""
    engine = EngineProcess(EngineConfig(), Features(kv_cache_dtype="fp8"))
    if not probe_hardware().cpu_has_avx512_or_amx:
        error = _expect_diagnosed_failure(engine, "fp8_kv_cpu")
        assert str(error) == ("This CPU cannot keep the KV cache in FP8 (vLLM's CPU build needs AVX-512 or AMX for "
                              "it): set KV-cache precision to 'auto'.")
        return
    engine.start()
    try:
        engine.wait_ready(timeout_s=600)
        check = {c.key: c for c in engine.verify_features()}["kv_cache_dtype"]
        # verified by capacity: the same 1 GiB (VLLM_CPU_KVCACHE_SPACE) holds twice the tokens
        assert check.status == "verified", check
        assert "2.00x the" in check.evidence and "a 16-bit cache would" in check.evidence, check.evidence
    finally:
        engine.stop()
    assert group_members(engine.pid or 0) == []


def test_missing_model_is_diagnosed_within_seconds() -> None:
    engine = EngineProcess(EngineConfig(model="/nonexistent/model", runtime=RuntimeConfig(env={"HF_HUB_OFFLINE": "1"})),
                           Features())
    error = _expect_diagnosed_failure(engine, "model_missing")
    assert str(error).startswith("The model was not found")


def test_cli_engine_start_then_ctrl_c_stops_the_whole_group(repo_root: Path) -> None:
    cli = subprocess.Popen([*TUNEBENCH, "engine", "start", "cpu-demo", "--port", "0"], cwd=repo_root,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        ready, seen = read_until(cli, r"engine ready at (http://127\.0\.0\.1:\d+) \(pid (\d+)", 600)
        key, _ = read_until(cli, r"API key: (\S+)", 10)
        read_until(cli, r"feature prefix_caching=True: active \(verified by prefix-cache hits on \d+ of", 60)
        assert any("[loading weights]" in line for line in seen)
        engine_pid = int(ready.group(2))
        assert stream_completion(ready.group(1), key.group(1), max_tokens=4)[-1]["usage"]["completion_tokens"] == 4
        cli.send_signal(signal.SIGINT)  # what Ctrl-C does to the CLI
        rest = cli.communicate(timeout=60)[0]
        assert cli.returncode == 0, rest
        assert "engine stopped (SIGINT)" in rest
        assert group_members(engine_pid) == []
    finally:
        if cli.poll() is None:
            cli.kill()


def test_engine_of_a_sigkilled_tunebench_is_stopped_by_its_watchdog(repo_root: Path) -> None:
    """kill -9 of the CLI mid-startup: the engine's watchdog ends the engine's whole group at once,
    and the next tunebench finds no orphan left to reap."""
    cli = subprocess.Popen([*TUNEBENCH, "engine", "start", "cpu-demo"], cwd=repo_root,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        read_until(cli, r"\[loading weights\]", 300)
        records = [json.loads(p.read_text()) for p in registry_dir().glob("*.json")]
        mine = [r for r in records if r["owner_pid"] == cli.pid]
        assert len(mine) == 1, records
        engine_pid, watchdog_pid = mine[0]["pid"], mine[0]["watchdog_pid"]
        assert group_members(engine_pid) and group_members(watchdog_pid)
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait(timeout=10)
        killed = time.monotonic()
        while group_members(engine_pid) and time.monotonic() - killed < 30:
            time.sleep(0.2)
        gone_s = time.monotonic() - killed
        assert group_members(engine_pid) == [], "the engine outlived the killed tunebench"
        print(f"\nengine group gone {gone_s:.1f} s after tunebench was killed")
        while group_members(watchdog_pid) and time.monotonic() - killed < 40:
            time.sleep(0.2)
        assert group_members(watchdog_pid) == []
        assert not (registry_dir() / f"{engine_pid}.json").exists()
        again = subprocess.run([*TUNEBENCH, "profile", "check", "cpu-demo", "--no-discover"], cwd=repo_root,
                               capture_output=True, text=True, timeout=120)
        assert "orphaned" not in again.stderr
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        if cli.poll() is None:
            cli.kill()


def test_engine_orphaned_with_its_watchdog_is_stopped_at_next_start(repo_root: Path) -> None:
    """The second line: tunebench and the watchdog die together (say, the whole session is
    killed); the real engine lives on until the next tunebench command finds it in the registry."""
    cli = subprocess.Popen([*TUNEBENCH, "engine", "start", "cpu-demo"], cwd=repo_root,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        read_until(cli, r"\[loading weights\]", 300)
        mine = [r for r in (json.loads(p.read_text()) for p in registry_dir().glob("*.json")) if r["owner_pid"] == cli.pid]
        assert len(mine) == 1, mine
        engine_pid, watchdog_pid = mine[0]["pid"], mine[0]["watchdog_pid"]
        os.kill(watchdog_pid, signal.SIGKILL)
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait(timeout=10)
        time.sleep(1.0)
        assert group_members(engine_pid), "with its watchdog gone too, the engine should outlive tunebench"
        again = subprocess.run([*TUNEBENCH, "profile", "check", "cpu-demo", "--no-discover"], cwd=repo_root,
                               capture_output=True, text=True, timeout=120)
        assert f"stopped orphaned engine pid {engine_pid}" in again.stderr, again.stderr
        assert again.returncode == 0, again.stdout + again.stderr
        assert group_members(engine_pid) == []
        assert not (registry_dir() / f"{engine_pid}.json").exists()
    finally:
        if cli.poll() is None:
            cli.kill()
        for record in [r for r in (json.loads(p.read_text()) for p in registry_dir().glob("*.json"))
                       if r["owner_pid"] == cli.pid]:
            stop_group(record["pgid"], grace_s=(1.0, 3.0, 3.0))


def test_docker_runtime_failure_is_explained_not_hung() -> None:
    """Where docker is installed without a reachable daemon, the launch fails with plain advice.
    Few machines have that, so tests/unit/test_docker_runtime.py runs the same path everywhere
    against a fake ``docker`` (argv, API key by name, each of docker's failures diagnosed)."""
    import shutil

    if shutil.which("docker") is None:
        pytest.skip("docker is not installed on this machine")
    if subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=30).returncode == 0:
        pytest.skip("a docker daemon runs here: a real vLLM image launch is out of scope for the suite")
    engine = EngineProcess(EngineConfig(model="org/model", runtime=RuntimeConfig(kind="docker")), Features())
    engine.start()
    try:
        with pytest.raises(EngineStartError) as info:
            engine.wait_ready(timeout_s=60)
    finally:
        engine.stop()
    assert info.value.diagnosis is not None
    assert info.value.diagnosis.code in {"docker_daemon", "docker_gpu", "docker_image"}, engine.snapshot_log()[-5:]
