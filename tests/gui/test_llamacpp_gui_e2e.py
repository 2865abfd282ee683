"""The shipped llama.cpp profile runs from the workbench, as it runs from
``tunebench run``: pick it, start, watch the engine start and the load, and find a
completed run whose client tokens equal llama.cpp's own counter. llama.cpp is ready in about a
second, so this costs a few seconds."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSpinBox

from app.gui.dashboard import Dashboard
from app.gui.main_window import MainWindow
from engine_adapters.llamacpp_runtime import ensure_gguf_demo_model
from engine_adapters.runtimes import COMPLETE_MARKER, demo_model_dir, managed_runtime

pytestmark = [pytest.mark.e2e, pytest.mark.gui]


def test_the_llamacpp_profile_runs_from_the_workbench(qtbot, make_window: Callable[..., MainWindow]) -> None:
    runtime = managed_runtime("llamacpp-cpu")
    if not runtime.is_installed() or not (demo_model_dir() / COMPLETE_MARKER).is_file():
        pytest.fail("llama.cpp runtime or demo model missing: run `make engine`")
    ensure_gguf_demo_model(str(runtime.interpreter))
    window = make_window("llamacpp-cpu-demo")
    assert window.state.config.engine.kind == "llamacpp"
    spin = window.config_panel.editor("workload.num_requests").widget
    assert isinstance(spin, QSpinBox)
    spin.setValue(16)
    qtbot.waitUntil(lambda: window.config_panel.summary.text().startswith("Configuration OK"), timeout=60_000)
    qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
    assert window.running
    qtbot.waitUntil(lambda: not window.running, timeout=240_000)
    result = window.last_result
    assert result is not None and result.status == "completed", window.banner.text()
    assert (result.engine_version or "").startswith("xllamacpp-"), result.engine_version  # llama.cpp ran it
    (level,) = result.levels
    s = level.summary
    assert s.completed == 16 and s.errors == 0
    assert s.engine.generation_tokens is not None and s.output_tokens == int(s.engine.generation_tokens)
    assert window.dashboard.page == Dashboard.PLOTS and window.dashboard.tiles.mode == "summary"
    assert window.dashboard.tiles.tiles["done"].text() == "16"
