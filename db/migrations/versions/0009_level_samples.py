"""One request of each level kept as it streamed (``levels.sample``): its prompt, its text in the
pieces it arrived in and their arrival times, so that two runs can be replayed side by side at
the pace they measured. Runs stored before keep none (NULL): a replay of them says so.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from db.migrations.tables import json_column_revision

revision = "0009"
down_revision = "0008"

upgrade, downgrade = json_column_revision("levels", "sample")
