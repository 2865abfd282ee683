"""A stored run as a quality reference (``[quality] reference = <run id or uid>``)."""

from __future__ import annotations

from typing import Any

from app.quality.probe import Reference


def stored_reference(store: Any, ref: str) -> Reference:
    """The run ``ref`` names in ``store`` (an ``app.store.RunStore``) as a reference; where it
    cannot be one (no such run, no store, no outputs kept) the reference says why in one line,
    and the run it is asked for still runs and is stored."""
    from app.store import StoreError

    if store is None:
        return Reference(kind="run", label=ref, problem=f"reference run '{ref}': no run database (--no-store)")
    try:
        run = store.get_run(store.resolve(ref))
    except StoreError as exc:
        return Reference(kind="run", label=ref, problem=f"reference run '{ref}': {exc}")
    return Reference.of_figures(run.quality, "run", run_id=run.id, uid=run.uid, label=run.name)
