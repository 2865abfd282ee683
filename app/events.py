"""What travels on the bus (:mod:`app.bus`): samples and typed events, each kind defined once here.

Producers construct these types and consumers read their attributes, so a renamed or retyped
field is a mypy error in every place that uses it, not a silent ``.get()`` returning None.

Order of one run (``app.runner``): :class:`RunStarted`, then :class:`PhaseChanged` /
:class:`LogLine` while the engine starts (held back until ``RunStarted`` went out),
:class:`EngineReady`, per level :class:`LevelStarted`, :class:`RequestDone` per request and
:class:`Progress` about twice a second, :class:`SampleStreamed` while the level's sample request
streams (about ten a second, the last one at its end), :class:`LevelFinished`; :class:`QualityMeasured` when the
run has a quality probe; finally :class:`RunFinished`.
The telemetry collector adds :class:`Sample` s (sources ``gpu<i>``, ``host``, ``engine``),
one :class:`TelemetrySupport` per source and :class:`Notice` s. Client-side live figures are
the :class:`Progress` event only; consumers that plot them (the GUI, the store) read them as
the ``client`` series through :meth:`Progress.sample`.

The store keeps events as JSON (``model_dump(mode="json")``): the field names below are also
the stored payload's keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SerializeAsAny, field_validator

from app.campaign_state import CampaignStateBase
from app.config import RunConfig
from app.load.metrics import LevelSummary, RequestRecord
from engine_adapters.base import FeatureCheck, Phase
from engine_adapters.secrets import mask_argv, mask_env, mask_obj, mask_text, mask_url

RunStatus = Literal["completed", "failed", "cancelled", "interrupted"]
CLIENT_SOURCE = "client"
"""The sample source under which client-side progress is plotted and stored."""


def _masked(mask: Callable[[str], str]) -> BeforeValidator:
    """Mask a string where it enters the bus, so the GUI, the CLI and the store only see it masked;
    any other value is left to the field's own type check."""
    return BeforeValidator(lambda value: mask(value) if isinstance(value, str) else value)


MaskedText = Annotated[str, _masked(mask_text)]
"""Free text that may quote a secret (a log line, a reason, an error)."""
MaskedUrl = Annotated[str, _masked(mask_url)]
"""A URL whose credentials and secret query values are masked."""


def now() -> tuple[float, float]:
    """(monotonic, wall) clock pair: monotonic orders and spaces samples, wall dates them."""
    return time.monotonic(), time.time()


@dataclass(frozen=True, slots=True)
class Sample:
    """Values one sampler read at one instant. Names carry units: ``memory_used_bytes``,
    ``gpu_util_pct``, ``generation_tok_per_s``. ``source`` is e.g. ``gpu0``, ``host``, ``engine``,
    ``client``."""

    source: str
    t_mono: float
    t_wall: float
    values: Mapping[str, float]


class EventPayload(BaseModel):
    """Base of every event kind; ``kind`` is its name on the bus and in the store."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        """The payload as the store keeps it."""
        return self.model_dump(mode="json")


class RunStarted(EventPayload):
    """A run began: what it runs and where. Secrets (``engine_adapters.secrets``) are masked when
    it is built: in ``config``, ``argv``, ``env`` and ``endpoint``."""

    kind: ClassVar[str] = "run_started"
    run_id: str
    name: str
    tags: list[str] = Field(default_factory=list)
    config: RunConfig
    engine_kind: str
    model: str
    argv: list[str] | None = None  # None when attached to an endpoint
    env: dict[str, str] = Field(default_factory=dict)
    engine_version: str | None = None
    hardware: dict[str, Any] = Field(default_factory=dict)  # HardwareInfo as JSON
    endpoint: MaskedUrl | None = None
    engine_pid: int | None = None
    started_wall_s: float

    @field_validator("config", mode="before")
    @classmethod
    def _mask_config(cls, value: Any) -> Any:
        """Secrets never travel on the bus: env values, ``--api-key`` in extra_args, URLs."""
        return mask_obj(value.model_dump(mode="json") if isinstance(value, BaseModel) else value)

    @field_validator("argv", mode="before")
    @classmethod
    def _mask_argv(cls, value: Any) -> Any:
        return mask_argv(value) if isinstance(value, list | tuple) else value

    @field_validator("env", mode="before")
    @classmethod
    def _mask_env(cls, value: Any) -> Any:
        return mask_env(value) if isinstance(value, Mapping) else value


class PhaseChanged(EventPayload):
    """The engine entered a startup (or stop) phase. ``run_id`` is None for an engine the GUI
    keeps warm between runs."""

    kind: ClassVar[str] = "phase"
    run_id: str | None = None
    phase: Phase
    detail: MaskedText = ""


NOTE_PREFIX = "tunebench: "
"""How a note of tunebench's about a run reads in the run's log, among the engine's own lines."""


