"""Campaigns on a Ray cluster, side by side: connecting and the nodes (``cluster``), one trial as
one placement (``trial``), the checks before a campaign (``preflight``). The only package that
imports Ray; docs/fleet.md says how it fits together."""
