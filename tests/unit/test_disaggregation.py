"""Disaggregated prefill/decode and expert parallelism as a configuration: each pool engine's
flags (against vLLM 0.32's and SGLang 0.5.23's recorded help), the router's argv (against
vllm-router 0.1.17's recorded help), the refusals before launch, each in one line, and the
group's launch and stop on stand-in processes."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from app.bus import Bus
from app.config import RunConfig
from app.engines import SPREAD_NEEDS_A_CLUSTER, check_config, launch_engine, launch_group
from app.errors import UserError
from app.runner import Runner
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import DisaggregationConfig, EngineConfig, Features, RuntimeConfig
from engine_adapters.disaggregation import expert_count, has_router, pool_features
from engine_adapters.hardware import GpuInfo, HardwareInfo
from engine_adapters.launcher import group_members
from engine_adapters.pd_group import DisaggregatedGroup, PoolMember, PoolSeat, launch_here
from engine_adapters.registry import get_adapter
from engine_adapters.sglang import ADAPTER as SGLANG
from engine_adapters.vllm import ADAPTER as VLLM
from engine_adapters.vllm import VllmAdapter, parse_help

DATA = Path(__file__).parents[1] / "data"
VLLM_FLAGS = parse_help((DATA / "vllm-0.32.0-help.txt").read_text(), "0.32.0")
SGLANG_HELP = (DATA / "sglang" / "sglang-0.5.23-help.txt").read_text()
ROUTER_HELP = (DATA / "vllm-router" / "vllm-router-0.1.17-help.txt").read_text()
NIXL = DisaggregationConfig(connector="nixl", prefill_instances=1, decode_instances=2, decode_tensor_parallel_size=2)
HUB = EngineConfig(model="Qwen/Qwen3-8B", runtime=RuntimeConfig(kind="executable", executable="vllm"))


def flags_of(argv: list[str]) -> list[str]:
    return [t for t in argv if t.startswith("--")]


def gpus(n: int) -> HardwareInfo:
    return HardwareInfo(gpus=[GpuInfo(index=i, name="H100", memory_total_bytes=80 * 2**30) for i in range(n)])


def errors(adapter: object, engine: EngineConfig, features: Features, hardware: HardwareInfo | None) -> list[str]:
    issues = adapter.validate(engine, features, None, hardware)  # type: ignore[attr-defined]
    return [f"{i.field}: {i.message}" for i in issues if i.severity == "error"]


# --- the configuration ------------------------------------------------------------------------------

def test_both_pools_count_in_the_gpus_and_each_engine_gets_its_pool_size() -> None:
    f = Features(tensor_parallel_size=4, disaggregation=NIXL)
    assert (f.pool_gpu_count("prefill"), f.pool_gpu_count("decode"), f.gpu_count) == (4, 4, 8)
    prefill, decode = pool_features(f, "prefill"), pool_features(f, "decode")
    assert (prefill.tensor_parallel_size, decode.tensor_parallel_size) == (4, 2)
    assert (prefill.disaggregation.role, decode.disaggregation.role) == ("prefill", "decode")
    assert decode.gpu_count == 2  # one engine of the pool


def test_vllm_pool_engine_gets_its_kv_transfer_config_and_flags_exist_in_0_32() -> None:
    f = Features(disaggregation=NIXL.model_copy(update={"kv_buffer_device": "cpu"}), expert_parallel_size=2,
                 eplb=True, tensor_parallel_size=2)
    argv = [t for toks in VLLM.feature_flags(pool_features(f, "decode")).values() for t in toks]
    at = argv.index("--kv-transfer-config")
    assert json.loads(argv[at + 1]) == {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
    assert "--enable-expert-parallel" in argv and "--enable-eplb" in argv
    assert [flag for flag in flags_of(argv) if not VLLM_FLAGS.has(flag)] == []
    # a single engine outside a pool renders no connector
    assert "--kv-transfer-config" not in [t for toks in VLLM.feature_flags(f).values() for t in toks]
    mooncake = pool_features(Features(disaggregation=DisaggregationConfig(connector="mooncake")), "prefill")
    assert json.loads(VLLM.feature_flags(mooncake)["disaggregation.connector"][1])["kv_role"] == "kv_producer"


def test_vllm_router_argv_uses_only_vllm_router_flags_and_no_secret() -> None:
    f = Features(disaggregation=NIXL)
    argv = VLLM.router_argv(HUB, f, [("http://127.0.0.1:9001", 5601)],
                            ["http://127.0.0.1:9002", "http://127.0.0.1:9003"], 9000)
    assert argv[:3] == ["python3", "-m", "vllm_router.launch_router"]
    tail = " ".join(argv[3:])
    assert tail == ("--host 127.0.0.1 --port 9000 --vllm-pd-disaggregation --prefill http://127.0.0.1:9001 "
                    "--decode http://127.0.0.1:9002 --decode http://127.0.0.1:9003 --kv-connector nixl "
                    "--disable-retries --disable-circuit-breaker --health-check-timeout-secs 30 --health-check-interval-secs 86400 "
                    "--prometheus-host 127.0.0.1 --prometheus-port 9001")
    known = set(re.findall(r"--[a-z][a-z0-9-]*", ROUTER_HELP))
    assert [flag for flag in flags_of(argv) if flag not in known] == []
    assert "--api-key" not in argv  # the key travels in the router's environment


def test_sglang_pool_engines_and_router_use_the_recorded_interface() -> None:
    f = Features(disaggregation=DisaggregationConfig(connector="nixl"), expert_parallel_size=4, eplb=True)
    prefill = pool_features(f, "prefill")
    argv = [t for toks in SGLANG.feature_flags(prefill).values() for t in toks] + SGLANG.pool_args(prefill, 8998)
    assert " ".join(argv).count("--disaggregation-mode prefill --disaggregation-transfer-backend nixl") == 1
    assert "--disaggregation-bootstrap-port" in argv and "--ep-size" in argv and "--enable-eplb" in argv
    assert [flag for flag in flags_of(argv) if flag not in SGLANG_HELP] == []
    assert SGLANG.pool_args(pool_features(f, "decode"), 8999) == []
    router = SGLANG.router_argv(HUB, f, [("http://127.0.0.1:30000", 8998)], ["http://127.0.0.1:30001"], 8000)
    assert router[3:] == ["--pd-disaggregation", "--prefill", "http://127.0.0.1:30000", "8998",
                          "--decode", "http://127.0.0.1:30001", "--host", "127.0.0.1", "--port", "8000"]
    assert has_router(VLLM) and has_router(SGLANG) and not has_router(get_adapter("llamacpp"))


# --- bad input: one line, nothing launched --------------------------------------------------------

def test_a_pool_larger_than_the_cluster_is_one_line() -> None:
    f = Features(tensor_parallel_size=4, disaggregation=NIXL.model_copy(update={"prefill_instances": 2}))
    lines = errors(VLLM, HUB.model_copy(update={"runtime": RuntimeConfig(kind="docker")}), f, gpus(8))
    assert lines == ["disaggregation.prefill_instances: the P/D pools need 12 GPUs (prefill 2 x TP 4 + decode 2 x TP 2); "
                     "8 visible: shrink the pools, or export a multi-node recipe (--format ray or k8s-multinode)"]
    assert errors(VLLM, HUB.model_copy(update={"runtime": RuntimeConfig(kind="docker")}), f, gpus(12)) == []


def test_ep_on_a_dense_model_and_eplb_without_ep_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    dense = EngineConfig(model=str(tmp_path), runtime=RuntimeConfig(kind="docker"))
    lines = errors(VLLM, dense, Features(expert_parallel_size=2, tensor_parallel_size=2), gpus(2))
    assert lines == [f"expert_parallel_size: expert parallelism needs a mixture-of-experts model; {tmp_path} is dense "
                     "(its config.json names no routed experts)"]
    assert errors(SGLANG, dense, Features(eplb=True), gpus(1)) == [
        "eplb: expert load balancing needs expert parallelism: set expert_parallel_size"]
    (tmp_path / "config.json").write_text(json.dumps({"num_experts": 128, "num_experts_per_tok": 8}))
    assert errors(VLLM, dense, Features(expert_parallel_size=2, tensor_parallel_size=2), gpus(2)) == []
    assert errors(VLLM, dense, Features(expert_parallel_size=4, tensor_parallel_size=2), gpus(2)) == [
        "expert_parallel_size: vLLM spreads the experts over the tensor x data parallel GPUs (2): set "
        "expert_parallel_size to 2"]
    assert expert_count({"text_config": {"n_routed_experts": 256}}) == 256 and expert_count({}) is None


def _fake_venv(tmp_path: Path, connectors: list[str]) -> EngineConfig:
    """A venv whose vLLM registers ``connectors`` (its factory file only)."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "vllm/distributed/kv_transfer/kv_connector"
    site.mkdir(parents=True)
    (site / "factory.py").write_text("".join(f'KVConnectorFactory.register_connector(\n    "{c}",\n    "m", "{c}")\n'
                                             for c in connectors))
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    return EngineConfig(model="Qwen/Qwen3-8B", runtime=RuntimeConfig(kind="python", python=str(python)))


