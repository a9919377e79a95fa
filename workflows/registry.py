"""Workflows and rewards by name: how one is registered, found and checked.

``@workflow("solver_verifier", roles=...)`` registers an episode function with the roles it
calls and what the dataflow checks its groups against (:class:`WorkflowSpec`);
``@reward("name", low=, high=)`` registers a scorer of one completion with its range. The
shipped ones register when :mod:`.builtin` is imported; a user's from the module the job
config names (``workflow.module``).

The lookups here (:func:`get_workflow`, :func:`get_reward`, :func:`get_scorer`) see what is
registered so far; :mod:`astraflow.workflows.api`'s load the shipped ones first, and are
what code outside this package calls. This module knows nothing about roles, engines or
Kafka.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .types import EpisodeFn


#: a reward range that declares no bound (``reward(name, low=None, high=None)``)
UNBOUNDED = (float("-inf"), float("inf"))


def _default_turn_tokens(params: Mapping[str, Any], max_new_tokens: int) -> int:
    return max_new_tokens


@dataclass(frozen=True)
class WorkflowSpec:
    name: str
    fn: EpisodeFn
    roles: tuple[str, ...]  #: the role names the workflow calls (the job binds each to a policy)
    doc: str = ""
    #: the reward that scores one answer of the first role alone, unless ``workflow.params.reward``
    #: names another (what the evaluator's per-policy accuracy of the lead policy measures)
    reward: str = "exact_match"
    #: checks ``workflow.params`` when a job config is loaded; raises :class:`WorkflowParamError`.
    #: The params it gets hold ``_config`` too: the config file's path, beside which user code the
    #: params name is found (:func:`~.user_modules.import_user_module`)
    check: Callable[[Mapping[str, Any]], None] | None = None
    #: True: the held-out score is the mean reward of the first role's trajectories from whole
    #: episodes of the workflow (its reward comes from an environment over several turns, not
    #: from a scorer of one completion)
    episode_eval: bool = False
    #: role -> ``(low, high)`` its trajectories' rewards lie in, for a role whose rewards are not
    #: the reward function's (:func:`reward_range`) alone: the dataflow refuses a group outside it
    reward_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    #: role -> ``(low, high)``: a group of that role holds ``low * n`` to ``high * n`` trajectories
    #: for a task of ``n`` samples (default exactly ``n``)
    group_sizes: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: ``(params, rollout.max_new_tokens) -> the most tokens one generate call may return``: the
    #: longest turn (for a workflow whose calls pass their own ``max_new_tokens``)
    turn_tokens: Callable[[Mapping[str, Any], int], int] = _default_turn_tokens

    def role_reward_range(self, role: str, params: Mapping[str, Any] | None = None) -> tuple[float, float]:
        """What ``role``'s rewards may be: its declared range, else that of the reward the
        job's ``workflow.params.reward`` (or this workflow's default reward) names."""
        if role in self.reward_ranges:
            r = self.reward_ranges[role]
            if callable(r):  # a range that depends on the job's workflow.params
                lo, hi = r(dict(params or {}))
                return float(lo), float(hi)
            return r
        return reward_range(str((params or {}).get("reward", self.reward)))

    def group_size(self, role: str, n_samples: int) -> tuple[int, int]:
        """The fewest and most trajectories a group of ``role`` holds for ``n_samples``."""
        lo, hi = self.group_sizes.get(role, (1, 1))
        return lo * n_samples, hi * n_samples


class WorkflowParamError(ValueError):
    """A workflow's ``workflow.params`` entry is unusable; ``key`` names it (below ``params``)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


class RuleChoices:
    """A workflow's rule params: each key names one of its values, the first the default (the
    reference system's rule). An instance is the ``check`` of :func:`workflow`; ``rule(params,
    key)`` reads one."""

    def __init__(self, choices: Mapping[str, Sequence[str]]) -> None:
        self.choices = {k: tuple(v) for k, v in choices.items()}

    def __call__(self, params: Mapping[str, Any]) -> None:
        for key, allowed in self.choices.items():
            if key in params and params[key] not in allowed:
                raise WorkflowParamError(key, f"is {params[key]!r}; it is one of {', '.join(allowed)}")

    def rule(self, params: Mapping[str, Any], key: str) -> str:
        return str(params.get(key, self.choices[key][0]))


WORKFLOWS: dict[str, WorkflowSpec] = {}
REWARDS: dict[str, Callable[..., float]] = {}
#: reward name -> ``(low, high)``: what it may return (``-inf`` / ``inf`` where unbounded)
REWARD_RANGES: dict[str, tuple[float, float]] = {}


