"""`tunebench export -o` and the GUI's Save write by one rule: atomically, scripts 0755, and never
onto a pipe, a device or through a symbolic link; a bad path is one line and exit code 2."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from app.cli import main
from app.errors import UserError
from app.export import STDOUT, Target, export, save
from app.export.files import check_target, write_atomic
from app.profiles import resolve_profile


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _export_demo(capsys: pytest.CaptureFixture[str], out: str, fmt: str = "bash") -> tuple[int, str, str]:
    return run_cli(capsys, "export", "cpu-demo", "--format", fmt, "-o", out)


def _one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tunebench: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture()
def out_dir(tmp_path: Path) -> Path:
    """Where the outputs go (``tmp_path`` also holds the test's state directory)."""
    path = tmp_path / "out"
    path.mkdir()
    return path


def _only(directory: Path) -> list[str]:
    """What is in ``directory``: a failed write leaves no temporary file behind."""
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("fmt, mode", [("bash", 0o755), ("docker", 0o755), ("compose", 0o644), ("k8s", 0o644)])
def test_scripts_are_executable_and_manifests_are_not(out_dir: Path, capsys: pytest.CaptureFixture[str],
                                                      fmt: str, mode: int) -> None:
    target = out_dir / f"out-{fmt}"
    target.write_text("old content")
    target.chmod(0o600)
    code, out, err = _export_demo(capsys, str(target), fmt)
    assert code == 0 and out == "" and f"wrote {target}" in err
    assert stat.S_IMODE(target.stat().st_mode) == mode
    assert "old content" not in target.read_text()
    assert _only(out_dir) == [target.name]


def test_gui_save_and_cli_write_the_same_bytes_and_mode(out_dir: Path) -> None:
    """The dialog saves the previewed text with ``save``; the CLI writes with ``export``: one rule."""
    profile = resolve_profile("cpu-demo")
    text = export(Target(profile=profile), "docker")
    saved = save(text, "docker", out_dir / "gui.sh")
    written = out_dir / "cli.sh"
    assert export(Target(profile=profile), "docker", written) == written.read_text()
    assert stat.S_IMODE(saved.stat().st_mode) == stat.S_IMODE(written.stat().st_mode) == 0o755
    body = [line for line in saved.read_text().splitlines() if "exported by tunebench" not in line]
    assert body == [line for line in written.read_text().splitlines() if "exported by tunebench" not in line]


def test_dash_means_standard_output(out_dir: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(out_dir)
    code, out, err = _export_demo(capsys, STDOUT)
    assert code == 0 and out.startswith("#!/usr/bin/env bash") and err == ""
    assert _only(out_dir) == []  # no file called '-'


def test_a_path_under_a_regular_file_is_one_line(out_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (out_dir / "file").write_text("x")
    line = _one_line_error(*_export_demo(capsys, str(out_dir / "file" / "launch.sh"))[::2])
    assert "not a directory" in line
    assert _only(out_dir) == ["file"]


def test_an_over_long_name_is_one_line(out_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(*_export_demo(capsys, str(out_dir / ("x" * 300 + ".sh")))[::2])
    assert "too long" in line
    assert _only(out_dir) == []


def test_a_missing_directory_is_one_line(out_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(*_export_demo(capsys, str(out_dir / "nowhere" / "launch.sh"))[::2])
    assert "does not exist" in line


def test_a_directory_is_refused(out_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(*_export_demo(capsys, str(out_dir))[::2])
    assert "is a directory" in line


def test_a_named_pipe_is_refused_without_blocking(out_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = out_dir / "pipe"
    os.mkfifo(fifo)
    result: dict[str, tuple[int, str, str]] = {}
    worker = threading.Thread(target=lambda: result.update(r=_export_demo(capsys, str(fifo))), daemon=True)
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():  # unblock the writer so the test run can end, then fail
        with open(fifo, "rb", buffering=0) as reader:
            reader.read()
        pytest.fail("export -o onto a named pipe blocked")
    line = _one_line_error(*result["r"][::2])
    assert "named pipe" in line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the pipe, not replaced by a file
    assert _only(out_dir) == ["pipe"]


def test_a_symlink_is_refused_and_neither_it_nor_its_target_changes(out_dir: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    real = out_dir / "real.sh"
    real.write_text("keep me")
    link = out_dir / "link.sh"
    link.symlink_to(real)
    line = _one_line_error(*_export_demo(capsys, str(link))[::2])
    assert "symbolic link" in line
    assert link.is_symlink() and os.readlink(link) == str(real) and real.read_text() == "keep me"
    dangling = out_dir / "dangling.sh"
    dangling.symlink_to(out_dir / "absent")
    _one_line_error(*_export_demo(capsys, str(dangling))[::2])
    assert dangling.is_symlink() and not (out_dir / "absent").exists()


def test_a_device_node_is_never_replaced(out_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As root, replacing /dev/stdout or /dev/null by a file would break the machine. A device node
    of our own stands in for them (the real ones are only looked at, never written)."""
    for path in ("/dev/stdout", "/dev/null"):
        with pytest.raises(UserError, match=f"-o {STDOUT}"):
            check_target(Path(path))
    node = out_dir / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError:
        pytest.skip("cannot create a device node here (not root, or no CAP_MKNOD)")
    line = _one_line_error(*_export_demo(capsys, str(node))[::2])
    assert "a device" in line
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert _only(out_dir) == ["null"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(out_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    target = out_dir / "report.html"
    target.write_text("old")

    def full_disk(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(UserError, match="No space left on device") as info:
        write_atomic(target, "new text")
    assert "\n" not in str(info.value)
    assert target.read_text() == "old" and _only(out_dir) == ["report.html"]


def test_cleanup_failure_does_not_mask_the_error(out_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary file cannot be removed either: the user still gets the write's one line."""
    def fail(*_args: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", fail)
    monkeypatch.setattr(os, "unlink", fail)
    with pytest.raises(UserError, match="Input/output error"):
        write_atomic(out_dir / "x.sh", "text", executable=True)
