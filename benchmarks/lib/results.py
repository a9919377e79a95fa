"""Where benchmark results go: one JSON per benchmark under ``benchmarks/results/``.

Each file (or each section of one, e.g. a benchmark's ``emulated`` arms beside its CPU ones)
is stamped with the machine, the time and the load average it was measured under (a 2-core
box shared with other work makes absolute numbers move; the load says how far to trust
them). Knows nothing about what a benchmark measured or how its JSON is laid out.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"

#: 1-minute load average per core above which a result is marked as measured under load
BUSY_LOAD_PER_CORE = 0.75


#: the repository's root: a path a result records is relative to it, so a result written from one
#: checkout (a worktree, a clone) reads back from another
ROOT = Path(__file__).resolve().parents[2]


def repo_relative(path: str | os.PathLike) -> str:
    """``path`` as a result records it: relative to the repository when inside it."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def repo_path(recorded: str) -> Path:
    """A path a result recorded (:func:`repo_relative`), to open from this checkout."""
    p = Path(recorded)
    return p if p.is_absolute() else ROOT / p


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
