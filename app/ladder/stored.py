"""Ladders in the run store: written as campaigns (``db.campaign_store``, kind ``ladder``: the
staircase as the campaign's state, each step's runs as its links), listed (History's view of
them), opened whole (Compare, the report), and marked ``interrupted`` when the process that ran
one died.

A run the ladder had not linked yet (the step that was running when the process died) is found
by its tags (``ladder:<id>``, ``repeat:<id>-<step>``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from app.analysis.compare import REPEAT_TAG
from app.errors import UserError
from app.ladder.state import KEPT_STEPS, TAG, LadderState, StepRow, compute_factors
from app.store import RunDetail, RunStore, StoreError
from db import campaign_store
from db.campaign_store import StoredCampaign, StoredLink

KIND = "ladder"
REPLACED, REPLACED_STEP = "replaced", -1
"""The role and step of a link to a run a resume replaced (``LadderState.replaced_run_ids``)."""
COLUMN_FIELDS = frozenset({"ladder_id", "name", "profile", "status", "reason", "revision", "writer_pid",
                           "writer_create_time"})
"""A ladder state's fields that are the campaign row's own columns."""


@dataclass
class StoredLadder:
    state: LadderState
    runs: list[RunDetail]

    @property
    def ladder_id(self) -> str:
        return self.state.ladder_id

    @property
    def run_ids(self) -> list[int]:
        """The ladder's runs, step by step (what Compare opens as a whole, the first as baseline)."""
        known = self.state.run_ids
        return known + [r.id for r in self.runs if r.id not in known]


def ladder_tag(tags: list[str]) -> str | None:
    """The ladder id a run belongs to, or None."""
    return next((t[len(TAG):] for t in tags if t.startswith(TAG)), None)


def _step_index(run: RunDetail, ladder_id: str) -> int | None:
    prefix = f"{REPEAT_TAG}{ladder_id}-"
    for tag in run.tags:
        if tag.startswith(prefix) and tag[len(prefix):].isdigit():
            return int(tag[len(prefix):])
    return None


def save_ladder(store: RunStore, state: LadderState) -> None:
    """The ladder's state and its runs, step by step, in one transaction (the run ids live in the
    links only, so a copy into another store maps them)."""
    doc = state.model_dump(mode="json", exclude=set(COLUMN_FIELDS) | {"replaced_run_ids"})
    for row in doc["rows"]:
        row.pop("run_ids", None)
    links = [StoredLink(step=row.index, idx=i, run_id=run_id, status=row.status)
             for row in state.rows for i, run_id in enumerate(row.run_ids)]
    links += [StoredLink(step=REPLACED_STEP, idx=i, run_id=run_id, status="replaced", role=REPLACED)
              for i, run_id in enumerate(state.replaced_run_ids)]
    campaign_store.save_campaign(store, state.ladder_id, kind=KIND, name=state.name, profile=state.profile,
                                 status=state.status, reason=state.reason, state=doc, revision=state.revision,
                                 links=links)


def _state_of(campaign: StoredCampaign) -> LadderState:
    by_step = campaign.run_ids_by_step()
    replaced = by_step.pop(REPLACED_STEP, [])
    rows = [{**row, "run_ids": by_step.get(int(row["index"]), [])} for row in campaign.state.get("rows") or []]
    try:
        return LadderState.model_validate({
            **campaign.state, "ladder_id": campaign.id, "name": campaign.name, "profile": campaign.profile,
            "status": campaign.status, "reason": campaign.reason, "revision": campaign.revision,
            "writer_pid": campaign.writer_pid, "writer_create_time": campaign.writer_create_time, "rows": rows,
            "replaced_run_ids": replaced})
    except ValidationError as exc:
        raise UserError(f"ladder {campaign.id}: its stored state is not readable by this version: "
                        f"{exc.errors()[0]['msg']}") from None


def _row_from_run(row: StepRow, run: RunDetail) -> None:
    """A step the state did not see end (the process died first): what its run says."""
    if run.status == "running":
        row.status = "running"
    elif run.status == "completed":
        row.status = "completed"
        figures = {k: float(v) for k, v in run.metrics.items() if isinstance(v, int | float)}
        row.output_tok_per_s = figures.get("output_tok_per_s")
        row.total_tok_per_s = figures.get("total_tok_per_s")
        row.ttft_ms, row.itl_ms = figures.get("ttft_ms_p50"), figures.get("itl_ms_p50")
    else:
        row.status = "interrupted" if run.status == "interrupted" else \
            "cancelled" if run.status == "cancelled" else "failed"
        row.reason = row.reason or run.reason


def _unstored(store: RunStore, ladder_id: str, run_ids: list[int]) -> StoredCampaign:
    """A ladder whose process died in its first step, before it stored itself: known from the
    first of its runs and their tags."""
    infos = sorted((i for i in store.list_runs(tag=f"{TAG}{ladder_id}") if i.id in run_ids),
                   key=lambda i: (i.started_at, i.id))
    first = store.get_run(infos[0].id) if infos else None
    state = {} if first is None else {"started_wall_s": first.started_at, "model": first.model,
                                      "engine_version": first.engine_version, "hardware": first.hardware or {}}
    return StoredCampaign(id=ladder_id, kind=KIND, name="" if first is None else first.name.split(" [", 1)[0],
                          profile="", status="running", reason=None, created_at=0.0, updated_at=0.0, revision=0,
                          state=state)


