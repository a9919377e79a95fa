"""The search environment: BM25 over its generated corpus, its questions and the episodes
the agent workflow runs in it on the real CPU engine with the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from astraflow.workflows import search_env
from astraflow.workflows.agent import END_REASONS
from astraflow.workflows.api import ENV, EngineRole, Episode, get_workflow, run_episode
from astraflow.workflows.environments import EnvTask, get_environment
from astraflow.workflows.search_env import SearchEnv, normalize, search, search_prompts, split_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "search_agent.yaml"


@pytest.fixture(scope="module")
def questions():
    """Every question of the task set once (both splits)."""
    out = list({p.text: p for split in ("train", "heldout") for p in search_prompts(1000, 0, split)}.values())
    assert len({p.text for p in out}) == len(out) == 2 * search_env.PEOPLE + search_env.TOWNS
    return out


def words(doc: str) -> list[str]:
    return normalize(doc).split()


def play(prompt, actions, **params):
    env = SearchEnv(**params)
    obs = env.reset(EnvTask(prompt.prompt_id, prompt.text, prompt.answer, prompt.metadata))
    assert obs == prompt.text
    out = [env.step(a) for a in actions]
    env.close()
    return out


def test_the_corpus_is_short_ascii_facts_with_one_index_per_process():
    docs = search_env.corpus()
    assert len(docs) == search_env.PEOPLE + search_env.TOWNS == len(set(docs))
    assert all(d.isascii() and len(d) <= 24 for d in docs)
    assert search_env._world() is search_env._world()  # built once, shared by every instance
    assert SearchEnv().step("search " + docs[0].split()[0])[0] == docs[0]


def test_a_one_hop_questions_natural_query_retrieves_the_document_with_its_answer(questions):
    one_hop = [p for p in questions if p.metadata["hops"] == 1]
    assert {p.metadata["kind"] for p in one_hop} == {"town", "region"}
    for p in one_hop:
        (fact,) = p.metadata["facts"]
        assert p.answer in words(fact)
        # the entity the question names, and the question itself, as the query: top-1 is the fact
        for query in (p.metadata["entity"], p.text):
            assert search(query, 1) == [fact], (p.text, query)


def test_a_two_hop_question_needs_two_different_searches(questions):
    two_hop = [p for p in questions if p.metadata["hops"] == 2]
    assert len(two_hop) == search_env.PEOPLE
    for p in two_hop:
        entity, bridge = p.metadata["entity"], p.metadata["bridge"]
        assert entity != bridge
        # the first search (the entity, or the question as asked) never shows the answer,
        # however many documents it shows, but its top document names the town ...
        for query in (entity, p.text):
            first = search(query, search_env.TOP_K_MAX)
            assert first and not any(p.answer in words(d) for d in first), (p.text, first)
            assert bridge in words(first[0])
        # ... and a search for that town does
        second = search(bridge, 1)
        assert second == [p.metadata["facts"][1]] and p.answer in words(second[0])


def test_every_questions_solution_pays_one_and_records_its_searches_and_hops(questions):
    for p in questions:
        steps = play(p, p.metadata["solution"].split(";"))
        *searches, (obs, reward, done, info) = steps
        assert all(not d and r == 0.0 and i["valid"] for _o, r, d, i in searches)
        assert (obs, reward, done) == ("right", 1.0, True)
        assert info["searches"] == info["hops"] == p.metadata["hops"] == len(searches)
        assert info["facts_found"] == p.metadata["hops"] and info["correct"] is True


def test_every_solution_with_its_observations_fits_the_tiny_models_window(tokenizer_and_engine, questions):
    """Question, turns (with their tags) and observations, as the agent workflow lays them out."""
    tok, _engine = tokenizer_and_engine

    def n(text):
        return len(tok.encode(text, add_special_tokens=False))
    longest = 0
    for p in questions:
        actions = p.metadata["solution"].split(";")
        obs = [o for o, *_ in play(p, actions)][:-1]  # (the answer's observation is not kept)
        longest = max(longest, n(p.text + "<a>") + sum(n(a + "</a>") for a in actions)
                      + sum(n(f" {o}<a>") for o in obs))
    assert longest <= 128


def test_answers_compare_after_normalisation_and_a_wrong_one_ends_with_zero(questions):
    p = next(q for q in questions if q.metadata["kind"] == "region")
    assert play(p, [f"answer The {p.answer.upper()}."])[0][:3] == ("right", 1.0, True)
    assert play(p, [{"name": "answer", "arguments": {"text": f" the {p.answer}"}}])[0][:3] == ("right", 1.0, True)
    wrong = next(r for r in search_env.REGIONS if r != p.answer)
    obs, reward, done, info = play(p, [f"answer {wrong}"])[0]
    assert (obs, reward, done, info["correct"], info["facts_found"]) == ("wrong", 0.0, True, False, 0)


def test_json_tool_calls_are_the_same_commands(questions):
    p = next(q for q in questions if q.metadata["hops"] == 2)
    tagged = play(p, p.metadata["solution"].split(";"))
    calls = [{"name": "search", "arguments": {"query": p.metadata["entity"]}},
             {"name": "search", "arguments": {"query": p.metadata["bridge"]}},
             {"name": "answer", "arguments": {"text": p.answer}}]
    assert play(p, calls) == tagged


@pytest.mark.parametrize("action,obs", [
    ("", "try: search WORDS, answer WORDS"),
    ("jump high", "try: search WORDS, answer WORDS"),
    ("search", "search what?"),
    ("search   ", "search what?"),
    ("answer", "answer what?"),
    ("answer ...", "answer what?"),
    ({"name": "search", "arguments": {}}, "search what?"),
    ({"name": "search", "arguments": {"query": 5}}, "search what?"),
    ({"name": "search", "arguments": {"text": "zob"}}, "search what?"),
    ({"name": "answer", "arguments": {"query": "north"}}, "answer what?"),
    ({"name": "fly", "arguments": {"to": "north"}}, "try: search WORDS, answer WORDS"),
    ({"arguments": {"query": "x"}}, "try: search WORDS, answer WORDS"),
])
def test_a_malformed_action_is_an_observation_saying_what_is_understood(questions, action, obs):
    p = questions[0]
    out, reward, done, info = play(p, [action])[0]
    assert (out, reward, done, info["valid"], info["searches"]) == (obs, 0.0, False, False, 0)


def test_a_search_that_matches_nothing_says_so_and_results_are_cut_to_fit(questions):
    p = questions[0]
    obs, _r, done, info = play(p, ["search zzzz qqqq"])[0]
    assert (obs, done, info["valid"], info["searches"]) == ("no match", False, True, 1)
    assert play(p, ["search the of in"])[0][0] == "no match"  # stopwords alone match nothing
    # a town shows its region and its residents: the documents that fit, whole
    town = next(q for q in questions if q.metadata["kind"] == "region").metadata["entity"]
    docs = search(town, search_env.TOP_K_MAX)
    assert len(docs) > 2
    obs = play(p, [f"search {town}"], top_k=search_env.TOP_K_MAX, max_chars=45)[0][0]
    assert len(obs) <= 45 and obs == " ".join(docs[:obs.count(".")]) and obs.count(".") >= 2
    assert play(p, [f"search {town}"], top_k=2, max_chars=200)[0][0] == " ".join(docs[:2])
    assert play(p, [f"search {town}"], top_k=1, max_chars=8)[0][0] == docs[0][:8]


def test_the_split_is_disjoint_deterministic_and_by_the_question_text(questions):
    train, held = search_prompts(len(questions), 0, "train"), search_prompts(len(questions) // 4, 0, "heldout")
    train_texts, held_texts = {p.text for p in train}, {p.text for p in held}
    assert train_texts and held_texts and not train_texts & held_texts
    assert train_texts | held_texts == {p.text for p in questions}
    assert all(split_of(t) == "train" for t in train_texts) and all(split_of(t) == "heldout" for t in held_texts)
    assert {p.metadata["hops"] for p in held} == {1, 2}
    assert [(p.prompt_id, p.text, p.answer, p.metadata) for p in search_prompts(40, 3)] == \
        [(p.prompt_id, p.text, p.answer, p.metadata) for p in search_prompts(40, 3)]
    assert [p.text for p in search_prompts(40, 3)] != [p.text for p in search_prompts(40, 4)]
    assert all(p.source == "search" and p.answer for p in train)
    with pytest.raises(ValueError, match="split"):
        search_prompts(1, 0, "test")


def test_data_source_search_feeds_the_job_and_its_held_out_set():
    from astraflow.actors.heldout import heldout_problems
    from astraflow.config import load_config
    from astraflow.workflows.datasets import DatasetError, load_prompts

    rows = load_prompts("search", 7, seed=2)
    assert [p.text for p in rows] == [p.text for p in search_prompts(7, 2)] and len(rows) == 7
    with pytest.raises(DatasetError, match="data.num_prompts"):
        load_prompts("search", None)
    held = heldout_problems(load_config(EXAMPLE))
    assert len(held) == 54 == len({p.text for p in held})  # every held-out question
    assert all(split_of(p.text) == "heldout" and p.source == "search" for p in held)


def test_the_example_passes_config_check(capsys):
    from astraflow.cli import main
    from astraflow.config import load_config

    cfg = load_config(EXAMPLE)
    assert cfg.data.source == "search" and cfg.workflow.name == "agent" and cfg.workflow.params["env"] == "search"
    assert main(["config", "check", str(EXAMPLE)]) == 0
    assert capsys.readouterr().err.strip().endswith(f"{EXAMPLE}: valid")


@pytest.mark.parametrize("env_params,words", [
    ({"top_k": 0}, "env_params.top_k is 0; it is an integer from 1 to 8"),
    ({"top_k": "2"}, "env_params.top_k is '2'"),
    ({"max_chars": 10_000}, "env_params.max_chars is 10000"),
    ({"k": 2}, "'k'"),
])
def test_a_bad_env_param_is_a_config_error_naming_the_key_and_file(tmp_path, env_params, words):
    from astraflow.config import load_config
    from astraflow.typed_config import ConfigError

    data = yaml.safe_load(EXAMPLE.read_text())
    data["workflow"]["params"]["env_params"] = env_params
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value) and "workflow.params.env_params" in str(e.value) and words in str(e.value)
    assert "search" in str(e.value)


def test_a_task_without_an_answer_fails_on_its_input():
    env = get_environment("search")()
    with pytest.raises(ValueError, match="t1: the answer is empty"):
        env.reset(EnvTask("t1", "where does x live?", " . "))


# --- episodes of the agent workflow on the real CPU engine with the tiny model --------------

def run_agent(tok, engine, prompt, params, n=2, temperature=1.0, max_new_tokens=8):
    role = EngineRole("agent", "p", engine, tok, {"temperature": temperature, "top_p": 1.0, "top_k": 0,
                                                  "max_new_tokens": max_new_tokens})
    ep = Episode("t0000031-p1", prompt.text, prompt.answer, n, {"agent": role}, tok, params, prompt.metadata)
    return run_episode(get_workflow("agent"), ep, 7)


def runs(t):
    """The trajectory's completion as ``[(is_observation, token ids)]`` runs, in order."""
    out = []
    for tid, writer in zip(t.tokens, t.token_roles):
        obs = writer == ENV
        if out and out[-1][0] == obs:
            out[-1][1].append(tid)
        else:
            out.append((obs, [tid]))
    return out


