"""Faults as production has them, on real hosts (tests/netns_hosts.py: network namespaces, each
with its own address, Ray registry and state): a driver killed with SIGKILL, a worker host cut off
mid-trial, a worker with other code, the store's host cut off for a while and for longer than the
recorder waits. Each checks that nothing is lost (every request stored) and nothing is left (no
engine on any host, each host's own registry empty). The tests share the session's hosts and run
in this order; each leaves the cluster as it found it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from app.analysis.compare import NODE_TAG
from app.store import RunStore
from engine_adapters.launcher import EngineRecord, group_members
from engine_adapters.process_group import same_process_alive
from engine_adapters.watchdog import WATCHDOG_GRACE_S
from tests.netns_hosts import Host, Hosts, in_netns
from tests.ray_cluster import MID_RUN_RATE_RPS, tiny_profile

pytestmark = pytest.mark.e2e

ENGINE_GONE_S = 10.0
"""The engine watchdog's promise: an engine whose owner is gone stops within this."""
DRIVER_GONE_S = 30.0
"""A cluster engine's owner is its trial's actor, not the driver: the actor ends once Ray has
noticed that its job's driver died (seconds more on a loaded machine: one run here saw an engine
still up 10 s after the driver's SIGKILL), then the watchdog's ``ENGINE_GONE_S`` applies."""
PARTITION_S = 5.0


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)


def engines_left(hosts: Hosts, within_s: float = ENGINE_GONE_S) -> dict[str, list[EngineRecord]]:
    """Host -> its engines still running ``within_s`` from now."""
    deadline = time.monotonic() + within_s
    while True:
        left = {h.name: running for h in hosts.hosts.values() if (running := h.running_engines())}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.25)


def registries(hosts: Hosts) -> dict[str, list[int]]:
    """Host -> the engine pids its own registry still lists."""
    return {h.name: [r.pid for r in records] for h in hosts.hosts.values() if (records := h.registered_engines())}


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe(pid: int) -> str:
    try:
        p = psutil.Process(pid)
        return f"{pid} {p.status()} parent {p.ppid()} {psutil.Process(p.ppid()).cmdline()[:3]} {p.cmdline()[:4]}"
    except psutil.Error as exc:
        return f"{pid}: {exc}"


def registries_after_next_start(hosts: Hosts, profile: Path) -> dict[str, list[int]]:
    """Host -> the engines its registry lists once tunebench has started there again. An entry
    left behind must be of a stopped engine whose owner and watchdog are gone: Ray kills a dead
    actor's children, the engine's watchdog among them, before the watchdog removes the entry;
    the host's next tunebench start forgets it (launcher.reap_orphans), as the next trial there does."""
    for host in hosts.hosts.values():
        # a watchdog outlives its engine's leader by as long as stop_group waits for the rest of the
        # group (its grace), then removes the entry and exits: an orphan is one still there after that
        wait_for(lambda host=host: not [r for r in host.registered_engines()  # type: ignore[misc]
                                        if r.watchdog_pid is not None and alive(r.watchdog_pid)],
                 sum(WATCHDOG_GRACE_S) + 10.0, f"the watchdogs on {host.name} done", every_s=0.5)
        records = host.registered_engines()
        for record in records:
            assert not group_members(record.pgid, not_before=record.create_time), record
            assert not same_process_alive(record.owner_pid, record.owner_create_time), record
            assert record.watchdog_pid is None or not alive(record.watchdog_pid), (record, describe(record.watchdog_pid))
        if records:
            done = hosts.cli(["profile", "check", str(profile)], host=host.name, timeout_s=120)
            assert done.returncode == 0, done.stderr
    return registries(hosts)


def driver(hosts: Hosts, args: list[str], log: Path, env: dict[str, str] | None = None,
           module: list[str] | None = None) -> subprocess.Popen[bytes]:
    """The CLI on the head's host in the background (``ip netns exec`` execs it: its pid is the driver's)."""
    argv = hosts.hosts["head"].exec_argv([sys.executable, "-m", *(module or ["app.cli"]), *args])
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**hosts.hosts["head"].env(), **(env or {})}, start_new_session=True)


def engine_host(hosts: Hosts, among: list[Host]) -> dict[str, list[EngineRecord]]:
    return {h.name: running for h in among if (running := h.running_engines())}


def node_of(tags: list[str]) -> str:
    return next(t.removeprefix(NODE_TAG) for t in tags if t.startswith(NODE_TAG))


