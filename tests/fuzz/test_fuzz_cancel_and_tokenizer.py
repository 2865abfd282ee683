"""Cancel while a large workload is built, and a tokenizer the profile names that does not load.

A cancel must act at once in every phase: building 200,000 prompts once took over a minute to
notice one and then still started a level. Here the build must stop at its first ask after the
cancel and the run must end within a generous bound (a loaded 2-core machine decides the exact
seconds); benchmarks/responsiveness.py measures them against the strict figures. A ``workload.tokenizer`` that is missing
or not a tokenizer.json must refuse the run in one line naming the file, not silently count
lengths another way. Against the fake OpenAI server on 127.0.0.1 (no engine)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import app.runner as runner_module
from app.bus import Bus, Event
from app.campaign import Campaign, Step
from app.config import RunConfig
from app.errors import UserError
from app.load import datasets
from app.load.datasets import build_dataset
from app.load.tokens import ApproxTokenizer
from app.runner import Runner
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer

LARGE = WorkloadConfig(num_requests=200_000, input_len=LengthSpec(mean=128), output_len=LengthSpec(mean=8))
"""The QA run's size: generating it takes tens of seconds (more on a loaded machine)."""
CANCEL_AFTER_S = 0.3
ENDS_WITHIN_S = 10.0
"""How soon a cancelled build or run must end here: only a cancel that is ignored misses it (the
build alone takes tens of seconds). The strict figures (a build within 1 s, a run within 2 s) are
benchmarks/responsiveness.py's."""
GIVE_UP_S = 30.0
"""How long a run that ignores the cancel is waited for before the test fails."""


@pytest.fixture()
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeBehaviour()) as srv:
        yield srv


def write_sharegpt(folder: Path) -> Path:
    """A ShareGPT file large enough that reading and counting it takes seconds."""
    entries = [{"id": str(i), "conversations": [
        {"from": "human", "value": f"question {i}: " + "tell me about the river and the stone " * 8},
        {"from": "gpt", "value": "the river runs past the stone " * 6}]} for i in range(100_000)]
    path = folder / "big.json"
    path.write_text(json.dumps(entries))
    return path


@pytest.fixture(scope="module")
def sharegpt_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sharegpt(tmp_path_factory.mktemp("sharegpt"))


def large_workload(kind: str, sharegpt_file: Path) -> WorkloadConfig:
    return LARGE if kind == "random" else LARGE.model_copy(update={"kind": "sharegpt",
                                                                   "dataset_path": str(sharegpt_file)})