class LogLine(EventPayload):
    """One line of the engine's output, or a note of tunebench's about the run (:meth:`note`)."""

    kind: ClassVar[str] = "log"
    run_id: str | None = None
    line: MaskedText
    """Masked where it enters the bus: the GUI, the CLI and the store see it masked."""

    @classmethod
    def note(cls, text: str, run_id: str | None = None) -> LogLine:
        return cls(run_id=run_id, line=NOTE_PREFIX + text)


class EngineReady(EventPayload):
    """The engine answers; startup time, KV-cache capacity and whether each requested feature
    really took effect. ``startup_s`` is None when attached to a running endpoint."""

    kind: ClassVar[str] = "engine_ready"
    run_id: str
    base_url: MaskedUrl
    startup_s: float | None = None
    kv_cache: dict[str, float] = Field(default_factory=dict)
    feature_checks: list[FeatureCheck] = Field(default_factory=list)


class LevelStarted(EventPayload):
    """A load level began (closed loop at ``concurrency``, or open loop at ``rate_rps``)."""

    kind: ClassVar[str] = "level_started"
    run_id: str
    index: int
    label: str
    mode: str
    concurrency: int | None = None
    rate_rps: float | None = None
    arrival: str | None = None  # open loop only
    burstiness: float | None = None  # open loop only
    started_wall_s: float
    num_requests: int | None = None


class RequestDone(EventPayload):
    """One request finished (or failed): the client's record of it."""

    kind: ClassVar[str] = "request"
    run_id: str
    record: RequestRecord


REQUEST_FIELDS: tuple[str, ...] = tuple(RequestRecord.model_fields)
"""The order of a request record's values in a :class:`RequestsDone` row."""


class RequestsDone(EventPayload):
    """Requests that finished, in one event: what a trial on a cluster sends in place of its
    ``RequestDone`` events. Each record is a row of its values (``REQUEST_FIELDS`` order): a
    stream of pydantic objects costs the driver that takes them in more than it can afford at
    tens of thousands a second; rows cost a fraction."""

    kind: ClassVar[str] = "requests"
    run_id: str
    rows: list[tuple[Any, ...]]

    @classmethod
    def of(cls, run_id: str, records: Iterable[RequestRecord]) -> RequestsDone:
        """The records' rows (built without validation: they come from validated records)."""
        return cls.model_construct(run_id=run_id, rows=[tuple([r.__dict__[f] for f in REQUEST_FIELDS])
                                                         for r in records])

    def records(self) -> list[dict[str, Any]]:
        """Each record as ``RequestRecord.model_dump()`` gives it: what the store keeps."""
        return [dict(zip(REQUEST_FIELDS, row, strict=True)) for row in self.rows]


class Progress(EventPayload):
    """Rolling client-side figures of the running level, about twice a second: the CLI's live
    line, the GUI's client tiles and graphs, and (as the ``client`` series) the store's."""

    kind: ClassVar[str] = "progress"
    run_id: str
    level: int
    planned: int | None = None  # requests the level will send; None when it runs for a duration
    requests_done: int
    errors: int
    requests_in_flight: int
    output_tokens: int
    elapsed_s: float
    output_tok_per_s: float
    ttft_ms_p50: float | None = None  # over the last few seconds
    itl_ms_p50: float | None = None
    ttfat_ms_p50: float | None = None  # reasoning models only: the first answer token, over the last few seconds

    def series(self) -> dict[str, float]:
        """The plotted values (names as the ``client`` sample source has them)."""
        values = {"output_tok_per_s": self.output_tok_per_s, "requests_done": float(self.requests_done),
                  "errors": float(self.errors), "requests_in_flight": float(self.requests_in_flight)}
        if self.ttft_ms_p50 is not None:
            values["ttft_ms_p50"] = self.ttft_ms_p50
        if self.itl_ms_p50 is not None:
            values["itl_ms_p50"] = self.itl_ms_p50
        if self.ttfat_ms_p50 is not None:
            values["ttfat_ms_p50"] = self.ttfat_ms_p50
        return values

    def sample(self, t_mono: float, t_wall: float) -> Sample:
        """These figures as a ``client`` sample at the event's time (for series and the store)."""
        return Sample(CLIENT_SOURCE, t_mono, t_wall, self.series())


