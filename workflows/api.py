"""The workflow contract: plain Python episodes over named roles.

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
"""

from __future__ import annotations

import contextlib
import math
import hashlib
import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from astraflow.engines.base import Generation, RolloutEngine, SamplingParams

__all__ = ["Turn", "Trajectory", "EpisodeResult", "Episode", "Role", "EngineRole", "WorkflowSpec", "WorkflowParamError",
           "workflow", "get_workflow", "WORKFLOWS", "reward", "get_reward", "get_scorer", "takes_metadata",
           "REWARDS", "REWARD_RANGES", "reward_range", "UNBOUNDED", "run_episode",
           "ENV", "role_seed", "ConcurrentGenerateError", "SamplingOverrideError", "call_sampling", "RuleChoices"]

ENV = "env"  #: the writer of tokens that no role generated (feedback, tool output)


@dataclass(frozen=True)
class Turn:
    """What one row of a ``generate`` call produced."""

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    version: int  #: weight version of the policy that generated every token
    finish_reason: str
    text: str  #: the tokens decoded (special tokens skipped)
    role: str
    policy: str


@dataclass(frozen=True)
class Trajectory:
    """One sequence a role is trained on.

    ``prompt_ids`` is context before the first token; ``tokens`` the rest, where
    ``loss_mask[i] == 1`` marks a token this role generated (trained on, with its
    ``logprobs[i]`` and ``versions[i]``) and 0 context written by another role or the
    environment (``token_roles[i]`` says by whom; its logprob and version are 0).

    ``prompt_ids`` is never empty: the first token is trained as predicted from the one
    before it, so a trajectory without context cannot be trained, and on the topic an
    empty :attr:`Sample.prompt_ids <astraflow.topics.Sample.prompt_ids>` means "the task's
    prompt" — a context-free trajectory would be trained after the task prompt it never
    saw. Building one raises ``ValueError``; a chain that begins with context passes that
    context as its ``prompt_ids``.
    """

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    loss_mask: tuple[int, ...]
    token_roles: tuple[str, ...]
    reward: float
    finish_reason: str
    text: str = ""
    info: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("trajectory: prompt_ids is empty; a trajectory needs the context its first token "
                             "was generated from (e.g. ep.encode(ep.prompt), or the chain's leading context) — an "
                             "empty prompt would be read as the task's prompt at training time")
        n = len(self.tokens)
        for name in ("logprobs", "versions", "loss_mask", "token_roles"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"trajectory: {n} tokens but {len(getattr(self, name))} {name}")
        if n and not any(self.loss_mask):
            raise ValueError("trajectory: no token is trained on (loss_mask is all 0)")

    @classmethod
    def of(cls, turn: Turn, reward: float, **info: Any) -> "Trajectory":
        """A single-turn trajectory: the turn's prompt is context, every token is trained on."""
        n = len(turn.tokens)
        return cls(turn.prompt_ids, turn.tokens, turn.logprobs, (turn.version,) * n, (1,) * n, (turn.role,) * n,
                   float(reward), turn.finish_reason, turn.text, dict(info))

    @classmethod
    def chain(cls, prompt_ids: Sequence[int], parts: Sequence[Turn | tuple[str, Sequence[int]]], role: str,
              reward: float, **info: Any) -> "Trajectory":
        """A multi-turn trajectory of ``role``: ``parts`` in order, each a :class:`Turn` (trained on
        iff written by ``role``) or ``(writer, token ids)`` context from another role or :data:`ENV`.

        Tokens in, tokens out: each turn of ``role`` must have been generated from exactly
        ``prompt_ids`` + the tokens of the parts before it (else ``ValueError``), so what is
        trained is the sequence the engine saw and produced, never a re-tokenized history."""
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        mask: list[int] = []
        roles: list[str] = []
        last, text = "stop", ""
        for k, p in enumerate(parts):
            if isinstance(p, Turn):
                own = p.role == role
                if own and tuple(p.prompt_ids) != tuple(prompt_ids) + tuple(tokens):
                    raise ValueError(
                        f"trajectory of role {role!r}: part {k} (a turn of its own) was generated from a prompt of "
                        f"{len(p.prompt_ids)} tokens that is not the {len(prompt_ids) + len(tokens)} tokens built "
                        f"so far (prompt_ids + the parts before it); its logprobs would be trained on a context "
                        f"the policy never saw — build each turn's prompt from the exact tokens of the chain, "
                        f"never by re-tokenizing text")
                tokens += p.tokens
                logprobs += p.logprobs if own else [0.0] * len(p.tokens)
                versions += [p.version if own else 0] * len(p.tokens)
                mask += [1 if own else 0] * len(p.tokens)
                roles += [p.role] * len(p.tokens)
                if own:
                    last, text = p.finish_reason, p.text
            else:
                writer, ids = p
                tokens += ids
                logprobs += [0.0] * len(ids)
                versions += [0] * len(ids)
                mask += [0] * len(ids)
                roles += [writer] * len(ids)
        return cls(tuple(prompt_ids), tuple(tokens), tuple(logprobs), tuple(versions), tuple(mask), tuple(roles),
                   float(reward), last, text, dict(info))


