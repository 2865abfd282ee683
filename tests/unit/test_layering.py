"""Architecture rules, checked on the source: only app/gui imports Qt; engine_adapters and db
never import app. (An import-linter equivalent that needs no configuration to stay true.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QT_MODULES = ("PySide6", "pyqtgraph", "shiboken6", "PyQt5", "PyQt6")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def python_files(*parts: str) -> list[Path]:
    return sorted((ROOT.joinpath(*parts)).rglob("*.py"))


def top(name: str) -> str:
    return name.split(".", 1)[0]


@pytest.mark.parametrize("package", ["engine_adapters", "db"])
def test_lower_layers_never_import_app(package: str) -> None:
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p) if top(m) == "app")
                 for p in python_files(package)}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_app_gui_imports_qt() -> None:
    offenders = {}
    for package in ("app", "engine_adapters", "db", "benchmarks"):
        for path in python_files(package):
            if path.is_relative_to(ROOT / "app" / "gui") or path.name == "gui_update.py":
                continue
            qt = sorted(m for m in imported_modules(path) if top(m) in QT_MODULES)
            if qt:
                offenders[str(path.relative_to(ROOT))] = qt
    assert offenders == {}


def test_core_imports_without_qt() -> None:
    """The headless core must import in a process where Qt is not importable at all."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6'):\n"
        "            raise ImportError('Qt blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import app.cli, app.engines, app.profiles, app.bus, engine_adapters.launcher\n"
        "import app.cli as c; c.build_parser()\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_no_shell_or_kill_by_name_in_product_code() -> None:
    banned = ("shell=True", "os.system(", "pkill", "killall")
    offenders = []
    for package in ("app", "engine_adapters", "db"):
        for path in python_files(package):
            text = path.read_text(encoding="utf-8")
            offenders += [f"{path.relative_to(ROOT)}: {b}" for b in banned if b in text]
    assert offenders == []