class SampleStreamed(EventPayload):
    """The level's sample request while it streams (what a live race shows): its start (prompt and
    send time), then its pieces as they arrived since the last event, in
    ``app.load.client.stream_sample``'s shape; the last one (``ended``) carries the whole sample as
    the store keeps it (``LevelFinished.sample``). Not stored: the sample is, with its level."""

    kind: ClassVar[str] = "sample_streamed"
    run_id: str
    level: int
    label: str
    part: dict[str, Any]
    """Secrets masked (``app.load.client``): ``prompt`` and ``start_wall_s`` in the first part only;
    ``text``, ``t_ms`` (ms since the request was sent) and ``tokens`` per piece."""
    ended: bool = False


class LevelFinished(EventPayload):
    """A load level ended; its figures."""

    kind: ClassVar[str] = "level_finished"
    run_id: str
    index: int
    label: str
    summary: LevelSummary
    sample: dict[str, Any] | None = None
    """One request of the level as it streamed (``app.load.client.stream_sample``), secrets masked."""


class QualityMeasured(EventPayload):
    """The quality probe ended, after the last level (``app.quality.probe.QualityFigures`` as JSON:
    its figures, or the one line saying why there are none)."""

    kind: ClassVar[str] = "quality"
    run_id: str
    quality: dict[str, Any]


class RunFinished(EventPayload):
    """The run ended, however it ended; ``summary`` has each level's flat figures."""

    kind: ClassVar[str] = "run_finished"
    run_id: str
    status: RunStatus
    reason: MaskedText | None = None
    ended_wall_s: float
    summary: dict[str, Any] = Field(default_factory=dict)


class TelemetrySupport(EventPayload):
    """Once per telemetry source (``gpu<i>``; ``gpu`` when there is no usable NVIDIA GPU;
    ``host``; ``engine`` after its first scrape): what it can measure and why not the rest."""

    kind: ClassVar[str] = "telemetry_support"
    source: str
    available: bool
    supported: list[str] = Field(default_factory=list)
    unsupported: dict[str, str] = Field(default_factory=dict)  # value name -> why not
    detail: MaskedText = ""
    state: str | None = None  # "no NVIDIA GPU" for the ``gpu`` source without one
    name: str | None = None  # GPU name
    uuid: str | None = None
    url: MaskedText | None = None  # the engine's /metrics
    peak_bandwidth: dict[str, Any] | None = None
    labels: dict[str, str] = Field(default_factory=dict)  # value name -> what it means here


class Notice(EventPayload):
    """A new condition worth a line, reported once (endpoint unreachable, counters reset)."""

    kind: ClassVar[str] = "notice"
    source: str
    message: MaskedText


class CampaignUpdated(EventPayload):
    """A campaign moved: a ladder (``app.ladder.run``) or a tune (``app.tuner.run``) was planned,
    a step or trial started or ended, the campaign ended. Carries the whole state, so a consumer
    just redraws it; not stored with the run it happens in (a campaign stores itself)."""

    kind: ClassVar[str] = "campaign"
    state: SerializeAsAny[CampaignStateBase]
    """A ladder's (``app.ladder.state.LadderState``) or a tune's (``app.tuner.state.TuneState``)
    state, as its owner built it (``state.campaign`` says which)."""


AnyEvent = (RunStarted | PhaseChanged | LogLine | EngineReady | LevelStarted | RequestDone | RequestsDone | Progress
            | SampleStreamed | LevelFinished | QualityMeasured | RunFinished | TelemetrySupport | Notice | CampaignUpdated)
"""Every event kind; ``isinstance`` (or ``match``) on an event's payload narrows it."""

EVENT_TYPES: tuple[type[EventPayload], ...] = (
    RunStarted, PhaseChanged, LogLine, EngineReady, LevelStarted, RequestDone, RequestsDone, Progress, SampleStreamed,
    LevelFinished, QualityMeasured, RunFinished, TelemetrySupport, Notice, CampaignUpdated)


@dataclass(frozen=True, slots=True)
class Event:
    """One event on the timeline: a typed payload and the moment it was published."""

    t_mono: float
    t_wall: float
    payload: AnyEvent

    @property
    def kind(self) -> str:
        return self.payload.kind


Item = Sample | Event
