"""Crafted inputs for the data algorithms: prompts, groups with chosen rewards, outcomes."""

from __future__ import annotations

from astraflow.algorithms import Context, Outcome, build_pipeline
from astraflow.config import from_dict, JobConfig
from astraflow.topics import Prompt, Sample, TrajectoryGroup

CTX = Context(seed=0, groups_per_batch=4, n_samples=4, max_staleness=1)


def prompt(pid: str, text: str = "1+1=", source: str = "arithmetic", **metadata) -> Prompt:
    return Prompt(pid, text, "2", source, metadata)


def group(task_id: str, rewards, *, version: int = 0, prompt_id: str | None = None) -> TrajectoryGroup:
    samples = [Sample([5], [-0.1], [version], float(r), "stop") for r in rewards]
    return TrajectoryGroup(task_id, prompt_id or f"p-{task_id}", "policy", "raas-0", [1], samples,
                           scheduled_version=version)


def outcome(pid: str, rewards, **tags) -> Outcome:
    return Outcome(pid, tuple(float(r) for r in rewards), 0, tags)


def pipeline(*algorithms, B: int = 4, n_samples: int = 4, force_after_skips: int = 64, seed: int = 0):
    """The pipeline a job config with ``dataflow.algorithms: algorithms`` builds."""
    cfg = from_dict(JobConfig, {"job": "t", "seed": seed, "rollout": {"n_samples": n_samples},
                                "dataflow": {"groups_per_batch": B, "algorithms": list(algorithms),
                                             "force_after_skips": force_after_skips}})
    from astraflow.algorithms.pipeline import context_of
    return build_pipeline(cfg.dataflow.algorithms, context_of(cfg), force_after_skips)
