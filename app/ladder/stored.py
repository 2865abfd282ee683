"""Ladders read back from the run store: listed (History's view of them), opened whole (Compare,
the report), and marked ``interrupted`` when the process that ran one died.

A ladder has no table of its own: its runs share the tag ``ladder:<id>`` and each keeps the
ladder's latest state in its summary (``app.ladder.run``). The copy with the highest revision is
current; runs the state does not know yet (the step that was running when the process died) are
added from their tags (``repeat:<id>-<step>``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from app.analysis.compare import REPEAT_TAG
from app.errors import UserError
from app.ladder.state import SUMMARY_KEY, TAG, LadderState, StepRow, compute_factors
from app.store import RunDetail, RunStore, StoreError
from db.writes import writer_may_be_alive

MAX_LISTED_RUNS = 20_000


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


def _latest_state(runs: list[RunDetail]) -> LadderState | None:
    best: LadderState | None = None
    for run in runs:
        doc = run.summary.get(SUMMARY_KEY) if isinstance(run.summary, dict) else None
        if not isinstance(doc, dict):
            continue
        try:
            state = LadderState.model_validate(doc)
        except ValidationError:
            continue
        if best is None or state.revision > best.revision:
            best = state
    return best


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


def _assemble(ladder_id: str, runs: list[RunDetail]) -> tuple[LadderState, bool]:
    """(the ladder's state, whether it was just found interrupted)."""
    runs = sorted(runs, key=lambda r: (r.started_at, r.id))
    state = _latest_state(runs)
    if state is None:  # died during its first step: only the run and its tags are known
        first = runs[0]
        state = LadderState(ladder_id=ladder_id, name=first.name.split(" [", 1)[0], started_wall_s=first.started_at,
                            model=first.model, engine_version=first.engine_version, hardware=first.hardware or {})
    for run in runs:
        index = _step_index(run, ladder_id)
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
    if state.status == "running":
        places = {r.writer_namespace for r in runs}  # its writer recorded them: where its pid means something
        alive = writer_may_be_alive(state.writer_pid, state.writer_create_time, places.pop() if len(places) == 1 else "") \
            if state.writer_pid else any(r.status == "running" for r in runs)
        if not alive:
            found = True
            state.status = "interrupted"
            state.reason = state.reason or "the process that ran the ladder ended before the ladder finished"
            state.ended_wall_s = max((r.finished_at or r.started_at) for r in runs)
            for row in state.rows:
                if row.status == "running":
                    row.status, row.reason = "interrupted", row.reason or "interrupted"
                elif row.status == "pending":
                    row.reason = row.reason or "not run: the ladder was interrupted"
    compute_factors(state.rows)
    return state, found


def _persist(store: RunStore, state: LadderState, runs: list[RunDetail]) -> None:
    """Write a state found interrupted back into the runs, so it is marked once."""
    state.revision += 1
    doc = {SUMMARY_KEY: state.model_dump(mode="json")}
    for run in runs:
        store.update_run(run.id, summary=doc)


def list_ladders(store: RunStore, *, mark_interrupted: bool = True) -> list[StoredLadder]:
    """Every stored ladder, newest first; one whose process died is marked interrupted."""
    groups: dict[str, list[int]] = {}
    for info in store.list_runs(limit=MAX_LISTED_RUNS):
        lid = ladder_tag(info.tags)
        if lid is not None:
            groups.setdefault(lid, []).append(info.id)
    out = []
    for lid, ids in groups.items():
        runs = []
        for run_id in ids:
            try:
                runs.append(store.get_run(run_id))
            except StoreError:  # deleted meanwhile
                continue
        if not runs:
            continue
        state, found = _assemble(lid, runs)
        if found and mark_interrupted:
            _persist(store, state, runs)
        out.append(StoredLadder(state, sorted(runs, key=lambda r: (r.started_at, r.id))))
    out.sort(key=lambda s: s.state.started_wall_s, reverse=True)
    return out


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
