"""How long a version waits between arriving at a node and its engine loading it (what a
node's calls in flight cost the weights: ``raas.weights_wait_s``, the emulated Table 2's
"time weights wait to be loaded")."""

from __future__ import annotations

import time

import torch
from opentelemetry import trace

from astraflow.weights.held import HeldWeights


class _Engine:
    """The part of an engine the held weights talk to: its version and ``load_weights``."""

    def __init__(self) -> None:
        self.version, self.loaded = 0, []

    def load_weights(self, named, version: int) -> None:
        self.version = version
        self.loaded.append(version)


def test_each_load_adds_how_long_its_version_had_been_held():
    held = HeldWeights({"w": torch.zeros(2)}, version=0, epoch=0, policy="p", node_id="raas-0",
                       tracer=trace.get_tracer("test"))
    engine = _Engine()
    assert held.apply_to(engine) is None and held.load_waits == {"loads": 0, "wait_s": 0.0}  # nothing newer
    held.replace({"w": torch.ones(2)}, {"w": b"h"}, 0, 1, None, 0)
    time.sleep(0.2)  # the engine's calls in flight keep it busy meanwhile
    assert held.apply_to(engine) == 1
    first = held.load_waits
    assert first["loads"] == 1 and first["wait_s"] >= 0.2
    assert held.apply_to(engine) is None and held.load_waits == first  # the same version loads once
    held.replace({"w": torch.full((2,), 2.0)}, {"w": b"h2"}, 0, 2, None, 0)
    assert held.apply_to(engine) == 2  # loaded at once: it adds (almost) nothing
    assert held.load_waits["loads"] == 2 and held.load_waits["wait_s"] < first["wait_s"] + 0.2
    assert engine.loaded == [1, 2]