def test_a_connector_this_engine_version_lacks_is_refused(tmp_path: Path) -> None:
    engine = _fake_venv(tmp_path, ["ExampleConnector", "NixlConnector"])
    mooncake = Features(disaggregation=DisaggregationConfig(connector="mooncake"))
    assert errors(VLLM, engine, mooncake, gpus(2)) == [
        "disaggregation.connector: this vLLM has no MooncakeConnector (its connectors: ExampleConnector, NixlConnector)"]
    assert errors(VLLM, engine, Features(disaggregation=DisaggregationConfig(connector="nixl")), gpus(2)) == []
    assert errors(VLLM, engine, Features(disaggregation=DisaggregationConfig(connector="lmcache")), gpus(2)) == [
        "disaggregation.connector: vllm-router joins P/D pools over mooncake or nixl only, not lmcache"]
    # SGLang: the recorded help's choices of --disaggregation-transfer-backend have no lmcache
    from engine_adapters.sglang import parse_help as sglang_help

    flags = sglang_help(SGLANG_HELP, "0.5.23")
    lmcache = pool_features(Features(disaggregation=DisaggregationConfig(connector="lmcache")), "decode")
    issues = SGLANG.version_issues(lmcache, flags)
    assert len(issues) == 1 and "lmcache" in issues[0].message and "0.5.23" in issues[0].message


