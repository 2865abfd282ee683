"""docs/cluster-box.png: the Cluster box after a Check of a real Ray cluster (offscreen Qt).

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/make_cluster_screenshot.py

Starts the tests' local cluster (tests/ray_cluster.py: a head and two worker nodes, 127.0.0.1
only), opens the workbench on the cpu-demo profile at a laptop's 1366x768, checks the cluster and
saves the box; ``--window`` also saves the whole window beside it. The cluster is shut down
through its handle at the end. Takes about half a minute.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from screenshot_kit import ROOT, fail, open_window, pause, wait_until

from tests.ray_cluster import start_test_cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs"), help="folder for the PNG files")
    parser.add_argument("--window", action="store_true", help="also save the whole window (cluster-window.png)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="tb-shot-")
    os.environ["TUNEBENCH_CONFIG_DIR"] = str(Path(scratch) / "config")  # the user's settings stay as they are
    cluster = start_test_cluster()
    try:
        app, window = open_window("cpu-demo", str(Path(scratch) / "runs.db"))
        wait_until(app, lambda: window.hardware is not None, 60, "the hardware probe")
        box = window.cluster_box
        box.address_edit.setText(cluster.address)
        box.check()
        wait_until(app, lambda: box.checking is None, 120, "the cluster check")
        if box.status is None:
            raise fail(f"the check failed: {box.status_label.text()}")
        pause(app, 0.4)  # the layout settles
        if not box.grab().save(str(out / "cluster-box.png")):
            raise fail(f"cannot write {out / 'cluster-box.png'}")
        print(f"wrote {out / 'cluster-box.png'}: {box.status_label.text()}")
        if args.window:
            if not window.grab().save(str(out / "cluster-window.png")):
                raise fail(f"cannot write {out / 'cluster-window.png'}")
            print(f"wrote {out / 'cluster-window.png'}")
        window.close()
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
