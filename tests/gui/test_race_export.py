"""The race and the staircase without a real engine: a store recorded before samples were kept
(``tests/data/store-before-campaigns.db``, a real ladder's runs) still opens, its runs say in one
line that they cannot race, and its ladder's staircase exports as an animation of a frame per
twentieth of a second and as a PNG. A sample's secrets are masked as everywhere else."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from PIL import Image

from app.export.animation import gif_frame_cs
from app.gui.staircase_export import STEP_S
from app.ladder.stored import list_ladders
from app.load.client import stream_sample
from app.load.metrics import RequestRecord
from app.race import FPS
from app.store import RunStore
from engine_adapters.secrets import MASK
from tests.fuzz.hostile import cli

pytestmark = pytest.mark.gui

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    path = tmp_path / "runs.db"
    shutil.copyfile(DATA / "store-before-campaigns.db", path)
    return path


def test_runs_stored_before_samples_say_in_one_line_that_they_cannot_race(old_store: Path) -> None:
    outcome = cli("race", "1", "2", "--db", str(old_store), "--export", str(old_store.parent / "race.gif"))
    assert outcome.code != 0 and outcome.out == ""
    lines = outcome.err.strip().splitlines()
    assert len(lines) == 1 and "no sample request stored" in lines[0] and "run 1" in lines[0], outcome.err
    assert not (old_store.parent / "race.gif").exists()


def test_a_stored_ladders_staircase_exports_as_an_animation_and_a_png(old_store: Path, qapp) -> None:  # type: ignore[no-untyped-def]
    with RunStore(str(old_store)) as store:
        ladder = list_ladders(store)[0].state
    ladder_id, steps = ladder.ladder_id, len(ladder.rows)
    gif, png = old_store.parent / "stairs.gif", old_store.parent / "stairs.png"
    for path in (gif, png):
        outcome = cli("staircase", ladder_id, "--db", str(old_store), "--export", str(path))
        assert outcome.code == 0, outcome.err
    with Image.open(gif) as image:
        assert image.n_frames == math.ceil(steps * STEP_S * FPS)
        durations = []
        for k in range(image.n_frames):
            image.seek(k)
            durations.append(image.info["duration"])
        assert set(durations) == {gif_frame_cs(FPS) * 10}  # ms, as Pillow reads a GIF's hundredths
    with Image.open(png) as still:
        assert still.size == (1024, 576) and len(still.convert("RGB").getcolors(1 << 20) or ()) > 10


def test_a_samples_secrets_are_masked_and_its_pieces_keep_their_times() -> None:
    key = "sk-test-0123456789abcdefghij"
    marks = [(10.0, "The ", 1), (20.0, "header is Authorization: ", 1), (30.0, f"Bearer {key[:10]}", 1),
             (40.0, f"{key[10:]} ok", 1)]
    rec = RequestRecord.model_construct(output_tokens=4, ttft_ms=10.0, e2e_ms=40.0, start_wall_s=1.0)
    sample = stream_sample(f"my api_key={key} please", marks, rec)
    assert key not in sample["prompt"] and MASK in sample["prompt"]
    whole = "".join(sample["text"])
    assert key[:10] not in whole and key[10:] not in whole and MASK in whole
    assert sample["t_ms"] == [10.0, 20.0, 30.0, 40.0] and sample["tokens"] == [1, 1, 1, 1]
    assert len(sample["text"]) == 4
