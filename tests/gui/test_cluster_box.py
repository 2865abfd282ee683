"""The Cluster box (offscreen): an unreachable address is one line within seconds; a check of a
real local Ray cluster (tests/ray_cluster.py: a head and two worker nodes on 127.0.0.1) lists its
nodes; Start with Repeats 2 runs both repeats on the cluster with the real llama.cpp engine, one
on each node, each stored with its node and its lines labelled with it; the Ladder hands the
campaign the cluster's fleet; the address and trials at once are kept in the settings; and
without an address nothing of Ray is imported."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest
from PySide6.QtCore import Qt

from app.errors import UserError
from app.gui.main_window import MainWindow
from app.gui.settings import load_settings, settings_path
from app.live_run import node_of
from app.store import RunStore
from engine_adapters.llamacpp_runtime import ensure_gguf_demo_model
from engine_adapters.runtimes import COMPLETE_MARKER, MANAGED_RUNTIMES, demo_model_dir
from tests.fuzz.hostile import closed_port
from tests.ray_cluster import LocalRayCluster, tiny_profile

pytestmark = pytest.mark.gui

REPO = Path(__file__).resolve().parents[2]
UNREACHABLE_WITHIN_S = 10.0


@pytest.fixture(autouse=True)
def _own_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's window keeps its Cluster box in settings of its own: a cluster address left in
    the session's settings would send every later window's runs to a cluster."""
    monkeypatch.setenv("TUNEBENCH_CONFIG_DIR", str(tmp_path / "config"))


def check(qtbot, window: MainWindow, address: str, timeout_ms: int = 120_000) -> str:  # type: ignore[no-untyped-def]
    """Type ``address``, press Check, and wait for the box's one-line answer."""
    box = window.cluster_box
    box.address_edit.setText(address)
    box.address_edit.textEdited.emit(address)
    qtbot.mouseClick(box.check_button, Qt.MouseButton.LeftButton)
    assert box.checking is not None, box.status_label.text()
    qtbot.waitUntil(lambda: box.checking is None, timeout=timeout_ms)
    return box.status_label.text()


