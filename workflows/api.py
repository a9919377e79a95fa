"""The workflow contract as users import it: plain Python episodes over named roles.

A workflow is a function registered by name (``@workflow("solver_verifier", roles=...)``).
It receives one :class:`Episode` (the task, the roles, a tokenizer, its parameters) and may
use any control flow (retries, several turns, branching). Each ``ep.roles[name].generate``
call samples completions from the policy the job binds that role to: on this node's engine,
or, when another policy's pool serves it, over Kafka (:mod:`astraflow.actors.generation`).
The workflow returns, for every role that generated tokens, that role's
:class:`Trajectory` list with its own rewards and a loss mask: tokens written by another
role or by the environment are context and never trained on.

Nothing here knows about Kafka: the rollout actor turns an :class:`EpisodeResult` into one
trajectory group per role, written in one transaction with the task's offset (the episode
is the unit of exactly-once). :func:`run_episode` is the whole contract in one call, used
by the rollout actor, the in-process sequential baseline and tests alike.

The names live in three modules, re-exported here: :mod:`.types` (what an episode receives
and returns), :mod:`.roles` (how roles sample; :func:`run_episode`) and :mod:`.registry`
(workflows and rewards by name). The lookups of this module (:func:`get_workflow`,
:func:`get_reward`, :func:`get_scorer`, :func:`reward_range`, :func:`get_environment`)
register the shipped workflows, rewards and environments (:mod:`.builtin`) before they
look; a missing dependency of one of them raises its ``ModuleNotFoundError`` there, naming
the module, at config load.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from . import environments, registry
from .registry import (REWARD_RANGES, REWARDS, UNBOUNDED, WORKFLOWS, RuleChoices, WorkflowParamError, WorkflowSpec,
                       reward, takes_metadata, workflow)
from .roles import (ConcurrentGenerateError, EngineRole, SamplingOverrideError, call_sampling, role_seed,
                    run_episode)
from .types import ENV, Episode, EpisodeResult, PromptRow, Role, Trajectory, Turn, chain_context

__all__ = ["Turn", "Trajectory", "EpisodeResult", "Episode", "Role", "EngineRole", "WorkflowSpec", "WorkflowParamError",
           "workflow", "get_workflow", "WORKFLOWS", "reward", "get_reward", "get_scorer", "takes_metadata",
           "REWARDS", "REWARD_RANGES", "reward_range", "UNBOUNDED", "run_episode",
           "ENV", "role_seed", "ConcurrentGenerateError", "SamplingOverrideError", "call_sampling", "RuleChoices",
           "get_environment", "PromptRow", "chain_context"]

Lookup = TypeVar("Lookup", bound=Callable)


def _with_builtins(lookup: Lookup) -> Lookup:
    """``lookup``, once the shipped workflows, rewards and environments are registered."""
    @functools.wraps(lookup)
    def loaded(*args, **kwargs):
        # At the first lookup, not at import: the shipped modules (agent, code, OpenAI-endpoint
        # and HTTP environments) cost ~360 ms and 67 modules, which a process that only reads
        # these types (an actor importing Turn) does not pay.
        from . import builtin  # noqa: F401 - importing it registers them
        return lookup(*args, **kwargs)
    return loaded  # type: ignore[return-value]


get_workflow = _with_builtins(registry.get_workflow)
get_reward = _with_builtins(registry.get_reward)
get_scorer = _with_builtins(registry.get_scorer)
reward_range = _with_builtins(registry.reward_range)
get_environment = _with_builtins(environments.get_environment)
