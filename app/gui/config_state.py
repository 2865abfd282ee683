"""The Qt face of the configuration being edited (:class:`app.editing.EditedConfig`).

The model calls plain callbacks; widgets connect to :attr:`ConfigState.changed`, a Qt signal,
instead, so Qt drops a connection when its widget is deleted (a plain callback list would go on
calling a deleted widget). Everything else is the model's: this class only forwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.config import RunConfig
from app.editing import EditedConfig
from app.gui.forwarded import Forwarded
from app.ladder.spec import LadderSpec
from app.profiles import Campaigns


class ConfigState(QObject):
    """The RunConfig being edited (see :class:`EditedConfig`). ``changed(path)`` fires after every
    accepted edit ("" = all); ``validated(issues)`` after each validation."""

    changed = Signal(str)
    validated = Signal(object)  # list[ValidationIssue], passed as is

    def __init__(self, config: RunConfig | EditedConfig | None = None) -> None:
        super().__init__()
        self.model = config if isinstance(config, EditedConfig) else EditedConfig(config)
        self.model.changed.connect(self.changed.emit)
        self.model.validated.connect(self.validated.emit)

    config = Forwarded[RunConfig]("model")
    pending = Forwarded[str | None]("model")
    profile_path = Forwarded[Path | None]("model")
    campaigns = Forwarded[Campaigns]("model")

    def set_ladder(self, spec: LadderSpec | None) -> None:
        self.model.set_ladder(spec)

    def draft_value(self, path: str) -> Any:
        return self.model.draft_value(path)

    def replace(self, config: RunConfig) -> None:
        self.model.replace(config)

    def set(self, path: str, value: Any) -> str | None:
        """Apply one edit; returns a one-line message when it is refused or left as a draft."""
        return self.model.set(path, value)