def test_pool_sizes_with_p_d_off_do_nothing_and_are_refused() -> None:
    f = Features(disaggregation=DisaggregationConfig(decode_instances=3))
    assert errors(VLLM, HUB, f, None) == [
        "disaggregation.decode_instances: has no effect: disaggregated prefill/decode is off (set disaggregation.connector)"]


def test_bad_input_launches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    monkeypatch.setattr("app.engines.EngineProcess.start", lambda self: started.append(self))
    monkeypatch.setattr("app.engines.probe_hardware", lambda: gpus(4))
    config = RunConfig(engine=HUB.model_copy(update={"runtime": RuntimeConfig(kind="docker")}),
                       features=Features(tensor_parallel_size=4, disaggregation=NIXL))
    assert [i.field for i in check_config(config, discover_flags=False).errors] == ["disaggregation.prefill_instances"]
    with pytest.raises(UserError, match="the P/D pools need 8 GPUs"):
        launch_engine(config)
    assert started == []


# --- the group: three process groups, one stop ------------------------------------------------------

STAND_IN = textwrap.dedent('''
    import http.server, json, os, sys
    role, port, record = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(record, "a") as out:
        out.write(json.dumps({"role": role, "pgid": os.getpgid(0), "argv": sys.argv[4:],
                              "key": os.environ.get("VLLM_API_KEY") or os.environ.get("OPENAI_API_KEY"),
                              "side": os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT"),
                              "ucx": os.environ.get("UCX_TLS")}) + "\\n")
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    print("Application startup complete.", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
''')


class StandInAdapter(VllmAdapter):
    """vLLM's P/D knowledge with stand-in engines and router that record what they were given."""

    def __init__(self, script: Path, record: Path) -> None:
        self.script, self.record = script, record

    def build_argv(self, engine: EngineConfig, features: Features, port: int, *, portable: bool = False) -> list[str]:
        pool = [t for toks in self.feature_flags(features).values() for t in toks] + list(features.extra_args)
        return [sys.executable, str(self.script), str(features.disaggregation.role), str(port), str(self.record), *pool]

    def router_argv(self, engine: EngineConfig, features: Features, prefill: Sequence[tuple[str, int]],
                    decode_urls: Sequence[str], port: int, *, metrics_port: int | None = None,
                    portable: bool = False) -> list[str]:
        real = super().router_argv(engine, features, prefill, decode_urls, port, metrics_port=metrics_port,
                                   portable=True)
        return [sys.executable, str(self.script), "router", str(port), str(self.record), *real[3:]]


