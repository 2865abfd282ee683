"""Makes the repository importable from a benchmark run as a script: ``python benchmarks/x.py``
puts benchmarks/ on the import path, not the repository. A benchmark imports it before anything
of ``app`` or ``tests``."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root."""
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
