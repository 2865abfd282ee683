"""The race from real runs: two runs of the demo engine (one request at a time, then four), each
recorded into an SQLite file and a PostgreSQL database at once. Each level keeps one request as
it streamed; the replay shows every piece of it at its stored time, a run raced against itself
ties, the export has a frame per twentieth of a second, and the workbench races them under a
real X server (Xvfb) at a projector's 1024x768."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.config import RunConfig
from app.race import FPS, race_of
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.launcher import EngineProcess
from tests.fuzz.hostile import cli
from tests.pg_server import PgServer
from tests.stored_runs import record_run
from tests.xvfb import xvfb

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = WorkloadConfig(kind="random", num_requests=4, input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=128))
PROJECTOR = (1024, 768)
XVFB_RUN_TIMEOUT_S = 300


@dataclass
class Raced:
    file: str
    url: str
    alone: int
    """Run ids (the same in both stores: recorded in the same order) of one request at a time..."""
    crowded: int
    """...and of four at a time."""


def _record(stores: list[RunStore], engine: EngineProcess, name: str, concurrency: int) -> list[int]:
    config = RunConfig(name=name, engine=engine.engine, features=engine.features, workload=WORKLOAD,
                       load=LoadConfig(concurrency=concurrency, warmup_requests=0))
    return record_run(stores, engine, config, telemetry=False)


@pytest.fixture(scope="module")
def raced(demo_engine: EngineProcess, pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Raced:
    file, url = str(tmp_path_factory.mktemp("race") / "runs.db"), pg_server.create_database()
    with RunStore(file) as sqlite_store, RunStore(url) as pg_store:
        stores = [sqlite_store, pg_store]
        alone = _record(stores, demo_engine, "one at a time", 1)
        crowded = _record(stores, demo_engine, "four at a time", 4)  # the sample shares the engine with 3
    assert alone[0] == alone[1] and crowded[0] == crowded[1]
    return Raced(file, url, alone[0], crowded[0])


def _stored_sample(store: RunStore, run_id: int) -> dict[str, list[float]]:
    sample = store.get_run(run_id).levels[0].sample
    assert sample is not None
    return sample


def test_the_replay_shows_every_token_at_its_stored_time(raced: Raced) -> None:
    races = []
    for where in (raced.file, raced.url):
        with RunStore(where) as store:
            race = race_of(store, raced.alone, raced.crowded)
            for side in (race.a, race.b):
                sample = _stored_sample(store, side.run_id)
                # The sample is the stored request itself: its TTFT, end and tokens are its record's.
                requests = store.requests(side.run_id)
                row = int(np.argmin(np.abs(requests.start_wall - sample["start_wall_s"])))
                assert abs(requests.start_wall[row] - sample["start_wall_s"]) < 1e-3
                assert abs(side.first_ms - requests.ttft_ms[row]) <= 1.0
                assert abs(side.finish_ms - requests.e2e_ms[row]) <= 1.0
                assert side.total_tokens == requests.output_tokens[row] > 1
        races.append(race)
        schedule = race.schedule()
        assert len(schedule) == len(race.a.t_ms) + len(race.b.t_ms)
        stored = {"A": race.a, "B": race.b}
        for t_ms, key, i in schedule:
            side = stored[key]
            assert abs(t_ms - side.t_ms[i]) <= 1.0
            assert side.arrived(t_ms - 1.0) <= i < side.arrived(t_ms)  # shown at its time, not 1 ms before
            state = side.state_at(t_ms)
            assert state.tokens >= sum(side.tokens[:i + 1]) and state.text.startswith("".join(side.pieces[:i + 1]))
    assert [replace(s, run_id=0) for s in (races[0].a, races[0].b)] == \
        [replace(s, run_id=0) for s in (races[1].a, races[1].b)]  # PostgreSQL gives the same race


def test_a_run_against_itself_ties_and_exports_a_frame_per_twentieth(raced: Raced, tmp_path: Path) -> None:
    with RunStore(raced.file) as store:
        race = race_of(store, raced.alone, raced.alone)
    assert race.winner == "tie" and race.verdict().startswith("Tie")
    said = cli("race", str(raced.alone), str(raced.alone), "--db", raced.url)
    assert said.code == 0 and said.out.strip().splitlines()[-1].startswith("Tie"), said.err
    gif = tmp_path / "race.gif"
    exported = cli("race", str(raced.alone), str(raced.crowded), "--db", raced.file, "--export", str(gif))
    assert exported.code == 0, exported.err
    with RunStore(raced.file) as store:
        duration_s = race_of(store, raced.alone, raced.crowded).duration_ms / 1e3
    with Image.open(gif) as image:
        assert image.n_frames == math.ceil(duration_s * FPS)
        total_ms = 0
        for k in range(image.n_frames):
            image.seek(k)
            total_ms += image.info["duration"]
    assert abs(total_ms / 1e3 - duration_s) <= 1 / FPS
    png = tmp_path / "race.png"
    assert cli("race", str(raced.alone), str(raced.crowded), "--db", raced.file, "--export", str(png)).code == 0
    assert Image.open(png).size == (1024, 576)


def test_an_mp4_without_pyav_says_what_to_install(raced: Raced, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # as where the optional extra is not installed
    said = cli("race", str(raced.alone), str(raced.crowded), "--db", raced.file, "--export", str(tmp_path / "r.mp4"))
    assert said.code != 0 and len(said.err.strip().splitlines()) == 1 and "PyAV" in said.err, said.err


def test_the_workbench_races_under_a_real_x_server(raced: Raced, tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path_factory.mktemp("race-screens")
    with xvfb(*PROJECTOR) as display:
        env = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb", "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        done = subprocess.run([sys.executable, "-m", "tests.e2e.race_screens", raced.file, str(out), str(raced.alone),
                               str(raced.crowded)], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=XVFB_RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["platform"] == "xcb" and seen["presenting"] and seen["race_page"] == "race"
    assert seen["window"] == list(PROJECTOR)  # full screen on the projector
    assert "finished first" in seen["verdict"] or seen["verdict"].startswith("Tie")
    print(f"\nscreenshots under Xvfb: {out}")
    for name in seen["shots"]:
        with Image.open(out / name) as shot:
            assert shot.size == PROJECTOR
            assert len(shot.convert("RGB").getcolors(1 << 20) or ()) > 50, f"{name} is (nearly) blank"

