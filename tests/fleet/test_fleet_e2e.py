"""The fleet on a real Ray cluster on this machine (tests/ray_cluster.py: a head and two worker
nodes, 127.0.0.1 only) with the real llama.cpp CPU engine: trials spread over the nodes, each run
stored with its node, token counts equal each engine's counter, a lost node's trial runs again
elsewhere, and a driver killed with SIGKILL leaves no engine on any node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.analysis.compare import NODE_TAG
from app.bus import Bus, Event, Subscription
from app.campaign import Campaign, CampaignResult, Step
from app.config import RunConfig
from app.events import RunStarted
from app.profiles import load_profile_file
from app.recording import RunRecorder
from app.store import RunStore
from engine_adapters.launcher import EngineRecord, group_members, registered_engines
from engine_adapters.llamacpp_runtime import ensure_gguf_demo_model
from engine_adapters.runtimes import COMPLETE_MARKER, MANAGED_RUNTIMES, demo_model_dir
from tests.fuzz.hostile import closed_port
from tests.ray_cluster import MID_RUN_RATE_RPS, LocalRayCluster, tiny_profile

pytestmark = pytest.mark.e2e

RUNTIME = MANAGED_RUNTIMES["llamacpp-cpu"]
@pytest.fixture(scope="module")
def gguf() -> Path:
    """Made once here, before two nodes would both convert it at the same moment."""
    if not RUNTIME.is_installed() or not (demo_model_dir() / COMPLETE_MARKER).is_file():
        pytest.fail("llama.cpp runtime or demo model missing: run `make engine`")
    return ensure_gguf_demo_model(str(RUNTIME.interpreter))


def tunebench(args: list[str], cluster: LocalRayCluster, tmp_path: Path, timeout_s: float = 300) \
        -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=timeout_s,
                          env={**cluster.env(), "TUNEBENCH_DB": str(tmp_path / "runs.db")}, check=False)


@pytest.fixture
def engines_before() -> set[tuple[int, float]]:
    """The engines already registered when a test starts: the session's shared engines of other tests may run."""
    return {(r.pid, r.create_time) for r in registered_engines()}


def engines_since(before: set[tuple[int, float]]) -> list[EngineRecord]:
    return [r for r in registered_engines() if (r.pid, r.create_time) not in before]


@dataclass
class TrialInBackground:
    """One trial of the tiny profile on the cluster, run by a campaign in a thread of this process."""

    started: Subscription
    store: RunStore
    recorder: RunRecorder
    thread: threading.Thread
    box: dict[str, CampaignResult]

    def result(self, timeout_s: float = 240) -> CampaignResult:
        self.thread.join(timeout=timeout_s)
        assert not self.thread.is_alive(), "the campaign did not end"
        self.recorder.close()
        return self.box["result"]


def trial_in_background(tmp_path: Path, name: str) -> TrialInBackground:
    from app.fleet.trial import RayFleet

    config: RunConfig = load_profile_file(tiny_profile(tmp_path, requests=120, rate_rps=MID_RUN_RATE_RPS)).run
    bus = Bus()
    started = bus.subscribe(kinds=(RunStarted,))
    store = RunStore(tmp_path / f"{name.replace(' ', '-')}.db")
    recorder = RunRecorder(bus, store)
    box: dict[str, CampaignResult] = {}
    campaign = Campaign([Step(name, config, 1)], bus, fleet=RayFleet(), recorder=recorder)
    thread = threading.Thread(target=lambda: box.update(result=campaign.run()), daemon=True)
    thread.start()
    return TrialInBackground(started, store, recorder, thread, box)


