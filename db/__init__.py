"""Run store: SQLAlchemy models, Alembic migrations, queries. Never imports ``app``."""

import numpy as _np

# Decoding a run's requests makes large short-lived arrays (every latency of 100,000 requests),
# and numpy asks the kernel for transparent huge pages for them: the kernel then zeroes 2 MiB
# pages over and over (about 7 GiB a run, 1.5 s of a run's end here). Small pages cost nothing of
# that. The switch has no public name; numpy reads NUMPY_MADVISE_HUGEPAGE only when imported.
_switch = getattr(getattr(getattr(_np, "_core", None), "multiarray", None), "_set_madvise_hugepage", None)
if _switch is not None:
    _switch(False)
