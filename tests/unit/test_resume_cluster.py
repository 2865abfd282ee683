"""A ladder that ran on a cluster keeps its cluster options in its stored state, and ``tunebench
resume`` goes on there (``--cluster`` and the others given to it replace them, ``--no-cluster``
stays here); a ladder stored before ladders kept them still opens. The tune's side is in
tests/unit/test_tune.py (``test_resume_goes_on_with_the_cluster_options_the_tune_ran_with``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.bus import Bus
from app.campaign_state import ClusterOptions
from app.cli import main
from app.config import RunConfig
from app.errors import UserError
from app.ladder.run import Ladder
from app.ladder.state import StepRow
from app.ladder.stored import list_ladders, save_ladder
from app.profiles import load_profile, resolve_profile
from app.store import RunStore
from db import campaign_store

RAN_ON = ClusterOptions(address="head:6379", parallel=2, skip_bad_nodes=True, trial_resources=["pool=1"])


class _NoCluster:
    """``open_fleet`` of the ladder command: notes the cluster options it was given, then stops."""

    def __init__(self) -> None:
        self.asked: list[tuple[str | None, int | None, bool, list[str]]] = []

    def __call__(self, args: Any, config: RunConfig) -> Any:
        self.asked.append((args.cluster, args.parallel, args.skip_bad_nodes, list(args.trial_resource)))
        raise UserError("no cluster in this test")


def _stored_ladder(db: Path) -> str:
    """A cancelled ladder of the shipped cpu-ladder profile that ran with :data:`RAN_ON`."""
    ladder = Ladder(load_profile(resolve_profile("cpu-ladder")), Bus(), profile="cpu-ladder", ladder_id="c1a55e7")
    ladder.cluster = RAN_ON
    state = ladder._new_state()
    state.status = "cancelled"
    state.rows = [StepRow(index=0, name="baseline", status="cancelled")]
    with RunStore(db) as store:
        save_ladder(store, state)
    return state.ladder_id


def test_a_ladder_keeps_its_cluster_and_resume_goes_on_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"
    ladder_id = _stored_ladder(db)
    with RunStore(db) as store:
        (found,) = list_ladders(store)
    assert found.state.cluster == RAN_ON
    cluster = _NoCluster()
    monkeypatch.setattr("app.cli.ladder_cmds.open_fleet", cluster)
    for extra in ([], ["--cluster", "other", "--parallel", "3"], ["--no-cluster"]):
        assert main(["resume", ladder_id, "--db", str(db), *extra]) == 2
        assert "no cluster in this test" in capsys.readouterr().err
    assert cluster.asked == [("head:6379", 2, True, ["pool=1"]), ("other", 3, True, ["pool=1"]),
                             (None, None, False, [])]


def test_a_ladder_stored_before_ladders_kept_their_cluster_still_opens(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    ladder_id = _stored_ladder(db)
    with RunStore(db) as store:
        with store.engine.begin() as conn:  # the state as an older tunebench wrote it: no cluster
            stored = campaign_store.find_campaign(store, ladder_id)
            state = {k: v for k, v in stored.state.items() if k != "cluster"}
            conn.exec_driver_sql("UPDATE campaigns SET state = ? WHERE id = ?",
                                 (json.dumps(state), ladder_id))
        (found,) = list_ladders(store)
    assert found.state.ladder_id == ladder_id and found.state.cluster is None