def check_trajectory(tok, t, prompt, max_turns):
    assert t.info["end_reason"] in END_REASONS and 1 <= t.info["turns"] <= max_turns
    assert len(t.prompt_ids) + len(t.tokens) <= 128  # the tiny model's window
    assert tok.decode(list(t.prompt_ids), skip_special_tokens=True).startswith(prompt.text)
    own = [i for i, m in enumerate(t.loss_mask) if m]
    assert own and all(t.token_roles[i] == "agent" for i in own)
    env_at = [i for i, w in enumerate(t.token_roles) if w == ENV]
    assert all(t.loss_mask[i] == 0 and t.logprobs[i] == 0.0 for i in env_at)
    return env_at


@pytest.mark.parametrize("action_format", ["tag", "json"])
def test_an_agent_episode_of_the_example_runs_to_an_end_reason(tokenizer_and_engine, questions, action_format):
    tok, engine = tokenizer_and_engine
    p = next(q for q in questions if q.metadata["hops"] == 2)
    params = dict(yaml.safe_load(EXAMPLE.read_text())["workflow"]["params"], action_format=action_format)
    res = run_agent(tok, engine, p, params)
    assert len(res.trajectories["agent"]) == 2
    for t in res.trajectories["agent"]:
        check_trajectory(tok, t, p, params["max_turns"])
    assert 0.0 <= res.metrics["success"] <= 1.0 and res.team_reward >= 0.0


