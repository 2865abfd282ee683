"""The parts of the window that its helpers and tabs ask for, each declared once.

Each helper declares its host as the parts it needs (``ChecksHost``, ``RunHost``, ``StoreHost``,
``FilesHost``, ``CampaignHost``: :class:`typing.Protocol` s that inherit these) plus what only it
asks for. The window (``app.gui.main_window``) is all of them; no module of app.gui imports it,
not even for type hints (``importlinter-type-checking.toml``), so a test can host a helper or a
tab on a small window of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from PySide6.QtWidgets import QCheckBox, QStatusBar, QTabWidget, QWidget

if TYPE_CHECKING:
    from app.bus import Bus
    from app.cost import PriceTable
    from app.gui.cluster_box import ClusterChoice
    from app.gui.config_panel import ConfigPanel
    from app.gui.config_state import ConfigState
    from app.gui.live import PhaseBar
    from app.gui.live_tab import LiveTab
    from app.gui.presentation import PresentationView
    from app.gui.session import EngineSession
    from app.gui.settings import GuiSettings
    from app.live_run import LiveRun
    from app.store import RunStore

T = TypeVar("T")


class Lifetime(Protocol):
    def window(self) -> QWidget:
        """The window a helper lives and dies with (its Qt parent; dialogs open over it)."""
        ...


class Errors(Protocol):
    def show_error(self, message: str) -> None:
        """A one-line error, shown to the user (secrets masked)."""
        ...


class Banner(Errors, Protocol):
    def show_banner(self, text: str | None, error: bool = True) -> None:
        """A line above the tabs (None hides it); ``error=False`` for good news."""
        ...


class Status(Protocol):
    def statusBar(self) -> QStatusBar: ...


class Editing(Protocol):
    """The configuration being edited, and the panel that edits it."""

    @property
    def state(self) -> ConfigState: ...
    @property
    def config_panel(self) -> ConfigPanel: ...


class LiveShown(Protocol):
    """The running run as the bus tells it, and the Live tab that draws it."""

    @property
    def live(self) -> LiveRun: ...
    @property
    def live_tab(self) -> LiveTab: ...


class PhaseShown(Protocol):
    @property
    def phase_bar(self) -> PhaseBar:
        """Where the engine's phase, the level running and the idle state are told in a line."""
        ...


class Busy(Protocol):
    @property
    def running(self) -> bool:
        """A run or a campaign is running: only one at a time."""
        ...


class ProfileNamed(Protocol):
    @property
    def profile_path(self) -> Path | None:
        """The profile file the configuration came from (None: not saved yet)."""
        ...


class Tabs(Protocol):
    @property
    def tabs(self) -> QTabWidget:
        """Live, History, Compare, Ladder and Tune: a helper brings forward the one it fills."""
        ...


class Previous(Protocol):
    previous_config: dict[str, Any] | None
    """The last run's configuration, as JSON: a run's name is suggested against it."""


class Settings(Protocol):
    settings: GuiSettings
    """The workbench settings: read by all; the files and the store link keep a changed copy."""


class Priced(Protocol):
    def prices(self) -> PriceTable:
        """The shipped prices with yours from the settings on top."""
        ...


class Records(Protocol):
    """Where a run publishes its events and is recorded."""

    @property
    def bus(self) -> Bus: ...
    @property
    def db_path(self) -> str | None: ...

    def with_store(self, fn: Callable[[RunStore], T]) -> T:
        """``fn(store)`` on the window's run database (from a worker)."""
        ...


class Engines(Protocol):
    """Where a run's engine runs: the one kept warm between runs, or a Ray cluster's."""

    @property
    def session(self) -> EngineSession: ...
    @property
    def keep_engine(self) -> QCheckBox: ...

    def cluster_choice(self) -> ClusterChoice | None:
        """Where a run or a campaign's steps go: a Ray cluster, or None for this machine."""
        ...

    def follow_slot(self, slot_bus: Bus) -> None:
        """The live view follows a campaign slot's bus too (a trial on a cluster)."""
        ...


class RunPlace(Editing, Banner, PhaseShown, Settings, Priced, Records, Engines, Protocol):
    """What starting a run or a campaign needs, wherever it is started (Start, a campaign tab):
    the configuration, where it runs and records, and where its progress and failure are told."""

    @property
    def presentation(self) -> PresentationView:
        """The full-screen view, whose heading names the run."""
        ...
