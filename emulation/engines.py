"""Engines on an emulated device: the real engine computes, the device's clock prices it.

:class:`EmulatedRolloutEngine` wraps any ``RolloutEngine`` (the CPU engine with the tiny
model): ``generate`` returns the real tokens and log-probs, held until the modelled time of
its prefill and continuous-batching decode has passed — on a device of ``count`` devices the
rows are dealt out over them (engine replicas) and the slowest share decides; ``load_weights``
is held for the modelled model's weight load (every replica loads at once). With a cost
profile it takes several calls at once (``concurrent_calls``), as a rollout server does: the
real work of one call at a time, under a lock, and every call's rows on one continuous-batching
schedule of the ``count`` devices (:class:`~.batching.BatchingClock`), so a call that arrives
while others decode joins their batch instead of waiting for its own.
:class:`EmulatedTrainEngine` wraps a ``TrainEngine`` (the DeepSpeed trainer): a ``train_step``
learns for real and is held for the modelled step on the device's ``count`` devices (data
parallel), forward + backward over the batch's tokens once per PPO epoch plus the
forward-only passes the trainer says its step makes (``proximal_pass``, its reference model).
On devices it shares with a pool (``device.share``) a step first claims them (the pool's
batch pauses) and pays the swap of its states onto them and off. Everything else is the
wrapped engine's. They know nothing about Kafka or the components that hold them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from astraflow.engines.base import (AdapterEngine, Generation, NamedTensors, RolloutEngine, SamplingParams, TrainBatch,
                                    TrainEngine, generated_context, row_seeds)

from .batching import BatchingClock
from .device import EmulatedDevice
from .partial import InFlightRows

__all__ = ["EmulatedRolloutEngine", "EmulatedTrainEngine", "dealt_s"]


class EmulatedRolloutEngine(RolloutEngine):
    def __init__(self, inner: RolloutEngine, device: EmulatedDevice) -> None:
        self.inner, self.device = inner, device
        #: set to a list to record every call's rows as (prompt, completion, length factor, cap):
        #: real lengths, what a different placement of the same work would cost (:func:`dealt_s`
        #: on another device count); None (a node's default) keeps nothing, so a long run does not grow
        self.rows: list[list[tuple[int, int, float, int]]] | None = None
        self._unseeded = 0  # rows generated without seeds: their length factors' keys
        #: several calls at once on a shared schedule (a cost profile); a slowdown device
        #: stretches each call's own time, so it takes one at a time
        self.concurrent_calls = device.cost is not None
        self.clock = BatchingClock(device.cost, device.cfg.count, device.cfg.dilation) if self.concurrent_calls else None
        self._compute = threading.Lock()  # the wrapped engine computes one call at a time
        self._accounted_busy = 0.0
        #: partial rollouts (:meth:`set_weight_refresh`): the calls held on the clock, whose live
        #: rows a mid-call load cuts and continues under the new weights (:mod:`.partial`)
        self.partial: InFlightRows | None = None
        self._refresh = None
        self._switching = threading.Lock()
        self._adapter_costs: dict = {}  #: adapter name -> the cost model pricing its loads (:meth:`adapter`)
        if device.share is not None:  # devices a trainer takes turns on: pause while it holds them
            device.share.yield_to_claims(self.clock.pause, self.clock.resume)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None, adapters: Sequence[str] | None = None) -> list[Generation]:
        """``adapters``: each row's adapter, on a host engine serving several (a shared pool)."""
        extra = {} if adapters is None else {"adapters": adapters}
        if self.clock is not None:
            return self._scheduled(prompts, params, seeds, extra)
        with self.device.hold("generate") as price:
            out = self.inner.generate(prompts, params, seeds=seeds, **extra)
            if self.device.cost is not None:
                price(self._modelled(prompts, out, params, seeds))
        return out

    def _scheduled(self, prompts, params: SamplingParams, seeds, extra: dict) -> list[Generation]:
        """A call on the shared schedule: in the batch from its arrival, computed (one call at a
        time), settled to the lengths it generated and held until its rows are decoded there."""
        t0, arrived = time.monotonic(), self.clock.now()
        factors = self._factors(len(prompts), seeds)
        units = self._prompt_units(prompts)
        call = self.clock.admit(units, params.max_new_tokens, arrived, factors)
        try:
            with self._compute:
                c0 = time.process_time()
                out = self.inner.generate(prompts, params, seeds=seeds, **extra)
                cpu = time.process_time() - c0
                self.clock.settle(call, [len(g.tokens) for g in out])
                if self.partial is not None:  # held from now: a load cuts its live rows
                    self.partial.add(call, prompts, out, params, row_seeds(prompts, params, seeds), factors)
        except BaseException:
            self.clock.cancel(call)
            raise
        computed = time.monotonic() - t0
        timing = self._held(call, arrived)
        if self.partial is not None:
            out = self.partial.pop(call)
        lens = [(u, len(g.tokens), f, params.max_new_tokens) for u, g, f in zip(units, out, factors)]
        with self._compute:
            if self.rows is not None:
                self.rows.append(lens)
            work, self._accounted_busy = self.clock.busy_s - self._accounted_busy, self.clock.busy_s
        held = time.monotonic() - t0
        self.device.account("generate", work, held, cpu, overrun=computed > timing.latency_s * self.device.cfg.dilation,
                            target=timing.latency_s * self.device.cfg.dilation, joined=timing.joined)
        return out

    #: modelled seconds between two asks for newer weights while a call is held (partial rollouts)
    REFRESH_EVERY_S = 1.0

    def _held(self, call: int, arrived: float):
        """Wait out ``call``'s decode on the clock; with partial rollouts, ask for newer weights
        every :attr:`REFRESH_EVERY_S` modelled seconds meanwhile (a load cuts the live rows)."""
        if self._refresh is None:
            return self.clock.wait(call, arrived)
        while (timing := self.clock.wait(call, arrived, until=self.clock.now() + self.REFRESH_EVERY_S)) is None:
            if self._switching.acquire(blocking=False):  # one call's thread asks; the others wait on
                try:
                    if self.partial.may_switch():
                        self._refresh()
                finally:
                    self._switching.release()
        return timing

    def set_weight_refresh(self, refresh, max_versions: int = 0) -> None:
        """Partial rollouts (see ``RolloutEngine.set_weight_refresh`` and :mod:`.partial`): while
        calls are held, ``refresh`` is asked for newer weights; a load then cuts every live row
        where the schedule has decoded it and generates its rest under the new weights. Needs a
        cost profile (a slowdown device holds whole calls, with no schedule to cut)."""
        if refresh is None:
            self._refresh, self.partial = None, None
            return
        if self.clock is None:
            raise NotImplementedError("rollout.partial: a slowdown device holds whole calls; give the device a "
                                      "profile (device.profile) to continue rows across weight updates")
        if max_versions < 0:
            raise ValueError(f"max_versions must be >= 0 (0: no bound), got {max_versions}")
        self.partial = InFlightRows(self.clock, self.device.cost.token_scale)
        self.partial.max_versions = max_versions
        self._refresh = refresh

    @property
    def refreshes(self) -> dict[str, int]:
        """Rows continued under newer weights and the real tokens prefilled again for them."""
        p = self.partial
        return {"rows": p.rows if p else 0, "recomputed_tokens": p.recomputed_tokens if p else 0}

    def _prompt_units(self, prompts) -> list[float]:
        """Each row's prompt in prompt-token units, its generated context priced as generated
        (:meth:`CostModel.prompt_units`, the row's :class:`~astraflow.engines.base.PromptRow` count)."""
        cost = self.device.cost
        return [cost.prompt_units(len(p), generated_context(p)) for p in prompts]

    def _factors(self, rows: int, seeds: Sequence[int] | None) -> list[float]:
        """Each row's length factor (:meth:`CostModel.length_factor`), keyed by its seed."""
        cost = self.device.cost
        if seeds is None:
            first, self._unseeded = self._unseeded, self._unseeded + rows
            seeds = [f"unseeded-{i}" for i in range(first, first + rows)]
        return [cost.length_factor(s) for s in seeds]

    def _modelled(self, prompts, out: list[Generation], params: SamplingParams, seeds) -> float:
        """The call on ``device.count`` devices: its rows dealt out in turn (engine replicas, data
        parallel), each device decoding its share by continuous batching; the slowest finishes it."""
        lens = [(u, len(g.tokens), f, params.max_new_tokens)
                for u, g, f in zip(self._prompt_units(prompts), out, self._factors(len(prompts), seeds))]
        if self.rows is not None:
            self.rows.append(lens)
        return dealt_s(self.device.cost, lens, self.device.cfg.count)

    def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        if self.partial is not None and self.partial.holding():
            return self._load_mid_call(named_tensors, version)
        with self.device.hold("weight_load") as price:
            self.inner.load_weights(named_tensors, version)
            if self.device.cost is not None:
                price(self.device.cost.weight_load_s())

    # -- a host engine serving several adapters (a shared pool on this device) -------------

    def adapter(self, name: str, lora=None):
        """Adapter ``name`` of the wrapped host as a rollout engine whose calls and loads go
        through this device (the pool's: one clock for every adapter's rows); ``lora``: its
        settings, which price its loads (default: the device's own policy's)."""
        self.inner.adapter(name)  # KeyError for an adapter the host does not serve
        if lora is not None and self.device.cost is not None:
            self._adapter_costs[name] = self.device.cost.with_adapter(lora)
        return AdapterEngine(self, name)

    def load_adapter(self, name: str, named_tensors: NamedTensors, version: int) -> None:
        """A version of adapter ``name``, held for its modelled load (the adapter's bytes)."""
        with self.device.hold("weight_load") as price:
            self.inner.load_adapter(name, named_tensors, version)
            cost = self._adapter_costs.get(name, self.device.cost)
            if cost is not None:
                price(cost.weight_load_s())

    def adapter_version(self, name: str) -> int:
        return self.inner.adapter_version(name)

    def _load_mid_call(self, named_tensors: NamedTensors, version: int) -> None:
        """A load while calls are held (partial rollouts): the devices stop, the load is held
        for its modelled time, the live rows are cut and continued under the new weights
        (:meth:`.partial.InFlightRows.switch`), and the devices resume by prefilling again the
        context their rows hold."""
        self.clock.pause()
        try:
            with self.device.hold("weight_load") as price:
                with self._compute:
                    self.inner.load_weights(named_tensors, version)
                    self.partial.switch(lambda p, params, seeds: self.inner.generate(p, params, seeds=seeds), version)
                price(self.device.cost.weight_load_s())
        finally:
            self.clock.resume(recompute=True)

    @property
    def version(self) -> int:
        return self.inner.version

    def close(self) -> None:
        if self.device.share is not None:
            self.device.share.close()
        self.inner.close()

    def __getattr__(self, name: str):  # what only the wrapped engine has (e.g. its model, for the evaluator)
        return getattr(self.inner, name)


