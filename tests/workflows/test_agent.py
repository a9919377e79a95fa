"""The agent workflow on the real CPU engine with the tiny model: tokens in / tokens out,
observation tokens masked, limits with reasons, and environments that crash, hang or
answer garbage failing their episode alone."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
import torch

from astraflow.actors.episodes import EpisodeRunner
from astraflow.engines.sampling import sampling_logprobs
from astraflow.topics import Task
from astraflow.workflows.agent import LIMITS, parse_action
from astraflow.workflows.api import ENV, EngineRole, Episode, Trajectory, Turn, get_workflow, run_episode
from astraflow.workflows.environments import (ENV_ERROR, ENV_GARBAGE, ENV_TIMEOUT, EnvironmentFailed, EnvTask,
                                              environment)
from astraflow.workflows.text_game import TextGame, text_game_prompts

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 6}
REASONS = set(LIMITS) | {"done", "eos"}


@environment("test_drill")
class Drill:
    """Three sums in a row, each shown after the last answer (a real environment, for tests:
    the tiny model answers sums, so its turns are actions)."""

    def __init__(self, problems: int = 3, pad: int = 0, sleep_s: float = 0.0, any_number: bool = False) -> None:
        self.problems, self.pad, self.sleep_s = problems, pad, sleep_s
        self.any_number = any_number  #: an answer counts if it is a number at all (a test of scoring, not of skill)

    def reset(self, task: EnvTask) -> str:
        self.k, self.right = 0, 0
        return self._problem()

    def _problem(self) -> str:
        a, b = 1 + self.k, 2 + 2 * self.k
        self.answer = str(a + b)
        return "x" * self.pad + f"{a}+{b}="

    def step(self, action):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        self.right += action.isdigit() if self.any_number else action == self.answer
        self.k += 1
        if self.k == self.problems:
            return "bye", self.right / self.problems, True, {}
        return self._problem(), 0.0, False, {"k": self.k}


@environment("test_crash")
class Crash(Drill):
    def step(self, action):
        raise RuntimeError("the tool broke")


@environment("test_garbage")
class Garbage(Drill):
    def step(self, action):
        return "obs", 1.0, False  # three values, not four


@environment("test_hang")
class Hang(Drill):
    def step(self, action):
        time.sleep(3)
        return "late", 0.0, False, {}


@environment("test_async")
class AsyncDrill(Drill):
    async def reset(self, task):
        return Drill.reset(self, task)

    async def step(self, action):
        return Drill.step(self, action)


@pytest.fixture(scope="module")
def tok_engine(tokenizer_and_engine):
    return tokenizer_and_engine


def run_agent(tok, engine, params, n=4, prompt="drill", metadata=None, max_new_tokens=6):
    role = EngineRole("agent", "p", engine, tok, dict(SAMPLING, max_new_tokens=max_new_tokens))
    ep = Episode("t0000001-p1", prompt, "", n, {"agent": role}, tok, params, metadata or {})
    return run_episode(get_workflow("agent"), ep, 7)


def replayed_logprobs(model, traj: Trajectory) -> torch.Tensor:
    """Every token's logprob from one forward pass over the trajectory as a whole."""
    ids = torch.tensor([list(traj.prompt_ids) + list(traj.tokens)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    p = len(traj.prompt_ids)
    logp = sampling_logprobs(logits[p - 1:p - 1 + len(traj.tokens)], 1.0, 1.0, 0)
    return logp.gather(-1, torch.tensor(traj.tokens).unsqueeze(-1)).squeeze(-1)


def test_the_trajectory_is_what_the_engine_saw_and_observations_are_masked(tok_engine):
    tok, engine = tok_engine
    res = run_agent(tok, engine, {"env": "test_drill", "action_format": "eos", "max_turns": 3})
    trajs = res.trajectories["agent"]
    assert len(trajs) == 4
    for t in trajs:
        assert t.info["end_reason"] in ("done", "max_turns", "context")
        assert t.prompt_ids == tuple(tok.encode("1+2=", add_special_tokens=False))
        # Observation tokens: context written by the environment, loss mask 0, logprob 0.
        env_at = [i for i, w in enumerate(t.token_roles) if w == ENV]
        assert env_at and all(t.loss_mask[i] == 0 and t.logprobs[i] == 0.0 for i in env_at)
        own = [i for i, m in enumerate(t.loss_mask) if m]
        assert own and all(t.token_roles[i] == "agent" for i in own)
        # The observations are exactly the environment's text, encoded once, between turns.
        text = tok.decode(list(t.prompt_ids) + list(t.tokens), skip_special_tokens=True)
        assert text.startswith("1+2=") and (" 2+4=" in text)
        # Tokens in, tokens out: the behaviour logprob of every trained token is the model's
        # logprob of it given exactly the tokens before it in this trajectory.
        replay = replayed_logprobs(engine.model, t)
        torch.testing.assert_close(replay[own], torch.tensor([t.logprobs[i] for i in own]), atol=1e-4, rtol=1e-4)
        assert t.info["turns"] <= 3 and t.info["actions"] >= 1
    assert res.metrics["turns"] >= 1 and 0 <= res.metrics["success"] <= 1


def test_async_environments_run_the_same_episode(tok_engine):
    tok, engine = tok_engine
    a = run_agent(tok, engine, {"env": "test_drill", "action_format": "eos", "max_turns": 3})
    b = run_agent(tok, engine, {"env": "test_async", "action_format": "eos", "max_turns": 3})
    assert [t.tokens for t in a.trajectories["agent"]] == [t.tokens for t in b.trajectories["agent"]]


def test_turn_limit_ends_with_its_reason_and_reward_rule(tok_engine):
    tok, engine = tok_engine
    res = run_agent(tok, engine, {"env": "test_drill", "action_format": "eos", "max_turns": 1,
                                  "limit_reward": -1.0})
    for t in res.trajectories["agent"]:
        assert (t.info["end_reason"], t.info["turns"], t.reward) == ("max_turns", 1, -1.0)
        assert t.token_roles[-1] == "agent"  # the observation after the last turn is not kept
    assert res.metrics["end.max_turns"] == 1.0


def test_token_limit_and_observation_truncation(tok_engine):
    tok, engine = tok_engine
    res = run_agent(tok, engine, {"env": "test_drill", "env_params": {"pad": 40}, "action_format": "eos",
                                  "max_turns": 6, "max_total_tokens": 60, "max_observation_tokens": 20})
    for t in res.trajectories["agent"]:
        assert len(t.prompt_ids) == 20  # the first observation, cut to 20 tokens (no tag in this format)
        assert t.info["observations_truncated"] >= 1
        assert len(t.prompt_ids) + len(t.tokens) <= 60
        assert t.info["end_reason"] in ("max_tokens", "done")


def test_the_context_window_ends_the_episode_and_nothing_passes_it(tok_engine):
    tok, engine = tok_engine
    res = run_agent(tok, engine, {"env": "test_drill", "env_params": {"problems": 1000, "pad": 30},
                                  "action_format": "eos", "max_turns": 200}, n=2)
    for t in res.trajectories["agent"]:
        assert t.info["end_reason"] == "context"
        assert len(t.prompt_ids) + len(t.tokens) <= engine.max_positions


def test_a_malformed_action_is_answered_by_an_observation(tok_engine):
    tok, engine = tok_engine
    task = text_game_prompts(1)[0]
    res = run_agent(tok, engine, {"env": "text_game", "max_turns": 2, "on_eos": "continue"}, n=2,
                    prompt=task.text, metadata=task.metadata, max_new_tokens=8)
    for t in res.trajectories["agent"]:
        text = tok.decode(list(t.prompt_ids) + list(t.tokens), skip_special_tokens=True)
        assert text.startswith(task.text + "<a>")
        if t.info["malformed"]:
            assert "error: " in text
            assert t.info["actions"] + t.info["malformed"] >= 1
        assert t.info["end_reason"] in REASONS


def test_the_deadline_ends_the_episode_and_keeps_its_turns(tok_engine):
    tok, engine = tok_engine
    res = run_agent(tok, engine, {"env": "test_drill", "env_params": {"sleep_s": 1.0}, "action_format": "eos",
                                  "deadline_s": 0.3, "env_timeout_s": 30}, n=2)
    for t in res.trajectories["agent"]:
        assert t.info["end_reason"] == "deadline" and t.info["turns"] == 1 and any(t.loss_mask)


@pytest.mark.parametrize("env,reason", [("test_crash", ENV_ERROR), ("test_garbage", ENV_GARBAGE),
                                        ("test_hang", ENV_TIMEOUT)])
def test_a_broken_environment_fails_its_episode_with_the_reason(tok_engine, env, reason):
    tok, engine = tok_engine
    with pytest.raises(EnvironmentFailed) as e:
        run_agent(tok, engine, {"env": env, "action_format": "eos", "env_timeout_s": 0.5}, n=2)
    assert e.value.reason == reason and env in str(e.value)


def test_the_node_fails_the_broken_episode_alone_and_goes_on(tok_engine):
    tok, engine = tok_engine
    runner = EpisodeRunner("p", "node-test", engine, tok, 7, engine_lock=threading.Lock())

    def task(i, env):
        return Task(f"t{i:07d}-p{i}", f"p{i}", "p", "drill", "", 2, SAMPLING, workflow="agent", role="agent",
                    params={"env": env, "action_format": "eos", "max_turns": 2, "env_timeout_s": 0.5})
    groups = runner.run([task(0, "test_drill"), task(1, "test_crash"), task(2, "test_hang"), task(3, "test_drill")])
    ok0, crash, hang, ok3 = (g for (g,) in groups)
    assert ok0.status == ok3.status == "ok" and len(ok0.samples) == 2
    assert all(s.info["end_reason"] in REASONS for s in ok0.samples)
    # observation tokens reach the group with loss mask 0 and the environment as their writer
    s = ok0.samples[0]
    assert s.loss_mask and ok0.roles[s.token_roles[s.loss_mask.index(0)]] == ENV
    assert crash.status == "failed" and ENV_ERROR in crash.error and "the tool broke" in crash.error
    assert hang.status == "failed" and ENV_TIMEOUT in hang.error
    assert runner.run([task(4, "test_drill")])[0][0].status == "ok"
    runner.close()


@environment("test_waits_for_neighbour")
class WaitsForNeighbour(Drill):
    """A step that returns only once another episode of the poll, which starts its engine call
    after this step began, had it answered: it can only if this episode stepped out of the
    node's batch while it steps (else that call waits for this episode, which waits for it)."""

    stepping, answered = threading.Event(), threading.Event()

    def step(self, action):
        self.stepping.set()
        seen = self.answered.wait(20)
        return ("seen" if seen else "never"), 1.0 if seen else 0.0, True, {}


def test_an_environment_step_does_not_stall_the_other_episodes(tok_engine):
    from astraflow.workflows.api import EpisodeResult, WORKFLOWS, workflow
    tok, engine = tok_engine
    if "test_neighbour" not in WORKFLOWS:
        @workflow("test_neighbour", roles=("agent",))
        def neighbour(ep):
            with ep.off_engine():  # (waiting here must not hold the agent's first turn)
                assert WaitsForNeighbour.stepping.wait(20)
            (t,) = ep.roles["agent"].generate([ep.encode(ep.prompt)])
            WaitsForNeighbour.answered.set()
            return EpisodeResult({"agent": [Trajectory.of(t, 0.0)]})
    WaitsForNeighbour.stepping.clear()
    WaitsForNeighbour.answered.clear()
    runner = EpisodeRunner("p", "node-test", engine, tok, 7, engine_lock=threading.Lock())
    agent = Task("t0000001-p1", "p1", "p", "drill", "", 1, SAMPLING, workflow="agent", role="agent",
                 params={"env": "test_waits_for_neighbour", "action_format": "eos", "max_turns": 4,
                         "env_timeout_s": 60})
    other = Task("t0000002-p2", "p2", "p", "3+4=", "7", 1, SAMPLING, workflow="test_neighbour", role="agent")
    (a,), (b,) = runner.run([agent, other])
    runner.close()
    assert a.status == b.status == "ok", (a.error, b.error)
    assert a.samples[0].info["actions"] == 1, "the agent stepped its environment once (which says done)"
    assert a.samples[0].reward == 1.0 and a.samples[0].info["end_reason"] == "done"


def test_chain_refuses_a_turn_generated_from_another_prompt():
    own = Turn((5, 6, 7), (8,), (-0.1,), 0, "stop", "x", "agent", "p")
    assert Trajectory.chain((5,), [(ENV, [6, 7]), own], "agent", 0.0).loss_mask == (0, 0, 1)
    with pytest.raises(ValueError, match="not the 3 tokens built so far"):
        Trajectory.chain((5,), [(ENV, [6, 9]), own], "agent", 0.0)


def test_parse_action_formats():
    assert parse_action("go 3</a>", "tag") == ("go 3", "")
    assert parse_action("go 3", "tag")[0] is None
    assert parse_action(" </a>", "tag") == (None, "empty action")
    assert parse_action('{"name": "go", "arguments": {"room": 3}}</tool_call>', "json") == \
           ({"name": "go", "arguments": {"room": 3}}, "")
    assert "not JSON" in parse_action("{go</tool_call>", "json")[1]
    assert parse_action("[1]</tool_call>", "json")[0] is None
    assert parse_action("46", "eos", ended=True) == ("46", "")
    assert parse_action("46", "eos", ended=False)[0] is None


def test_the_text_game_takes_several_turns_with_partial_observations():
    (task,) = [p for p in text_game_prompts(40) if p.metadata["room"] != 0][:1]
    m = task.metadata
    game = TextGame()
    assert game.reset(EnvTask("e", task.text, task.answer, m)) == task.text
    assert game.step("open")[:3] == ("locked", 0.0, False)
    assert game.step(f"go {m['decoy_room']}")[0] == f"room {m['decoy_room']}: {m['decoy_colour']} key"
    assert game.step("take")[0] == f"you hold the {m['decoy_colour']} key"
    assert game.step("open")[0] == "wrong key"
    assert game.step({"name": "go", "arguments": {"room": m["room"]}})[0] == f"room {m['room']}: {m['colour']} key"
    game.step("take")
    assert game.step("open")[:3] == ("the door opens", 1.0, True)
    assert game.step("fly")[0].startswith("try:")
    assert task.answer == f"go {m['room']};take;open"


def test_text_game_tasks_split_by_text():
    train = {p.text for p in text_game_prompts(500)}
    held = {p.text for p in text_game_prompts(50, split="heldout")}
    assert train and held and not train & held
    assert text_game_prompts(5, seed=1) == text_game_prompts(5, seed=1)


def test_observation_tokens_stay_masked_on_real_trajectories_from_the_broker(tok_engine, job_topics, make_producer,
                                                                             make_consumer):
    """What a node writes for agent episodes, read back from the topic and made a training
    batch: every token the environment wrote has loss mask 0 there, every model token 1."""
    from kafka import TopicPartition

    from astraflow.actors.common import to_train_batch
    from astraflow.topics import Batch

    tok, engine = tok_engine
    runner = EpisodeRunner("p", "node-test", engine, tok, 7, engine_lock=threading.Lock())
    games = text_game_prompts(2)
    tasks = [Task(f"t{i:07d}-p{i}", f"p{i}", "p", g.text, g.answer, 2, dict(SAMPLING, max_new_tokens=8),
                  workflow="agent", role="agent", metadata=g.metadata,
                  params={"env": "text_game", "max_turns": 3, "on_eos": "continue"}) for i, g in enumerate(games)]
    tasks.append(Task("t0000009-p9", "p9", "p", "drill", "", 2, SAMPLING, workflow="agent", role="agent",
                      params={"env": "test_drill", "action_format": "eos", "max_turns": 3}))
    groups = [g for (g,) in runner.run(tasks)]
    runner.close()
    assert all(g.status == "ok" for g in groups), [g.error for g in groups]
    producer = make_producer()
    for g in groups:
        producer.send_sync(job_topics.trajectories, g, key=g.task_id, partition=0)
    consumer = make_consumer(partitions=[TopicPartition(job_topics.trajectories, 0)])
    got = []
    for _ in range(40):
        got += consumer.poll(500)
        if len(got) >= len(groups):
            break
    assert len(got) == len(groups)
    batch = to_train_batch(Batch("p", 0, [d.message for d in got], [d.source for d in got]))
    samples = [s for d in got for s in d.message.samples]
    assert len(batch.samples) == len(samples)
    env_tokens = 0
    for d in got:
        g = d.message
        for s in g.samples:
            writers = [g.roles[w] for w in s.token_roles]
            assert s.loss_mask == [0 if w == ENV else 1 for w in writers]
            env_tokens += writers.count(ENV)
            assert s.info["end_reason"] in REASONS
    assert env_tokens > 0
    for t, s in zip(batch.samples, samples):
        assert list(t.completion_ids) == s.tokens and list(t.mask_values()) == s.loss_mask


@pytest.mark.parametrize("key,value,words", [
    ("max_turns", 0, "an integer >= 1"),
    ("env", "nope", "unknown environment 'nope'"),
    ("action_format", "xml", "one of tag, json, eos"),
    ("deadline_s", -1, "seconds > 0"),
    ("max_turn", 3, "no parameter 'max_turn'"),
    ("turn_discount", 0, "a number in (0, 1]"),
    ("turn_penalty", 2, "a number in [-1, 1]"),
])
def test_bad_agent_params_are_config_errors_naming_the_key_and_file(tmp_path, key, value, words):
    from pathlib import Path

    import yaml

    from astraflow.config import load_config
    from astraflow.typed_config import ConfigError

    example = Path(__file__).resolve().parents[2] / "examples" / "text_game.yaml"
    data = yaml.safe_load(example.read_text())
    assert load_config(example).workflow.params["env"] == "text_game"
    data["workflow"]["params"][key] = value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value) and f"workflow.params.{key}" in str(e.value) and words in str(e.value)


def test_a_generation_request_carries_checked_stop_sequences():
    from astraflow.topics import GenerationRequest

    ok = GenerationRequest("r", "e", "p", "agent", [[3, 4]], [1], {"stop": ["</a>"], "stop_token_ids": [1]})
    ok.validate()
    for bad in ({"stop": "</a>"}, {"stop": [""]}, {"stop_token_ids": [-1]}, {"stop_token_ids": ["1"]}):
        with pytest.raises(ValueError, match="stop"):
            GenerationRequest("r", "e", "p", "agent", [[3, 4]], [1], bad).validate()


def test_held_out_rows_of_an_agent_job_are_scored_by_whole_episodes(tok_engine):
    """The evaluator plays the job's own workflow on held-out rows: the score is the mean
    environment reward of the agent's trajectories (not the exact match of one completion
    against the row's answer: for an environment task that is empty, and an empty completion
    "matches" it whatever the policy does)."""
    from astraflow.actors.evaluator import episode_accuracy, episode_evaluation, heldout_accuracy
    from astraflow.actors.heldout import eval_reward
    from astraflow.config import JobConfig, from_dict
    from astraflow.topics import Prompt
    tok, engine = tok_engine
    # Any number counts: what is tested is how episodes are scored, not whether the tiny model
    # gets these sums right (a warm start that got some right by luck once made this pass).
    params = {"env": "test_drill", "action_format": "eos", "max_turns": 3, "env_params": {"any_number": True}}
    cfg = from_dict(JobConfig, {"job": "agent-eval", "workflow": {"name": "agent", "params": params},
                                "rollout": {"max_new_tokens": 6}, "eval": {"k": 2, "temperature": 0.6}})
    problems = [Prompt(f"p{i}", "drill", "") for i in range(4)]
    score = heldout_accuracy(cfg, engine, tok, problems)
    assert eval_reward(cfg) == "agent episode reward"
    # the tiny model answers with numbers, so the episodes score above 0, where the exact match of
    # a completion against the row's empty answer would score 0 ...
    assert 0.0 < score <= 1.0
    # ... the same weights, rows and seed give the same score ...
    assert episode_accuracy(cfg, engine, tok, problems) == score
    # ... and it is what the episodes' trajectories say, row by row
    rewards, per_task, turns, actions = [], [], [], []
    for i, p in enumerate(problems):
        role = EngineRole("agent", cfg.policy, engine, tok,
                          {"temperature": 0.6, "top_p": 1.0, "top_k": 0, "max_new_tokens": 6})
        ep = Episode(f"eval-{i}", p.text, p.answer, 2, {"agent": role}, tok,
                     {**params, "_job_seed": cfg.seed + 1000}, {})
        trajs = run_episode(get_workflow("agent"), ep, cfg.seed + 1000).trajectories["agent"]
        rewards += [t.reward for t in trajs]
        per_task.append(sum(t.reward for t in trajs) / 2)
        turns += [t.info["turns"] for t in trajs]
        actions += [t.info["actions"] for t in trajs]
    assert len(rewards) == 8 and score == pytest.approx(sum(rewards) / 8)
    # the evaluator's episode statistics: standard errors over episodes and over tasks, turns
    # and tool calls per episode, all from the same episodes
    stats = episode_evaluation(cfg, engine, tok, problems)
    assert stats.accuracy == score and stats.episodes == 8
    assert stats.stderr == pytest.approx(statistics.stdev(rewards) / 8 ** 0.5)
    assert stats.stderr_tasks == pytest.approx(statistics.stdev(per_task) / 4 ** 0.5)
    assert stats.turns == pytest.approx(sum(turns) / 8) and 1 <= stats.turns <= 3
    assert stats.actions == pytest.approx(sum(actions) / 8) and stats.actions <= stats.turns
    # each row's mean reward, by its index (the same rows at every version: a change pairs up)
    assert list(stats.per_task) == [0, 1, 2, 3] and list(stats.per_task.values()) == pytest.approx(per_task)


def test_the_multi_turn_benchmark_compares_the_same_episodes_in_and_out_of_the_batch(tok_engine):
    """benchmarks/multi_turn.py's two arms: the same tokens; staying in the batch makes every
    call wait for every episode (so its calls carry all rows), stepping out does not."""
    import argparse

    from astraflow.benchmarks.multi_turn import _tasks, run_arm
    tok, engine = tok_engine
    tasks = _tasks(argparse.Namespace(episodes=3, samples=2, turns=2, tool_s=0.05), tail=0.2)
    out, stay = run_arm(engine, tok, tasks, True), run_arm(engine, tok, tasks, False)
    assert out["fingerprint"] == stay["fingerprint"] and out["tokens"] == stay["tokens"] > 0
    assert out["tool_calls"] == stay["tool_calls"] > 0
    assert stay["engine_calls"] <= out["engine_calls"] and stay["rows_per_call"] >= out["rows_per_call"]


def test_turn_discount_and_turn_penalty_shape_the_reward_and_its_declared_range(tok_engine):
    from astraflow.workflows.api import get_workflow
    tok, engine = tok_engine
    base = {"env": "test_drill", "action_format": "eos", "max_turns": 3, "env_params": {"problems": 1}}
    plain = run_agent(tok, engine, base)
    shaped = run_agent(tok, engine, dict(base, turn_discount=0.5, turn_penalty=-0.1))
    for a, b in zip(plain.trajectories["agent"], shaped.trajectories["agent"], strict=True):
        assert a.tokens == b.tokens  # the same episode, scored differently
        # the drill of one problem pays at its only step (step 0: discount 0.5**0 = 1)
        assert b.reward == pytest.approx(a.info["env_reward"] - 0.1 * b.info["turns"])
    two = run_agent(tok, engine, dict(base, env_params={"problems": 2}, turn_discount=0.5))
    for t in two.trajectories["agent"]:
        if t.info["actions"] == 2:  # the drill pays right/2 at its second step, discounted once
            assert t.reward == pytest.approx(t.info["env_reward"]) and t.reward in (0.0, 0.25, 0.5)
    spec = get_workflow("agent")
    assert spec.role_reward_range("agent", base) == (0.0, 1.0)
    assert spec.role_reward_range("agent", dict(base, turn_penalty=-0.1)) == pytest.approx((-0.3, 1.0))
    assert spec.role_reward_range("agent", dict(base, limit_reward=-1.0)) == (-1.0, 1.0)


def test_a_turn_never_outgrows_the_policys_max_new_tokens_under_a_total_token_budget(tok_engine):
    """With ``max_total_tokens`` and no ``max_tokens_per_turn``, a turn's cap is the smaller of
    the room left and ``rollout.max_new_tokens`` — what the dataflow's content check allows
    (a longer turn would be dead-lettered as ``length_over_limit``)."""
    from astraflow.workflows.agent import turn_tokens
    tok, engine = tok_engine
    hot = EngineRole("agent", "p", engine, tok, dict(SAMPLING, temperature=8.0, max_new_tokens=2))  # EOS is rare
    ep = Episode("t0000001-p1", "drill", "", 4, {"agent": hot}, tok,
                 {"env": "test_drill", "action_format": "tag", "max_turns": 3, "max_total_tokens": 120}, {})
    res = run_episode(get_workflow("agent"), ep, 7)
    for t in res.trajectories["agent"]:
        run = longest = 0
        for m in t.loss_mask:
            run = run + 1 if m else 0
            longest = max(longest, run)
        assert 1 <= longest <= 2, longest
    assert turn_tokens({}, 2) == 2 and turn_tokens({"max_tokens_per_turn": 7}, 2) == 7
