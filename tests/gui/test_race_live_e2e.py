"""The live race on two real engines: two llama.cpp servers on the demo GGUF (one sequence at a
time against four) run at once, each in a slot of its own (``app.race_live``), while the race view
follows both trials' events. Both trials run at the same time, each sample request's pieces
arrive before its end, both finish, and the stored race of the same two runs replays what was
shown live: the same pieces at the same times, the same tokens per side. Then the same from the
CLI with each side a trial on a Ray cluster (``race --live --cluster``)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from app.bus import Bus, Event
from app.config import RunConfig
from app.events import RunFinished, RunStarted, SampleStreamed
from app.gui.race_view import RaceView
from app.live_run import node_of
from app.profiles import load_profile, resolve_profile
from app.race import LiveRace, race_of, side_tag
from app.race_live import LiveRaceResult, run_live_race
from app.recording import RunRecorder
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig
from engine_adapters.llamacpp_runtime import ensure_gguf_demo_model
from engine_adapters.runtimes import COMPLETE_MARKER, demo_model_dir, managed_runtime
from tests.ray_cluster import LocalRayCluster, tiny_profile_text

pytestmark = [pytest.mark.e2e, pytest.mark.gui]

RUN_TIMEOUT_MS = 300_000


def _config(base: RunConfig, name: str, sequences: int) -> RunConfig:
    return base.model_copy(update={
        "name": name, "features": base.features.model_copy(update={"max_num_seqs": sequences}),
        "workload": base.workload.model_copy(update={"num_requests": 8, "output_len": LengthSpec(mean=96)}),
        "load": LoadConfig(concurrency=4, warmup_requests=0)})


def _demo_gguf() -> None:
    runtime = managed_runtime("llamacpp-cpu")
    if not runtime.is_installed() or not (demo_model_dir() / COMPLETE_MARKER).is_file():
        pytest.fail("llama.cpp runtime or demo model missing: run `make engine`")
    ensure_gguf_demo_model(str(runtime.interpreter))  # made once here, not by both sides at once


def test_two_llamacpp_trials_race_live_and_the_store_replays_the_same_race(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _demo_gguf()
    base = load_profile(resolve_profile("llamacpp-cpu-demo"))
    config_a, config_b = _config(base, "one sequence at a time", 1), _config(base, "four sequences at once", 4)
    shown = Bus().subscribe(kinds=(RunStarted, SampleStreamed, RunFinished))  # what the view drains
    heard = Bus().subscribe(kinds=(RunStarted, SampleStreamed, RunFinished))  # the same events, for the checks
    view = RaceView()
    qtbot.addWidget(view)
    view.resize(1024, 600)
    live = LiveRace(config_a.name, config_b.name)
    view.follow_live(live, shown)
    store = RunStore(tmp_path / "runs.db")
    recorder = RunRecorder(Bus(), store)
    box: dict[str, Any] = {}

    def follow(slot_bus: Bus) -> None:
        slot_bus.attach(shown)
        slot_bus.attach(heard)

    def work() -> None:
        try:
            box["result"] = run_live_race(config_a, config_b, follow, recorder=recorder, telemetry=False)
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=work, name="live-race")
    worker.start()
    try:
        qtbot.waitUntil(lambda: not worker.is_alive(), timeout=RUN_TIMEOUT_MS)  # the GUI thread stays free
    finally:
        worker.join()
        recorder.close()
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert isinstance(result, LiveRaceResult) and result.completed, result.reasons()
    qtbot.waitUntil(lambda: view.finished, timeout=10_000)  # the view drained the last events

    events = [item.payload for item in heard.drain() if isinstance(item, Event)]
    started = {p.run_id: k for k, p in enumerate(events) if isinstance(p, RunStarted)}
    finished = {p.run_id: k for k, p in enumerate(events) if isinstance(p, RunFinished)}
    assert len(started) == 2 and all(s < min(finished.values()) for s in started.values())  # both live at once
    names = {p.run_id: p.name for p in events if isinstance(p, RunStarted)}
    for run_id in started:
        streamed = [p for p in events if isinstance(p, SampleStreamed) and p.run_id == run_id and p.level == 0]
        end = next(k for k, p in enumerate(streamed) if p.ended)
        assert sum(len(p.part["tokens"]) for p in streamed[:end]) > 0, names[run_id]  # pieces before the end

    race = view.race
    assert race is not None and race.live and race.ended and view.live is live
    assert "Live" in race.title() and not race.a.failed and not race.b.failed
    tokens = live.tokens()
    assert tokens["A"] > 1 and tokens["B"] > 1
    id_a, id_b = result.stored_ids
    assert id_a is not None and id_b is not None
    with store:
        stored = race_of(store, id_a, id_b)
    assert stored.a.total_tokens == tokens["A"] and stored.b.total_tokens == tokens["B"]
    for shown_side, stored_side in ((race.a, stored.a), (race.b, stored.b)):
        assert (shown_side.pieces, shown_side.t_ms, shown_side.tokens) == \
            (stored_side.pieces, stored_side.t_ms, stored_side.tokens)  # the same schedule, to the microsecond
    assert stored.schedule() == race.schedule()


def test_race_live_on_a_cluster_runs_each_side_as_a_trial_and_stores_the_race(ray_cluster: LocalRayCluster,
                                                                               tmp_path: Path) -> None:
    _demo_gguf()
    profiles = []
    for name, sequences in (("alone", 1), ("four at once", 4)):
        path = tmp_path / f"{sequences}.toml"
        # paced (8 s a side): the sides' trials start on two nodes with no barrier between them, and
        # an unpaced side of the tiny model can end before a loaded machine has started the other
        path.write_text(tiny_profile_text(requests=8, warmup_requests=0, rate_rps=1.0)
                        .replace('name = "fleet tiny"', f'name = "{name}"')
                        .replace("max_num_seqs = 4", f"max_num_seqs = {sequences}"))
        profiles.append(str(path))
    db = tmp_path / "runs.db"
    done = subprocess.run([sys.executable, "-m", "app.cli", "race", "--live", *profiles, "--cluster",
                           ray_cluster.address, "--parallel", "2", "--no-telemetry", "--db", str(db)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_MS / 1e3, check=False,
                          env=ray_cluster.env())
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for key, name in (("A", "alone"), ("B", "four at once")):  # its pieces came back from its node before its end
        assert lines.index(f"{key} '{name}': sample request streaming") < lines.index(f"{key} '{name}': sample request ended")
    stored_line = next(line for line in lines if line.startswith("stored as runs "))
    id_a, id_b = (int(word) for word in stored_line.split()[3:6:2])
    with RunStore(db) as store:
        runs = [store.get_run(i) for i in (id_a, id_b)]
        race = race_of(store, id_a, id_b)
    assert side_tag("A") in runs[0].tags and side_tag("B") in runs[1].tags
    assert len({node_of(r.tags) for r in runs} - {None}) == 2  # a trial on each node
    assert all(r.started_at < min(o.finished_at or 0 for o in runs) for r in runs)  # at the same time
    assert race.a.total_tokens > 1 and race.b.total_tokens > 1 and lines[-1] == race.verdict()