def test_an_unreachable_cluster_is_one_line_within_seconds(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    import ray  # noqa: F401  (loaded before the clock: what is timed is the reach check, not a cold import)

    address = f"127.0.0.1:{closed_port()}"
    started = time.monotonic()
    text = check(qtbot, window, address, timeout_ms=int(UNREACHABLE_WITHIN_S * 1000))
    assert time.monotonic() - started < UNREACHABLE_WITHIN_S
    assert text.startswith(f"cannot reach the Ray cluster at {address}"), text
    assert "\n" not in text and "Traceback" not in text and "Error:" not in text
    assert not window.cluster_box.table.isVisible()
    assert window.cluster_box.check_button.isEnabled()  # another try is one click away
    assert window.cluster_choice() is not None  # the address stays: a run would be refused the same way


def test_the_check_lists_the_nodes_of_a_real_cluster(qtbot, ray_cluster: LocalRayCluster,  # type: ignore[no-untyped-def]
                                                     make_window: Callable[..., MainWindow]) -> None:
    window = make_window()
    import ray

    text = check(qtbot, window, ray_cluster.address)
    # Ray lists the nodes that other tests removed from the session's cluster too, as dead
    dead = sum(1 for node in ray.nodes() if not node.get("Alive"))
    assert text == "3 nodes" + (f" ({dead} dead)" if dead else "") + ", 2 can host trials; up to 2 at once", text
    assert window.cluster_box.status_label.toolTip().startswith(f"{ray_cluster.address}: 3 nodes")
    table = window.cluster_box.table
    assert table.isVisible() and table.rowCount() == 3 + dead
    every = [[table.item(r, c).text() for c in range(table.columnCount())] for r in range(table.rowCount())]
    rows = [r for r in every if r[1] == "yes"]
    assert len(rows) == 3 and all(r[1] == "dead" for r in every if r not in rows)
    assert sorted(r[2] for r in rows) == ["0/0", "2/2", "2/2"]  # the head holds no trial
    assert {r[5] for r in rows} == {"no"}  # every node runs this workbench's code
    status = window.cluster_box.status
    assert status is not None and {r[4] for r in rows} == {status.driver}
    window.cluster_box.parallel.setValue(1)
    assert window.cluster_box.status_label.text().endswith("up to 1 at once")
    assert window.cluster_choice() == window.cluster_box.choice()
    assert window.cluster_box.choice().trials_at_once == 1  # type: ignore[union-attr]


def test_repeats_on_the_cluster_run_on_both_nodes_each_stored_with_its_node(  # type: ignore[no-untyped-def]
        qtbot, ray_cluster: LocalRayCluster, make_window: Callable[..., MainWindow], tmp_path: Path) -> None:
    runtime = MANAGED_RUNTIMES["llamacpp-cpu"]
    if not runtime.is_installed() or not (demo_model_dir() / COMPLETE_MARKER).is_file():
        pytest.fail("llama.cpp runtime or demo model missing: run `make engine`")
    ensure_gguf_demo_model(str(runtime.interpreter))  # made once here, not by both nodes at once
    profile = tiny_profile(tmp_path)
    window = make_window(str(profile), db_path=tmp_path / "runs.db")
    window.cluster_box.address_edit.setText(ray_cluster.address)
    window.cluster_box.parallel.setValue(2)
    window.repeats.setValue(2)
    logged_lines: list[str] = []  # every line, not the bounded tail: two verbose engines nearly fill it
    window.live.logged.connect(logged_lines.extend)
    qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
    assert window.running
    assert not window.cluster_box.address_edit.isEnabled()  # the run's cluster stays as it was
    qtbot.waitUntil(lambda: not window.running, timeout=300_000)
    assert window.last_result is not None and window.last_result.status == "completed", window.banner.text()
    with RunStore(tmp_path / "runs.db") as store:
        runs = [store.get_run(r.id) for r in store.list_runs()]
    assert len(runs) == 2 and {r.status for r in runs} == {"completed"}
    nodes = {node_of(r.tags) for r in runs}
    assert len(nodes) == 2 and None not in nodes, nodes  # one repeat on each node
    assert {r.hardware["node"]["ray_node_id"] for r in runs} == {ray_cluster.node_id_of(n) for n in ray_cluster.workers}
    logged = "\n".join(logged_lines)
    for node in nodes:
        assert f"[{node}] " in logged  # each trial's lines say where they ran
    assert "cluster: cluster at" in logged and "up to 2 at once" in logged


def _stopped_here(handed: dict[str, Any]) -> Callable[..., NoReturn]:
    """A stand-in for a campaign's entry point (the ladder's run, the tuner): it keeps the keyword
    arguments the tab handed it, then stops the campaign there."""

    def stand_in(*_args: Any, **kwargs: Any) -> NoReturn:
        handed.update(kwargs)
        raise UserError("stopped here by the test")

    return stand_in


def _handed_the_fleet(qtbot: Any, window: MainWindow, handed: dict[str, Any]) -> None:
    """The campaign started on the cluster was handed its fleet, how many trials run at once and
    the window's way of following each trial's bus."""
    from app.fleet.trial import RayFleet

    qtbot.waitUntil(lambda: not window.running, timeout=120_000)
    assert "stopped here by the test" in window.banner.text(), window.banner.text()
    assert isinstance(handed.get("fleet"), RayFleet)
    assert handed["max_parallel"] == 2  # what the two worker nodes hold at once
    assert handed["on_slot_bus"] == window.follow_slot


def _tab_whose_campaign_stops(make_window: Callable[..., MainWindow], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              profile: str, entry: tuple[ModuleType, str],
                              tab_name: str) -> tuple[MainWindow, Any, dict[str, Any]]:
    """A window on ``profile`` showing its campaign tab ``tab_name``, whose campaign stops at its
    entry point ``entry`` (a module and a name: :func:`_stopped_here`); and what the tab handed it."""
    handed: dict[str, Any] = {}
    monkeypatch.setattr(*entry, _stopped_here(handed))
    window = make_window(profile, db_path=tmp_path / "runs.db")
    tab = getattr(window, tab_name)
    window.tabs.setCurrentWidget(tab)
    return window, tab, handed


def test_the_ladder_on_a_cluster_gets_its_fleet_and_follows_its_slots(  # type: ignore[no-untyped-def]
        qtbot, ray_cluster: LocalRayCluster, make_window: Callable[..., MainWindow], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import app.ladder.run as ladder_run

    window, tab, handed = _tab_whose_campaign_stops(make_window, tmp_path, monkeypatch, "cpu-ladder",
                                                    (ladder_run, "run_ladder"), "ladder")
    qtbot.waitUntil(lambda: tab.start_button.isEnabled(), timeout=60_000)
    window.cluster_box.address_edit.setText(ray_cluster.address)
    tab.start()
    _handed_the_fleet(qtbot, window, handed)


def test_a_tune_on_a_cluster_gets_its_fleet_and_follows_its_slots(  # type: ignore[no-untyped-def]
        qtbot, ray_cluster: LocalRayCluster, make_window: Callable[..., MainWindow], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import app.tuner.run as tuner_run

    window, tab, handed = _tab_whose_campaign_stops(make_window, tmp_path, monkeypatch, "cpu-demo",
                                                    (tuner_run, "Tuner"), "tune")
    tab.slo_edit.setText("ttft_ms<=150,tpot_ms<=60")
    window.cluster_box.address_edit.setText(ray_cluster.address)
    qtbot.mouseClick(tab.start_button, Qt.MouseButton.LeftButton)
    _handed_the_fleet(qtbot, window, handed)


def test_the_address_and_trials_at_once_are_kept_in_the_settings(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    window.cluster_box.address_edit.setText("ray://head.example:10001")
    window.cluster_box.address_edit.editingFinished.emit()
    window.cluster_box.parallel.setValue(3)
    qtbot.waitUntil(lambda: load_settings(settings_path()).cluster_trials_at_once == 3, timeout=10_000)
    saved = load_settings(settings_path())
    assert saved.cluster_address == "ray://head.example:10001"
    window.cluster_box.restore("", 0)  # a later session's values
    assert window.cluster_box.choice() is None and window.cluster_box.parallel.text() == "auto"
    window.cluster_box.restore(saved.cluster_address, saved.cluster_trials_at_once)
    assert window.cluster_box.choice() is not None
    assert (window.cluster_box.choice().address, window.cluster_box.choice().trials_at_once) == (  # type: ignore[union-attr]
        "ray://head.example:10001", 3)


NO_RAY = """
import os, sys, time
os.environ["QT_QPA_PLATFORM"] = "offscreen"
from PySide6.QtWidgets import QApplication
app = QApplication([])
import app.gui.repeats as repeats
from app.errors import EngineFailed
from app.gui.main_window import MainWindow
from app.profiles import load_profile_file, resolve_profile

calls = []
def no_engine(*args, **kwargs):
    calls.append(kwargs)
    raise EngineFailed("no engine in this test")
repeats.run_repeats = no_engine
path = resolve_profile("cpu-demo")
window = MainWindow(load_profile_file(path), path, db_path=sys.argv[1])
window.show()
deadline = time.monotonic() + 60
while (window.hardware is None or window.availability is None) and time.monotonic() < deadline:
    app.processEvents(); time.sleep(0.02)
assert window.cluster_choice() is None
window.repeats.setValue(2)
window.start_run()
while window.running and time.monotonic() < deadline:
    app.processEvents(); time.sleep(0.02)
assert not window.running and calls and "fleet" not in calls[0], calls
assert "no engine in this test" in window.banner.text(), window.banner.text()
print("ray" in sys.modules)
sys.stdout.flush()
os._exit(0)  # the window's background workers (history, checks) need no tidy end here
"""


def test_without_an_address_nothing_of_ray_is_imported(tmp_path: Path) -> None:
    """In a process of its own: this session's other tests import Ray."""
    done = subprocess.run([sys.executable, "-c", NO_RAY, str(tmp_path / "runs.db")], capture_output=True, text=True,
                          cwd=REPO, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "False", "the window imported Ray without a cluster"
