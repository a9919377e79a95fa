"""Fixtures of the sandbox tests."""

from __future__ import annotations

import psutil
import pytest

from astraflow.sandbox import Limits, run_python


@pytest.fixture
def no_sandbox_leftovers():
    """A sandbox test: no process of a run survives it, and the caller still runs programs."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before, f"sandbox processes left behind: {after - before}"
    check = run_python("print(sum(range(10)))", limits=Limits(cpu_s=1, wall_s=20, memory_mb=128, processes=16))
    assert (check.reason, check.stdout) == ("ok", "45\n")
