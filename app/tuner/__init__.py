"""The tuner: the best configuration under an SLO, the trade-off behind it, and the
winner exported as a launch script.

Modules, by job (this package file imports none of them):

- :mod:`~app.tuner.space`: the search space (engine knobs from the feature catalogue and a load
  range), read from a TOML file or derived from the profile and the machine;
- :mod:`~app.tuner.slo`: judging one trial against the SLO (at a percentile) and naming the
  constraint that bound it;
- :mod:`~app.tuner.state`: what a tune produced (candidates, trials, the pick), as the store
  keeps it and the GUI and the report show it; the Pareto front;
- :mod:`~app.tuner.run`: :class:`~app.tuner.run.Tuner`, built on :class:`app.campaign.Campaign`
  (engine reuse, cold caches, recording): grid or Bayesian search, goodput per engine
  configuration, pruning by the planner, resume from the store;
- :mod:`~app.tuner.stored`: tunes read back from the run store.
"""
