"""A run's quality figures (``app.quality``): agreement and KL divergence against a reference, the
noise floor, accuracy, and the outputs that make the run a reference for others. Runs recorded
before this revision have none (NULL).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from db.migrations.tables import json_column_revision

revision = "0008"
down_revision = "0007"

upgrade, downgrade = json_column_revision("runs", "quality")
