"""Figures from stored runs: the request summary (the one definition of every figure), the metric
catalogue (names, units, which way is better), statistics over repeats, and Compare. Above the
store, which only stores (docs/architecture.md)."""