def dealt_s(cost, rows: Sequence[Sequence], devices: int) -> float:
    """One call's ``(prompt, completion[, length factor, cap])`` rows dealt out in turn over
    ``devices`` (engine replicas), each decoding its share by continuous batching; the slowest
    finishes the call."""
    k = min(devices, len(rows)) or 1
    full = [tuple(r) if len(r) == 4 else (r[0], r[1], 1.0, r[1]) for r in rows]
    return max(cost.generate_s([r[0] for r in full[d::k]], [r[1] for r in full[d::k]],
                               [r[2] for r in full[d::k]], [r[3] for r in full[d::k]]) for d in range(k))


class EmulatedTrainEngine(TrainEngine):
    """``swap``: a step on shared devices pays the swap (a pool's devices); False: trainers of
    LoRA adapters of one base taking turns on their devices, which keep the base and every
    adapter's states resident (one trainer process training several adapters), swap nothing."""

    def __init__(self, inner: TrainEngine, device: EmulatedDevice, swap: bool = True) -> None:
        self.inner, self.device, self.swap = inner, device, swap

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        share = self.device.share
        if share is None:
            return self._step(batch, 0.0)
        with share.claim():  # devices a pool takes turns on: held from the pool's pause to the step's end
            return self._step(batch, self.device.cost.swap_s(self.device.cfg.count) if self.swap else 0.0)

    def _step(self, batch: TrainBatch, swap_s: float) -> dict[str, float]:
        """One step held for its modelled time, plus ``swap_s`` (the training states onto shared
        devices and off again, the pool's weights off and back)."""
        with self.device.hold("train") as price:
            out = self.inner.train_step(batch)
            if self.device.cost is not None:
                price(self._modelled(batch) + swap_s)
        return out

    def _modelled(self, batch: TrainBatch) -> float:
        epochs = getattr(getattr(self.inner, "cfg", None), "ppo_epochs", 1)
        # the forward-only passes the trainer's step makes: the proximal one, the reference model's
        passes = int(getattr(self.inner, "proximal_pass", False))
        passes += int(getattr(self.inner, "ref_model", None) is not None)
        cost = self.device.cost
        # what a model generated (each sample's trained tokens and the earlier turns in its
        # context) at the generated scale; the prompts' and the environment's text at the prompt's
        generated = sum(s.trained_tokens + s.context_generated for s in batch.samples)
        held = sum(len(s.prompt_ids) + len(s.completion_ids) for s in batch.samples)
        tokens = cost.modelled_tokens(held - generated, generated)
        return cost.train_step_s(tokens * epochs, tokens * passes, devices=self.device.cfg.count)

    def named_weights(self, *args, **kwargs):
        return self.inner.named_weights(*args, **kwargs)

    def save_checkpoint(self, directory, extra_state):
        return self.inner.save_checkpoint(directory, extra_state)

    def load_checkpoint(self, directory):
        return self.inner.load_checkpoint(directory)

    def export_hf(self, directory, weights=None):
        return self.inner.export_hf(directory, weights)

    @property
    def step(self) -> int:
        return self.inner.step

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str):  # rank, world, barrier, cfg, ... of the wrapped trainer
        return getattr(self.inner, name)
