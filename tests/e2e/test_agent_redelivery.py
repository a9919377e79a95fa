"""An agent episode whose RaaS node is SIGKILLed mid-episode, on the real broker, with its
environment behind HTTP: the episode is redone on another node under a new attempt, the
server cancels the dead attempt's session when the new one starts, and the episode is
trained once (the conservation audit)."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
import yaml

from astraflow.chaos.harness import JobHarness
from astraflow.topics import Batch, ensure_topics, job_topics
from astraflow.topics.replay import read_topic
from astraflow.workflows.environments import environment
from astraflow.workflows.http_env import EnvServer
from astraflow.workflows.text_game import TextGame

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@environment("test_gated_game")
class GatedGame(TextGame):
    """The text game, whose steps for attempts of node ``raas-0`` hang until released (so
    that node is surely mid-episode when it is killed)."""

    entered = threading.Event()
    release = threading.Event()

    def reset(self, task):
        self.gated = task.attempt.startswith("raas-0/")
        return super().reset(task)

    def step(self, action):
        if self.gated:
            GatedGame.entered.set()
            GatedGame.release.wait(300)
        return super().step(action)


def _config(tmp_path, url: str):
    from astraflow.config import load_config
    data = yaml.safe_load((ROOT / "examples" / "text_game.yaml").read_text())
    data.update({"job": f"agent-kill-{uuid.uuid4().hex[:8]}", "run_dir": str(tmp_path / "runs")})
    data["data"]["num_prompts"] = 64
    data["model"] = {"task": "arithmetic"}  # its turns end with EOS, so every turn steps (action_format: eos)
    data["rollout"].update({"n_samples": 2, "tasks_per_call": 2, "heartbeat_s": 1.0, "max_new_tokens": 6})
    data["dataflow"] = {"groups_per_batch": 2, "max_staleness": 1}
    data["trainer"].update({"steps": 3, "checkpoint_every": 1, "snapshot_every": 2})
    data["eval"] = {"every": 0}
    data["workflow"]["params"].update({"env": "http", "env_params": {"url": url, "timeout_s": 600},
                                       "max_turns": 2, "deadline_s": 600, "env_timeout_s": 600,
                                       "action_format": "eos"})  # every turn steps (the tiny model never closes a tag)
    path = tmp_path / f"{data['job']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_a_node_killed_mid_episode_redoes_it_once_and_its_old_session_is_cancelled(bootstrap, tmp_path):
    with EnvServer("test_gated_game") as server:
        cfg = _config(tmp_path, server.address)
        ensure_topics(bootstrap, job_topics(cfg).specs())
        h = JobHarness(cfg, bootstrap, tmp_path / "run")
        try:
            h.start("dataflow", "dataflow")
            h.start("trainer", "trainer-0")
            h.start("raas", "raas-0")
            assert GatedGame.entered.wait(300), "raas-0 never stepped an episode"
            held = [s for s in server.stats()["sessions"] if s["attempt"].startswith("raas-0/")]
            assert held, server.stats()
            h.kill("raas-0")  # mid-episode: its sessions stay open on the server, nobody says goodbye
            h.start("raas", "raas-1")
            h.wait_for(lambda m: m.name == "trainer.done", 900, "trainer.done")
            report = h.audit_until_settled()
        finally:
            GatedGame.release.set()
            h.stop_all()
        assert report.ok, report.violations[:10]
        # every episode raas-0 held was started again by raas-1, under another attempt, and the
        # server cancelled the dead attempt's session when the new one started
        redone = {(s["episode"], s["sample"]) for s in held}
        again = {(e, n): a for e, n, a in server.attempts if a.startswith("raas-1/")}
        assert redone <= set(again), (redone, again)
        assert server.stats()["cancelled"].get("superseded", 0) >= len(held)
        assert not [s for s in server.stats()["sessions"] if s["attempt"].startswith("raas-0/")]
    # trained once: each held episode's group is in exactly one batch, from raas-1
    batches = [b for _, _, b in read_topic(bootstrap, job_topics(cfg).batches(cfg.policy)) if isinstance(b, Batch)]
    trained = [g for b in batches for g in b.groups]
    for episode, _ in redone:
        mine = [g for g in trained if g.task_id == episode]
        assert len(mine) <= 1, (episode, len(mine))
        assert all(g.node_id == "raas-1" for g in mine)
    assert len({g.task_id for g in trained}) == len(trained)
