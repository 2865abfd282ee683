"""The contract of importlinter-type-checking.toml (no module of app.gui imports the main window,
even for type hints) really catches such an import: lint-imports runs the config on a small
package of the test's own, laid out as app.gui is (the package's main() opens the window)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "importlinter-type-checking.toml"
GUI_INIT = "def main() -> object:\n    from app.gui.main_window import MainWindow\n    return MainWindow()\n"
WINDOW = "from app.gui.helper import Helper\n\n\nclass MainWindow:\n    def __init__(self) -> None:\n        self.helper = Helper(self)\n"
HELPER_FOR_TYPES = """from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.gui.main_window import MainWindow


class Helper:
    def __init__(self, window: MainWindow) -> None:
        self.window = window
"""
HELPER_WITH_PROTOCOL = """from typing import Protocol


class HelperHost(Protocol):
    helper: object


class Helper:
    def __init__(self, host: HelperHost) -> None:
        self.host = host
"""


def lint(tmp_path: Path, helper: str) -> subprocess.CompletedProcess[str]:
    gui = tmp_path / "app" / "gui"
    gui.mkdir(parents=True, exist_ok=True)
    (tmp_path / "app" / "__init__.py").write_text("")
    (gui / "__init__.py").write_text(GUI_INIT)
    (gui / "main_window.py").write_text(WINDOW)
    (gui / "helper.py").write_text(helper)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # this app, not tunebench's
    return subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-logo", "--no-cache", str(CONFIG)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=False)


def test_a_type_checking_import_of_the_main_window_breaks_the_contract(tmp_path: Path) -> None:
    result = lint(tmp_path, HELPER_FOR_TYPES)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "app.gui.helper is not allowed to import app.gui.main_window" in result.stdout
    assert "app.gui.helper -> app.gui.main_window (l.6)" in result.stdout


def test_a_helper_with_a_protocol_and_the_packages_main_keep_it(tmp_path: Path) -> None:
    result = lint(tmp_path, HELPER_WITH_PROTOCOL)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 1 kept, 0 broken." in result.stdout
