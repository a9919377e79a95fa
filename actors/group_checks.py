"""What a trajectory group may hold: the content checks the dataflow makes before a group
enters a batch, and the conservation audit makes again (issue 29, item 3).

A group signed by the job's RaaS pool (:class:`~astraflow.actors.signing.GroupGate`) is the
pool's output, but a buggy or compromised node can still sign content no engine produces.
Before a group is admitted to a batch, :func:`impossible` checks (the group's size first,
then its prompt, then each sample in turn; the first check that fails names the refusal):

* ``group_size`` — the group holds the trajectories its workflow returns for a task of
  ``n_samples`` samples (exactly ``n``, unless the workflow declares ``group_sizes``);
* ``length_mismatch`` — each sample's logprobs, versions, loss mask and token roles are one
  per token (the codec refuses such a record on decode already; this keeps the check
  where groups are built in-process), and no sample lacks a context;
* ``token_out_of_vocab`` — every token id (the group's prompt, each sample's context and
  completion) is in ``[0, vocab_size)`` of the policy's model (its ``config.json``);
* ``length_over_limit`` — the prompt is no longer than the task's prompt allows (one token per
  UTF-8 byte, plus :data:`PROMPT_SLACK`; when the prompt is known), each turn (a run of trained tokens) no longer than
  the longest ``generate`` call may return (``rollout.max_new_tokens``, or the workflow's own
  ``turn_tokens``), and context plus completion within the model's ``max_position_embeddings``;
* ``reward_not_finite`` / ``reward_out_of_range`` — every reward (and the group's numeric
  statistics) is finite, and each reward lies in the range the role's reward declares
  (:func:`astraflow.workflows.api.reward`, ``reward_ranges`` of the workflow).

``unknown_task`` (a group for a task the dataflow never published) is decided by the
dataflow and the audit themselves, from what they know of the tasks. Each check is a loop or
a ``min`` / ``max`` over the token lists: no model is loaded, no tokenizer run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from astraflow.config import JobConfig
from astraflow.topics import TrajectoryGroup

__all__ = ["CONTENT_REASONS", "GroupLimits", "ImpossibleGroup", "PROMPT_SLACK", "impossible", "limits_for"]

#: the refusals :func:`impossible` names, in the order it checks them; ``unknown_task`` last
CONTENT_REASONS = ("group_size", "length_mismatch", "token_out_of_vocab", "length_over_limit", "reward_not_finite",
                   "reward_out_of_range", "unknown_task")

#: tokens a prompt may have beyond one per UTF-8 byte of its text (a tokenizer's word-start marker)
PROMPT_SLACK = 2


class ImpossibleGroup(ValueError):
    """Why a group was refused (its dead letter's error): ``"<reason>: <detail>"``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class GroupLimits:
    """What the groups of one policy's lane may hold (:func:`limits_for`)."""

    vocab_size: int
    max_positions: int | None  #: None: the model declares none
    turn_tokens: int  #: the most tokens one turn may have
    n_samples: int  #: samples per task (the lead policy's ``rollout.n_samples``)
    #: role -> (low, high): a group holds ``low * n`` to ``high * n`` trajectories
    group_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: role -> (low, high) of its rewards
    reward_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)

    def role_of(self, g: TrajectoryGroup) -> str:
        return g.role if g.role in self.reward_ranges else next(iter(self.reward_ranges), "")


def limits_for(cfg: JobConfig, policy: str) -> GroupLimits:
    """The limits of ``policy``'s groups in the job ``cfg``: its model's shape (read from its
    ``config.json``, or the tiny model's spec), the rollout settings and the workflow's
    declarations."""
    from astraflow.models.bootstrap import model_shape
    from astraflow.workflows.api import get_workflow
    view = cfg.view(policy)
    shape = model_shape(view.model.path, view.model.seed, view.model.task, view.model.max_positions, view.model.name)
    spec = get_workflow(cfg.workflow.name)
    params = dict(cfg.workflow.params)
    n = cfg.view(cfg.lead_policy).rollout.n_samples  # a task carries the lead's n_samples to every role
    longest = max(cfg.view(p).rollout.max_new_tokens for p in cfg.policy_names)  # a role may call another pool
    roles = [r for r, p in cfg.role_policies.items() if p == policy] or [spec.roles[0]]
    return GroupLimits(shape.vocab_size, shape.max_positions, int(spec.turn_tokens(params, longest)), n,
                       {r: spec.group_size(r, 1) for r in roles},
                       {r: spec.role_reward_range(r, params) for r in roles})


