"""The engine/profile CLI: exit codes and one-line errors, never a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from app.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return str(path)


def test_profile_check_ok(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "profile", "check", "cpu-demo", "--no-discover")
    assert code == 0 and out.strip().endswith("cpu-demo: OK")


def test_profile_check_reports_each_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    profile = write(tmp_path, "[engine]\nmodel = '/no/such/model'\n[features]\nkv_offload_gib = 4\n"
                              "gpu_memory_utilization = 1.5\n")
    code, out, _ = run_cli(capsys, "profile", "check", profile, "--no-discover")
    assert code == 2
    assert "error: kv_offload_backend: KV offload needs a backend" in out
    assert "error: engine.model: model path not found: /no/such/model" in out
    assert "warning: gpu_memory_utilization: has no effect on the CPU build" in out
    # three errors (gpu_memory_utilization out of range, the backend, the model), each on its line,
    # and the count says so
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3, out
    assert out.splitlines()[-1] == f"{profile}: 3 error(s)"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[engine\n", "not valid TOML"),
        ("[features]\nturbo = true\n", "features.turbo: Extra inputs are not permitted"),
    ],
)
def test_corrupt_profile_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, fragment: str) -> None:
    code, _, err = run_cli(capsys, "profile", "check", write(tmp_path, text))
    assert code == 2
    assert err.startswith("tunebench: error: ") and fragment in err
    assert "Traceback" not in err


def test_missing_profile(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "engine", "start", "/nope/profile.toml")
    assert code == 2 and "no such profile file or shipped profile" in err


def test_engine_start_refuses_invalid_config_before_launch(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    profile = write(tmp_path, "[features.speculative]\nmethod = 'eagle3'\n")
    code, out, err = run_cli(capsys, "engine", "start", profile)
    assert code == 2
    assert "speculative.draft_model: speculative method 'eagle3' needs a draft model" in err
    assert "[launching]" not in out


def test_engine_start_on_a_busy_port(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run_cli(capsys, "engine", "start", "cpu-demo", "--port", str(port))
    assert code == 3
    assert f"port {port} on 127.0.0.1 is already in use" in err


def test_engine_stop_with_nothing_running(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "engine", "stop")  # the registry is private to the test (conftest)
    assert code == 0 and "no running engine started by tunebench" in out


def test_engine_flags_lists_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "engine", "flags")
    assert code == 0
    assert out.startswith("vLLM 0.32.0: ")
    assert "  --enable-prefix-caching" in out.splitlines()


def test_unknown_engine_flag_refused_naming_the_version(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    profile = write(tmp_path, "[features]\nextra_args = ['--enable-warp-drive']\n")
    code, out, _ = run_cli(capsys, "profile", "check", profile)
    assert code == 2
    assert "error: extra_args: --enable-warp-drive is not supported by the installed vLLM 0.32.0" in out


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys)
    assert code == 2 and "usage: tunebench" in out
