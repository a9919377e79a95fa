"""A baseline run as its own Python process: nothing shared with the benchmark's process.

The in-process and sequential baselines (``inprocess_loop``, ``sequential_multi``) run as
``python -m <module> ... --out <json>``: the child writes its result with :func:`write_result`,
the parent reads it back with :func:`run_child`. Knows nothing about what the child measures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable


def run_child(module: str, argv: list[str], what: str, env: dict[str, str] | None = None) -> dict:
    """``python -m module *argv --out <tmp>.json`` to its end (``env``: variables added to this
    process's environment for it); its JSON. A failed child raises
    ``RuntimeError("<what> failed (<status>): <its stderr's tail>")``."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "result.json"
        proc = subprocess.run([sys.executable, "-m", module, *argv, "--out", str(out)], capture_output=True, text=True,
                              env={**os.environ, **env} if env else None)
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        return json.loads(out.read_text())


def write_result(out: Path | None, result: dict) -> None:
    """The child's side: its result as JSON at ``out`` (``--out``; nothing when not given)."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))


def child_run(argv: list[str] | None, flag: str, child: Callable[[list[str]], int]) -> int | None:
    """A benchmark that is also its own child: ``child(args)``'s exit status when ``flag`` is
    among ``argv`` (``None``: this process's arguments), else ``None`` (the parent goes on)."""
    args = sys.argv[1:] if argv is None else argv
    return child(args) if flag in args else None
