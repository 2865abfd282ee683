"""One root for every error a user can act on (engine_adapters.errors.TunebenchError): each layer's
error derives from it with its exit code, the CLI prints any of them as one line with that code,
and the GUI words them by type, never by class name."""

from __future__ import annotations

import pytest

from app.cli import engine_cmds, main
from app.errors import EngineFailed, UserError
from app.load.datasets import DatasetError
from app.profiles import ProfileError
from app.store import StoreError
from engine_adapters.errors import EXIT_ENGINE_FAILED, EXIT_INPUT, TunebenchError
from engine_adapters.launcher import EngineStartError
from engine_adapters.runtimes import RuntimeErrorMessage

ROOTS = [
    (UserError, EXIT_INPUT), (ProfileError, EXIT_INPUT), (DatasetError, EXIT_INPUT), (StoreError, EXIT_INPUT),
    (RuntimeErrorMessage, EXIT_INPUT), (EngineFailed, EXIT_ENGINE_FAILED), (EngineStartError, EXIT_ENGINE_FAILED),
]


@pytest.mark.parametrize(("error", "code"), ROOTS, ids=[e.__name__ for e, _ in ROOTS])
def test_every_user_error_shares_the_root_and_its_exit_code(error: type[TunebenchError], code: int) -> None:
    assert issubclass(error, TunebenchError)
    assert error("x").exit_code == code


def test_the_engine_exit_status_is_not_the_cli_exit_code() -> None:
    exc = EngineStartError("the engine died", None, -9)
    assert exc.exit_code == EXIT_ENGINE_FAILED and exc.engine_exit_code == -9


@pytest.mark.parametrize(("error", "code"), ROOTS, ids=[e.__name__ for e, _ in ROOTS])
def test_the_cli_prints_any_of_them_as_one_line_with_its_code(
        error: type[TunebenchError], code: int, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def fails(_args: object) -> int:
        raise error("the database is locked")

    monkeypatch.setattr(engine_cmds, "cmd_engine_stop", fails)
    assert main(["engine", "stop"]) == code
    err = capsys.readouterr().err
    assert err == "tunebench: error: the database is locked\n"


def test_the_gui_words_errors_by_type_not_by_name() -> None:
    pytest.importorskip("PySide6")
    from app.gui.workers import user_message

    class StoreError(Exception):  # the right name, the wrong type: an unexpected error
        pass

    class BrandNewProblem(TunebenchError):  # any name, the right type: the user's message
        pass

    assert user_message(BrandNewProblem("the disk is full")) == "the disk is full"
    assert user_message(StoreError("boom")) == "StoreError: boom"
    assert user_message(KeyError("x")) == "KeyError: 'x'"
    assert user_message(EngineStartError("the engine exited during startup (code 1)")) == \
        "the engine exited during startup (code 1)"
