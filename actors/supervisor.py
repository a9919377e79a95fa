"""Actor supervision for one process: restart failed actors with backoff, or give up loudly.

:class:`LoopActor` is the shape of every component actor: ``setup`` in ``on_start``, then
one unit of work per ``step`` (poll, generate, train, ...), re-scheduled through the
actor's own inbox so ``ask``/``stop`` messages are served between steps. Unhandled errors
reach ``on_failure``, which tells the :class:`Supervisor`; the supervisor restarts the
actor after an exponential backoff, and when a child exhausts its restarts it records a
fatal error that makes the process exit non-zero with the reason. A child that fails with
a fatal error (:mod:`astraflow.errors`: bad data, bad config, missing model) is not
restarted: the same input would fail the same way, so the process stops at once with
that error as its cause.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import pykka

from astraflow.errors import fatal_cause, one_line

log = logging.getLogger(__name__)


class _Tick(NamedTuple):
    """Do one unit of work."""


class ChildFailed(NamedTuple):
    """A child actor died."""

    name: str  #: the child's name in the supervisor
    error: str  #: one-line description
    trace: str  #: formatted traceback
    fatal: str | None = None  #: the cause when the error is not retriable (no restart can help)


class ChildDone(NamedTuple):
    """A child actor finished its work (e.g. the trainer reached its last step)."""

    name: str


class _Restart(NamedTuple):
    name: str


class LoopActor(pykka.ThreadingActor):
    """Base of component actors: ``setup`` / ``step`` / ``teardown``.

    Subclasses set ``self.finished = True`` when they have nothing more to do.
    """

    def __init__(self, supervisor: pykka.ActorRef | None = None, name: str = "") -> None:
        super().__init__()
        self.supervisor = supervisor
        self.name = name or type(self).__name__
        self.finished = False

    # -- subclass hooks --------------------------------------------------------------
    def setup(self) -> None:
        """Open consumers/producers, load engines. Runs in the actor's thread."""

    def step(self) -> None:
        """One unit of work; must return within a few seconds (poll with timeouts)."""
        raise NotImplementedError

    def teardown(self) -> None:
        """Close what ``setup`` opened. Also runs after a failure."""

    def handle(self, message: Any) -> Any:
        """Messages other than the loop's own tick."""
        raise TypeError(f"{self.name}: unexpected message {message!r}")

    # -- pykka plumbing --------------------------------------------------------------
    def on_start(self) -> None:
        try:
            self.setup()
        except Exception:
            # pykka does not call on_failure for on_start errors; the supervisor must hear of them.
            self.on_failure(*sys.exc_info())
            raise
        self.actor_ref.tell(_Tick())

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Tick):
            if self.finished:
                return None
            self.step()
            if self.finished:
                if self.supervisor is not None:
                    self.supervisor.tell(ChildDone(self.name))
            else:
                self.actor_ref.tell(_Tick())
            return None
        return self.handle(message)

    def on_failure(self, exception_type, exception_value, tb) -> None:
        if self.supervisor is not None:
            cause = fatal_cause(exception_value)
            self.supervisor.tell(ChildFailed(
                self.name, f"{exception_type.__name__}: {exception_value}",
                "".join(traceback.format_exception(exception_type, exception_value, tb)),
                one_line(cause) if cause is not None else None))
        try:
            self.teardown()
        except Exception:  # noqa: BLE001 - teardown after a failure is best effort
            log.exception("%s: teardown after failure failed", self.name)

    def on_stop(self) -> None:
        self.teardown()


@dataclass
class Outcome:
    """How a supervised process ended; shared between the supervisor and the main thread."""

    finished: threading.Event = field(default_factory=threading.Event)
    fatal: str | None = None
    #: False when ``fatal`` is a deterministic error: restarting the process cannot help.
    retriable: bool = True
    child: str | None = None  #: the child whose failure ended the process