def test_group_starts_both_pools_then_the_router_and_one_stop_ends_all(tmp_path: Path) -> None:
    script, record = tmp_path / "stand_in.py", tmp_path / "record.jsonl"
    script.write_text(STAND_IN)
    features = Features(disaggregation=DisaggregationConfig(connector="nixl", decode_instances=2,
                                                            kv_buffer_device="cpu"))
    group = DisaggregatedGroup(EngineConfig(require_api_key=True), features, StandInAdapter(script, record))
    try:
        group.start()
        group.wait_ready(timeout_s=60)
        seen = [json.loads(line) for line in record.read_text().splitlines()]
        assert sorted(s["role"] for s in seen) == ["decode", "decode", "prefill", "router"]
        pgids = {s["pgid"] for s in seen}
        assert len(pgids) == 4 and os.getpgid(0) not in pgids  # each in a process group of its own
        assert {s["key"] for s in seen} == {group.api_key} and group.api_key  # one key, from the environment
        engines = [s for s in seen if s["role"] != "router"]
        assert len({s["side"] for s in engines}) == 3 and {s["ucx"] for s in engines} == {"tcp,self"}
        router = next(s for s in seen if s["role"] == "router")["argv"]
        assert router.count("--decode") == 2 and router[router.index("--prefill") + 1] == group.pool("prefill")[0].base_url
        assert all(group.api_key not in " ".join(s["argv"]) for s in seen)
        assert group.base_url.startswith("http://127.0.0.1:")
    finally:
        done = group.stop(grace_s=(2.0, 2.0, 2.0))
    assert [line.split(":")[0] for line in done] == ["router", "prefill 0", "decode 0", "decode 1"]
    assert all(group_members(pgid) == [] for pgid in pgids)


def test_the_group_asks_its_launcher_for_each_engine_the_first_decode_engine_first(tmp_path: Path) -> None:
    """Where each pool engine starts is the launcher's (a cluster spreads them); the group joins
    what it returns: the router gets each prefill engine's URL and side port from it."""
    script, record = tmp_path / "stand_in.py", tmp_path / "record.jsonl"
    script.write_text(STAND_IN)
    seats: list[PoolSeat] = []

    def launcher(seat: PoolSeat, *args: Any) -> PoolMember:
        seats.append(seat)
        return launch_here(seat, *args)

    features = Features(disaggregation=DisaggregationConfig(connector="nixl", prefill_instances=2, kv_buffer_device="cpu",
                                                            placement="spread"))
    logged: list[str] = []
    group = DisaggregatedGroup(EngineConfig(require_api_key=True), features, StandInAdapter(script, record),
                               launch_member=launcher, on_log=logged.append)
    try:
        group.start()
        group.wait_ready(timeout_s=60)
        assert [(s.role, s.index) for s in seats] == [("decode", 0), ("prefill", 0), ("prefill", 1)]
        assert {s.api_key for s in seats} == {group.api_key} and {s.features.disaggregation.role for s in seats} == {
            "prefill", "decode"}
        router = next(json.loads(line) for line in record.read_text().splitlines() if '"router"' in line)["argv"]
        assert [router[i + 1] for i, t in enumerate(router) if t == "--prefill"] == [
            m.process.base_url for m in group.members if m.role == "prefill"]
        assert group.first_decode is group.pool("decode")[0]
        deadline = time.monotonic() + 30
        while "[router] Application startup complete." not in logged and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "[router] Application startup complete." in logged  # the router's lines go with the run's log
        assert "[prefill 1] Application startup complete." in logged
    finally:
        done = group.stop(grace_s=(2.0, 2.0, 2.0))
    assert [line.split(":")[0] for line in done] == ["router", "prefill 0", "prefill 1", "decode 0"]


def test_pools_spread_over_nodes_without_a_cluster_are_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    monkeypatch.setattr("engine_adapters.pd_group.EngineProcess.start", lambda self: started.append(self))
    monkeypatch.setattr("app.engines.probe_hardware", lambda: gpus(2))
    config = RunConfig(engine=HUB, features=Features(disaggregation=DisaggregationConfig(connector="nixl",
                                                                                         placement="spread")))
    with pytest.raises(UserError) as refused:
        launch_group(config)
    assert str(refused.value) == SPREAD_NEEDS_A_CLUSTER and "--cluster" in str(refused.value)
    assert started == []


