"""The acceleration ladder: a plain engine, then one feature at a time, each step measured on the
same shared-prefix workload and set against the baseline, the previous step and the physical
ceiling.

Modules, by job (this package file imports none of them):

- :mod:`~app.ladder.spec`: the ``[campaigns.ladder]`` table of a profile, the default order after the
  seeds, and how a step's change is applied to the previous step's configuration;
- :mod:`~app.ladder.state`: what a ladder produced (one row per step), as events carry it and the
  store keeps it;
- :mod:`~app.ladder.run`: :class:`~app.ladder.run.Ladder`, built on :class:`app.campaign.Campaign`
  (engine reuse, cold caches, per-step verification, one stored group);
- :mod:`~app.ladder.stored`: ladders in the run store, as campaigns (written, listed, marked
  interrupted, resumed, compared).
"""
