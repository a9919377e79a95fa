"""How many weight versions one trajectory may span (``rollout.max_versions_per_trajectory``).

With partial rollouts (or turns generated under several versions) a trajectory's trained
tokens can come from several versions; a RaaS node refuses an episode past the bound before
it is written, as a transient failure the dataflow schedules again. Knows trajectories'
per-token versions and loss masks; nothing about engines, Kafka or how the episode ran.
"""

from __future__ import annotations

from collections.abc import Sequence


class VersionSpanError(RuntimeError):
    """A trajectory's trained tokens span more versions than ``rollout.max_versions_per_trajectory``
    (a transient failure: the task is scheduled again, and a new attempt may span fewer)."""


def check_version_span(result, train: Sequence[str], bound: int) -> None:
    """Raise :class:`VersionSpanError` if a trained role's trajectory spans more than ``bound``
    versions over its own tokens (partial rollouts, or turns under several versions)."""
    for role in train:
        for t in result.trajectories.get(role, []):
            spanned = sorted({v for v, m in zip(t.versions, t.loss_mask) if m})
            if len(spanned) > bound:
                raise VersionSpanError(f"a trajectory of role {role!r} spans {len(spanned)} versions "
                                       f"({spanned[0]}..{spanned[-1]}), more than rollout.max_versions_per_trajectory "
                                       f"= {bound}")