def _runs_of(store: RunStore, campaign: StoredCampaign) -> list[RunDetail]:
    """The ladder's runs: linked, or tagged with it (one running when its process died)."""
    ids = {link.run_id for link in campaign.links if link.run_id is not None and link.role != REPLACED}
    replaced = {link.run_id for link in campaign.links if link.role == REPLACED}
    ids |= {info.id for info in store.list_runs(tag=f"{TAG}{campaign.id}") if info.id not in replaced}
    runs = []
    for run_id in ids:
        try:
            runs.append(store.get_run(run_id))
        except StoreError:  # deleted meanwhile
            continue
    return sorted(runs, key=lambda r: (r.started_at, r.id))


def _assemble(campaign: StoredCampaign, runs: list[RunDetail]) -> tuple[LadderState, bool]:
    """(the ladder's state, whether it was just found interrupted and needs writing back)."""
    state = _state_of(campaign)
    for run in runs:
        index = _step_index(run, campaign.id)
        if index is None:
            continue
        while len(state.rows) <= index:
            state.rows.append(StepRow(index=len(state.rows), name=f"step {len(state.rows) + 1}"))
        row = state.rows[index]
        if run.id not in row.run_ids:
            row.run_ids.append(run.id)
            if row.name.startswith("step ") and "] " in run.name:
                row.name = run.name.split("] ", 1)[1]
            if row.status in ("pending", "running"):
                _row_from_run(row, run)
    found = False
    if state.status == "interrupted" and (state.ended_wall_s is None or any(r.status == "running" for r in state.rows)):
        found = True
        ends = [(r.finished_at or r.started_at) for r in runs]
        state.ended_wall_s = state.ended_wall_s or (max(ends) if ends else campaign.updated_at)
        for row in state.rows:
            if row.status == "running":
                row.status, row.reason = "interrupted", row.reason or "interrupted"
            elif row.status == "pending":
                row.reason = row.reason or "not run: the ladder was interrupted"
    compute_factors(state.rows)
    return state, found


def list_ladders(store: RunStore, *, mark_interrupted: bool = True) -> list[StoredLadder]:
    """Every stored ladder, newest first; one whose process died is marked interrupted."""
    out = []
    campaigns = campaign_store.list_campaigns(store, kind=KIND, mark_interrupted=mark_interrupted)
    campaigns += [_unstored(store, lid, ids) for lid, ids in campaign_store.unstored_tagged(store, TAG, KIND).items()]
    for campaign in campaigns:
        runs = _runs_of(store, campaign)
        if not runs and not campaign.links and not campaign.state:
            continue  # its runs were deleted meanwhile
        if campaign.status == "running" and not (campaign_store.writer_may_run(store, campaign) if campaign.writer_pid
                                                 else any(r.status == "running" for r in runs)):
            campaign.status, campaign.reason = "interrupted", campaign.reason or campaign_store.interrupted_reason(KIND)
        state, found = _assemble(campaign, runs)
        if found and mark_interrupted:
            state.revision += 1
            save_ladder(store, state)
        out.append(StoredLadder(state, runs))
    out.sort(key=lambda s: s.state.started_wall_s, reverse=True)
    return out


def claim_ladder(store: RunStore, ladder_id: str) -> None:
    """This process goes on with the stored ladder (a resume): it becomes its writer."""
    campaign_store.update_campaign(store, ladder_id, status="running", claim=True)


RESUMABLE = ("interrupted", "cancelled", "failed", "completed")
"""Statuses of a ladder that may have steps left to run (a completed one may hold a failed step)."""


def resumable_ladder(store: RunStore, ref: str | None, profile: str) -> LadderState:
    """The ladder to resume: ``ref`` (an id or a run id), or the newest ladder of ``profile`` with a
    step left unfinished."""
    if ref:
        return load_ladder(store, ref).state
    found = [s.state for s in list_ladders(store) if s.state.profile == profile and s.state.status in RESUMABLE
             and any(r.status not in KEPT_STEPS for r in s.state.rows)]
    if not found:
        raise UserError(f"no unfinished ladder of profile '{profile}' to resume (tunebench ladders lists the ladders)")
    return found[0]


def load_ladder(store: RunStore, ref: str | int, *, mark_interrupted: bool = True) -> StoredLadder:
    """A stored ladder by its id (``ladder:`` prefix allowed, a unique start is enough) or by one
    of its runs (a run id)."""
    text = str(ref).strip()
    if text.startswith(TAG):
        text = text[len(TAG):]
    ladders = list_ladders(store, mark_interrupted=mark_interrupted)
    if text.isdigit():
        by_run = [s for s in ladders if int(text) in s.run_ids]
        if by_run:
            return by_run[0]
    found = [s for s in ladders if s.ladder_id.startswith(text)] if text else []
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise UserError(f"ladder '{ref}' is ambiguous: {', '.join(s.ladder_id for s in found)}")
    raise UserError(f"no stored ladder '{ref}' (tunebench ladders lists them)")
