"""The tests' one way to wait for something: check a condition until it holds or time runs out.

``from tests.waiting import wait_until``. Between checks the test either does the work that
makes the condition come true (``step``: an actor's loop, a server's poll) or sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float, what: str | Callable[[], object], *,
               step: Callable[[], object] | None = None, interval_s: float = 0.05) -> T:
    """Return ``condition()``'s first true value; between checks call ``step()``, or sleep
    ``interval_s``. After ``timeout_s`` seconds: AssertionError with ``what`` (or, when it is
    a callable, what it returns then: the state worth reporting)."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, what() if callable(what) else what
        if step is not None:
            step()
        else:
            time.sleep(interval_s)
    return value
