"""A streamed reply as the network may cut it, fed to the client's stream parser."""

from __future__ import annotations

import asyncio

from app.load.client import _StreamState


def feed_split(chunks: list[bytes], cuts: list[int] | None = None, *, chat: bool = False,
               keep_text: bool = True) -> _StreamState:
    """The parser's state after reading ``chunks`` joined and cut again at the byte offsets ``cuts``."""
    blob = b"".join(chunks)
    edges = sorted(set(cuts or []))
    pieces = [blob[a:b] for a, b in zip([0, *edges], [*edges, len(blob)], strict=True) if blob[a:b]]

    class Content:
        async def iter_any(self):  # type: ignore[no-untyped-def]
            for piece in pieces:
                yield piece

    state = _StreamState(0.0, chat=chat, keep_text=keep_text, on_tokens=None, on_first=None)
    asyncio.run(state.consume(Content()))  # type: ignore[arg-type]
    return state