def still_running(engines: list[EngineRecord], within_s: float = 10.0) -> list[EngineRecord]:
    """The engines of ``engines`` still running ``within_s`` from now (checked every 0.25 s)."""
    deadline = time.monotonic() + within_s
    left = [r for r in engines if group_members(r.pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = [r for r in left if group_members(r.pid)]
    return left


def node_of(tags: list[str]) -> str | None:
    return next((t.removeprefix(NODE_TAG) for t in tags if t.startswith(NODE_TAG)), None)


def test_cluster_status_shows_every_node_and_no_mismatch(ray_cluster: LocalRayCluster, tmp_path: Path) -> None:
    done = tunebench(["cluster", "status", ray_cluster.address, "--json"], ray_cluster, tmp_path, 120)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    alive = [n for n in status["nodes"] if n["alive"]]
    assert len(alive) == 1 + len(ray_cluster.workers)
    assert status["mismatches"] == []
    assert {n["report"]["tunebench"] for n in alive} == {status["driver"]}
    assert {k for n in alive for k in n["total"]} >= set(ray_cluster.workers)


def test_cluster_status_counts_a_placement_groups_resources_as_held(ray_cluster: LocalRayCluster) -> None:
    """Free is a node's total less what placement groups hold there (a trial's or a client's)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    from app.fleet import cluster

    node_a = ray_cluster.node_id_of("node_a")
    before = {v.node_id: v for v in cluster.nodes(reports=False)}
    group = placement_group([{"CPU": 1.0, "node_a": 0.5}], strategy="STRICT_PACK")
    assert group.wait(60), "the placement group was not placed"
    try:
        during = {v.node_id: v for v in cluster.nodes(reports=False)}
    finally:
        remove_placement_group(group)
    assert during[node_a].total == before[node_a].total
    assert during[node_a].free["CPU"] == before[node_a].free["CPU"] - 1.0
    assert during[node_a].free["node_a"] == before[node_a].free["node_a"] - 0.5
    assert {k: v.free for k, v in during.items() if k != node_a} == {k: v.free for k, v in before.items() if k != node_a}


def test_repeats_spread_over_both_nodes_each_stored_with_its_node(ray_cluster: LocalRayCluster, gguf: Path,
                                                                   tmp_path: Path,
                                                                   engines_before: set[tuple[int, float]]) -> None:
    out = tmp_path / "result.json"
    done = tunebench(["run", str(tiny_profile(tmp_path)), "--repeat", "2", "--cluster", ray_cluster.address,
                      "--parallel", "2", "--json", str(out)], ray_cluster, tmp_path)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0, done.stderr
    assert "up to 2 at once" in done.stderr
    result = json.loads(out.read_text())
    runs = result["steps"][0]["runs"]
    assert [r["status"] for r in runs] == ["completed", "completed"]
    nodes = {node_of(r["config"]["tags"]) for r in runs}
    assert len(nodes) == 2 and None not in nodes, nodes  # one repeat per node
    for run in runs:
        assert run["hardware"]["node"]["label"] == node_of(run["config"]["tags"])
        for level in run["levels"]:
            summary = level["summary"]
            assert summary["errors"] == 0
            assert summary["tokens_match_engine"] is True
            assert summary["output_tokens"] == int(summary["engine"]["generation_tokens"])
    store = RunStore(tmp_path / "runs.db")
    stored = [store.get_run(i) for i in result["steps"][0]["stored_ids"]]
    assert {node_of(r.tags) for r in stored} == nodes
    assert {r.hardware["node"]["ray_node_id"] for r in stored} == {ray_cluster.node_id_of(n) for n in ray_cluster.workers}
    assert "[" in done.stdout and "] level" in done.stdout  # the console labels each trial's lines with its node
    assert not engines_since(engines_before)  # every trial's engine was stopped with its placement


def test_a_node_lost_mid_trial_is_interrupted_and_runs_again_elsewhere(ray_cluster: LocalRayCluster, gguf: Path,
                                                                        tmp_path: Path,
                                                                        engines_before: set[tuple[int, float]]) -> None:
    trial = trial_in_background(tmp_path, "lost node")
    deadline = time.monotonic() + 120
    first = None
    while first is None and time.monotonic() < deadline:
        for item in trial.started.drain(timeout_s=0.5):
            if isinstance(item, Event) and isinstance(item.payload, RunStarted):
                first = node_of(item.payload.tags)
    assert first is not None, "the trial never started"
    lost = next(name for name in ray_cluster.workers if ray_cluster.node_id_of(name).startswith(first.split("/")[1]))
    time.sleep(2.0)  # mid-trial: its requests are under way
    on_lost_node = [r for r in engines_since(engines_before) if r.pid and group_members(r.pid)]
    assert len(on_lost_node) == 1, on_lost_node  # the one trial's engine, on the node about to be lost
    ray_cluster.remove_worker(lost)
    try:
        result = trial.result()
        step = result.steps[0]
        assert result.status == "completed", result.reason
        assert [r.status for r in step.runs] == ["interrupted", "completed"]
        assert step.runs[0].reason == f"node {first} lost"
        second = step.runs[1].hardware["node"]["label"]
        assert second != first
        stored = [trial.store.get_run(i) for i in step.stored_ids]
        assert [r.status for r in stored] == ["interrupted", "completed"]
        assert stored[0].reason == f"node {first} lost"
        left = still_running(on_lost_node)
        assert not left, f"the lost node's engine still runs: {[r.pid for r in left]}"
        for level in step.runs[1].levels:  # the rerun's tokens are the engine's own count
            assert level.summary.errors == 0
            assert level.summary.tokens_match_engine is True
        assert not [r for r in engines_since(engines_before) if group_members(r.pid)]
    finally:
        ray_cluster.add_worker(lost)  # the session's cluster has both workers again


def test_sigkill_of_the_driver_leaves_no_engine_on_any_node(ray_cluster: LocalRayCluster, gguf: Path,
                                                              tmp_path: Path,
                                                              engines_before: set[tuple[int, float]]) -> None:
    driver = subprocess.Popen([sys.executable, "-m", "app.cli", "run", str(tiny_profile(tmp_path, requests=2000)),
                               "--repeat", "2", "--cluster", ray_cluster.address, "--parallel", "2"],
                              env={**ray_cluster.env(), "TUNEBENCH_DB": str(tmp_path / "runs.db")},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        engines = []
        while time.monotonic() < deadline and len(engines) < 2:
            engines = [r for r in engines_since(engines_before) if r.pid and group_members(r.pid)]
            time.sleep(0.5)
        assert len(engines) == 2, "two engines never ran"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        left = still_running(engines)
        assert not left, f"engine processes still running 10 s after the driver died: {[r.pid for r in left]}"
    finally:
        if driver.poll() is None:
            driver.kill()


def test_a_ladder_on_the_cluster_runs_the_steps_it_plans_locally(ray_cluster: LocalRayCluster, gguf: Path,
                                                                  tmp_path: Path,
                                                                  engines_before: set[tuple[int, float]]) -> None:
    from app.analysis.summary import numbers

    profile = Path(__file__).with_name("ladder.toml")
    planned_at = tmp_path / "plan.json"
    assert tunebench(["ladder", str(profile), "--dry-run", "--json", str(planned_at)], ray_cluster,
                     tmp_path).returncode == 0
    ran_at = tmp_path / "ladder.json"
    done = tunebench(["ladder", str(profile), "--cluster", ray_cluster.address, "--parallel", "2", "--json",
                      str(ran_at)], ray_cluster, tmp_path)
    print(done.stdout[-4000:], done.stderr[-2000:])
    assert done.returncode == 0, done.stderr
    planned = json.loads(planned_at.read_text())["plan"]["rows"]
    ladder = json.loads(ran_at.read_text())["ladder"]
    rows = ladder["rows"]
    assert [(r["name"], r["changes"]) for r in rows] == [(r["name"], r["changes"]) for r in planned]
    assert [r["status"] for r in rows] == ["completed"] * len(planned)
    assert [r["config"]["features"] for r in rows] == [r["config"]["features"] for r in planned]
    assert [r["config"]["load"] for r in rows] == [r["config"]["load"] for r in planned]
    store = RunStore(tmp_path / "runs.db")
    runs = [store.get_run(i) for r in rows for i in r["run_ids"]]
    nodes = {node_of(run.tags) for run in runs}
    assert len(nodes) == 2 and None not in nodes  # its steps ran side by side on both nodes
    assert rows[1]["factor_previous"] is not None
    for run in runs:  # each step's client tokens equal its engine's counter
        assert run.status == "completed"
        assert numbers(run.metrics)["tokens_match_engine"] == 1.0, numbers(run.metrics)
    assert not engines_since(engines_before)  # every step's engine was stopped with its placement


def test_an_unreachable_cluster_is_one_line_and_exit_2(tmp_path: Path) -> None:
    port = closed_port()
    env = {**os.environ, "TUNEBENCH_DB": str(tmp_path / "runs.db"), "RAY_ADDRESS": f"127.0.0.1:{port}"}
    for args in (["run", str(tiny_profile(tmp_path)), "--cluster", f"127.0.0.1:{port}"],
                 ["run", str(tiny_profile(tmp_path)), "--cluster"],  # RAY_ADDRESS, as Ray reads it
                 ["cluster", "status", f"ray://127.0.0.1:{port}"]):
        done = subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=60,
                              env=env, check=False)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr, done.stderr
        assert f"cannot reach the Ray cluster at {'ray://' if 'ray://' in args[-1] else ''}127.0.0.1:{port}" \
            in done.stderr, done.stderr
    assert not (tmp_path / "runs.db").exists() or RunStore(tmp_path / "runs.db").list_runs() == []


def test_the_preflight_names_every_node_and_problem_and_launches_nothing(ray_cluster: LocalRayCluster, gguf: Path,
                                                                          tmp_path: Path,
                                                                          engines_before: set[tuple[int, float]]) \
        -> None:
    profile = tiny_profile(tmp_path)
    profile.write_text(profile.read_text().replace('model = "tunebench:demo"', 'model = "/nonexistent/model.gguf"'))
    for extra in ([], ["--skip-bad-nodes"]):
        done = tunebench(["run", str(profile), "--cluster", ray_cluster.address, *extra], ray_cluster, tmp_path)
        assert done.returncode == 2, done.stderr
        lines = [line for line in done.stderr.splitlines() if "does not exist" in line]
        assert len(lines) == len(ray_cluster.workers), done.stderr  # one line per node that could host a trial
        assert all(line.startswith("tunebench: node ") for line in lines)
        assert "nothing was launched" in done.stderr and "Traceback" not in done.stderr
    assert not engines_since(engines_before)


def test_load_from_two_nodes_merges_into_one_level_that_the_engine_counted(ray_cluster: LocalRayCluster, gguf: Path,
                                                                           tmp_path: Path) -> None:
    from engine_adapters.config import EngineConfig, Features, RuntimeConfig
    from engine_adapters.launcher import EngineProcess

    engine = EngineProcess(EngineConfig(kind="llamacpp", runtime=RuntimeConfig(managed="llamacpp-cpu")),
                           Features(max_num_seqs=4))
    engine.start()
    try:
        engine.wait_ready(timeout_s=300)
        out = tmp_path / "result.json"
        done = tunebench(["run", str(tiny_profile(tmp_path, requests=24)), "--endpoint", engine.base_url,
                          "--api-key", engine.api_key or "", "--cluster", ray_cluster.address, "--client-nodes", "2",
                          "--json", str(out)], ray_cluster, tmp_path)
        print(done.stdout[-3000:], done.stderr[-2000:])
        assert done.returncode == 0, done.stderr
        result = json.loads(out.read_text())
        (level,) = result["levels"]
        summary = level["summary"]
        assert summary["completed"] == 24 and summary["errors"] == 0  # both workers' records, in one level
        assert summary["tokens_match_engine"] is True
        assert summary["output_tokens"] == int(summary["engine"]["generation_tokens"])
        notes = "\n".join(result["notes"])
        assert "the load client runs on 2 nodes" in notes
        assert "started on 2 hosts within" in notes and "ms of each other" in notes
    finally:
        engine.stop()


SPACE = """
slo = "e2e_ms<=600000"
[knobs]
max_num_seqs = [2, 4]
[load]
concurrency = [1, 2]
"""


def test_a_four_trial_grid_tune_two_at_once_lands_on_both_nodes(ray_cluster: LocalRayCluster, gguf: Path,
                                                                 tmp_path: Path,
                                                                 engines_before: set[tuple[int, float]]) -> None:
    from app.analysis.summary import numbers

    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    out = tmp_path / "tune.json"
    done = tunebench(["tune", str(tiny_profile(tmp_path)), "--space", str(space), "--cluster", ray_cluster.address,
                      "--parallel", "2", "--json", str(out)], ray_cluster, tmp_path, timeout_s=600)
    print(done.stdout[-4000:], done.stderr[-2000:])
    assert done.returncode == 0, done.stderr
    assert "up to 2 at once" in done.stderr
    tune = json.loads(out.read_text())["tune"]
    assert tune["status"] == "completed" and tune["pick"] is not None
    trials = tune["trials"]
    assert len(trials) == 4 and {t["status"] for t in trials} == {"passed"}
    store = RunStore(tmp_path / "runs.db")
    runs = [store.get_run(t["run_id"]) for t in trials]
    nodes = {node_of(r.tags) for r in runs}
    assert len(nodes) == 2 and None not in nodes, nodes  # the two configurations were searched side by side
    for run in runs:
        assert run.status == "completed"
        assert run.hardware["node"]["label"] == node_of(run.tags)
        figures = numbers(run.metrics)
        assert figures["tokens_match_engine"] == 1.0, figures  # the client's tokens equal the engine's counter
    spans = sorted((t["started_at"], t["finished_at"]) for t in trials)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))  # two trials ran at the same time
    assert not engines_since(engines_before)


def test_ctrl_c_cancels_every_trial_stops_every_engine_and_keeps_the_finished(ray_cluster: LocalRayCluster,
                                                                             gguf: Path, tmp_path: Path,
                                                                             engines_before: set[tuple[int, float]]) \
        -> None:
    out = tmp_path / "result.json"
    driver = subprocess.Popen([sys.executable, "-m", "app.cli", "run",
                               str(tiny_profile(tmp_path, requests=60, rate_rps=MID_RUN_RATE_RPS)),
                               "--repeat", "3", "--cluster", ray_cluster.address, "--parallel", "2", "--json",
                               str(out)],
                              env={**ray_cluster.env(), "TUNEBENCH_DB": str(tmp_path / "runs.db")},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(driver.stdout.readline, "")),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and sum("] level 0" in line for line in list(lines)) < 3:
            time.sleep(0.1)  # the third repeat starts once one of the first two has finished
        assert sum("] level 0" in line for line in list(lines)) >= 3, "".join(lines[-40:])
        running = [r for r in engines_since(engines_before) if r.pid and group_members(r.pid)]
        assert running, "no engine ran"
        os.kill(driver.pid, signal.SIGINT)
        assert driver.wait(timeout=60) == 130, "".join(lines[-40:])
        left = still_running(running)
        assert not left, f"engines still running 10 s after Ctrl-C: {[r.pid for r in left]}"
    finally:
        if driver.poll() is None:
            driver.kill()
    reader.join(timeout=10)
    stored = RunStore(tmp_path / "runs.db").list_runs()
    statuses = sorted(r.status for r in stored)
    assert "completed" in statuses and "cancelled" in statuses, statuses  # the finished stay, the rest cancelled
    assert set(statuses) <= {"completed", "cancelled"}, statuses
    assert not engines_since(engines_before)


def test_a_trials_worker_killed_takes_its_engine_with_it_and_the_run_goes_again(
        ray_cluster: LocalRayCluster, gguf: Path, tmp_path: Path, engines_before: set[tuple[int, float]]) -> None:
    trial = trial_in_background(tmp_path, "worker dies")
    deadline = time.monotonic() + 120
    engines: list[EngineRecord] = []
    while time.monotonic() < deadline and not engines:
        engines = [r for r in engines_since(engines_before) if r.pid and group_members(r.pid)]
        time.sleep(0.25)
    assert len(engines) == 1, "the trial's engine never ran"
    (engine,) = engines
    time.sleep(2.0)  # its requests are under way
    os.kill(engine.owner_pid, signal.SIGKILL)  # the trial's actor: the process that launched the engine
    assert not still_running([engine]), "the engine outlived its worker by 10 s"
    result = trial.result()
    step = result.steps[0]
    assert result.status == "completed", result.reason
    assert [r.status for r in step.runs] == ["interrupted", "completed"]
    reason = step.runs[0].reason or ""
    assert reason.startswith("the trial's worker on node ") and reason.endswith(" died"), reason
    assert [trial.store.get_run(i).status for i in step.stored_ids] == ["interrupted", "completed"]
    assert not engines_since(engines_before)


def test_skip_bad_nodes_leaves_a_node_without_the_runtime_out_and_runs_on_the_others(
        ray_cluster: LocalRayCluster, gguf: Path, tmp_path: Path, engines_before: set[tuple[int, float]]) -> None:
    empty_cache = tmp_path / "bare-node-cache"  # a node where neither the runtime nor the model was installed
    empty_cache.mkdir()
    ray_cluster.add_worker("node_bare", env_vars={"TUNEBENCH_CACHE_DIR": str(empty_cache)})
    try:
        bare = ray_cluster.node_id_of("node_bare")[:8]
        refused = tunebench(["run", str(tiny_profile(tmp_path)), "--cluster", ray_cluster.address], ray_cluster,
                            tmp_path)
        assert refused.returncode == 2 and "nothing was launched" in refused.stderr, refused.stderr
        problems = [line for line in refused.stderr.splitlines() if line.startswith("tunebench: node ")]
        assert problems and all(bare in line for line in problems), refused.stderr  # only the bare node
        assert any("is not installed" in line for line in problems)
        out = tmp_path / "result.json"
        done = tunebench(["run", str(tiny_profile(tmp_path)), "--repeat", "2", "--cluster", ray_cluster.address,
                          "--skip-bad-nodes", "--json", str(out)], ray_cluster, tmp_path)
        print(done.stdout[-2000:], done.stderr[-2000:])
        assert done.returncode == 0, done.stderr
        assert "left out: node " in done.stderr and "2 node(s) can host trials; up to 2 at once" in done.stderr
        runs = json.loads(out.read_text())["steps"][0]["runs"]
        assert [r["status"] for r in runs] == ["completed", "completed"]
        assert not any(bare in (node_of(r["config"]["tags"]) or "") for r in runs)  # kept off the bare node
    finally:
        ray_cluster.remove_worker("node_bare")
    assert not engines_since(engines_before)
