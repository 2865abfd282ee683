"""The docker runtime, run for real against a fake ``docker`` on PATH (the e2e test needs docker
installed without a daemon, which almost no machine has): the launcher starts ``docker run`` from
an argv with the API key passed by name only and the port published on loopback, and docker's
own failures come back at once as plain advice instead of a hang until the startup time-out."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from engine_adapters.config import EngineConfig, Features, RuntimeConfig
from engine_adapters.launcher import EngineProcess, EngineStartError, group_members

# What docker 2x prints, word for word, for each failure (stderr, exit status 125).
FAILURES = {
    "docker_daemon": "docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker "
                     "daemon running?\nSee 'docker run --help'.",
    "docker_gpu": 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].',
    "docker_image": "Unable to find image 'org/nope:latest' locally\ndocker: Error response from daemon: pull access "
                    "denied for org/nope, repository does not exist or may require 'docker login': denied: requested "
                    "access to the resource is denied.",
}


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``docker`` executable first on PATH that writes down its argv and the API key it was
    given, then fails the way ``FAKE_DOCKER_FAILURE`` says. Returns where it writes."""
    record = tmp_path / "docker-call.json"
    script = tmp_path / "bin" / "docker"
    script.parent.mkdir()
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"FAILURES = {FAILURES!r}\n"
        f"with open({str(record)!r}, 'w') as f:\n"
        "    json.dump({'argv': sys.argv[1:], 'api_key': os.environ.get('VLLM_API_KEY')}, f)\n"
        "print(FAILURES[os.environ['FAKE_DOCKER_FAILURE']], file=sys.stderr, flush=True)\n"
        "sys.exit(125)\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return record


@pytest.mark.parametrize("code", sorted(FAILURES))
def test_docker_failures_are_explained_at_once(fake_docker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               code: str) -> None:
    monkeypatch.setenv("FAKE_DOCKER_FAILURE", code)
    model = tmp_path / "model"
    model.mkdir()
    engine = EngineProcess(EngineConfig(model=str(model), runtime=RuntimeConfig(kind="docker",
                                                                                docker_image="org/nope:latest")),
                           Features(prefix_caching=True))
    engine.start()
    started = time.monotonic()
    try:
        with pytest.raises(EngineStartError) as info:
            engine.wait_ready(timeout_s=120)
    finally:
        engine.stop()
    assert time.monotonic() - started < 60  # docker's exit is noticed, not waited out to the time-out
    assert info.value.diagnosis is not None and info.value.diagnosis.code == code, engine.snapshot_log()[-5:]
    assert group_members(engine.pid or 0) == []

    call = json.loads(fake_docker.read_text())
    argv, key = call["argv"], call["api_key"]
    assert argv[0] == "run" and "--rm" in argv and argv[argv.index("-p") + 1] == f"127.0.0.1:{engine.port}:{engine.port}"
    assert argv[argv.index("-e") + 1] == "VLLM_API_KEY"  # passed by name: docker reads the value from its env
    assert key and key == engine.api_key and not any(key in a for a in argv)
    assert f"{model}:{model}:ro" in argv  # the local model folder is mounted read-only
    image = argv.index("org/nope:latest")
    assert argv[image + 1] == str(model) and "--enable-prefix-caching" in argv[image:]  # vllm serve's arguments
