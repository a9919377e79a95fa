"""Devices that a policy's rollout pool and its trainer take turns on (emulated).

DESIGN.md puts every pool and every trainer on devices of its own. A lightly loaded policy
then leaves its devices idle for much of an iteration while another policy's stage is the
bound. ``device.share: NAME`` on a pool and a trainer puts them on the same devices, taking
turns, as a trainer-centred system colocates everything but for one policy alone:

* the **trainer claims** the devices for each training step (it waits for nothing but the
  pool's yield: a step is what the policy's next version waits for);
* the **pool yields**: its continuous batch stops at the next step boundary (no step starts
  while the devices are claimed) and goes on when the step is done, first prefilling again
  the context of the rows it held (their KV cache went with the devices); calls that arrive
  meanwhile wait in its queue;
* the trainer's step pays the **swap** a trainer-centred system pays per policy switch
  (``CostModel.swap_s``: its training states onto the devices and off again, the rollout
  weights off and back).

Components on one host coordinate through two lock files in the run's ``devices/``
directory (``fcntl.flock``, released by the kernel when a process dies, so a killed trainer
never strands the pool): a claimant holds ``NAME.gate`` exclusively from the moment it wants
the devices, then ``NAME.devices`` exclusively while it holds them; a pool holds
``NAME.devices`` shared while it runs and, every ``poll_s``, tries the gate: when a claimant
holds it, the pool pauses, lets the devices go, waits for the gate, and takes them back.
Only one host's components can share devices (as only one host's processes share a GPU).
It knows nothing about engines or Kafka: the pool's side is two callbacks.
"""

from __future__ import annotations

import fcntl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["DeviceShare"]


class DeviceShare:
    """The turn-taking of devices named ``name`` by the components whose ``device.share`` is it."""

    def __init__(self, directory: str | Path, name: str, poll_s: float = 0.002) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.name, self.poll_s = name, poll_s
        self._gate = self.directory / f"{name}.gate"
        self._devices = self.directory / f"{name}.devices"
        for path in (self._gate, self._devices):
            path.touch(exist_ok=True)
        self.claims = 0  #: claims held (a claimant's count)
        self.claim_wait_s = 0.0  #: wall seconds claims waited for the devices
        self.yields = 0  #: times the pool let the devices go (a yielder's count)
        self.yielded_s = 0.0  #: wall seconds the pool was paused for claims
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @contextmanager
    def claim(self) -> Iterator[None]:
        """Hold the devices (exclusively) for the body: waits until every yielder has paused."""
        t0 = time.monotonic()
        with open(self._gate, "rb") as gate, open(self._devices, "rb") as devices:
            fcntl.flock(gate, fcntl.LOCK_EX)
            try:
                fcntl.flock(devices, fcntl.LOCK_EX)
                self.claims += 1
                self.claim_wait_s += time.monotonic() - t0
                try:
                    yield
                finally:
                    fcntl.flock(devices, fcntl.LOCK_UN)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)

    def yield_to_claims(self, pause: Callable[[], None], resume: Callable[[bool], None]) -> None:
        """Run as a yielder (a pool): ``pause()`` now, ``resume(False)`` once the devices are
        held, and from then on ``pause()`` when a claim comes and ``resume(True)`` when it is
        over (True: the devices were away, so what they held is gone). A daemon thread watches."""
        if self._watcher is not None:
            raise RuntimeError(f"device share {self.name!r}: already yielding")
        pause()
        self._watcher = threading.Thread(target=self._watch, args=(pause, resume), daemon=True,
                                         name=f"device-share-{self.name}")
        self._watcher.start()

    def _watch(self, pause: Callable[[], None], resume: Callable[[bool], None]) -> None:
        with open(self._gate, "rb") as gate, open(self._devices, "rb") as devices:
            fcntl.flock(devices, fcntl.LOCK_SH)
            resume(False)
            while not self._stop.wait(self.poll_s):
                try:
                    fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # a claimant wants the devices
                    t0 = time.monotonic()
                    pause()
                    fcntl.flock(devices, fcntl.LOCK_UN)
                    fcntl.flock(gate, fcntl.LOCK_SH)  # until the claim is over
                    fcntl.flock(gate, fcntl.LOCK_UN)
                    fcntl.flock(devices, fcntl.LOCK_SH)  # (a claim that came in between goes first)
                    self.yields += 1
                    self.yielded_s += time.monotonic() - t0
                    resume(True)
                else:
                    fcntl.flock(gate, fcntl.LOCK_UN)

    def close(self) -> None:
        """Stop yielding (the devices are let go when the watcher's files close)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5.0)

    def summary(self) -> dict:
        return {"name": self.name, "claims": self.claims, "claim_wait_s": round(self.claim_wait_s, 3),
                "yields": self.yields, "yielded_s": round(self.yielded_s, 3)}
