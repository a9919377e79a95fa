"""Dealing emulated devices over every policy's pool and trainer at the lowest priced bound.

A split is ``{policy: {"rollout": d, "trainer": d}}``, or ``{policy: {"shared": d}}`` for a
policy whose pool and trainer take turns on the same devices. The search tries every way to
deal the devices and keeps the one whose busiest stage is priced lowest; the price of a stage
on ``d`` devices comes from the caller (Table 2 prices (c)'s calls with the cost model,
:func:`split_from_runs` prices a team's own runs). Knows nothing about how a run is launched.
"""

from __future__ import annotations

import itertools
import math

from astraflow.benchmarks.lib.emulated import stage_of

STAGES = ("rollout", "trainer")

#: a shared placement is taken only when priced this much below the best disjoint one: the
#: turn-taking's waits (a pool's calls, and the other policy's episodes that need them, stand
#: still for a step) are not in the price
SHARE_MARGIN = 0.05


def devices_of_stage(parts: dict[str, int], stage: str) -> int:
    """A policy's devices for ``stage`` in a split: its own, or those its pool and trainer share."""
    return parts["shared"] if "shared" in parts else parts[stage]


def placement(parts: dict[str, int]) -> str:
    """A policy's place in a split, in words."""
    if "shared" in parts:
        return f"pool and trainer taking turns on {parts['shared']}"
    return f"pool {parts['rollout']} + trainer {parts['trainer']}"


def min_max_split(keys: list[tuple[str, str]], devices: int, price, allowed) -> dict | None:
    """Of every way to deal ``devices`` over the stages ``keys`` ((policy, "rollout" |
    "trainer"), each at least one device, ``allowed(key, d)``), the one whose largest
    ``price(key, d)`` is smallest: ``{"split": {policy: {stage: d}}, "priced_stage_s",
    "priced_bound_s_per_iter"}``, or None when no way is allowed. The search of every split
    rule here (Table 2's, the re-priced one, the team at scale's)."""
    best = None
    for cut in itertools.combinations(range(1, devices), len(keys) - 1):
        parts = [b - a for a, b in zip((0, *cut), (*cut, devices))]
        if not all(allowed(key, d) for key, d in zip(keys, parts)):
            continue
        stages = {f"{p}.{st}": price((p, st), d) for (p, st), d in zip(keys, parts)}
        if best is None or max(stages.values()) < best[0]:
            best = (max(stages.values()), parts, stages)
    if best is None:
        return None
    split: dict[str, dict[str, int]] = {}
    for (p, st), d in zip(keys, best[1]):
        split.setdefault(p, {})[st] = d
    return {"split": split, "priced_stage_s": best[2], "priced_bound_s_per_iter": best[0]}


def best_placement(policies: list[str], devices: int, price, allowed, shareable: bool) -> dict | None:
    """:func:`min_max_split` over each placement of the ``policies``: every pool and trainer on
    devices of its own, or (``shareable``) some policies' pool and trainer taking turns on the
    same devices (stage ``"shared"``, ``price((p, "shared"), d)``, ``device.share``). A shared
    placement is taken when its priced bound is ``SHARE_MARGIN`` below the best disjoint one's;
    the answer keeps that one as ``disjoint``."""
    best, disjoint = None, None
    for k in range(len(policies) + 1 if shareable else 1):
        for shared in itertools.combinations(policies, k):
            keys = [(p, st) for p in policies for st in (("shared",) if p in shared else STAGES)]
            got = min_max_split(keys, devices, price, allowed)
            if got is None:
                continue
            if not shared:
                disjoint = best = got
            elif best is None or got["priced_bound_s_per_iter"] < best["priced_bound_s_per_iter"] * (
                    1 - SHARE_MARGIN if best is disjoint else 1):
                best = got
    if best is None:
        return None
    return {**best, **({"disjoint": disjoint} if disjoint is not None and best is not disjoint else {})}


def split_from_runs(split: dict[str, dict[str, int]], reps: list[dict], key: str, devices: int,
                    train_scaling: float, need: int, fits=lambda d: True, grow: float = 1.0,
                    swap=None) -> dict | None:
    """The split of ``devices`` priced on the team's own runs on ``split`` (``reps``: each one's
    modelled work per iteration by resource under ``key``, the mean over them), the batch
    ``grow`` times theirs. A pool's work is its nodes' busy seconds times the devices each
    holds, dealt over ``d`` devices (the same work per device at any size: conservative, as a
    pool of fewer devices decodes more rows per step); a trainer's is rescaled to ``d``-way data
    parallel with the profile's efficiency ``train_scaling`` per doubling, as Table 2's
    ``choose_split`` does. Trainers keep >= ``need`` devices; a pool's ``d`` must pass ``fits``.
    With ``swap`` (the swap's price on ``d`` devices, ``CostModel.swap_s``) a policy's pool and
    trainer may also take turns on the same ``d`` devices, priced as the sum of both plus a swap
    per iteration (:func:`best_placement`); a shared policy of the runs had its swaps in its
    trainer's work, taken out before pricing."""
    s = lambda d: train_scaling ** math.log2(d)  # noqa: E731
    mean = lambda k: sum(r[key].get(k, 0.0) for r in reps) / len(reps)  # noqa: E731
    device_s: dict[tuple[str, str], float] = {}
    for p, parts in split.items():
        nodes = [k for k in reps[0][key] if stage_of(k) == (p, "rollout")]
        pool_d, train_d = devices_of_stage(parts, "rollout"), devices_of_stage(parts, "trainer")
        swapped = swap(train_d) if swap is not None and "shared" in parts else 0.0
        device_s[p, "rollout"] = sum(mean(k) for k in nodes) * pool_d / max(1, len(nodes)) * grow
        device_s[p, "trainer"] = (mean(f"trainer.{p}") - swapped) * train_d * s(train_d) * grow

    def price(k: tuple[str, str], d: int) -> float:
        p, st = k
        if st == "shared":
            return price((p, "rollout"), d) + price((p, "trainer"), d) + swap(d)
        return device_s[k] / (d if st == "rollout" else d * s(d))

    return best_placement(sorted(split), devices, price,
                          lambda k, d: d >= need if k[1] != "rollout" else fits(d), swap is not None)
