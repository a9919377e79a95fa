"""Where benchmark results go: one JSON per benchmark under ``benchmarks/results/``."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def write_results(path: str | os.PathLike, data: dict) -> Path:
    """Write ``data`` plus the machine and time it was measured on; print where it went."""
    path = Path(path)
    data.setdefault("machine", {}).update(cpus=os.cpu_count(), platform=platform.platform(),
                                          python=platform.python_version())
    data.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {path}")
    return path
