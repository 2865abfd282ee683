"""The user's files the window reads and writes: profiles (opened from the toolbar's picker or
Open…, saved with Save / Save as…) and the workbench settings (recent profiles and models, the
store chosen, prices, each engine's last start time), each read or written in a worker.

The configuration a profile holds goes into the editing model (``app.editing.EditedConfig``),
which remembers the file; the settings stay the window's (``window.settings``, which the
campaign tabs read). What it needs of the window is :class:`FilesHost`; the window is one.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, Signal

from app.events import EngineReady
from app.gui.host import Banner, Busy, Editing, Lifetime, LiveShown, ProfileNamed, Settings, Status
from app.gui.run_control import startup_key
from app.gui.settings import GuiSettings, load_settings, save_settings
from app.gui.workers import run_in_worker
from app.labels import engine_defaults
from app.profiles import Profile, ProfileError, load_profile_file, save_profile, shipped_profiles

if TYPE_CHECKING:
    from app.gui.cluster_box import ClusterBox
    from app.gui.toolbar import MainToolBar


class FilesHost(Lifetime, Banner, Status, Editing, LiveShown, Busy, ProfileNamed, Settings, Protocol):
    """What the files need of the window: the settings they read and write, the configuration a
    profile goes into, and the widgets that show what was read."""

    @property
    def toolbar(self) -> MainToolBar: ...
    @property
    def cluster_box(self) -> ClusterBox: ...
    def show_prices(self, prices: list[str]) -> None: ...


class UserFiles(QObject):
    settings_read = Signal(object, str)
    """The settings were read: the store they name (None: the default) and the author."""
    settings_missing = Signal()
    """No settings could be read: the store is the one --db, the environment or the default names."""
    profile_opened = Signal()
    """A profile was opened: what this machine can run of it is worked out again."""

    def __init__(self, host: FilesHost) -> None:
        super().__init__(host.window())
        self.host = host
        self.shipped = shipped_profiles()  # listed once, before the event loop runs
        self._saving = threading.Lock()

    # -- settings ------------------------------------------------------------------------------

    def load_settings(self) -> None:
        run_in_worker(load_settings, self._settings_loaded, self._settings_failed, name="settings",
                      parent=self)

    def _settings_loaded(self, settings: GuiSettings) -> None:
        w = self.host
        w.settings = settings
        self.settings_read.emit(settings.store_location, settings.author)
        w.show_prices(settings.prices)
        w.config_panel.set_recent_models(settings.recent_models)
        w.cluster_box.restore(settings.cluster_address, settings.cluster_trials_at_once)
        self.fill_picker()

    def _settings_failed(self, message: str) -> None:
        self.host.show_error(message)
        self.settings_missing.emit()

    def save_settings(self) -> None:
        """In a worker, one save at a time, each writing the newest settings: two saves in flight
        (an address, then trials at once, changed in quick succession) could otherwise land out
        of order and leave the older settings in the file."""
        host, lock = self.host, self._saving

        def save() -> None:
            with lock:
                save_settings(host.settings)

        run_in_worker(save, None, self.host.show_error, name="save-settings", parent=self)

    def remember_cluster(self) -> None:
        """The Cluster box's address and trials at once, as the next session's."""
        w = self.host
        address, at_once = w.cluster_box.address(), w.cluster_box.parallel.value()
        if (address, at_once) == (w.settings.cluster_address, w.settings.cluster_trials_at_once):
            return
        w.settings = w.settings.model_copy(update={"cluster_address": address, "cluster_trials_at_once": at_once})
        self.save_settings()

    def remember(self, kind: str, value: str) -> None:
        """A recent profile or model, first in its list."""
        w = self.host
        w.settings = w.settings.remember(kind, value)
        self.save_settings()
        if kind == "recent_models":
            w.config_panel.set_recent_models(w.settings.recent_models)

    def remember_startup(self, ready: EngineReady) -> None:
        """How long this engine took to start: the next start's time left."""
        w = self.host
        if ready.startup_s is not None and w.live.config is not None:
            w.settings = w.settings.with_startup(startup_key(w.live.config), ready.startup_s)
            self.save_settings()

    # -- profiles ------------------------------------------------------------------------------

    def _is_shipped(self, path: Path) -> bool:
        return str(path) in {str(p) for p in self.shipped.values()}

    def fill_picker(self) -> None:
        w = self.host
        w.toolbar.fill_profiles(self.shipped, w.settings.recent_profiles, w.profile_path)

    def picked(self, index: int) -> None:
        path = self.host.toolbar.picked_profile(index)
        if path is not None:
            self.open_profile(path)

    def ask_and_open(self) -> None:
        current = self.host.profile_path
        path = self.host.toolbar.ask_open_path(current.parent if current else Path.home())
        if path is not None:
            self.open_profile(path)

    def open_profile(self, path: Path) -> None:
        """Load in a worker; a bad file leaves the current configuration untouched."""
        w = self.host

        def loaded(profile: Profile) -> None:
            config = profile.run
            w.state.model.load(config, path, profile.campaigns)
            w.config_panel.set_engine_defaults(engine_defaults(config.engine.kind))
            w.window().setWindowTitle(f"tunebench — {path.name}")
            w.statusBar().showMessage("; ".join([f"Opened {path}", *profile.notes]), 10_000 if profile.notes else 5000)
            w.show_banner(None)
            if not self._is_shipped(path):
                self.remember("recent_profiles", str(path))
            self.fill_picker()
            self.profile_opened.emit()
            if not w.running:  # the last run's graphs and figures belong to another profile
                w.live_tab.clear(f"Profile \u201c{config.name}\u201d loaded. Press \u25b6 Start to run it.")

        run_in_worker(lambda: load_profile_file(path), loaded, w.show_error, name="open-profile", parent=self)

    def save(self, ask: bool = False) -> None:
        """Save (or Save as…): a shipped profile, or none yet, asks where."""
        path = self.host.profile_path
        if ask or path is None or self._is_shipped(path):
            path = self.host.toolbar.ask_save_path(Path.home() / f"{self.host.state.config.name or 'profile'}.toml")
            if path is None:
                return
        self.save_profile_to(path)

    def save_profile_to(self, path: Path) -> None:
        w = self.host
        problems = w.config_panel.problems()
        if problems:
            w.show_error("Not saved, the configuration has unfinished edits: " + "; ".join(problems))
            return
        config, ladder = w.state.config, w.state.campaigns.ladder

        def saved(_: Any) -> None:
            w.state.model.saved(path)
            w.window().setWindowTitle(f"tunebench — {path.name}")
            w.statusBar().showMessage(f"Saved {path}", 5000)
            self.remember("recent_profiles", str(path))
            self.fill_picker()

        def write() -> Path:
            try:
                return save_profile(config, path, ladder)
            except OSError as exc:
                raise ProfileError(f"{path}: cannot write: {exc.strerror}") from None

        run_in_worker(write, saved, w.show_error, name="save-profile", parent=self)
