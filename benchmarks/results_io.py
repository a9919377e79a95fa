"""Where benchmark results go, and the shared shape of a repeated measurement.

One JSON per benchmark under ``benchmarks/results/``, stamped with the machine, the time
and the load average it was measured under (a 2-core box shared with other work makes
absolute numbers move; the load says how far to trust them). A number measured several
times is stored as a :func:`spread` — ``median`` with ``min``, ``max`` and every run — so
each table can show the spread, and a first (cold) run is kept apart from the warm ones.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: 1-minute load average per core above which a result is marked as measured under load
BUSY_LOAD_PER_CORE = 0.75


def spread(values: Sequence[float]) -> dict[str, Any]:
    """``{"median", "min", "max", "n", "runs"}`` of repeated measurements of one number."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("spread() needs at least one measurement")
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals), "runs": vals}


def ratio_spread(num: dict[str, Any], den: dict[str, Any]) -> dict[str, Any]:
    """The spread of ``num / den`` run by run (runs paired in order: measured alternately)."""
    if num["n"] != den["n"]:
        raise ValueError(f"ratio of spreads needs paired runs, got {num['n']} and {den['n']}")
    return spread([a / b for a, b in zip(num["runs"], den["runs"])])


def fmt_spread(s: dict[str, Any], fmt: str = ".2f") -> str:
    """``median (min–max)`` for tables."""
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}–{s['max']:{fmt}})"


def load_now() -> dict[str, Any]:
    """The 1/5/15-minute load averages and whether the box counts as busy."""
    one, five, fifteen = os.getloadavg()
    cpus = os.cpu_count() or 1
    return {"loadavg": [round(one, 2), round(five, 2), round(fifteen, 2)], "cpus": cpus,
            "busy": one / cpus > BUSY_LOAD_PER_CORE}


def write_results(path: str | os.PathLike, data: dict, load_before: dict | None = None) -> Path:
    """Write ``data`` plus the machine, the time and the load it was measured under.

    ``load_before`` is :func:`load_now` taken when the measurement started; the load at
    writing time is added as ``load.after``. ``load.busy`` is true if either was busy.
    """
    path = Path(path)
    _stamp(data, load_before)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {path}" + ("  (measured under load: see 'load' in the JSON)" if data["load"]["busy"] else ""))
    return path


def write_section(path: str | os.PathLike, name: str, section: dict, load_before: dict | None,
                  benchmark: str) -> Path:
    """Write ``section`` as the ``name`` section of the results file ``path`` (e.g. a benchmark's
    ``emulated`` arms beside its CPU ones, which stay as they are), stamped as
    :func:`write_results` stamps a whole file; a new file is ``{"benchmark": benchmark}``."""
    path = Path(path)
    _stamp(section, load_before)
    data = json.loads(path.read_text()) if path.is_file() else {"benchmark": benchmark}
    data[name] = section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote the {name} section of {path}")
    return path


def _stamp(data: dict, load_before: dict | None) -> None:
    """The machine, the load before and after, and the time of a measurement."""
    data.setdefault("machine", {}).update(cpus=os.cpu_count(), platform=platform.platform(),
                                          python=platform.python_version())
    after = load_now()
    data["load"] = {"before": load_before, "after": after,
                    "busy": bool(after["busy"] or (load_before or {}).get("busy"))}
    data.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
