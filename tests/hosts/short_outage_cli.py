"""The tunebench CLI with shorter waits for a run database that stopped answering: ``python -m
tests.hosts.short_outage_cli SECONDS ARGS...`` waits SECONDS for it to come back (the recorder's
outage limit) and gives up on one call after SECONDS as well (the store's timeout). A test of what
happens past the wait (the spill) then need not wait out the product's minute; everything else
is the CLI as users run it."""

from __future__ import annotations

import sys

import db.store
from app.cli import main
from app.recording import RunRecorder

if __name__ == "__main__":
    seconds = float(sys.argv[1])
    defaults = RunRecorder.__init__.__kwdefaults__
    assert defaults is not None and "outage_limit_s" in defaults, "RunRecorder no longer takes outage_limit_s"
    assert isinstance(db.store.BUSY_TIMEOUT_S, float), "the store's timeout moved"
    defaults["outage_limit_s"] = seconds
    db.store.BUSY_TIMEOUT_S = seconds
    sys.exit(main(sys.argv[2:]))