def workflow(name: str, roles: Sequence[str], reward: str = "exact_match",
             check: Callable[[Mapping[str, Any]], None] | None = None, *, episode_eval: bool = False,
             reward_ranges: Mapping[str, tuple[float, float]] | None = None,
             group_sizes: Mapping[str, tuple[int, int]] | None = None,
             turn_tokens: Callable[[Mapping[str, Any], int], int] | None = None) -> Callable[[EpisodeFn], EpisodeFn]:
    """Register an episode function under ``name``, calling roles ``roles``; ``reward`` scores one
    answer of the first role when the job's ``workflow.params`` name none; ``check`` validates
    ``workflow.params`` at config load (raising :class:`WorkflowParamError`); ``episode_eval``
    scores held-out rows by whole episodes (:attr:`WorkflowSpec.episode_eval`).

    What the dataflow checks a group of the workflow against (issue 29: a signed group with
    impossible content is refused), where the defaults do not hold: ``reward_ranges`` (role
    -> ``(low, high)`` of its rewards, or a function of ``workflow.params`` giving it; default:
    the range of the reward function, see
    :func:`reward`), ``group_sizes`` (role -> ``(low, high)``: a group holds ``low * n`` to
    ``high * n`` trajectories; default exactly ``n``) and ``turn_tokens`` (``(params,
    rollout.max_new_tokens) -> the longest turn``, for calls that pass ``max_new_tokens``)."""
    def deco(fn: EpisodeFn) -> EpisodeFn:
        if name in WORKFLOWS and not _same(WORKFLOWS[name].fn, fn):
            raise ValueError(f"workflow {name!r} registered twice")
        for role, r in (reward_ranges or {}).items():
            if not callable(r):
                _check_range(f"workflow {name!r}: reward_ranges[{role!r}]", *r)
        for role, (lo, hi) in (group_sizes or {}).items():
            if not (isinstance(lo, int) and isinstance(hi, int) and 0 < lo <= hi):
                raise ValueError(f"workflow {name!r}: group_sizes[{role!r}] is ({lo!r}, {hi!r}); "
                                 "it is (low, high) with 0 < low <= high, whole multiples of n_samples")
        WORKFLOWS[name] = WorkflowSpec(name, fn, tuple(roles), (fn.__doc__ or "").strip().split("\n")[0], reward,
                                       check, episode_eval, {role: r if callable(r) else (float(r[0]), float(r[1]))
                                                             for role, r in (reward_ranges or {}).items()},
                                       dict(group_sizes or {}), turn_tokens or _default_turn_tokens)
        return fn
    return deco


def reward(name: str, *, low: float | None = 0.0,
           high: float | None = 1.0) -> Callable[[Callable[..., float]], Callable[..., float]]:
    """Register a reward function under ``name``, returning values in ``[low, high]``.

    A reward is ``fn(completion_text, answer) -> float``, or, to see the row's metadata (the
    dataset's other columns: tests, units, a difficulty), ``fn(completion_text, answer, meta)``
    with a third positional parameter (or a keyword parameter named ``meta`` / ``metadata``).
    Callers score through :func:`get_scorer`, which passes the metadata only to rewards that
    take it, so two-argument rewards keep working unchanged.

    The range (default ``[0, 1]``; ``None`` for no bound on that side) is what the dataflow
    checks every trajectory's reward against: a group holding a reward outside it, or one
    that is not finite, is refused (``reward_out_of_range``, ``reward_not_finite``).
    """
    lo = float("-inf") if low is None else float(low)
    hi = float("inf") if high is None else float(high)
    _check_range(f"reward {name!r}", lo, hi)

    def deco(fn):
        if name in REWARDS and not _same(REWARDS[name], fn):
            raise ValueError(f"reward {name!r} registered twice")
        REWARDS[name] = fn
        REWARD_RANGES[name] = (lo, hi)
        return fn
    return deco


def _check_range(what: str, lo: float, hi: float) -> None:
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"{what}: the range ({lo}, {hi}) is empty; give low <= high (None: unbounded)")


def reward_range(name: str) -> tuple[float, float]:
    """The ``(low, high)`` reward ``name`` declared (default ``(0.0, 1.0)``); raises ``KeyError``
    for a reward never registered."""
    get_reward(name)
    return REWARD_RANGES.get(name, (0.0, 1.0))


def _same(a, b) -> bool:
    """The same function, or the same definition imported again (a reloaded module)."""
    return a is b or (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def get_workflow(name: str) -> WorkflowSpec:
    if name not in WORKFLOWS:
        raise KeyError(f"unknown workflow {name!r} (registered: {', '.join(sorted(WORKFLOWS))})")
    return WORKFLOWS[name]


def get_reward(name: str) -> Callable[..., float]:
    if name not in REWARDS:
        raise KeyError(f"unknown reward {name!r} (registered: {', '.join(sorted(REWARDS))})")
    return REWARDS[name]


def takes_metadata(fn: Callable[..., float]) -> str | int | None:
    """How ``fn`` takes a row's metadata: ``2`` (a third positional parameter or ``*args``), the
    name of its ``meta`` / ``metadata`` keyword parameter, or None (it takes two arguments)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: the two-argument contract
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in params):
        return 2
    for p in params:
        if p.kind == p.KEYWORD_ONLY and p.name in ("meta", "metadata"):
            return p.name
    return None


def get_scorer(name: str) -> Callable[[str, str, Mapping[str, Any] | None], float]:
    """The reward ``name`` as ``score(completion_text, answer, meta=None) -> float``: the row's
    metadata goes to a reward that takes it (:func:`reward`), never to one that does not."""
    fn = get_reward(name)
    how = takes_metadata(fn)

    def score(completion_text: str, answer: str, meta: Mapping[str, Any] | None = None) -> float:
        if how is None:
            return float(fn(completion_text, answer))
        if how == 2:
            return float(fn(completion_text, answer, dict(meta or {})))
        return float(fn(completion_text, answer, **{how: dict(meta or {})}))
    score.reward_name = name  # type: ignore[attr-defined]
    return score