def test_the_episodes_observations_are_the_environments_answers_to_its_actions_masked(tokenizer_and_engine,
                                                                                      questions):
    """Each model turn is the action (``eos`` format; a hot temperature so that the arithmetic
    warm start writes something): every observation in the trajectory is exactly what a fresh
    environment answers to the turns before it, and none of its tokens trains."""
    tok, engine = tokenizer_and_engine
    p = next(q for q in questions if q.metadata["hops"] == 2)
    params = dict(yaml.safe_load(EXAMPLE.read_text())["workflow"]["params"], action_format="eos")
    res = run_agent(tok, engine, p, params, n=3, temperature=4.0)
    steps = 0
    for t in res.trajectories["agent"]:
        check_trajectory(tok, t, p, params["max_turns"])
        env = SearchEnv(**params["env_params"])
        env.reset(EnvTask(p.prompt_id, p.text, p.answer, p.metadata))
        expected, reward, actions = [], 0.0, 0
        for obs, ids in runs(t):
            if obs:
                assert tok.decode(ids, skip_special_tokens=True) == expected.pop(0)
                continue
            action = tok.decode(ids, skip_special_tokens=True).strip()
            if ids[-1] != tok.eos_token_id:  # the turn met its cap (rollout.max_new_tokens) before ending
                expected.append(" error: end the turn")
            elif action:
                out, r, done, _info = env.step(action)
                actions, reward = actions + 1, reward + r
                expected.append(" " + out)
            else:
                expected.append(" error: empty action")
        assert (t.info["actions"], t.info["env_reward"]) == (actions, reward)
        steps += actions
    assert steps >= 1  # the environment answered real actions of the model
