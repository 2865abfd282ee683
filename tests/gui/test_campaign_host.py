"""The campaign tabs need of the window only what ``CampaignHost`` names: both tabs are hosted on
a small window of the test's own, with no ``MainWindow``, and a ladder runs there start to end
(stand-in engines and runs: ``tests.fakes.ladder``) into the host's store."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from PySide6.QtWidgets import QCheckBox, QWidget

import app.campaign as campaign_mod
import app.engines as engines_mod
import app.ladder.run as ladder_run
from app.bus import Bus
from app.cost import PriceTable, price_table
from app.editing import EditedConfig
from app.gui.config_panel import ConfigPanel, ConfigState
from app.gui.ladder_tab import LadderTab
from app.gui.live import PhaseBar
from app.gui.presentation import PresentationView
from app.gui.session import EngineSession
from app.gui.settings import GuiSettings
from app.gui.tune_tab import TuneTab
from app.gui.workers import busy_workers, run_in_worker
from app.profiles import load_profile_file, resolve_profile
from app.store import RunStore
from engine_adapters.hardware import probe_hardware
from engine_adapters.vllm import parse_help
from tests.fakes.ladder import FakeEngines, FakeLadderRunner, Script

pytestmark = pytest.mark.gui

T = TypeVar("T")
HELP_TEXT = (Path(__file__).resolve().parents[1] / "data" / "vllm-0.32.0-help.txt").read_text()


class SmallHost(QWidget):
    """The members of ``app.gui.campaign_panel.CampaignHost``, and nothing else of a window."""

    def __init__(self, db_path: Path) -> None:
        super().__init__()
        self.profile_path: Path | None = resolve_profile("cpu-ladder")
        self.bus = Bus()
        self.db_path: str | None = str(db_path)
        profile = load_profile_file(self.profile_path)
        self.state = ConfigState(EditedConfig(profile.run, self.profile_path, profile.campaigns))
        self.settings = GuiSettings()
        here = probe_hardware()  # the fake engines stand for a CPU that keeps an FP8 KV cache
        self.hardware = here.model_copy(update={"cpu_flags": [*here.cpu_flags, "avx512f"]})
        self.flags = parse_help(HELP_TEXT, "0.32.0")
        self.session = EngineSession()
        self.phase_bar = PhaseBar()
        self.presentation = PresentationView()
        self.config_panel = ConfigPanel(self.state)
        self.keep_engine = QCheckBox()
        self.worker: Any = None
        self.errors: list[str] = []
        self.store_calls = 0
        self.banners: list[str | None] = []

    @property
    def running(self) -> bool:
        return self.worker is not None

    def with_store(self, fn: Callable[[RunStore], T]) -> T:
        self.store_calls += 1
        with RunStore(self.db_path or "") as store:
            return fn(store)

    def prices(self) -> PriceTable:
        return price_table()

    def show_error(self, message: str) -> None:
        self.errors.append(message)

    def show_banner(self, text: str | None, error: bool = True) -> None:
        self.banners.append(text)

    def stop_run(self) -> None:
        raise AssertionError("not asked for in this test")

    def open_export(self, run_ids: list[int], comparison: bool = False) -> Any:
        raise AssertionError("not asked for in this test")

    def compare_runs(self, ids: list[int], baseline: int | None = None) -> None:
        raise AssertionError("not asked for in this test")

    def start_campaign(self, work: Callable[[], Any], done: Callable[[Any], None], failed: Callable[[str], None],
                       cancel: threading.Event, name: str, phase_text: str, owner: QWidget) -> None:
        self.worker = run_in_worker(work, done, failed, name=name, parent=owner)

    def run_ended(self) -> None:
        self.worker = None

    def cluster_choice(self) -> None:
        return None  # this machine

    def follow_slot(self, slot_bus: Bus) -> None:
        raise AssertionError("not asked for on this machine")


def test_both_tabs_run_on_a_host_of_their_own(qtbot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    host = SmallHost(tmp_path / "runs.db")
    qtbot.addWidget(host)
    for module in (engines_mod, ladder_run):
        monkeypatch.setattr(module, "probe_hardware", lambda: host.hardware)
    engines = FakeEngines()
    monkeypatch.setattr(campaign_mod.EngineKeeper, "engine_for",
                        lambda self, config, bus, cancel: engines.engine_for(config, bus, cancel))
    FakeLadderRunner.scripts = {"baseline": Script(400, 1.2), "batching": Script(1600, 12.0),
                                "FP8 KV": Script(1500, 12.0), "prefix": Script(2000, 13.0)}
    FakeLadderRunner.calls = []
    tune = TuneTab(host)
    ladder = LadderTab(host)
    qtbot.addWidget(tune)
    qtbot.addWidget(ladder)
    qtbot.waitUntil(lambda: ladder.table.rowCount() == 4, timeout=30_000)  # planned on the host's hardware
    ladder.runner_factory = FakeLadderRunner
    ladder.start()
    assert host.running
    qtbot.waitUntil(lambda: not host.running, timeout=60_000)
    assert ladder.state is not None and [r.status for r in ladder.state.rows] == ["completed"] * 4, host.errors
    assert len(ladder.chart.bars) == 4 and not host.errors
    assert any(b and b.startswith("Ladder completed: 4 of 4 steps ran") for b in host.banners), host.banners
    assert host.with_store(lambda store: len(store.list_runs())) == 4  # stored in the host's run database
    qtbot.waitUntil(lambda: ladder.stored_picker.count() == 1, timeout=10_000)  # listed, through with_store
    before, loaded, shown = host.store_calls, [], tune._stored_loaded
    tune._stored_loaded = lambda items: (loaded.append(items), shown(items))  # type: ignore[method-assign]
    tune.refresh_stored()  # the Tune tab reads its stored tunes (none) through the host too
    qtbot.waitUntil(lambda: loaded == [[]], timeout=10_000)
    assert host.store_calls > before
    qtbot.waitUntil(lambda: not busy_workers(), timeout=10_000)  # nothing of the tabs outlives the test
    qtbot.wait(100)  # and what the last workers said is delivered while the tabs still exist


def test_a_campaign_tab_that_lacks_a_hook_is_refused_when_it_is_built(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``CampaignTab``'s hooks are abstract: a third tab that forgets one fails at construction,
    naming it, instead of when the user first reaches it."""
    from app.gui.campaign_panel import CampaignTab

    class HalfTab(CampaignTab):
        def _done(self, state: Any) -> None: ...

    host = SmallHost(tmp_path / "runs.db")
    qtbot.addWidget(host)
    with pytest.raises(TypeError, match="_render_report"):
        HalfTab(host)  # type: ignore[abstract]