def test_a_pool_engine_on_a_node_address_uses_that_addresss_interface_for_nixl() -> None:
    features = pool_features(Features(disaggregation=DisaggregationConfig(connector="nixl")), "prefill")
    here = VLLM.pool_env(features, 5600)
    assert here["UCX_NET_DEVICES"] == "lo" and here["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    for every_address in ("0.0.0.0", "::"):  # an engine on every address: its peers on this machine use loopback
        assert VLLM.pool_env(features, 5600, every_address) == here
    assert VLLM.pool_env(features, 5600, "localhost")["UCX_NET_DEVICES"] == "lo"
    own = next(((name, a.address) for name, addrs in psutil.net_if_addrs().items() for a in addrs
                if a.family == socket.AF_INET and not a.address.startswith("127.")), None)
    if own is not None:  # a machine with a network interface besides loopback
        spread = VLLM.pool_env(features, 5600, own[1])
        assert spread["UCX_NET_DEVICES"] == own[0] and spread["VLLM_NIXL_SIDE_CHANNEL_HOST"] == own[1]
    with pytest.raises(ValueError, match="no network interface of this machine has the address 192.0.2.1"):
        VLLM.pool_env(features, 5600, "192.0.2.1")  # TEST-NET-1: never this machine's


def test_a_valid_p_d_configuration_is_not_launched_as_one_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A P/D configuration is never started as a plain engine (a run launches it as a group)."""
    started: list[object] = []
    monkeypatch.setattr("app.engines.EngineProcess.start", lambda self: started.append(self))
    config = RunConfig(engine=HUB, features=Features(disaggregation=DisaggregationConfig(connector="nixl")))
    with pytest.raises(UserError, match="export it"):
        launch_engine(config, force=True)
    assert started == []


# --- a run launches the group, and stops all of it however it ends ------------------------------------

def _group_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script_text: str,
               cancel_when_started: bool) -> tuple[Runner, object]:
    script, record = tmp_path / "stand_in.py", tmp_path / "record.jsonl"
    script.write_text(script_text)
    adapter = StandInAdapter(script, record)
    monkeypatch.setattr("app.engines.get_adapter", lambda kind: adapter)
    monkeypatch.setattr("app.runner.get_adapter", lambda kind: adapter)
    monkeypatch.setattr("app.engines.probe_hardware", lambda: gpus(2))
    config = RunConfig(
        engine=EngineConfig(model="stand-in", runtime=RuntimeConfig(kind="python", python=sys.executable)),
        features=Features(disaggregation=DisaggregationConfig(connector="nixl", kv_buffer_device="cpu")),
        workload=WorkloadConfig(num_requests=2, input_len=LengthSpec(mean=8), output_len=LengthSpec(mean=2)),
        load=LoadConfig(concurrency=1))
    runner, cancel = Runner(config, Bus(), telemetry=False), threading.Event()

    def cancel_once_both_engines_run() -> None:
        while not (record.exists() and len(record.read_text().splitlines()) >= 2):
            time.sleep(0.05)
        cancel.set()

    if cancel_when_started:
        threading.Thread(target=cancel_once_both_engines_run, daemon=True).start()
    return runner, runner.run(cancel)


def test_a_run_whose_p_d_warm_up_fails_says_so_and_stops_every_process(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in router answers no completion (HTTP 501): the warm-up is tried three times,
    the run fails in one line, and the router and both engines are stopped by process group."""
    runner, result = _group_run(tmp_path, monkeypatch, STAND_IN, cancel_when_started=False)
    assert result.status == "failed"  # type: ignore[attr-defined]
    assert re.fullmatch(r"P/D warm-up: the P/D warm-up request failed 5 times through the router; last: HTTP 501.*",
                        result.reason or "")  # type: ignore[attr-defined]
    group = runner._own_group
    assert group is not None and len(group.pids) == 3
    assert all(group_members(pid) == [] for pid in group.pids)


def test_a_run_cancelled_while_its_p_d_engines_start_stops_them_all(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    never_ready = STAND_IN.replace('print("Application startup complete."', 'time.sleep(600); print("x"')
    never_ready = never_ready.replace("import http.server, json, os, sys", "import http.server, json, os, sys, time")
    runner, result = _group_run(tmp_path, monkeypatch, never_ready, cancel_when_started=True)
    assert (result.status, result.reason) == ("cancelled", "cancelled while the P/D group was starting")  # type: ignore[attr-defined]
    group = runner._own_group
    assert group is not None and group.router is None and len(group.pids) == 2
    assert all(group_members(pid) == [] for pid in group.pids)
