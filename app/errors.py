"""Errors the user can act on: printed as one line by the CLI and shown as a message by the GUI."""

from __future__ import annotations


class UserError(Exception):
    """A problem with input or environment, with a plain one-line message."""

    exit_code = 2


class EngineFailed(UserError):
    """The engine failed to start or died; the message is the diagnosis."""

    exit_code = 3
