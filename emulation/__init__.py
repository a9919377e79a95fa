"""Emulated accelerators: one instrument to measure the schedule at a scale this machine lacks.

* :mod:`.profile` — ``profiles.yaml``: device kinds (H100, H200) and model shapes (Qwen3-8B,
  Qwen3-1.7B) with the source of every number, and the efficiencies applied to the peaks;
* :mod:`.cost` — the cost model: prefill, continuous-batching decode, training on k devices,
  weight load, in seconds of the emulated device;
* :mod:`.device` — the ``device`` config section and the clock that holds each call for its
  modelled time (sleeping) and accounts for the real work's CPU share;
* :mod:`.engines` — rollout and train engines on an emulated device (the real engine
  computes: the tiny model's tokens, log-probs and gradients are real, so learning is).

It measures the schedule and the plumbing (who waits for whom, how busy each device is,
what crosses Kafka); it says nothing about GPU kernels or about accuracy at the emulated
model's size. Every number it produces is in modelled seconds and labelled emulated. It
sits just above the engines and knows nothing about Kafka or the components.
"""

from .cost import CostModel
from .device import DeviceConfig, EmulatedDevice
from .engines import EmulatedRolloutEngine, EmulatedTrainEngine
from .profile import ProfileError, load_profile, profile_names

__all__ = ["CostModel", "DeviceConfig", "EmulatedDevice", "EmulatedRolloutEngine", "EmulatedTrainEngine",
           "ProfileError", "load_profile", "profile_names"]
