"""What a workflow receives and returns: an :class:`Episode` in, an :class:`EpisodeResult` out.

An episode holds the task, the roles (:class:`Role`: sample from the policy bound to it), a
tokenizer and the job's ``workflow.params``. Each ``generate`` call returns :class:`Turn` s;
the workflow builds, per role that generated tokens, that role's :class:`Trajectory` list
with its own rewards and a loss mask: tokens written by another role or by the environment
(:data:`ENV`) are context and never trained on.

These are plain data and one protocol. How a role samples (seeds, one call at a time, the
sampling a call may ask for) is :mod:`.roles`'; which workflows and rewards exist is
:mod:`.registry`'s. Nothing here knows about Kafka or training; of engines only the
:class:`~astraflow.engines.base.PromptRow` a chain's next prompt is (:func:`chain_context`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from astraflow.engines.base import PromptRow, generated_context

ENV = "env"  #: the writer of tokens that no role generated (feedback, tool output)


def chain_context(prompt_ids: Sequence[int], parts: Sequence["Turn | tuple[str, Sequence[int]]"]) -> PromptRow:
    """The prompt of a chain's next turn: ``prompt_ids`` then every part's tokens, as a
    :class:`~astraflow.engines.base.PromptRow` that says how many of them a model generated
    (every :class:`Turn`, every ``(writer, ids)`` whose writer is a role, not :data:`ENV`;
    ``prompt_ids``' own count when it is a row): what an emulated device prices as generated."""
    ids, generated = list(prompt_ids), generated_context(prompt_ids)
    for p in parts:
        part = p.tokens if isinstance(p, Turn) else p[1]
        ids += part
        generated += len(part) if isinstance(p, Turn) or p[0] != ENV else 0
    return PromptRow(ids, generated)


@dataclass(frozen=True)
class Turn:
    """What one row of a ``generate`` call produced."""

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    version: int  #: weight version of the policy that generated the first token
    finish_reason: str
    text: str  #: the tokens decoded (special tokens skipped)
    role: str
    policy: str
    #: per token, the version that generated it, when the turn went on under newer weights
    #: mid-generation (partial rollouts); empty: ``version`` generated every token
    token_versions: tuple[int, ...] = ()
    #: of ``prompt_ids``, how many tokens a model generated (the row's
    #: :class:`~astraflow.engines.base.PromptRow` count: earlier turns carried as context)
    context_generated: int = 0

    def versions(self) -> tuple[int, ...]:
        return self.token_versions or (self.version,) * len(self.tokens)


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
    #: of the context (``prompt_ids`` and the tokens ``loss_mask`` leaves out), how many tokens a
    #: model generated: an emulated trainer prices them as generated tokens, the rest as written ones
    context_generated: int = 0

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
        return cls(turn.prompt_ids, turn.tokens, turn.logprobs, turn.versions(), (1,) * n, (turn.role,) * n,
                   float(reward), turn.finish_reason, turn.text, dict(info), turn.context_generated)

    @classmethod
    def chain(cls, prompt_ids: Sequence[int], parts: Sequence[Turn | tuple[str, Sequence[int]]], role: str,
              reward: float, **info: Any) -> "Trajectory":
        """A multi-turn trajectory of ``role``: ``parts`` in order, each a :class:`Turn` (trained on
        iff written by ``role``) or ``(writer, token ids)`` context from another role or :data:`ENV`.

        Tokens in, tokens out: each turn of ``role`` must have been generated from exactly
        ``prompt_ids`` + the tokens of the parts before it (else ``ValueError``), so what is
        trained is the sequence the engine saw and produced, never a re-tokenized history.

        Of the context, a model generated: the tokens of ``prompt_ids`` a
        :class:`~astraflow.engines.base.PromptRow` says it did, every other role's turn and
        every ``(writer, ids)`` part whose writer is a role, not :data:`ENV`."""
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
                versions += p.versions() if own else [0] * len(p.tokens)
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
        generated = generated_context(prompt_ids) + sum(
            1 for m, w in zip(mask, roles) if not m and w != ENV)
        return cls(tuple(prompt_ids), tuple(tokens), tuple(logprobs), tuple(versions), tuple(mask), tuple(roles),
                   float(reward), last, text, dict(info), generated)


@dataclass
class EpisodeResult:
    """A finished episode: per role, its trajectories; the team's outcome; free metrics."""

    trajectories: dict[str, list[Trajectory]]
    team_reward: float | None = None  #: e.g. correctness of the team's final answer
    metrics: dict[str, float] = field(default_factory=dict)


class Role(Protocol):
    """``ep.roles[name]``: sample from the policy bound to the role.

    An episode's ``generate`` calls are sequential: a call made (from another thread) while
    another call of the same episode, on any of its roles, is still running raises
    :class:`~.roles.ConcurrentGenerateError`. Batch rows into one call instead (``prompts`` takes
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
        :func:`~.roles.call_sampling`: anything else raises :class:`~.roles.SamplingOverrideError`); ``stop``
        strings end a row (besides EOS) at the first token that completes one, which stays in
        the turn's tokens (e.g. a closing tool tag). A row whose context fills the model's
        positions finishes ``"context"`` (no token generated past them)."""
        ...


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
    #: the prompt rendered with the model's chat template when the task was made (empty: a raw
    #: prompt); :meth:`prompt_tokens` is what a workflow samples its first turn from
    prompt_ids: tuple[int, ...] = ()

    def prompt_tokens(self) -> list[int]:
        """The task's prompt as token ids: its chat rendering if it has one, else ``prompt`` encoded."""
        return list(self.prompt_ids) if self.prompt_ids else self.encode(self.prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


EpisodeFn = Callable[[Episode], EpisodeResult]
