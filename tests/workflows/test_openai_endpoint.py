"""Bring your own agent (workflows/openai_endpoint.py): agent code written against the real
``openai`` client runs unchanged against the episode's endpoint, on the real CPU engine with
the tiny model; the trajectory is the exact tokens the engine saw and produced."""

from __future__ import annotations

import json
import sys
import urllib.request

import openai
import pytest
import torch

from astraflow.engines.sampling import sampling_logprobs
from astraflow.workflows.api import ENV, EngineRole, Episode, get_workflow, run_episode

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 6}
HERE = sys.modules[__name__].__name__


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=60)


def rewrites_history(base_url, task):
    c = _client(base_url)
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": task["prompt"]}])
    c.chat.completions.create(model="m", messages=[
        {"role": "user", "content": task["prompt"]}, {"role": "assistant", "content": r.choices[0].message.content + "!"},
        {"role": "user", "content": "again"}])


def other_temperature(base_url, task):
    c = _client(base_url)
    try:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": task["prompt"]}], temperature=0.2)
    except openai.BadRequestError as e:
        assert "temperature" in str(e)
    else:
        raise AssertionError("a temperature the trainer cannot reproduce was accepted")
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": task["prompt"]}], temperature=1.0)
    return 0.5


def never_stops(base_url, task):
    c = _client(base_url)
    msgs = [{"role": "user", "content": task["prompt"]}]
    while True:
        r = c.chat.completions.create(model="m", messages=msgs, max_tokens=3)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "more"}]


def reports_reward(base_url, task):
    c = _client(base_url)
    assert [m.id for m in c.models.list().data] == ["p"]
    for bad in ({"n": 2}, {"stream": True}):
        with pytest.raises(openai.BadRequestError, match="not supported"):
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], **bad)
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": task["prompt"]}], stop=["7"])
    req = urllib.request.Request(base_url + "/reward", data=json.dumps({"reward": 0.25}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()


@pytest.fixture(scope="module")
def tok_engine(tokenizer_and_engine):
    return tokenizer_and_engine


def run_agent(tok, engine, agent: str, n: int = 3, prompt: str = "12+34=", answer: str = "46", **params):
    role = EngineRole("agent", "p", engine, tok, SAMPLING)
    ep = Episode("t0000001-p1", prompt, answer, n, {"agent": role}, tok, {"agent": agent, **params}, {},
                 attempt="node/1")
    return run_episode(get_workflow("openai_agent"), ep, 5)


def test_the_example_agent_runs_unchanged_and_its_trajectory_is_what_the_engine_saw(tok_engine):
    tok, engine = tok_engine
    res = run_agent(tok, engine, "astraflow.examples.chat_agent:run", n=4)
    trajs = res.trajectories["agent"]
    assert len(trajs) == 4
    for t in trajs:
        assert t.prompt_ids == tuple(tok.encode("12+34=", add_special_tokens=False))
        assert t.info["end_reason"] == "done" and t.info["turns"] in (1, 2) and t.info["reward_reported"]
        own = [i for i, m in enumerate(t.loss_mask) if m]
        assert own and all(t.token_roles[i] == "agent" for i in own)
        env = [i for i, w in enumerate(t.token_roles) if w == ENV]
        assert all(t.loss_mask[i] == 0 and t.logprobs[i] == 0.0 for i in env)
        if t.info["turns"] == 2:  # the feedback message is context, encoded once, between the turns
            assert tok.decode([t.tokens[i] for i in env], skip_special_tokens=True) == " wrong. 12+34="
        else:
            assert not env
        # tokens in, tokens out: every trained token's behaviour logprob is the model's, given
        # exactly the tokens before it in this trajectory
        ids = torch.tensor([list(t.prompt_ids) + list(t.tokens)])
        with torch.no_grad():
            logits = engine.model(input_ids=ids).logits[0]
        p = len(t.prompt_ids)
        logp = sampling_logprobs(logits[p - 1:p - 1 + len(t.tokens)], 1.0, 1.0, 0)
        replay = logp.gather(-1, torch.tensor(t.tokens).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(replay[own], torch.tensor([t.logprobs[i] for i in own]), atol=1e-4, rtol=1e-4)
        answer = tok.decode([t.tokens[i] for i in own[-len(own):]], skip_special_tokens=True)
        assert t.reward in (0.0, 1.0) and answer
    assert res.team_reward == sum(t.reward for t in trajs) / 4
    # seeds are per sample and turn: batching the samples' requests changes nothing
    again = run_agent(tok, engine, "astraflow.examples.chat_agent:run", n=4)
    assert [t.tokens for t in again.trajectories["agent"]] == [t.tokens for t in trajs]


def test_a_rewritten_history_is_refused_never_retokenized(tok_engine):
    tok, engine = tok_engine
    with pytest.raises(openai.BadRequestError, match="never re-tokenizes"):
        run_agent(tok, engine, f"{HERE}:rewrites_history", n=1)


def test_sampling_the_trainer_cannot_reproduce_is_refused_and_the_agent_goes_on(tok_engine):
    tok, engine = tok_engine
    res = run_agent(tok, engine, f"{HERE}:other_temperature", n=2)
    for t in res.trajectories["agent"]:
        assert t.reward == 0.5 and t.info["turns"] == 1
        assert t.prompt_ids == tuple(tok.encode("12+34=", add_special_tokens=False))  # the refused call left nothing


def test_the_turn_limit_ends_an_agent_that_never_stops(tok_engine):
    tok, engine = tok_engine
    res = run_agent(tok, engine, f"{HERE}:never_stops", n=2, max_turns=3)
    for t in res.trajectories["agent"]:
        assert t.info["end_reason"] == "max_turns" and t.info["turns"] == 3 and t.reward == 0.0
    assert res.metrics["end.max_turns"] == 1.0


def test_reward_by_call_unsupported_options_and_stop_strings(tok_engine):
    tok, engine = tok_engine
    res = run_agent(tok, engine, f"{HERE}:reports_reward", n=2)
    for t in res.trajectories["agent"]:
        assert t.reward == 0.25 and t.info["reward_reported"]
        text = tok.decode(list(t.tokens), skip_special_tokens=True)
        assert "7" not in text[:-1]  # a stop string ends the reply (it stays, as the last text)


@pytest.mark.parametrize("params,key,words", [({"agent": "nope"}, "agent", "module:function"),
                                              ({"agent": "no.such.module:run"}, "agent", "no.such"),
                                              ({"agent": "astraflow.examples.chat_agent:run", "max_turns": 0},
                                               "max_turns", "integer >= 1")])
def test_bad_params_are_config_errors_naming_the_key_and_file(tmp_path, params, key, words):
    from pathlib import Path

    import yaml

    from astraflow.config import load_config
    from astraflow.typed_config import ConfigError
    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "arithmetic_grpo.yaml").read_text())
    data["workflow"] = {"name": "openai_agent", "params": params}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value) and f"workflow.params.{key}" in str(e.value) and words in str(e.value)
