"""Architecture rules import-linter cannot see. The import contracts themselves (layers, Qt only
in app/gui, the launcher knowing no engine) are declared in pyproject.toml and checked by
`lint-imports` in `make test`; here: the headless core really imports where Qt cannot (a lazy
import that runs at import time would break it), and product code never uses a shell or kills
by name."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_files(*parts: str) -> list[Path]:
    return sorted((ROOT.joinpath(*parts)).rglob("*.py"))


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