class CancelLater:
    """Sets ``cancel`` after ``delay_s`` (from another thread) and remembers when."""

    def __init__(self, cancel: threading.Event, delay_s: float) -> None:
        self.cancel = cancel
        self.armed = False
        self.at_s: float | None = None
        self._timer = threading.Timer(delay_s, self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.at_s = time.monotonic()
        self.cancel.set()

    def start(self) -> None:
        if not self.armed:
            self.armed = True
            self._timer.start()

    def since_s(self) -> float:
        assert self.at_s is not None, "the cancel never fired"
        return time.monotonic() - self.at_s


def cancel_a_build(workload: WorkloadConfig) -> tuple[float, int]:
    """Builds ``workload`` with a cancel CANCEL_AFTER_S in: the seconds from the cancel to the
    build's BuildCancelled, and how often the build asked after the cancel (1: at its first ask)."""
    cancel = threading.Event()
    later = CancelLater(cancel, CANCEL_AFTER_S)
    asks_after = 0

    def cancelled() -> bool:
        nonlocal asks_after
        is_set = cancel.is_set()
        asks_after += is_set
        return is_set

    later.start()
    with pytest.raises(datasets.BuildCancelled):
        build_dataset(workload, ApproxTokenizer(), cancelled=cancelled)
    return later.since_s(), asks_after


@pytest.mark.parametrize("kind", ["random", "sharegpt"])
def test_a_large_build_stops_at_its_first_ask_after_a_cancel(kind: str, sharegpt_file: Path) -> None:
    stopped_s, asks_after = cancel_a_build(large_workload(kind, sharegpt_file))
    assert asks_after == 1  # it stopped at once, and it was still building when the cancel came
    assert stopped_s < ENDS_WITHIN_S


def _arm_cancel_at_build(monkeypatch: pytest.MonkeyPatch, cancel: threading.Event,
                         server: FakeOpenAIServer) -> tuple[CancelLater, list[int]]:
    """The cancel fires CANCEL_AFTER_S into the runner's first dataset build, however long the
    attach before it took (a timer armed at ``run`` could fire before the build); with the
    completion requests the server had by then (the cache-salt probe of an attached endpoint)."""
    later = CancelLater(cancel, CANCEL_AFTER_S)
    before_build: list[int] = []
    real: Callable[..., Any] = runner_module.build_dataset

    def build(*args: Any, **kwargs: Any) -> Any:
        if not later.armed:
            before_build.append(server.requests)
            later.start()
        return real(*args, **kwargs)

    monkeypatch.setattr(runner_module, "build_dataset", build)
    return later, before_build


@dataclass
class CancelledAtBuild:
    """A run cancelled CANCEL_AFTER_S into its workload's build, and what it did."""

    ended_after_s: float | None
    """Seconds from the cancel to the run's end; None: still running ENDS_WITHIN_S after it."""
    result: Any
    kinds: list[str]
    """The kinds of the events it published."""
    requests_before_build: int
    requests_at_end: int


def cancel_a_run_at_its_build(server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> CancelledAtBuild:
    """A run of LARGE against ``server``, cancelled CANCEL_AFTER_S into its build; waited for
    ENDS_WITHIN_S after the cancel."""
    cfg = RunConfig(name="cancel at build", workload=LARGE, load=LoadConfig(concurrency=2, warmup_requests=2))
    cancel = threading.Event()
    later, before_build = _arm_cancel_at_build(monkeypatch, cancel, server)
    bus = Bus()
    sub = bus.subscribe()
    runner = Runner(cfg, bus, endpoint=server.base_url, telemetry=False)
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(runner.run(cancel)), name="cancel-at-build", daemon=True)
    thread.start()
    deadline = time.monotonic() + GIVE_UP_S
    while later.at_s is None and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert later.at_s is not None, "the run never started building its workload"
    thread.join(ENDS_WITHIN_S)
    ended_after_s = None if thread.is_alive() else later.since_s()
    return CancelledAtBuild(ended_after_s, box[0] if box else None, [e.kind for e in sub.drain() if isinstance(e, Event)],
                            before_build[0], server.requests)


def test_a_run_cancelled_while_its_workload_is_built_ends_soon_and_sends_nothing(
        server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    run = cancel_a_run_at_its_build(server, monkeypatch)
    assert run.ended_after_s is not None, f"the run still went on {ENDS_WITHIN_S:g} s after the cancel"
    result = run.result
    assert result.status == "cancelled" and "workload was built" in (result.reason or ""), result.reason
    kinds = run.kinds
    assert "level_started" not in kinds and "request" not in kinds, kinds
    assert kinds[-1] == "run_finished"
    assert run.requests_at_end == run.requests_before_build  # no warm-up, no level: not one request of the workload
    assert result.levels == []


def _garbage(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "tokenizer.json"
    path.write_text("this is not a tokenizer {")
    return path, "not a tokenizer.json that loads"


def _missing(tmp_path: Path) -> tuple[Path, str]:
    return tmp_path / "no-such" / "tokenizer.json", "no such file or folder"


def _empty_folder(tmp_path: Path) -> tuple[Path, str]:
    return tmp_path, "has no tokenizer.json"


BAD_TOKENIZERS = {"missing": _missing, "garbage": _garbage, "folder without one": _empty_folder}


def _small(tokenizer: str | None = None) -> RunConfig:
    return RunConfig(name="tokenizer", workload=WorkloadConfig(num_requests=4, input_len=LengthSpec(mean=16),
                                                               output_len=LengthSpec(mean=4), tokenizer=tokenizer),
                     load=LoadConfig(concurrency=2))


@pytest.mark.parametrize("case", sorted(BAD_TOKENIZERS))
def test_a_named_tokenizer_that_does_not_load_refuses_the_run(case: str, tmp_path: Path,
                                                              server: FakeOpenAIServer) -> None:
    path, reason = BAD_TOKENIZERS[case](tmp_path)
    bus = Bus()
    sub = bus.subscribe()
    result = Runner(_small(str(path)), bus, endpoint=server.base_url, telemetry=False).run()
    message = result.reason or ""
    assert result.status == "failed", (result.status, result.notes)
    assert "workload.tokenizer" in message and str(path) in message and reason in message, message
    assert "\n" not in message
    kinds = [e.kind for e in sub.drain() if isinstance(e, Event)]
    assert kinds == ["run_started", "run_finished"], kinds  # not attached, no level: nothing started
    assert server.requests == 0 and result.levels == []


def test_a_campaign_refuses_a_broken_named_tokenizer_before_any_run(tmp_path: Path) -> None:
    path, reason = _garbage(tmp_path)
    started: list[RunConfig] = []

    def runner_factory(config: RunConfig, *_args: Any, **_kwargs: Any) -> Any:
        started.append(config)
        raise UserError("no run should be made")

    outcome = Campaign([Step("broken", _small(str(path)), 3)], Bus(), endpoint="http://127.0.0.1:9",
                       runner_factory=runner_factory).run()
    assert outcome.status == "failed" and str(path) in (outcome.reason or "") and reason in (outcome.reason or "")
    assert started == []


def test_without_a_named_tokenizer_the_notes_say_which_counter_and_why(tmp_path: Path,
                                                                       server: FakeOpenAIServer) -> None:
    """A broken tokenizer.json in the engine's model folder still falls back, but says so."""
    (tmp_path / "tokenizer.json").write_text("[1, 2")
    cfg = _small()
    cfg.engine.model = str(tmp_path)
    result = Runner(cfg, Bus(), endpoint=server.base_url, telemetry=False).run()
    assert result.status == "completed", result.reason
    note = next((n for n in result.notes if n.startswith("prompt lengths")), "")
    assert "approximate" in note and str(tmp_path / "tokenizer.json") in note, note
    assert "not a tokenizer.json that loads" in note, note
