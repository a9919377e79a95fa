"""A job whose agent plays an environment written for OpenEnv (issue 62): openenv-core's own
server in a process of its own, the job's dataflow, RaaS node and trainer in theirs, only Kafka
between them and only OpenEnv's WebSocket protocol between the node and the environment. Every
task's episode ran in the server (reset with the task, steps, the session closed), every
trajectory ends as the environment said or at the turn limit, and the conservation audit
passes."""

from __future__ import annotations

import pytest

from astraflow.launcher import run_job
from astraflow.topics import TrajectoryGroup, job_topics
from astraflow.topics.replay import read_topic
from tests.workflows.openenv_servers import get, guess_server

pytestmark = [pytest.mark.slow]  # the slow tier (make test-all); tests/workflows/test_openenv_env.py runs in make test


@pytest.mark.timeout(900)
def test_a_job_trains_on_episodes_played_in_an_openenv_server(make_job_config, bootstrap, tmp_path):
    with guess_server() as url:
        cfg = make_job_config({
            "rollout": {"n_samples": 2, "tasks_per_call": 2},
            "dataflow": {"groups_per_batch": 2},
            "trainer": {"steps": 3},
            "eval": {"every": 0, "problems": 4, "k": 1},
            # the tiny arithmetic model ends its turns with EOS: each turn is an answer (eos)
            "workflow": {"name": "agent", "params": {
                "env": "openenv", "env_params": {"url": url, "observation_field": "text", "timeout_s": 60},
                "action_format": "eos", "max_turns": 2, "env_timeout_s": 60, "deadline_s": 300}},
        }, name="openenv")
        summary = run_job(cfg, bootstrap=bootstrap, run_dir=tmp_path / "run", progress=False, timeout_s=800)
        live = get(url, "/live")
    assert summary["steps_trained"] == 3 and summary["audit"]["ok"], summary.get("audit")
    served = summary["env_servers"][url]
    assert served["failures"] == 0 and served["requests"] > 0, served
    groups = [g for _, _, g in read_topic(bootstrap, job_topics(cfg).trajectories) if isinstance(g, TrajectoryGroup)]
    ok = [g for g in groups if g.status == "ok"]
    assert len(ok) >= 6 and len(ok) == len(groups), [g.error for g in groups if g.status != "ok"]
    samples = [s for g in ok for s in g.samples]
    assert all(s.info["end_reason"] in ("done", "max_turns") and s.info["actions"] >= 1 for s in samples)
    # the environment's reward is the trajectory's: 1 for the right answer, 0 otherwise
    assert all(s.reward == s.info["env_reward"] in (0.0, 1.0) for s in samples)
    # every sample was a session of its own on the server (the evaluator's episodes too), all closed
    assert live["open"] == 0 and live["made"] >= len(samples), live
