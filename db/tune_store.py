"""Tunes as campaigns (``db.campaign_store``, kind ``tune``): a tune's columns and doc, and its
trials as the campaign's links (step = trial index). The tuner (``app.tuner``) writes a trial when
it starts and again when it ends, so a tune whose process died shows which trials completed (kept
on ``--resume``) and which were running (rerun). Plain dicts in and out: ``db`` never imports ``app``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from db import campaign_store
from db.campaign_store import StoredCampaign, StoredLink
from db.errors import StoreError
from db.store import RunStore

KIND = "tune"
TRIAL_FIELDS = ("candidate", "source", "status", "knobs", "load_kind", "load_value", "run_id", "figures", "reason",
                "started_at", "finished_at", "doc")
LINK_DOC_KEYS = ("candidate", "knobs", "load_kind", "load_value", "figures")
"""A trial's fields that its link keeps in ``doc`` (the trial's own doc goes under ``detail``)."""
_COLUMNS = ("strategy", "slo")
"""A tune's own columns of old, kept in the campaign's state."""


@dataclass
class StoredTune(StoredCampaign):
    """A tune as stored: a campaign whose state holds the tune's columns of old (``strategy``,
    ``slo``) beside its ``doc``, and whose links are its trials. Read from the campaign, so the two
    never disagree."""

    @property
    def strategy(self) -> str:
        return str(self.state.get("strategy") or "grid")

    @property
    def slo(self) -> str:
        return str(self.state.get("slo") or "")

    @property
    def doc(self) -> dict[str, Any]:
        return {k: v for k, v in self.state.items() if k not in _COLUMNS}

    @property
    def trials(self) -> list[dict[str, Any]]:
        return [_trial(link) for link in self.links]


def _tune(c: StoredCampaign) -> StoredTune:
    return StoredTune(**{f.name: getattr(c, f.name) for f in fields(c)})


def _trial(link: StoredLink) -> dict[str, Any]:
    doc = link.doc
    return {"index": link.step, "candidate": int(doc.get("candidate") or 0), "source": link.role,
            "status": link.status, "knobs": dict(doc.get("knobs") or {}),
            "load_kind": doc.get("load_kind") or "concurrency", "load_value": doc.get("load_value"),
            "run_id": link.run_id, "figures": dict(doc.get("figures") or {}), "reason": link.reason,
            "started_at": link.started_at, "finished_at": link.finished_at, "doc": dict(doc.get("detail") or {})}


def _link(index: int, values: Mapping[str, Any]) -> StoredLink:
    unknown = set(values) - set(TRIAL_FIELDS)
    if unknown:
        raise StoreError(f"unknown trial field(s): {', '.join(sorted(unknown))}")
    row = {"candidate": 0, "source": "measured", "status": "pending", "knobs": {}, "load_kind": "concurrency",
           "load_value": None, "run_id": None, "figures": {}, "reason": None, "started_at": None,
           "finished_at": None, "doc": {}, **values}
    return StoredLink(step=index, idx=0, run_id=row["run_id"], status=row["status"], role=row["source"],
                      reason=row["reason"], started_at=row["started_at"], finished_at=row["finished_at"],
                      doc={**{k: row[k] for k in LINK_DOC_KEYS}, "knobs": dict(row["knobs"]),
                           "detail": dict(row["doc"])})


def create_tune(store: RunStore, tune_id: str, *, name: str, profile: str, strategy: str, slo: str,
                doc: Mapping[str, Any]) -> None:
    """A new tune, ``running`` and owned by this process."""
    campaign_store.create_campaign(store, tune_id, kind=KIND, name=name, profile=profile,
                                   state={**dict(doc), "strategy": strategy, "slo": slo})


def update_tune(store: RunStore, tune_id: str, *, status: str | None = None, reason: str | None = None,
                doc: Mapping[str, Any] | None = None, claim: bool = False) -> None:
    """Set the status (with its reason) and merge ``doc`` keys in. ``claim``: this process becomes
    the writer (a resumed tune)."""
    campaign_store.update_campaign(store, tune_id, status=status, reason=reason, merge_state=doc, claim=claim)


def put_trial(store: RunStore, tune_id: str, index: int, **values: Any) -> None:
    """Insert or replace trial ``index`` of a tune (fields: :data:`TRIAL_FIELDS`)."""
    put_trials(store, tune_id, [(index, values)])


def put_trials(store: RunStore, tune_id: str, rows: list[tuple[int, dict[str, Any]]]) -> None:
    """Several trials in one transaction (an import: all or nothing)."""
    campaign_store.put_links(store, tune_id, [_link(index, values) for index, values in rows])


def get_tune(store: RunStore, tune_id: str) -> StoredTune:
    campaign = campaign_store.get_campaign(store, tune_id)
    if campaign.kind != KIND:
        raise StoreError(f"no tune {tune_id}")
    return _tune(campaign)


def list_tunes(store: RunStore, *, mark_interrupted: bool = True) -> list[StoredTune]:
    """Every tune, newest first, with its trials; one left ``running`` by a dead process is marked
    ``interrupted`` (once: the mark is written back)."""
    return [_tune(c) for c in campaign_store.list_campaigns(store, kind=KIND, mark_interrupted=mark_interrupted)]


def find_tune(store: RunStore, ref: str, *, mark_interrupted: bool = True) -> StoredTune:
    """A tune by its id (``tune:`` prefix allowed; a unique start is enough)."""
    return _tune(campaign_store.find_campaign(store, ref, kind=KIND, mark_interrupted=mark_interrupted))


def delete_tune(store: RunStore, tune_id: str) -> None:
    """The tune and its trials (its runs stay: delete them with ``tunebench runs delete``)."""
    get_tune(store, tune_id)
    campaign_store.delete_campaign(store, tune_id)
