"""Per-token versions from a partial rollout reach the trajectory, and
``rollout.max_versions_per_trajectory`` fails an episode whose trajectory spans more."""

from __future__ import annotations

import pytest

from astraflow.actors.version_span import VersionSpanError, check_version_span
from astraflow.workflows.types import EpisodeResult, Trajectory, Turn


def turn(versions=(), version=3, n=4, role="solver"):
    return Turn((1, 2), tuple(range(10, 10 + n)), (-0.1,) * n, version, "stop", "x", role, "p", tuple(versions))


def test_a_turn_carries_its_tokens_versions_into_trajectories():
    assert Trajectory.of(turn(), 1.0).versions == (3, 3, 3, 3)
    assert Trajectory.of(turn((3, 3, 4, 5)), 1.0).versions == (3, 3, 4, 5)
    other = turn((7, 7, 8, 8), role="verifier")
    chain = Trajectory.chain((1, 2), [turn((3, 4, 4, 4)), other, ("env", [5, 6])], "solver", 0.0)
    # own tokens keep their versions; another role's and the environment's are context (version 0)
    assert chain.versions == (3, 4, 4, 4, 0, 0, 0, 0, 0, 0)


def test_the_span_counts_trained_tokens_only():
    solver = Trajectory.chain((1, 2), [turn((3, 4, 4, 5))], "solver", 0.0)
    result = EpisodeResult({"solver": [solver]})
    check_version_span(result, ["solver"], 3)
    with pytest.raises(VersionSpanError, match="spans 3 versions \\(3..5\\), more than rollout.max_versions_per_trajectory = 2"):
        check_version_span(result, ["solver"], 2)
    # a role not trained here is not checked
    check_version_span(result, ["verifier"], 1)
    # context tokens (another role's, at their versions) do not count
    mixed = Trajectory.chain((1, 2), [turn((3, 3, 3, 3)), turn((9, 9, 9, 9), role="verifier")], "solver", 0.0)
    check_version_span(EpisodeResult({"solver": [mixed]}), ["solver"], 1)
