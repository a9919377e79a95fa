"""An emulated device: hold each call until its modelled time has passed, and account for it.

:class:`DeviceConfig` is the ``device`` section of a rollout pool, a trainer or the
evaluator (``kind: cpu`` runs as it is; ``kind: emulated`` prices every call with the cost
model of ``profile``). :class:`EmulatedDevice` is the clock: the caller does the real work
(the tiny model's tokens, log-probs, gradients), says what it did, and the device sleeps —
never spins — until ``modelled seconds x dilation`` have passed since the call began. A
device with a ``slowdown`` instead of a profile prices a call at ``slowdown`` times its own
measured time: a slower device kind relative to this CPU (the one emulation a topology's
cheap pools need without a cost profile). The
CPU the real work took is measured against that hold: emulation is only an instrument for
the schedule while the real compute is a small part of each hold, so a device whose calls
cost more than ``max_cpu_fraction`` of their hold warns, once, and its stats say so. Every
number it reports is in modelled seconds and labelled emulated. It knows nothing about
Kafka or which component holds it. ``share`` names devices a policy's pool and trainer take
turns on (``emulation/share.py``); the device then holds a :class:`~.share.DeviceShare` in the
run's ``devices/`` directory.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from astraflow.typed_config import Bounds
from astraflow.typed_config import setting as _f

from .cost import CostModel
from .profile import load_profile, load_workload, profile_names, workload_names
from .share import DeviceShare

__all__ = ["DeviceConfig", "EmulatedDevice", "CallStats"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceConfig:
    kind: Literal["cpu", "emulated"] = _f("cpu", "cpu: the work runs as it is; emulated: each call is held for the "
                                                 "time the profile's cost model gives (emulation/profiles.yaml), or "
                                                 "for `slowdown` times its own")
    profile: str = _f("", "emulated: the profile (device kind x model shape), e.g. h100-qwen3-8b")
    slowdown: float = _f(1.0, "emulated without a profile: a device kind this many times slower than this CPU; each "
                              "call is held for slowdown x its measured time", bounds=Bounds(1, 1e6))
    count: int = _f(1, "emulated: devices this component stands for: a trainer's data-parallel width, or a RaaS "
                       "node's engine replicas (a call's rows dealt out over them)", bounds=Bounds(1, 100_000))
    dilation: float = _f(1.0, "emulated: wall seconds per modelled second (0.05 runs 20x faster than the device)",
                         bounds=Bounds(0, 1e6, lo_open=True))
    token_scale: int = _f(1, "emulated: modelled tokens per real generated token (the tiny model's lengths scaled to the "
                             "emulated model's)", bounds=Bounds(1, 10**6))
    prompt_token_scale: int = _f(0, "emulated: modelled tokens per real prompt token (0: token_scale); the tiny "
                                    "model's prompts and answers are both short, the emulated model's prompts "
                                    "are often far shorter than its answers", bounds=Bounds(0, 10**6))
    workload: str = _f("", "emulated with a profile: a workload of emulation/profiles.yaml (e.g. reasoning) whose "
                           "response-length spread the modelled lengths take; empty: the tiny model's lengths, "
                           "scaled by token_scale")
    share: str = _f("", "emulated with a profile: a name; a policy's pool and trainer that give the same name "
                        "take turns on the same devices (the trainer claims them for each step, the pool "
                        "pauses; emulation/share.py); empty: devices of its own")
    max_cpu_fraction: float = _f(0.2, "emulated: warn when a call's real CPU time exceeds this share of its hold",
                                 bounds=Bounds(0, 1, lo_open=True))

    def __post_init__(self) -> None:
        if self.slowdown < 1.0:
            raise ValueError(f"device.slowdown must be >= 1 (a slowdown factor), got {self.slowdown}")
        if self.count < 1 or self.dilation <= 0 or self.token_scale < 1 or self.prompt_token_scale < 0:
            raise ValueError("device.count and device.token_scale must be >= 1, device.prompt_token_scale >= 0 "
                             "and device.dilation > 0")
        if self.kind == "emulated":
            if bool(self.profile) == (self.slowdown > 1.0):
                raise ValueError("an emulated device takes either a profile (a cost model) or a slowdown > 1 "
                                 "(its measured time stretched), not both or neither")
            if self.profile and self.profile not in profile_names():
                raise ValueError(f"device.profile {self.profile!r} is not a profile of emulation/profiles.yaml "
                                 f"({', '.join(profile_names())})")
            if self.share and not self.profile:
                raise ValueError("device.share needs device.profile (a paused continuous batch is priced by it)")
            if self.share and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", self.share):
                raise ValueError(f"device.share {self.share!r}: expected a name of letters, digits, '_', '.', '-'")
            if self.workload and not self.profile:
                raise ValueError("device.workload needs device.profile (a cost model prices the lengths)")
            if self.workload and self.workload not in workload_names():
                raise ValueError(f"device.workload {self.workload!r} is not a workload of emulation/profiles.yaml "
                                 f"({', '.join(workload_names()) or 'none'})")
        elif self.profile or self.slowdown != 1.0 or self.workload or self.share:
            raise ValueError("device.profile, device.slowdown, device.workload and device.share need device.kind: "
                             "emulated")

    @property
    def emulated(self) -> bool:
        return self.kind == "emulated"


@dataclass
class CallStats:
    """Totals of one kind of call (``generate``, ``train``, ``weight_load``)."""

    calls: int = 0
    modelled_s: float = 0.0  #: what the device would have taken
    held_s: float = 0.0  #: wall time the calls took (modelled x dilation, or more on an overrun)
    cpu_s: float = 0.0  #: the real work's CPU time
    overruns: int = 0  #: calls whose real work outlasted their hold
    joined: int = 0  #: calls that joined other calls in flight (a device that batches concurrent calls)

    @property
    def cpu_fraction(self) -> float:
        return self.cpu_s / self.held_s if self.held_s > 0 else 0.0


class EmulatedDevice:
    """The clock and the accounts of one emulated device (thread-safe)."""

    def __init__(self, cfg: DeviceConfig, name: str = "device", share_dir: str | Path | None = None,
                 lora=None) -> None:
        if not cfg.emulated:
            raise ValueError("EmulatedDevice needs device.kind: emulated")
        if cfg.share and share_dir is None:
            raise ValueError(f"device.share {cfg.share!r} of {name}: needs the run directory the components that "
                             f"share the devices meet in")
        self.cfg, self.name = cfg, name
        #: the devices' turn-taking with the other components that name them (None: its own devices)
        self.share = DeviceShare(Path(share_dir) / "devices", cfg.share) if cfg.share else None
        #: None for a slowdown device: its calls are priced by their own measured time
        sigma = load_workload(cfg.workload).length_sigma if cfg.workload else 0.0
        # a LoRA policy (its trainer.engine.lora): the same adapter on the modelled shape
        self.cost = CostModel(load_profile(cfg.profile), token_scale=cfg.token_scale,
                              prompt_token_scale=cfg.prompt_token_scale or cfg.token_scale,
                              length_sigma=sigma).with_adapter(lora) if cfg.profile else None
        self.stats: dict[str, CallStats] = {}
        self._lock = threading.Lock()
        self._warned = False

    @contextmanager
    def hold(self, kind: str):
        """Time one call: yields ``price(modelled_s)``, which the caller calls once it knows
        what the work was (a slowdown device prices it itself: ``slowdown`` x the work's
        time); on exit the call is held until its modelled time (dilated) is up."""
        t0, c0 = time.monotonic(), time.process_time()
        priced: list[float] = []
        yield priced.append
        cpu = time.process_time() - c0
        modelled = sum(priced) if self.cost is not None else self.cfg.slowdown * (time.monotonic() - t0)
        target = modelled * self.cfg.dilation
        left = target - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)
        self.account(kind, modelled, time.monotonic() - t0, cpu, overrun=left < 0, target=target)

    def account(self, kind: str, modelled: float, held: float, cpu: float, *, overrun: bool, target: float,
                joined: bool = False) -> None:
        """Add one call to the accounts (:meth:`hold` does; an engine that schedules its calls
        itself, :class:`~.batching.BatchingClock`, calls it with the device work the call added
        as ``modelled`` and whether it ``joined`` calls in flight)."""
        with self._lock:
            s = self.stats.setdefault(kind, CallStats())
            s.calls += 1
            s.modelled_s += modelled
            s.held_s += held
            s.cpu_s += cpu
            s.overruns += overrun
            s.joined += joined
            warn = not self._warned and target > 0 and cpu > self.cfg.max_cpu_fraction * held
            self._warned = self._warned or warn
        if warn:
            log.warning("emulated %s (%s): a %s call's real CPU time was %.0f%% of its hold (%.3f of %.3f s); above "
                        "%.0f%% the emulation measures the CPU, not the device: raise device.dilation",
                        self.name, self.cfg.profile, kind, 100 * cpu / held, cpu, held, 100 * self.cfg.max_cpu_fraction)

    def _share_summary(self) -> dict:
        """The turn-taking's counts, its wall seconds in modelled ones (/ dilation)."""
        out = self.share.summary()
        for k in ("claim_wait_s", "yielded_s"):
            out[k] = round(out[k] / self.cfg.dilation, 6)
        return out

    def summary(self) -> dict:
        """Per kind of call: calls, modelled / held / CPU seconds, CPU fraction, overruns (labelled emulated)."""
        with self._lock:
            return {"emulated": True, "profile": self.cfg.profile or f"slowdown x{self.cfg.slowdown:g}",
                    "devices": self.cfg.count,
                    "dilation": self.cfg.dilation, "token_scale": self.cfg.token_scale,
                    "prompt_token_scale": self.cfg.prompt_token_scale or self.cfg.token_scale,
                    **({"workload": self.cfg.workload,
                        "length_sigma": self.cost.length_sigma} if self.cfg.workload and self.cost else {}),
                    **({"share": self._share_summary()} if self.share else {}),
                    **{k: {"calls": s.calls, "modelled_s": round(s.modelled_s, 6), "held_s": round(s.held_s, 6),
                           "cpu_s": round(s.cpu_s, 6), "cpu_fraction": round(s.cpu_fraction, 4),
                           "overruns": s.overruns, **({"joined": s.joined} if s.joined else {})} for k, s in self.stats.items()}}
