"""Reading and writing campaigns (tables ``campaigns`` and ``campaign_runs``, revision 0007): one
stored form for every kind (an acceleration ladder, a tune). A campaign's ``state`` is its own
JSON, whatever its kind; its links say which run measured which step, so a campaign whose process
died shows what completed (kept on resume) and what was running. Plain dicts in and out: ``db``
never imports ``app``, which gives each kind its typed state (``app.campaigns``).

A campaign remembers its writer (pid, start time and pid namespace) like a run does: one left
``running`` by a process that is gone reads back ``interrupted``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update

from db.errors import StoreError, guarded
from db.models import CAMPAIGN_KINDS, CAMPAIGN_STATUSES, Campaign, CampaignRun, Run, RunTag
from db.store import RunStore
from db.writes import writer_may_be_alive
from engine_adapters.process_group import pid_namespace, process_identity
from engine_adapters.secrets import mask_obj, mask_text

LINK_FIELDS = ("run_id", "status", "role", "reason", "started_at", "finished_at", "doc")
"""What a link holds beside its place (``step``, ``idx``)."""


@dataclass
class StoredLink:
    """One run of a step (or a tune's trial): ``idx`` counts a step's repeats."""

    step: int
    idx: int = 0
    run_id: int | None = None
    status: str = "pending"
    role: str = "measured"
    reason: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    doc: dict[str, Any] = field(default_factory=dict)


@dataclass
class StoredCampaign:
    """A campaign as stored: its columns, its state and its links in order."""

    id: str
    kind: str
    name: str
    profile: str
    status: str
    reason: str | None
    created_at: float
    updated_at: float
    revision: int
    state: dict[str, Any]
    writer_pid: int | None = None
    writer_create_time: float | None = None
    writer_namespace: str = ""
    links: list[StoredLink] = field(default_factory=list)

    @property
    def writer_is_alive(self) -> bool:
        return writer_may_be_alive(self.writer_pid, self.writer_create_time, self.writer_namespace)

    def run_ids_by_step(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for link in self.links:
            if link.run_id is not None:
                out.setdefault(link.step, []).append(link.run_id)
        return out


def interrupted_reason(kind: str) -> str:
    return f"the process that ran the {kind} ended before the {kind} finished"


def _campaign(row: Any, links: list[StoredLink]) -> StoredCampaign:
    return StoredCampaign(id=row.id, kind=row.kind, name=row.name, profile=row.profile, status=row.status,
                          reason=row.reason, created_at=row.created_at, updated_at=row.updated_at,
                          revision=row.revision, state=dict(row.state or {}), writer_pid=row.writer_pid,
                          writer_create_time=row.writer_create_time, writer_namespace=row.writer_namespace,
                          links=links)


def _link(row: Any) -> StoredLink:
    return StoredLink(step=row.step, idx=row.idx, **{k: getattr(row, k) for k in LINK_FIELDS})


def _check_status(kind: str, status: str) -> None:
    if status not in CAMPAIGN_STATUSES:
        raise StoreError(f"unknown {kind} status '{status}' (known: {', '.join(CAMPAIGN_STATUSES)})")


def _writer() -> dict[str, Any]:
    pid, created = process_identity()
    return {"writer_pid": pid, "writer_create_time": created, "writer_namespace": pid_namespace()}


def _insert(conn: Connection, campaign_id: str, *, kind: str, name: str, profile: str, state: Mapping[str, Any],
            status: str, reason: str | None, revision: int) -> None:
    now = time.time()
    conn.execute(insert(Campaign).values(id=campaign_id, kind=kind, name=name, profile=profile, status=status,
                                         reason=None if reason is None else mask_text(reason), created_at=now,
                                         updated_at=now, revision=revision, state=mask_obj(dict(state)), **_writer()))


@guarded
def create_campaign(store: RunStore, campaign_id: str, *, kind: str, name: str, profile: str,
                    state: Mapping[str, Any], status: str = "running", revision: int = 0) -> None:
    """A new campaign owned by this process."""
    _check_status(kind, status)
    with store.engine.begin() as conn:
        if conn.execute(select(Campaign.id).where(Campaign.id == campaign_id)).first() is not None:
            raise StoreError(f"a {kind} with id {campaign_id} is already stored")
        _insert(conn, campaign_id, kind=kind, name=name, profile=profile, state=state, status=status, reason=None,
                revision=revision)


@guarded
def update_campaign(store: RunStore, campaign_id: str, *, status: str | None = None, reason: str | None = None,
                    state: Mapping[str, Any] | None = None, merge_state: Mapping[str, Any] | None = None,
                    revision: int | None = None, claim: bool = False) -> None:
    """Set the status (with its reason); replace the state, or merge keys into it. ``claim``: this
    process becomes the writer (a resumed campaign)."""
    with store.engine.begin() as conn:
        row = conn.execute(select(Campaign.kind, Campaign.state).where(Campaign.id == campaign_id)).first()
        if row is None:
            raise StoreError(f"no campaign {campaign_id}")
        values: dict[str, Any] = {"updated_at": time.time()}
        if status is not None:
            _check_status(row.kind, status)
            values["status"] = status
            values["reason"] = None if reason is None else mask_text(reason)
        if state is not None:
            values["state"] = mask_obj(dict(state))
        if merge_state is not None:
            values["state"] = mask_obj({**(row.state or {}), **dict(merge_state)})
        if revision is not None:
            values["revision"] = revision
        if claim:
            values.update(_writer())
        conn.execute(update(Campaign).where(Campaign.id == campaign_id).values(**values))


@guarded
def save_campaign(store: RunStore, campaign_id: str, *, kind: str, name: str, profile: str, status: str,
                  reason: str | None, state: Mapping[str, Any], revision: int,
                  links: Sequence[StoredLink] | None = None) -> None:
    """Write the whole campaign in one transaction: its row, created (owned by this process) the
    first time and replaced after, and, given ``links``, all its links in place of the old ones."""
    _check_status(kind, status)
    with store.engine.begin() as conn:
        if conn.execute(select(Campaign.id).where(Campaign.id == campaign_id)).first() is None:
            _insert(conn, campaign_id, kind=kind, name=name, profile=profile, state=state, status=status,
                    reason=reason, revision=revision)
        else:
            conn.execute(update(Campaign).where(Campaign.id == campaign_id).values(
                name=name, profile=profile, status=status, reason=None if reason is None else mask_text(reason),
                state=mask_obj(dict(state)), revision=revision, updated_at=time.time()))
        if links is not None:
            conn.execute(delete(CampaignRun).where(CampaignRun.campaign_id == campaign_id))
            _insert_links(conn, campaign_id, links)


def _insert_links(conn: Connection, campaign_id: str, links: Iterable[StoredLink]) -> None:
    for link in links:
        values = {k: getattr(link, k) for k in LINK_FIELDS}
        values["doc"] = mask_obj(dict(values["doc"]))
        values["reason"] = None if values["reason"] is None else mask_text(str(values["reason"]))
        conn.execute(delete(CampaignRun).where(CampaignRun.campaign_id == campaign_id,
                                               CampaignRun.step == link.step, CampaignRun.idx == link.idx))
        conn.execute(insert(CampaignRun).values(campaign_id=campaign_id, step=link.step, idx=link.idx, **values))


@guarded
def put_links(store: RunStore, campaign_id: str, links: Iterable[StoredLink]) -> None:
    """Insert or replace links (by step and ``idx``), all in one transaction."""
    with store.engine.begin() as conn:
        if conn.execute(select(Campaign.id).where(Campaign.id == campaign_id)).first() is None:
            raise StoreError(f"no campaign {campaign_id}")
        _insert_links(conn, campaign_id, links)
        conn.execute(update(Campaign).where(Campaign.id == campaign_id).values(updated_at=time.time()))


def _links(conn: Connection, ids: Sequence[str]) -> dict[str, list[StoredLink]]:
    out: dict[str, list[StoredLink]] = {}
    query = select(CampaignRun).order_by(CampaignRun.campaign_id, CampaignRun.step, CampaignRun.idx)
    for row in conn.execute(query.where(CampaignRun.campaign_id.in_(list(ids)))):
        out.setdefault(row.campaign_id, []).append(_link(row))
    return out


@guarded
def get_campaign(store: RunStore, campaign_id: str) -> StoredCampaign:
    with store.engine.connect() as conn:
        row = conn.execute(select(Campaign).where(Campaign.id == campaign_id)).first()
        if row is None:
            raise StoreError(f"no campaign {campaign_id}")
        return _campaign(row, _links(conn, [campaign_id]).get(campaign_id, []))


def writer_may_run(store: RunStore, campaign: StoredCampaign) -> bool:
    """Whether the campaign's writer may still run it. One stored before campaigns named their
    writer (a ladder that died in its first step) runs while one of its runs does."""
    if campaign.writer_pid:
        return campaign.writer_is_alive
    ids = [link.run_id for link in campaign.links if link.run_id is not None]
    with store.engine.connect() as conn:
        return conn.execute(select(Run.id).where(Run.id.in_(ids), Run.status == "running")).first() is not None


@guarded
def list_campaigns(store: RunStore, *, kind: str | None = None, mark_interrupted: bool = True) -> list[StoredCampaign]:
    """Every campaign (of ``kind``), newest first, with its links; one left ``running`` by a dead
    process is marked ``interrupted`` (once: the mark is written back)."""
    query = select(Campaign).order_by(Campaign.created_at.desc(), Campaign.id)
    if kind is not None:
        query = query.where(Campaign.kind == kind)
    with store.engine.connect() as conn:
        rows = list(conn.execute(query))
        links = _links(conn, [r.id for r in rows])
    campaigns = [_campaign(r, links.get(r.id, [])) for r in rows]
    if mark_interrupted:
        for campaign in campaigns:
            if campaign.status == "running" and not writer_may_run(store, campaign):
                campaign.status = "interrupted"
                campaign.reason = campaign.reason or interrupted_reason(campaign.kind)
                update_campaign(store, campaign.id, status=campaign.status, reason=campaign.reason)
    return campaigns


def find_campaign(store: RunStore, ref: str, *, kind: str | None = None,
                  mark_interrupted: bool = True) -> StoredCampaign:
    """A campaign (of ``kind``) by its id (a ``<kind>:`` prefix allowed; a unique start is enough)."""
    noun = kind or "campaign"
    text = ref.strip()
    prefix, _, rest = text.partition(":")
    if rest and (prefix == kind or (kind is None and prefix in CAMPAIGN_KINDS)):
        text = rest
    campaigns = list_campaigns(store, kind=kind, mark_interrupted=mark_interrupted)
    exact = [c for c in campaigns if c.id == text]
    found = exact or ([c for c in campaigns if c.id.startswith(text)] if text else [])
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise StoreError(f"{noun} '{ref}' is ambiguous: {', '.join(c.id for c in found)}")
    where = f"tunebench {kind}s lists them" if kind else "tunebench ladders and tunebench tunes list them"
    raise StoreError(f"no stored {noun} '{ref}' ({where})")


@guarded
def delete_campaign(store: RunStore, campaign_id: str) -> None:
    """The campaign and its links (its runs stay: delete them with ``tunebench runs delete``)."""
    with store.engine.begin() as conn:
        conn.execute(delete(CampaignRun).where(CampaignRun.campaign_id == campaign_id))
        if not conn.execute(delete(Campaign).where(Campaign.id == campaign_id)).rowcount:
            raise StoreError(f"no campaign {campaign_id}")


@guarded
def unstored_tagged(store: RunStore, tag_prefix: str, kind: str) -> dict[str, list[int]]:
    """Campaign ids that runs carry as ``<tag_prefix><id>`` but that have no campaign of ``kind``
    stored (its process died before it wrote one), each with its runs."""
    with store.engine.connect() as conn:
        stored = set(conn.execute(select(Campaign.id).where(Campaign.kind == kind)).scalars())
        rows = conn.execute(select(RunTag.run_id, RunTag.tag).where(RunTag.tag.startswith(tag_prefix, autoescape=True)))
        out: dict[str, list[int]] = {}
        for run_id, tag in rows:
            if tag[len(tag_prefix):] not in stored:
                out.setdefault(tag[len(tag_prefix):], []).append(run_id)
    return out