@dataclass
class EpisodeResult:
    """A finished episode: per role, its trajectories; the team's outcome; free metrics."""

    trajectories: dict[str, list[Trajectory]]
    team_reward: float | None = None  #: e.g. correctness of the team's final answer
    metrics: dict[str, float] = field(default_factory=dict)


class ConcurrentGenerateError(RuntimeError):
    """A workflow called ``generate`` while another call of the same episode was in flight."""


class SamplingOverrideError(ValueError):
    """A ``generate`` call asked for sampling the policy's trainer cannot reproduce."""


def call_sampling(role: str, policy: str, sampling: Mapping[str, Any], *, max_new_tokens: int | None = None,
                  temperature: float | None = None, stop: Sequence[str] | None = None,
                  stop_token_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """The sampling settings of one ``generate`` call of ``role``: the policy's own
    (``sampling``: its ``rollout`` section, as the task or the node carries it), with
    ``max_new_tokens`` when given and not 0 (a length cap changes no token's probability)
    and the call's stop sequences when given (``stop`` strings, ``stop_token_ids``; they end
    a sample, they change no token's probability either: the trainer needs nothing of them).

    ``temperature`` may only repeat the policy's; any other value raises
    :class:`SamplingOverrideError`. The trainer of ``policy`` recomputes the logprob of every
    generated token at its ``rollout.temperature`` / ``top_p`` / ``top_k`` and weighs it by
    the ratio to the behaviour logprob the sample carries; a token drawn at another
    temperature would be weighted by the ratio of two different distributions, silently.
    To sample a role hotter or colder, set that role's policy's ``rollout.temperature``.
    """
    out = dict(sampling)
    if temperature is not None:
        have = float(sampling.get("temperature", 1.0))
        if float(temperature) != have:
            raise SamplingOverrideError(
                f"role {role!r} (policy {policy!r}): generate(temperature={temperature}) differs from the policy's "
                f"rollout.temperature {have}; the trainer computes importance ratios at the rollout temperature, "
                f"so per-call temperatures are refused — set policies.{policy}.rollout.temperature (or "
                f"rollout.temperature) instead")
    if max_new_tokens:
        out["max_new_tokens"] = int(max_new_tokens)
    if stop:
        if isinstance(stop, str):
            stop = [stop]
        bad = [x for x in stop if not isinstance(x, str) or not x]
        if bad:
            raise ValueError(f"role {role!r}: generate(stop=...) takes non-empty strings, got {bad[:3]!r}")
        out["stop"] = list(dict.fromkeys(stop))
    if stop_token_ids:
        out["stop_token_ids"] = [int(t) for t in stop_token_ids]
    return out


class Role(Protocol):
    """``ep.roles[name]``: sample from the policy bound to the role.

    An episode's ``generate`` calls are sequential: a call made (from another thread) while
    another call of the same episode, on any of its roles, is still running raises
    :class:`ConcurrentGenerateError`. Batch rows into one call instead (``prompts`` takes
    any number); the node already batches the calls of concurrent *episodes*. Why: the node
    coalesces calls by counting, per episode, whether it waits on an engine or another pool,
    and the seeds of call ``k`` follow the order of the calls, which threads would make
    depend on timing (a redone episode must reproduce its samples).
    """

    name: str
    policy: str

    def generate(self, prompts: Sequence[Sequence[int]], *, seeds: Sequence[int],
                 max_new_tokens: int | None = None, temperature: float | None = None,
                 stop: Sequence[str] | None = None) -> list[Turn]:
        """One completion per row of ``prompts``. ``max_new_tokens`` caps this call's length;
        ``temperature`` is accepted only equal to the policy's rollout temperature (see
        :func:`call_sampling`: anything else raises :class:`SamplingOverrideError`); ``stop``
        strings end a row (besides EOS) at the first token that completes one, which stays in
        the turn's tokens (e.g. a closing tool tag). A row whose context fills the model's
        positions finishes ``"context"`` (no token generated past them)."""
        ...


def role_seed(job_seed: int, episode_id: str, role: str, call: int, row: int) -> int:
    """The seed of row ``row`` of a role's ``call``-th generate call in an episode: a stable
    hash of those alone, so a redone episode reproduces its samples wherever it runs."""
    key = f"{int(job_seed)}\x1f{episode_id}\x1f{role}\x1f{call}\x1f{row}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


class EngineRole:
    """A role served by an engine in this process (the local case; also the sequential baseline).

    ``lock`` serialises engine calls when episodes run on several threads; ``before_call``
    (e.g. the weight subscriber's ``apply_to``) runs under it between requests.
    """

    def __init__(self, name: str, policy: str, engine: RolloutEngine, tokenizer, sampling: Mapping[str, Any],
                 lock=None, before_call: Callable[[], None] | None = None) -> None:
        self.name, self.policy, self.engine, self.tokenizer = name, policy, engine, tokenizer
        self.sampling, self.lock, self.before_call = dict(sampling), lock, before_call

    def params(self, max_new_tokens: int | None, temperature: float | None,
               stop: Sequence[str] | None = None) -> SamplingParams:
        sampling = call_sampling(self.name, self.policy, self.sampling, max_new_tokens=max_new_tokens,
                                 temperature=temperature, stop=stop)
        return SamplingParams.from_mapping(sampling, stop_token_ids=(self.tokenizer.eos_token_id,))

    def generate(self, prompts, *, seeds, max_new_tokens=None, temperature=None, stop=None) -> list[Turn]:
        params = self.params(max_new_tokens, temperature, stop)
        if self.lock is None:
            gens = self._call(prompts, params, seeds)
        else:
            with self.lock:
                gens = self._call(prompts, params, seeds)
        return [self.turn(g) for g in gens]

    def _call(self, prompts, params, seeds) -> list[Generation]:
        if self.before_call is not None:
            self.before_call()
        return self.engine.generate([list(p) for p in prompts], params, seeds=list(seeds))

    def turn(self, g: Generation) -> Turn:
        return Turn(tuple(g.prompt_ids), tuple(g.tokens), tuple(g.logprobs), g.version, g.finish_reason,
                    self.tokenizer.decode(list(g.tokens), skip_special_tokens=True), self.name, self.policy)


class _SeededRole:
    """Wraps a role so a workflow never has to invent seeds: call ``k`` row ``j`` draws
    :func:`role_seed` ``(job seed, episode, role, k, j)`` unless the workflow passes seeds."""

    def __init__(self, role: Role, job_seed: int, episode_id: str, guard: "_OneCallAtATime | None" = None) -> None:
        self._role, self._seed, self._episode, self._calls = role, job_seed, episode_id, 0
        self.name, self.policy = role.name, role.policy
        self._guard = guard or _OneCallAtATime(episode_id)
        self.turns = 0

    @property
    def max_new_tokens(self) -> int | None:
        """The policy's ``rollout.max_new_tokens`` (a call's default length), when the role says."""
        v = (getattr(self._role, "sampling", None) or {}).get("max_new_tokens")
        return int(v) if v else None

    def generate(self, prompts, *, seeds=None, max_new_tokens=None, temperature=None, stop=None) -> list[Turn]:
        with self._guard.call(self.name):
            prompts = [list(p) for p in prompts]
            if seeds is None:
                seeds = [role_seed(self._seed, self._episode, self.name, self._calls, j) for j in range(len(prompts))]
            self._calls += 1
            more = {"stop": stop} if stop else {}  # (a role written before stop sequences takes none)
            out = self._role.generate(prompts, seeds=seeds, max_new_tokens=max_new_tokens, temperature=temperature,
                                      **more)
            self.turns += len(out)
            return out


class _OneCallAtATime:
    """The episode's ``generate`` calls, one at a time (see :class:`Role`): a second call while
    one is in flight raises :class:`ConcurrentGenerateError` at once, never waits."""

    def __init__(self, episode_id: str) -> None:
        self.episode_id = episode_id
        self._lock = threading.Lock()
        self._busy: str | None = None

    @contextlib.contextmanager
    def call(self, role: str):
        with self._lock:
            if self._busy is not None:
                raise ConcurrentGenerateError(
                    f"episode {self.episode_id}: role {role!r} called generate while a call of role "
                    f"{self._busy!r} of the same episode is still in flight; an episode's generate calls must be "
                    f"sequential (pass several prompts to one call to batch them)")
            self._busy = role
        try:
            yield
        finally:
            with self._lock:
                self._busy = None


@dataclass
class Episode:
    """What a workflow function receives."""

    episode_id: str  #: the task id: stable across redeliveries
    prompt: str
    answer: str
    n_samples: int  #: the group size the job asks for (samples per role, as the workflow sees fit)
    roles: Mapping[str, Role]
    tokenizer: Any
    params: Mapping[str, Any] = field(default_factory=dict)  #: ``workflow.params`` of the job config
    metadata: Mapping[str, Any] = field(default_factory=dict)  #: the prompt's metadata (tests, ...)
    #: ``with ep.off_engine():`` around time spent on anything but ``generate`` (a tool, an
    #: environment step): the episode steps out of the node's batch, as a role served by
    #: another pool does, so the other episodes' engine calls do not wait for it
    off_engine: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    #: this try of the episode, unique per run (a redelivered episode gets a new one); what an
    #: out-of-process environment keys its sessions by
    attempt: str = ""

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


EpisodeFn = Callable[[Episode], EpisodeResult]


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
    #: checks ``workflow.params`` when a job config is loaded; raises :class:`WorkflowParamError`
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


def _load_builtin() -> None:
    # Importing the modules registers their workflows and rewards.
    from astraflow.workflows import builtin  # noqa: F401


def get_workflow(name: str) -> WorkflowSpec:
    _load_builtin()
    if name not in WORKFLOWS:
        raise KeyError(f"unknown workflow {name!r} (registered: {', '.join(sorted(WORKFLOWS))})")
    return WORKFLOWS[name]


def get_reward(name: str) -> Callable[..., float]:
    _load_builtin()
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


def run_episode(spec: WorkflowSpec, episode: Episode, job_seed: int) -> EpisodeResult:
    """Run one episode with seeded role handles; check what it returns against the contract."""
    guard = _OneCallAtATime(episode.episode_id)
    seeded = {name: _SeededRole(role, job_seed, episode.episode_id, guard) for name, role in episode.roles.items()}
    missing = set(spec.roles) - set(seeded)
    if missing:
        raise KeyError(f"workflow {spec.name!r} needs roles {sorted(missing)} bound to a policy")
    ep = Episode(episode.episode_id, episode.prompt, episode.answer, episode.n_samples, seeded, episode.tokenizer,
                 episode.params, episode.metadata, episode.off_engine, episode.attempt)
    result = spec.fn(ep)
    if not isinstance(result, EpisodeResult):
        raise TypeError(f"workflow {spec.name!r} returned {type(result).__name__}, not EpisodeResult")
    for role, trajs in result.trajectories.items():
        if role not in seeded:
            raise KeyError(f"workflow {spec.name!r} returned trajectories for unknown role {role!r}")
        if trajs and seeded[role].turns == 0:
            raise ValueError(f"workflow {spec.name!r}: role {role!r} returned trajectories but generated nothing")
    return result
