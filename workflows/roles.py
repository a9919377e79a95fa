"""How a workflow's roles sample, and one episode run against the contract.

A workflow calls ``ep.roles[name].generate``; behind the name is a :class:`~.types.Role`:
an :class:`EngineRole` on an engine in this process, or (on a RaaS node, for a role another
policy's pool serves) a role over Kafka (:mod:`astraflow.actors.generation`). Every role is
wrapped so that a workflow never invents seeds (:func:`role_seed`: a redone episode
reproduces its samples wherever it runs), its calls are sequential
(:class:`ConcurrentGenerateError`) and a call asks only for sampling the trainer can
reproduce (:func:`call_sampling`). :func:`run_episode` is the whole contract in one call,
used by the rollout actor, the in-process sequential baseline and tests alike.

It knows engines through their interface (:mod:`astraflow.engines.base`); nothing about
Kafka, the registry's names or training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from astraflow.engines.base import Generation, RolloutEngine, SamplingParams, generated_context, prompt_rows

from .registry import WorkflowSpec
from .types import Episode, EpisodeResult, Role, Turn


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
        return [self.turn(g, generated_context(p)) for g, p in zip(gens, prompts)]

    def _call(self, prompts, params, seeds) -> list[Generation]:
        if self.before_call is not None:
            self.before_call()
        return self.engine.generate(prompt_rows(prompts), params, seeds=list(seeds))

    def turn(self, g: Generation, context_generated: int = 0) -> Turn:
        """The turn of ``g``; ``context_generated``: of its prompt, the tokens a model generated."""
        return Turn(tuple(g.prompt_ids), tuple(g.tokens), tuple(g.logprobs), g.version, g.finish_reason,
                    self.tokenizer.decode(list(g.tokens), skip_special_tokens=True), self.name, self.policy,
                    tuple(g.token_versions), context_generated)


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
            prompts = prompt_rows(prompts)
            if seeds is None:
                seeds = [role_seed(self._seed, self._episode, self.name, self._calls, j) for j in range(len(prompts))]
            self._calls += 1
            more = {"stop": stop} if stop else {}  # (a role written before stop sequences takes none)
            out = self._role.generate(prompts, seeds=seeds, max_new_tokens=max_new_tokens, temperature=temperature,
                                      **more)
            self.turns += len(out)
            return out


class _OneCallAtATime:
    """The episode's ``generate`` calls, one at a time (see :class:`~.types.Role`): a second call while
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


def run_episode(spec: WorkflowSpec, episode: Episode, job_seed: int) -> EpisodeResult:
    """Run one episode with seeded role handles; check what it returns against the contract."""
    guard = _OneCallAtATime(episode.episode_id)
    seeded = {name: _SeededRole(role, job_seed, episode.episode_id, guard) for name, role in episode.roles.items()}
    missing = set(spec.roles) - set(seeded)
    if missing:
        raise KeyError(f"workflow {spec.name!r} needs roles {sorted(missing)} bound to a policy")
    ep = dataclasses.replace(episode, roles=seeded)  # every field kept (prompt_ids among them)
    result = spec.fn(ep)
    if not isinstance(result, EpisodeResult):
        raise TypeError(f"workflow {spec.name!r} returned {type(result).__name__}, not EpisodeResult")
    for role, trajs in result.trajectories.items():
        if role not in seeded:
            raise KeyError(f"workflow {spec.name!r} returned trajectories for unknown role {role!r}")
        if trajs and seeded[role].turns == 0:
            raise ValueError(f"workflow {spec.name!r}: role {role!r} returned trajectories but generated nothing")
    return result