def host_of_label(hosts: Hosts, label: str, node_addresses: dict[str, str]) -> Host:
    """The host of a node label (``HOST/ID``: every namespace has the machine's host name, the id tells)."""
    short = label.split("/", 1)[1]
    (address,) = [a for node_id, a in node_addresses.items() if node_id.startswith(short)]
    return hosts.host_at(address)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def test_sigkill_of_the_driver_leaves_no_engine_on_any_host(hosts: Hosts, tmp_path: Path) -> None:
    profile = tiny_profile(tmp_path, requests=2000)
    cli = driver(hosts, ["run", str(profile), "--repeat", "2", "--cluster", hosts.address, "--parallel", "2",
                         "--db", str(tmp_path / "runs.db")], tmp_path / "driver.log")
    try:
        running = wait_for(lambda: (found := engine_host(hosts, hosts.workers)) and len(found) == 2 and found,
                           240, "an engine on each worker host")
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait(timeout=30)
        left = engines_left(hosts, DRIVER_GONE_S)
        assert not left, f"engines still running {DRIVER_GONE_S:.0f} s after the driver died: {left}"
        assert registries_after_next_start(hosts, profile) == {}
        assert sorted(running) == ["w1", "w2"]
    finally:
        stop(cli)


def test_a_worker_host_cut_off_mid_trial_is_interrupted_rerun_elsewhere_and_left_clean(
        hosts: Hosts, tmp_path: Path) -> None:
    addresses = hosts.nodes_by_address()
    out = tmp_path / "result.json"
    cli = driver(hosts, ["run", str(tiny_profile(tmp_path, requests=120, rate_rps=MID_RUN_RATE_RPS)),
                         "--cluster", hosts.address,
                         "--db", str(tmp_path / "runs.db"), "--json", str(out)], tmp_path / "driver.log")
    lost: Host | None = None
    try:
        found = wait_for(lambda: engine_host(hosts, hosts.workers), 240, "the trial's engine on a worker host")
        (name,) = found
        lost = hosts.hosts[name]
        time.sleep(2.0)  # mid-trial: its requests are under way
        lost.partition()
        assert cli.wait(timeout=420) == 0, (tmp_path / "driver.log").read_text()[-4000:]
        lost.heal()
        runs = json.loads(out.read_text())["steps"][0]["runs"]
        assert [r["status"] for r in runs] == ["interrupted", "completed"], runs
        first, second = (node_of(r["config"]["tags"]) for r in runs)
        assert host_of_label(hosts, first, addresses) is lost
        assert runs[0]["reason"] == f"node {first} lost"
        assert host_of_label(hosts, second, addresses) is not lost  # rerun on a host that can be reached
        for level in runs[1]["levels"]:
            assert level["summary"]["errors"] == 0
            assert level["summary"]["tokens_match_engine"] is True
        stored = RunStore(tmp_path / "runs.db").list_runs()
        assert sorted(r.status for r in stored) == ["completed", "interrupted"]
        # Back on the network, the host learns its node is dead; the trial's actor goes and the
        # watchdog stops its engine: nothing of the trial is left there.
        wait_for(lambda: not lost.running_engines(), 60 + ENGINE_GONE_S,  # type: ignore[union-attr]
                 f"no engine running on {lost.name} after the link came back")
        assert registries_after_next_start(hosts, tmp_path / "tiny.toml") == {}
        assert not engines_left(hosts, 0)
    finally:
        stop(cli)
        if lost is not None:
            lost.heal()
            hosts.stop_ray_node(lost.name)  # the session's cluster gets the host back as a new node
            hosts.start_ray_node(lost.name)