@dataclass
class ChildSpec:
    """How to (re)start one child: ``factory(supervisor_ref, name) -> ActorRef``."""

    name: str
    factory: Callable[[pykka.ActorRef, str], pykka.ActorRef]
    required: bool = True  #: the process is done when every required child is done
    restarts: list[float] = field(default_factory=list)


class Supervisor(pykka.ThreadingActor):
    """Starts children, restarts failed ones with backoff, reports done or fatal.

    Args:
        specs: the children.
        max_restarts: restarts allowed per child within ``window_s``.
        backoff_s: first restart delay; doubles per recent restart, capped at 30 s.
    """

    def __init__(self, specs: list[ChildSpec], outcome: Outcome | None = None, *, max_restarts: int = 5,
                 window_s: float = 300.0, backoff_s: float = 1.0) -> None:
        super().__init__()
        self.outcome = outcome or Outcome()
        self.specs = {s.name: s for s in specs}
        self.max_restarts, self.window_s, self.backoff_s = max_restarts, window_s, backoff_s
        self.children: dict[str, pykka.ActorRef] = {}
        self.done: set[str] = set()

    def on_start(self) -> None:
        for name in self.specs:
            self._start(name)

    def _start(self, name: str) -> None:
        self.children[name] = self.specs[name].factory(self.actor_ref, name)

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, ChildFailed):
            self._on_failed(message)
        elif isinstance(message, ChildDone):
            self.done.add(message.name)
            if all(n in self.done for n, s in self.specs.items() if s.required):
                self.outcome.finished.set()
        elif isinstance(message, _Restart):
            if self.outcome.fatal is None and not self.outcome.finished.is_set():
                log.warning("supervisor: restarting %s", message.name)
                self._start(message.name)
        return None

    def _on_failed(self, msg: ChildFailed) -> None:
        log.error("supervisor: %s failed: %s\n%s", msg.name, msg.error, msg.trace)
        if self.outcome.finished.is_set():
            return
        if msg.fatal is not None:
            log.error("supervisor: %s failed with a fatal error; not restarting it", msg.name)
            self._give_up(msg.name, msg.fatal, retriable=False)
            return
        spec = self.specs[msg.name]
        now = time.monotonic()
        spec.restarts = [t for t in spec.restarts if now - t < self.window_s]
        if len(spec.restarts) >= self.max_restarts:
            self._give_up(msg.name, f"{msg.name} failed {len(spec.restarts) + 1} times within {self.window_s:.0f}s; "
                                    f"giving up. Last error: {msg.error}", retriable=True)
            return
        delay = min(30.0, self.backoff_s * 2 ** len(spec.restarts))
        spec.restarts.append(now)
        timer = threading.Timer(delay, self.actor_ref.tell, args=(_Restart(msg.name),))
        timer.daemon = True
        timer.start()

    def _give_up(self, name: str, reason: str, *, retriable: bool) -> None:
        self.outcome.fatal, self.outcome.retriable, self.outcome.child = reason, retriable, name
        self.outcome.finished.set()

    def stop_children(self, timeout: float = 30.0) -> None:
        for ref in list(self.children.values()):
            try:
                ref.stop(block=True, timeout=timeout)
            except Exception:  # noqa: BLE001 - already dead or slow to stop
                pass

    def on_stop(self) -> None:
        self.stop_children()


def run_supervised(specs: list[ChildSpec], stop: threading.Event, outcome: Outcome | None = None,
                   **kw: Any) -> str | None:
    """Run children until they are all done, ``stop`` is set, or a child is given up on.

    Returns the fatal reason, or None on a clean finish / stop; pass ``outcome`` to learn
    whether that reason is retriable and which child it came from.
    """
    outcome = outcome or Outcome()
    sup_ref = Supervisor.start(specs, outcome, **kw)
    try:
        while not stop.is_set() and not outcome.finished.wait(0.2):
            pass
        return outcome.fatal
    finally:
        sup_ref.stop(block=True, timeout=60)
