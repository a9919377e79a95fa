"""Partial rollouts on an emulated device: the rows in flight go on under new weights.

A real engine with ``rollout.partial`` (``CpuEngine.set_weight_refresh``) stops its live rows
between two tokens when newer weights come, loads them, prefills prompt and tokens so far
again and goes on. An emulated engine computes a call's real tokens at once and then holds
it for its modelled decode (:class:`~.batching.BatchingClock`), so its rows are "in flight"
in modelled time only. :class:`InFlightRows` keeps the calls being held; when newer weights
come (:meth:`switch`), the device group stops (the clock pauses: no step starts), the load is
held for its modelled time, and every row not finished is cut where the schedule has decoded
it — ``k`` real tokens, its modelled tokens so far over ``token_scale x`` its length factor —
and its rest is generated again by the real engine under the new weights, from prompt + the
``k`` tokens kept, with a seed of its own (the row's seed and ``k``: a fresh draw of the rest,
never the old rest relabelled). The row is settled to its new length on the schedule and,
on resume, each device first prefills again the context its running rows held (KV
recomputed, as the CPU engine does, for the same reason: keys and values of the old weights
would make every later token a function of two versions). Every token keeps the version
that generated it. ``max_versions`` bounds the versions one row may span: a switch that would
take a row past it waits for that row's call to end.

It knows the clock, the wrapped engine's ``generate`` and ``load_weights``, and nothing about
Kafka, subscribers or the node.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Callable

from astraflow.engines.base import Generation, PromptRow, SamplingParams, generated_context

from .batching import BatchingClock

__all__ = ["InFlightRows", "continuation_seed"]


def continuation_seed(seed: int, kept: int, version: int) -> int:
    """The seed of a row's rest regenerated after ``kept`` tokens under ``version``."""
    key = f"{int(seed)}\x1f{int(kept)}\x1f{int(version)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


@dataclasses.dataclass
class _Call:
    prompts: list
    out: list[Generation]
    params: SamplingParams
    seeds: list[int]
    factors: list[float]
    spans: list[int]


class InFlightRows:
    """The calls an emulated engine holds on its clock, and the switch of their live rows to new weights."""

    def __init__(self, clock: BatchingClock, token_scale: int) -> None:
        self.clock, self.token_scale = clock, token_scale
        self._calls: dict[int, _Call] = {}
        self._lock = threading.Lock()
        self.max_versions = 0
        self.rows = 0  #: rows continued under a newer version
        self.recomputed_tokens = 0  #: real tokens prefilled again for them (prompt + tokens kept)

    def add(self, call: int, prompts, out: list[Generation], params: SamplingParams, seeds, factors) -> None:
        seeds = list(seeds) if seeds is not None else [0] * len(prompts)
        with self._lock:
            self._calls[call] = _Call(list(prompts), list(out), params, seeds, list(factors), [1] * len(out))

    def holding(self) -> bool:
        """Calls are held (a load now cuts their live rows)."""
        with self._lock:
            return bool(self._calls)

    def pop(self, call: int) -> list[Generation]:
        """A call is done: its rows as they ended."""
        with self._lock:
            return self._calls.pop(call).out

    def may_switch(self) -> bool:
        """No live row would span more than ``max_versions`` versions."""
        if not self.max_versions:
            return True
        with self._lock:
            calls = list(self._calls.items())
        for call, c in calls:
            for i, done in enumerate(self.clock.progress(call)):
                if done is not None and c.spans[i] >= self.max_versions:
                    return False
        return True

    def switch(self, generate: Callable, version: int) -> int:
        """The weights changed to ``version`` (the clock paused by the caller): every live row of
        every held call is cut where the schedule has decoded it and its rest generated again
        with ``generate`` (the wrapped engine's, new weights loaded). Returns the rows continued."""
        with self._lock:
            calls = list(self._calls.items())
        cut: list[tuple[int, _Call, int, int]] = []  # (call, its record, row, real tokens kept)
        for call, c in calls:
            for i, decoded in enumerate(self.clock.progress(call)):
                if decoded is None:
                    continue
                g = c.out[i]
                kept = min(len(g.tokens), int(decoded // (self.token_scale * c.factors[i])))
                if kept >= len(g.tokens) or c.params.max_new_tokens - kept < 1:
                    continue  # its last token is being decoded: nothing left to generate again
                cut.append((call, c, i, kept))
        by_params: dict[SamplingParams, list] = {}
        for item in cut:
            by_params.setdefault(dataclasses.replace(item[1].params, seed=None), []).append(item)
        for params, items in by_params.items():
            # rows of one sampling setting in one call; each asks for what is left of its own budget
            # (the longest's, cut per row after: the engine's own length cap is per call)
            longest = max(c.params.max_new_tokens - kept for _, c, _, kept in items)
            prompts = [PromptRow([*c.prompts[i], *c.out[i].tokens[:kept]],
                                 generated_context(c.prompts[i]) + kept) for _, c, i, kept in items]
            seeds = [continuation_seed(c.seeds[i], kept, version) for _, c, i, kept in items]
            rests = generate(prompts, dataclasses.replace(params, max_new_tokens=longest), seeds)
            for (call, c, i, kept), rest in zip(items, rests):
                budget = c.params.max_new_tokens - kept
                tokens, logprobs = rest.tokens[:budget], rest.logprobs[:budget]
                reason = rest.finish_reason if len(rest.tokens) <= budget else "length"
                old = c.out[i]
                versions = old.versions()[:kept] + (version,) * len(tokens)
                with self._lock:  # a row cut before its first token is all the new version's
                    c.out[i] = Generation(old.prompt_ids, old.tokens[:kept] + tuple(tokens),
                                          old.logprobs[:kept] + tuple(logprobs), reason,
                                          versions[0] if versions else version,
                                          versions if len(set(versions)) > 1 else ())
                    c.spans[i] = c.spans[i] + 1 if kept else 1
                self.clock.resettle(call, i, kept + len(tokens))
                self.rows += 1
                self.recomputed_tokens += len(c.prompts[i]) + kept
        return len(cut)