def other_checkout(hosts: Hosts) -> Path:
    """A copy of this checkout's code with one comment more: another tunebench, as a host with a
    different checkout on its PYTHONPATH has."""
    repo = Path(__file__).resolve().parents[2]
    copy = hosts.root / "other-checkout"
    if not copy.exists():
        for package in ("app", "engine_adapters", "db"):
            shutil.copytree(repo / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
        with open(copy / "app" / "__init__.py", "a", encoding="utf-8") as init:
            init.write("# another checkout\n")
    return copy


def test_a_worker_host_with_other_code_is_refused_by_name(hosts: Hosts, tmp_path: Path) -> None:
    hosts.stop_ray_node("w1")
    try:
        hosts.start_ray_node("w1", extra_env={"PYTHONPATH": str(other_checkout(hosts))})
        w1_node = next(i for i, a in hosts.nodes_by_address().items() if a == hosts.hosts["w1"].address)
        done = hosts.cli(["run", str(tiny_profile(tmp_path)), "--cluster", hosts.address,
                          "--db", str(tmp_path / "runs.db")])
        assert done.returncode == 2, done.stderr
        problems = [line for line in done.stderr.splitlines() if ", the driver runs " in line]
        assert len(problems) == 1, done.stderr  # w2 runs the driver's code
        assert re.fullmatch(rf"tunebench: node [^/]+/{w1_node[:8]}: tunebench \S+, the driver runs \S+",
                            problems[0]), problems
        assert "do not run the driver's tunebench" in done.stderr and "Traceback" not in done.stderr
        assert not engines_left(hosts, 0) and not registries(hosts)  # nothing was launched
    finally:
        hosts.stop_ray_node("w1")
        hosts.start_ray_node("w1")


def stored_requests(hosts: Hosts, url: str) -> tuple[list[str], list[int]]:
    """(status of each run, request records of each run) in the store on the db host."""
    def read() -> tuple[list[str], list[int]]:
        store = RunStore(url)
        try:
            runs = store.list_runs()
            return [r.status for r in runs], [len(store.request_records(r.id)) for r in runs]
        finally:
            store.close()

    return in_netns(hosts.hosts["db"].netns, read)


def requests_written(hosts: Hosts, database: str) -> int:
    assert hosts.pg is not None
    try:
        return int(hosts.pg.psql("SELECT count(*) FROM request_chunks", database) or 0)
    except psycopg.errors.UndefinedTable:  # the CLI has not made the schema yet
        return 0


def made_requests(result: dict[str, Any]) -> int:
    return sum(level["summary"]["completed"] + level["summary"]["errors"] for level in result["levels"])


def test_the_stores_host_cut_off_for_5_s_mid_run_loses_no_request(hosts: Hosts, tmp_path: Path) -> None:
    assert hosts.pg is not None
    url = hosts.pg.create_database()
    database = url.rsplit("/", 1)[1]
    out = tmp_path / "result.json"
    cli = driver(hosts, ["run", str(tiny_profile(tmp_path, requests=60, rate_rps=MID_RUN_RATE_RPS)), "--db", url,
                         "--json", str(out)],
                 tmp_path / "driver.log")
    db = hosts.hosts["db"]
    try:
        wait_for(lambda: requests_written(hosts, database), 240, "the run's first requests stored")
        db.partition()
        time.sleep(PARTITION_S)
        db.heal()
        assert cli.wait(timeout=300) == 0, (tmp_path / "driver.log").read_text()[-4000:]
    finally:
        db.heal()
        stop(cli)
    result = json.loads(out.read_text())
    assert result["status"] == "completed", result.get("reason")
    statuses, records = stored_requests(hosts, url)
    assert statuses == ["completed"]
    assert records == [made_requests(result)] and records[0] >= 60  # every request stored
    assert not engines_left(hosts)


def test_the_stores_host_cut_off_past_the_wait_spills_and_unspill_stores_every_request(
        hosts: Hosts, tmp_path: Path) -> None:
    assert hosts.pg is not None
    url = hosts.pg.create_database()
    database = url.rsplit("/", 1)[1]
    out = tmp_path / "result.json"
    cli = driver(hosts, ["3", "run", str(tiny_profile(tmp_path, requests=60, rate_rps=MID_RUN_RATE_RPS)), "--db",
                         url, "--json", str(out)],
                 tmp_path / "driver.log", module=["tests.hosts.short_outage_cli"])
    db = hosts.hosts["db"]
    try:
        wait_for(lambda: requests_written(hosts, database), 240, "the run's first requests stored")
        db.partition()  # until the run has ended: its end and last records cannot be stored
        cli.wait(timeout=300)
    finally:
        db.heal()
        stop(cli)
    said = (tmp_path / "driver.log").read_text()
    spilled = re.search(r"kept in (\S+); `tunebench db unspill", said)
    assert spilled, said[-4000:]
    spill = Path(spilled.group(1))
    assert spill.is_relative_to(hosts.hosts["head"].data_dir)  # the driver's host keeps it
    done = hosts.cli(["db", "unspill", str(spill), "--db", url])
    assert done.returncode == 0, done.stderr
    assert not spill.exists()
    result = json.loads(out.read_text())
    statuses, records = stored_requests(hosts, url)
    assert statuses == ["completed"], statuses
    assert records == [made_requests(result)] and records[0] >= 60  # every request stored
    assert not engines_left(hosts)
