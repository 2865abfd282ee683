"""The quality probe: a run's greedy outputs and next-token distributions compared with a
reference configuration's, on a fixed prompt set, apart from the timed load (``app.quality.probe``),
with agreement and KL divergence figures defined once (``app.quality.divergence``)."""
