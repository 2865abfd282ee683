"""Text bound for the terminal. Run names, tags, notes, model names and error messages come from
users or from files; printed raw, a carriage return, a newline or an escape sequence in them could
move the cursor, recolour or clear the terminal, or forge lines of output. Every CLI printer
passes such text through :func:`safe`."""

from __future__ import annotations

import re

# C0 controls (newline and tab included), DEL, C1 controls, and the Unicode bidirectional
# overrides and isolates that reorder what a terminal shows.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def safe(text: object) -> str:
    """``text`` as one printable line: control characters written as escapes (``\\x1b``,
    ``\\r``, ``\\n``), everything else unchanged."""
    return _UNSAFE.sub(_escape, str(text))
