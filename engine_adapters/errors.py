"""The one root of every error a user can act on. It lives in the lowest layer so that
``engine_adapters``, ``db`` and ``app`` can all derive from it; the CLI prints it as one line and
exits with its ``exit_code``, and the GUI shows it as a message, both by type (never by name)."""

from __future__ import annotations

from engine_adapters.secrets import mask_text

EXIT_INPUT = 2
EXIT_ENGINE_FAILED = 3


class TunebenchError(Exception):
    """A problem with a plain one-line message; ``exit_code`` is what the CLI exits with
    (2: input or environment the user can fix, 3: the engine failed)."""

    exit_code: int = EXIT_INPUT

    def __str__(self) -> str:
        """The message with secrets masked: it is printed, shown and stored (an endpoint's
        ``user:password@``, a token a server echoed)."""
        return mask_text(super().__str__())


__all__ = ["EXIT_ENGINE_FAILED", "EXIT_INPUT", "TunebenchError"]
