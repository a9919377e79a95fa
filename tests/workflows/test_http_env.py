"""Environments behind HTTP (workflows/http_env.py): the agent workflow's episodes through a
real server process equal the in-process ones; sessions are keyed by episode, sample and
attempt, so a redelivered episode gets a fresh session and the old one is cancelled; a
server's failures fail the episode with the right reason and retry rule."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from astraflow.actors.episodes import EpisodeRunner
from astraflow.topics import Task
from astraflow.workflows.api import EngineRole, Episode, get_workflow, run_episode
from astraflow.workflows.environments import ENV_ERROR, ENV_GARBAGE, EnvHandle, EnvironmentFailed, EnvTask, \
    environment, get_environment
from astraflow.workflows.http_env import EnvRequestError, EnvServer, HttpEnvironment
from astraflow.workflows.text_game import text_game_prompts

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8}


@environment("test_http_broken")
class Broken:
    """A world that fails: ``mode`` ``runtime`` (the world's: retriable), ``value`` (its input:
    not), ``garbage`` (an answer outside the protocol)."""

    def __init__(self, mode: str = "runtime") -> None:
        self.mode = mode

    def reset(self, task):
        return "start"

    def step(self, action):
        if self.mode == "runtime":
            raise RuntimeError("the tool broke")
        if self.mode == "value":
            raise ValueError(f"cannot parse {action!r}")
        return "obs", "lots", False, {}


@pytest.fixture(scope="module")
def tok_engine(tokenizer_and_engine):
    return tokenizer_and_engine


@pytest.fixture(scope="module")
def server_process():
    """``astraflow env serve --env text_game`` as a process of its own; its address."""
    proc = subprocess.Popen([sys.executable, "-m", "astraflow", "env", "serve", "--env", "text_game", "--idle-s", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert "served at http://" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
    url = line.rsplit(" ", 1)[1].strip()
    yield url, proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/stats", timeout=10) as r:
        return json.loads(r.read())


def run_game(tok, engine, env_params: dict, attempt: str = "", n: int = 3, task_i: int = 0):
    p = text_game_prompts(4, seed=3)[task_i]
    role = EngineRole("agent", "p", engine, tok, SAMPLING)
    params = {"env": env_params.pop("env", "text_game"), "env_params": env_params, "max_turns": 3,
              "env_timeout_s": 10.0}
    ep = Episode(f"t000000{task_i}-p{task_i}", p.text, p.answer, n, {"agent": role}, tok, params, p.metadata,
                 attempt=attempt)
    return run_episode(get_workflow("agent"), ep, 11)


def test_episodes_through_a_server_process_equal_the_in_process_game(tok_engine, server_process):
    tok, engine = tok_engine
    url, _ = server_process
    before = stats(url)
    local = run_game(tok, engine, {})
    remote = run_game(tok, engine, {"env": "http", "url": url}, attempt="a1")
    for a, b in zip(local.trajectories["agent"], remote.trajectories["agent"], strict=True):
        assert a.prompt_ids == b.prompt_ids and a.tokens == b.tokens and a.loss_mask == b.loss_mask
        assert a.reward == b.reward and a.info["end_reason"] == b.info["end_reason"]
    after = stats(url)
    assert after["started"] - before["started"] == 3
    # every session ended: by the game (done) or cancelled by the episode at its limit
    ended = after["finished"] - before["finished"] + sum(after["cancelled"].values()) - sum(before["cancelled"].values())
    assert ended == 3 and after["open"] == before["open"] == 0
    done = sum(t.info["end_reason"] == "done" for t in remote.trajectories["agent"])
    assert after["finished"] - before["finished"] == done
    assert after["cancelled"].get("client", 0) - before["cancelled"].get("client", 0) == 3 - done


def test_a_redelivered_episode_gets_a_fresh_session_and_the_old_one_is_cancelled(server_process):
    url, _ = server_process
    task = EnvTask("t0000009-p9", "red door. key: room 3.", "go 3;take;open", {"colour": "red", "room": 3,
                   "decoy_colour": "blue", "decoy_room": 5}, sample=1, attempt="node-a/1")
    dead = HttpEnvironment(url)  # the first node: starts and steps, then dies without a goodbye
    dead.reset(task)
    dead.step("go 3")
    s = stats(url)
    assert [(x["episode"], x["sample"], x["attempt"]) for x in s["sessions"]] == [("t0000009-p9", 1, "node-a/1")]
    superseded = s["cancelled"].get("superseded", 0)
    # the same attempt again is a mistake of the caller, refused (and not retriable)
    with pytest.raises(EnvRequestError, match="409"):
        HttpEnvironment(url).reset(task)
    # the redelivered episode: another attempt; the old session is cancelled, the new one fresh
    again = HttpEnvironment(url)
    obs = again.reset(EnvTask(task.episode_id, task.prompt, task.answer, task.metadata, 1, 0, "node-b/1"))
    assert obs == task.prompt  # a fresh game, not the one the dead node had stepped
    s = stats(url)
    assert s["cancelled"].get("superseded", 0) == superseded + 1
    assert [x["attempt"] for x in s["sessions"]] == ["node-b/1"]
    with pytest.raises(EnvRequestError, match="no open session"):
        dead.step("take")  # the old session is gone
    # another sample of the same episode is another session, not superseded
    other = HttpEnvironment(url)
    other.reset(EnvTask(task.episode_id, task.prompt, task.answer, task.metadata, 2, 0, "node-b/1"))
    assert stats(url)["open"] == 2
    again.close()
    other.close()
    assert stats(url)["open"] == 0


def test_the_node_gives_every_run_of_an_episode_its_own_attempt(tok_engine):
    tok, engine = tok_engine
    with EnvServer("text_game") as server:
        runner = EpisodeRunner("p", "node-x", engine, tok, 7, engine_lock=threading.Lock())
        p = text_game_prompts(1, seed=5)[0]
        task = Task("t0000001-p1", "p1", "p", p.text, p.answer, 2, SAMPLING, workflow="agent", role="agent",
                    params={"env": "http", "env_params": {"url": server.address}, "max_turns": 2},
                    metadata=p.metadata)
        for _ in range(2):
            (group,), = runner.run([task])
            assert group.status == "ok" and len(group.samples) == 2
        runner.close()
        attempts = {a for (_, _, a) in server.attempts}
        assert len(server.attempts) == 4 and len(attempts) == 2  # two samples per run, one attempt per run
        assert all(a.startswith("node-x/") for a in attempts)
        assert server.stats()["open"] == 0


@pytest.mark.parametrize("mode,reason,retry", [("runtime", ENV_ERROR, True), ("value", ENV_ERROR, False),
                                               ("garbage", ENV_GARBAGE, False)])
def test_a_failing_server_fails_the_episode_with_its_reason_and_retry_rule(mode, reason, retry):
    with EnvServer("test_http_broken", {"mode": mode}) as server:
        h = EnvHandle("http", get_environment("http"), {"url": server.address}, 10.0)
        assert h.reset(EnvTask("e", "p", "", {}, attempt="x")) == "start"
        with pytest.raises(EnvironmentFailed) as e:
            h.step("go")
        assert e.value.reason == reason and e.value.retriable is retry
        h.close()


def test_an_unreachable_server_is_a_retriable_failure_and_a_bad_url_a_config_error():
    from astraflow.topics.broker import free_port
    h = EnvHandle("http", get_environment("http"), {"url": f"http://127.0.0.1:{free_port()}"}, 5.0)
    with pytest.raises(EnvironmentFailed) as e:
        h.reset(EnvTask("e", "p", ""))
    assert e.value.reason == ENV_ERROR and e.value.retriable
    with pytest.raises(EnvironmentFailed, match="env_params.url"):
        EnvHandle("http", get_environment("http"), {"url": "localhost:80"}, 5.0)


def test_an_idle_session_is_cancelled_by_the_server():
    with EnvServer("text_game", idle_s=0.4) as server:
        env = HttpEnvironment(server.address)
        env.reset(EnvTask("e", "red door. key: room 0.", "", {"colour": "red", "room": 0, "decoy_colour": "blue",
                                                              "decoy_room": 2}, attempt="a"))
        deadline = time.monotonic() + 15
        while server.stats()["open"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.stats()["open"] == 0 and server.stats()["cancelled"] == {"idle": 1}


def test_env_serve_stops_on_sigterm_and_says_what_it_served(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "astraflow", "env", "serve", "--env", "text_game"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = proc.stdout.readline().rsplit(" ", 1)[1].strip()
    HttpEnvironment(url).reset(EnvTask("e", "red door. key: room 1.", "", {"colour": "red", "room": 1,
                                                                            "decoy_colour": "teal", "decoy_room": 4}))
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "1 sessions started" in out
    bad = subprocess.run([sys.executable, "-m", "astraflow", "env", "serve", "--env", "no_such_env"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "no_such_env" in bad.stderr


def test_a_bad_server_address_is_a_config_error_naming_the_key_and_file(tmp_path):
    from pathlib import Path

    import yaml

    from astraflow.config import load_config
    from astraflow.typed_config import ConfigError

    example = Path(__file__).resolve().parents[2] / "examples" / "text_game.yaml"
    data = yaml.safe_load(example.read_text())
    data["workflow"]["params"].update({"env": "http", "env_params": {"url": "localhost:9"}})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value) and "workflow.params.env_params" in str(e.value) and "http(s)://" in str(e.value)
    data["workflow"]["params"]["env_params"] = {"url": "http://127.0.0.1:9", "timeout_s": 1}
    path.write_text(yaml.safe_dump(data))
    assert load_config(path).workflow.params["env_params"]["url"] == "http://127.0.0.1:9"
