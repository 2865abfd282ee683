"""What this machine and the configured engine can do, asked off the GUI thread: the hardware
fingerprint and the engine's flags (probed again when the runtime changes), which settings are
available here (``app.gui.availability``), and the adapter's validation of the configuration
being edited (its issues kept by ``app.editing.EditedConfig``, shown by the config panel).

What it needs of the window is :class:`ChecksHost`; the window is one.
"""

from __future__ import annotations

from typing import Protocol

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QPushButton

from app.engines import CheckReport, check_config
from app.gui.availability import Availability, compute_availability, judge_here
from app.gui.host import Busy, Editing, Errors, Lifetime, LiveShown, PhaseShown, Status
from app.gui.workers import run_in_worker
from engine_adapters.base import FlagSet, ValidationIssue
from engine_adapters.hardware import HardwareInfo
from engine_adapters.registry import get_adapter, maturity


class ChecksHost(Lifetime, Errors, Status, Editing, LiveShown, PhaseShown, Busy, Protocol):
    """What the checks need of the window: the configuration they check, and where they show
    what they found (the Start button's tooltip lists the configuration's errors)."""

    @property
    def start_button(self) -> QPushButton: ...


class MachineChecks(QObject):
    """The window's probe, availability and validation; each result is drawn as it arrives."""

    def __init__(self, host: ChecksHost) -> None:
        super().__init__(host.window())
        self.host = host
        self.flags: FlagSet | None = None
        self.hardware: HardwareInfo | None = None
        self.availability: Availability | None = None
        self._probed_runtime: str | None = None

    def start(self) -> None:
        """The first probe; later ones follow the configuration's runtime."""
        self.host.phase_bar.set_text("Checking hardware and the installed engine…")
        self._probe_engine()
        self.host.state.changed.connect(self._config_changed)

    def _probe_engine(self) -> None:
        """Hardware fingerprint and the configured runtime's flags (the first discovery runs the
        engine's --help, ~10 s; then it is cached by version)."""
        config = self.host.state.config
        self._probed_runtime = config.engine.runtime.model_dump_json() + config.engine.kind
        run_in_worker(lambda: check_config(config), self._probed, self.host.show_error, name="probe",
                      parent=self)

    def _config_changed(self, _path: str) -> None:
        engine = self.host.state.config.engine
        if engine.runtime.model_dump_json() + engine.kind != self._probed_runtime:
            self._probe_engine()

    def _probed(self, report: CheckReport) -> None:
        assert report.hardware is not None  # check_config always probes it
        w = self.host
        self.hardware, self.flags, note = report.hardware, report.flags, "; ".join(report.notes)
        w.live.has_gpu = w.live.has_gpu or self.hardware.has_gpu
        w.live_tab.apply_support()
        kind = w.state.config.engine.kind
        engine_text = f"{get_adapter(kind).display_name} {self.flags.version}" if self.flags else "engine version unknown"
        if (proven := maturity(kind)) is not None:
            engine_text += f" ({proven})"
        if not w.running:
            w.phase_bar.set_text(f"Idle — {self.hardware.summary()}; {engine_text}")
        if note:
            w.statusBar().showMessage(note, 15_000)
        self.refresh_availability()
        self.validate()

    def refresh_availability(self) -> None:
        if self.hardware is None:
            return
        config, hardware, flags = self.host.state.config, self.hardware, self.flags
        run_in_worker(lambda: compute_availability(config, hardware, flags), self._availability_ready,
                      self.host.show_error, name="availability", parent=self)

    def _availability_ready(self, availability: Availability) -> None:
        self.availability = availability
        self.host.config_panel.apply_availability(availability)

    def validate(self) -> None:
        """Adapter validation (and what this machine can do) in a worker; a newer request waits
        for the running one."""
        edited = self.host.state.model
        if self.hardware is None or not edited.begin_validation():
            return
        config, hardware, flags = edited.config, self.hardware, self.flags

        def judge() -> list[ValidationIssue]:
            issues = check_config(config, discover_flags=False, hardware=hardware, flags=flags).issues
            return [*issues, *judge_here(config, hardware, issues)]

        run_in_worker(judge, self._validated, self._validation_failed, name="validate", parent=self)

    def _validated(self, issues: list[ValidationIssue]) -> None:
        edited = self.host.state.model
        again = edited.finish_validation(issues)  # the config panel hears the issues from the model
        errors = edited.errors
        self.host.start_button.setToolTip("\n".join(str(i) for i in errors) if errors
                                          else "Launch the engine and run the load")
        if again:
            self.validate()

    def _validation_failed(self, message: str) -> None:
        self.host.state.model.validation_failed()
        self.host.show_error(message)
