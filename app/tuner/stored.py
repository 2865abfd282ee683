"""Tunes read back from the run store (``db.tune_store``) as :class:`~app.tuner.state.TuneState`:
listed, shown, reported, exported, and found again to resume."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from app.errors import UserError
from app.tuner.state import Trial, TuneState
from db import tune_store
from db.errors import StoreError

RESUMABLE = ("interrupted", "cancelled", "failed")


def state_of(stored: tune_store.StoredTune) -> TuneState:
    """The state a stored tune holds (its doc and its trial rows)."""
    doc = {k: v for k, v in stored.doc.items() if k in TuneState.model_fields}
    try:
        state = TuneState.model_validate({**doc, "tune_id": stored.id, "name": stored.name, "profile": stored.profile,
                                          "status": stored.status, "reason": stored.reason,
                                          "strategy": stored.strategy, "slo": stored.slo, "trials": []})
    except ValidationError as exc:
        raise UserError(f"tune {stored.id}: its stored state is not readable by this version: "
                        f"{exc.errors()[0]['msg']}") from None
    state.trials = [Trial.from_stored(t) for t in stored.trials]
    return state


def load_tune(store: Any, ref: str) -> TuneState:
    try:
        return state_of(tune_store.find_tune(store, ref))
    except StoreError as exc:
        raise UserError(str(exc)) from None


def list_states(store: Any) -> list[TuneState]:
    return [state_of(t) for t in tune_store.list_tunes(store)]


def resumable(store: Any, ref: str | None, profile: str) -> tune_store.StoredTune:
    """The tune to resume: ``ref`` (an id), or the newest unfinished tune of ``profile``."""
    if ref:
        try:
            return tune_store.find_tune(store, ref)
        except StoreError as exc:
            raise UserError(str(exc)) from None
    tunes = [t for t in tune_store.list_tunes(store) if t.profile == profile and t.status in RESUMABLE]
    if not tunes:
        raise UserError(f"no unfinished tune of profile '{profile}' to resume (tunebench tunes lists the tunes)")
    return tunes[0]
