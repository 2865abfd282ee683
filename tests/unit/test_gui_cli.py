"""`tunebench gui`: bad input and a missing display are one-line errors, before Qt starts."""

from __future__ import annotations

import pytest

from app.cli import main


def test_gui_unknown_profile_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gui", "no-such-profile"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-profile" in err and "cpu-demo" in err


def test_gui_without_a_display_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    assert main(["gui"]) == 2
    err = capsys.readouterr().err
    assert "no display" in err and "QT_QPA_PLATFORM=offscreen" in err and err.count("\n") == 1
