"""What every campaign's state shares, whatever its kind: the one shape the bus carries
(``app.events.CampaignUpdated``), the store keeps (``db.campaign_store``) and a resume, the CLI's
live line and the GUI's tabs read. A kind adds its own fields (a ladder's staircase, a tune's
space, candidates and pick) in a subclass whose ``campaign`` names it. See docs/architecture.md."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

CampaignStatus = Literal["running", "completed", "failed", "cancelled", "interrupted"]
"""A campaign's status (the store's ``db.models.CAMPAIGN_STATUSES``)."""


class ClusterOptions(BaseModel):
    """Where a campaign's trials ran when not on one machine: ``--cluster`` and its options
    (``app.cli.fleet_cmds``), kept so that a resume goes on there."""

    address: str
    """The cluster's address as connected (what ``--cluster`` takes)."""
    parallel: int | None = None
    skip_bad_nodes: bool = False
    trial_resources: list[str] = Field(default_factory=list)
    """``--trial-resource`` entries, as given (NAME or NAME=AMOUNT)."""


class CampaignStateBase(BaseModel):
    """A campaign at a moment: which it is, how it stands, and when it ran."""

    campaign: str
    """The kind (``ladder``, ``tune``): what ``CampaignUpdated`` is discriminated by."""
    name: str = ""
    profile: str = ""
    status: CampaignStatus = "running"
    reason: str | None = None
    started_wall_s: float = 0.0
    ended_wall_s: float | None = None
    engine_launches: int = 0
    cluster: ClusterOptions | None = None
    """The cluster it ran on (None: this machine, or stored before campaigns kept it)."""
    revision: int = 0
    """Bumped at every update (a consumer keeps the highest)."""

    @property
    def campaign_id(self) -> str:
        raise NotImplementedError

    @property
    def finished(self) -> bool:
        return self.status != "running"