def _ids_outside(ids, vocab: int) -> bool:
    return bool(ids) and (min(ids) < 0 or max(ids) >= vocab)


def _longest_run(mask) -> int:
    best = run = 0
    for m in mask:
        run = run + 1 if m else 0
        best = max(best, run)
    return best


def impossible(g: TrajectoryGroup, limits: GroupLimits, *, prompt_bytes: int | None = None,
               n_samples: int | None = None) -> tuple[str, str] | None:
    """``(reason, detail)`` of the first check ``g`` fails, or None when its content is possible.

    ``prompt_bytes``: the UTF-8 length of the task's prompt, when known (the prompt bound is
    skipped without it); ``n_samples``: the task's (default: the job's). A failed group (no
    samples) is not checked: it is dropped as ``failed`` anyway."""
    if g.status != "ok" or not g.samples:
        return None
    role = limits.role_of(g)
    n_task = limits.n_samples if n_samples is None else n_samples
    lo, hi = (k * n_task for k in limits.group_sizes.get(role, (1, 1)))
    if not lo <= len(g.samples) <= hi:
        want = f"{lo}" if lo == hi else f"{lo} to {hi}"
        return "group_size", f"{len(g.samples)} trajectories; a group of role {role or 'the only role'!r} holds {want}"
    vocab = limits.vocab_size
    if _ids_outside(g.prompt_ids, vocab):
        return "token_out_of_vocab", (f"prompt_ids hold ids {min(g.prompt_ids)}..{max(g.prompt_ids)}, outside the "
                                      f"model's vocabulary [0, {vocab})")
    if prompt_bytes is not None and len(g.prompt_ids) > prompt_bytes + PROMPT_SLACK:
        return "length_over_limit", (f"prompt_ids hold {len(g.prompt_ids)} tokens; the task's prompt of "
                                     f"{prompt_bytes} bytes tokenizes to at most {prompt_bytes + PROMPT_SLACK}")
    low, high = limits.reward_ranges.get(role, (0.0, 1.0))
    for i, s in enumerate(g.samples):
        n = len(s.tokens)
        for name in ("logprobs", "versions", "loss_mask", "token_roles"):
            got = len(getattr(s, name))
            if got != n and not (name in ("loss_mask", "token_roles") and got == 0):
                return "length_mismatch", f"samples[{i}].{name} has {got} entries for {n} tokens"
        context = s.prompt_ids or g.prompt_ids
        if n and not context:
            return "length_mismatch", f"samples[{i}] has no context (no prompt_ids of its own or the group's)"
        for name, ids in (("tokens", s.tokens), ("prompt_ids", s.prompt_ids)):
            if _ids_outside(ids, vocab):
                return "token_out_of_vocab", (f"samples[{i}].{name} hold ids {min(ids)}..{max(ids)}, outside the "
                                              f"model's vocabulary [0, {vocab})")
        turn = _longest_run(s.loss_mask) if s.loss_mask else n
        if turn > limits.turn_tokens:
            return "length_over_limit", (f"samples[{i}] has a turn of {turn} tokens; a generate call returns at "
                                         f"most {limits.turn_tokens}")
        if limits.max_positions is not None and len(context) + n > limits.max_positions:
            return "length_over_limit", (f"samples[{i}] is {len(context)} context + {n} tokens, over the model's "
                                         f"{limits.max_positions} positions")
        r = s.reward
        if not isinstance(r, (int, float)) or not math.isfinite(r):
            return "reward_not_finite", f"samples[{i}].reward is {r!r}"
        if not low <= r <= high:
            return "reward_out_of_range", (f"samples[{i}].reward is {r}; role {role or 'the only role'!r}'s rewards "
                                           f"lie in [{low}, {high}]")
    for k in TrajectoryGroup.NUMERIC_STATS:
        v = g.stats.get(k)
        if v is not None and not math.isfinite(v):
            return "reward_not_finite", f"stats[{k!r}] is {v!r}"
    return None
