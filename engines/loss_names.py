"""The RL losses a trainer config may name, and their parameters — data only, no torch.

Config validation (:mod:`astraflow.engines.config`) reads these, and so does every process
that loads a job config (the launcher, the CLI's ``status``/``run``); importing
:mod:`astraflow.engines.losses`, which holds the math, would load torch (~1.4 s) into each.
"""

from __future__ import annotations

__all__ = ["CORRECTIONS", "LOSS_PARAMS", "RETIRED_LOSSES"]

#: loss name -> the ``trainer.loss_params`` keys it takes
LOSS_PARAMS: dict[str, set[str]] = {
    "grpo": {"clip_eps", "clip_eps_high"},
    "decoupled_ppo": {"clip_eps", "iw_cap"},
    "m2po": {"tau"},
}
#: Names that once meant something else, with what to use instead.
RETIRED_LOSSES: dict[str, str] = {
    "ppo": "'ppo' was an alias of 'grpo' and has been removed: use 'grpo' (PPO-clip against the "
           "behaviour policy, group-relative advantages) or 'decoupled_ppo' (PPO-clip around the "
           "proximal policy, importance-weighted for stale samples)",
}
#: rollout-correction method (``trainer.correction.method``) -> the parameters it reads
#: (the math: :mod:`astraflow.engines.corrections`)
CORRECTIONS: dict[str, tuple[str, ...]] = {
    "tis": ("cap",),
    "mis_token": ("lo", "hi"),
    "mis_seq": ("lo", "hi"),
    "icepop": ("lo", "hi"),
    "geo_seq": ("lo", "hi"),
}
