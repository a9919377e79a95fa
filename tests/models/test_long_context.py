"""A longer-context tiny model: `astraflow model init --max-positions 1024` builds one warm-started
on the search agent's tool format, cached apart from the 128-position default (whose keys do not
change), selected by a job's ``model.max_positions``; the engines' context guard then uses its
window (a prompt past 128 tokens generates, an episode ends at 1,024 with the reason ``context``).

The builds here are few-step ones in a temporary cache (the real one is measured in docs/agentic.md).
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from astraflow.engines.base import CONTEXT, SamplingParams
from astraflow.cli.model import model_command
from astraflow.models.bootstrap import model_shape, resolve_model_path
from astraflow.models.build import build_tiny_model
from astraflow.models.spec import DEFAULT_POSITIONS, MARKER, default_spec
from astraflow.models.warm_start import task_names
from astraflow.typed_config import ConfigError
from astraflow.workflows.api import EngineRole, Episode, get_workflow, run_episode
from astraflow.workflows.environments import EnvTask, environment

LONG = 1024
FEW = {"max_steps": 2, "eval_every": 2, "eval_problems": 8, "heldout_problems": 8}
#: The cache keys of the default builds the shared cache and the examples use (seed 0): a window
#: option must not move them.
DEFAULT_KEYS = {"arithmetic": "tiny-qwen3-s0-571c50a1e854", "search": "tiny-qwen3-search-s0-8deb7b50ed7a",
                "text_game": "tiny-qwen3-text_game-s0-726bb0f6ee2e"}


@environment("test_long_pad")
class LongPad:
    """Sums behind ``pad`` characters of padding, one after another (the tiny models answer sums,
    so every turn is an action and the context grows by an observation each turn)."""

    def __init__(self, pad: int = 0, problems: int = 1000) -> None:
        self.pad, self.problems = pad, problems

    def reset(self, task: EnvTask) -> str:
        self.k = 0
        return self._problem()

    def _problem(self) -> str:
        return "x" * self.pad + f"{1 + self.k}+{2 + self.k}="

    def step(self, action):
        self.k += 1
        return self._problem(), 0.0, self.k >= self.problems, {}

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """A few-step search build with a 1,024-position window, where a job's cache finds it."""
    cache = tmp_path_factory.mktemp("cache") / "models"
    spec = dataclasses.replace(default_spec("search", LONG), **FEW)
    path = cache / default_spec("search", LONG).key(0, "search")
    build_tiny_model(path, seed=0, spec=spec, task="search", log=lambda _: None, pool_size=256)
    return path


@pytest.fixture(scope="module")
def long_engine(long_model):
    from transformers import AutoTokenizer

    from astraflow.engines.cpu import CpuEngine
    engine = CpuEngine(long_model)
    yield AutoTokenizer.from_pretrained(str(long_model)), engine
    engine.close()


def test_a_window_option_leaves_every_default_key_as_it_was():
    for task in task_names():
        spec = default_spec(task)
        assert default_spec(task, None) == spec
        if task == "search_wide":  # the one task whose spec has a window of its own
            continue
        assert spec.max_positions == DEFAULT_POSITIONS == 128
        assert default_spec(task, DEFAULT_POSITIONS).key(0, task) == spec.key(0, task)
        assert "-p" not in spec.key(0, task)
    for task, key in DEFAULT_KEYS.items():
        assert default_spec(task).key(0, task) == key
    long = default_spec("search", LONG)
    assert long.key(0, "search").startswith("tiny-qwen3-search-p1024-s0-")
    assert dataclasses.replace(long, max_positions=DEFAULT_POSITIONS) == default_spec("search")  # only the window
    with pytest.raises(ValueError, match="max_positions"):
        default_spec("search", 8)


def test_the_built_model_declares_its_window_and_is_what_a_job_resolves(long_model, monkeypatch):
    cfg = json.loads((long_model / "config.json").read_text())
    assert cfg["max_position_embeddings"] == LONG
    assert json.loads((long_model / "tokenizer_config.json").read_text())["model_max_length"] == LONG
    report = json.loads((long_model / MARKER).read_text())
    assert report["task"] == "search" and report["spec"]["max_positions"] == LONG
    assert report["key"].startswith("tiny-qwen3-search-p1024-s0-")  # (its few-step spec: a key of its own)
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(long_model.parent.parent))
    assert resolve_model_path("", 0, "search", LONG) == long_model
    assert model_shape(None, 0, "search", LONG).max_positions == LONG
    # the 128-position build is another cache entry (not built here: its spec describes it)
    assert model_shape(None, 0, "search").max_positions == DEFAULT_POSITIONS


def test_the_cpu_engine_guard_uses_the_window(long_engine):
    tok, engine = long_engine
    assert engine.max_positions == LONG
    unit = tok.encode("12+34=", add_special_tokens=False)
    past_128 = (unit * 100)[:300]
    near = (unit * 200)[:LONG - 3]
    over = (unit * 200)[:LONG + 5]
    gens = engine.generate([past_128, near, over], SamplingParams(temperature=1.0, max_new_tokens=8, seed=1))
    assert len(gens[0].tokens) == 8 and gens[0].finish_reason == "length"  # the 128 model would refuse it
    assert len(gens[1].tokens) == 3 and gens[1].finish_reason == CONTEXT
    assert gens[2].tokens == () and gens[2].finish_reason == CONTEXT


def run_agent(tok, engine, env_params: dict, max_turns: int, n: int = 2):
    role = EngineRole("agent", "p", engine, tok, {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 6})
    params = {"env": "test_long_pad", "env_params": env_params, "action_format": "eos", "max_turns": max_turns,
              "max_observation_tokens": 2 * LONG}
    ep = Episode("t0000001-p1", "long", "", n, {"agent": role}, tok, params, {})
    return run_episode(get_workflow("agent"), ep, 7).trajectories["agent"]


def test_an_episode_past_128_tokens_generates_and_one_past_1024_ends_with_the_context_reason(long_engine):
    tok, engine = long_engine
    # A first observation of ~300 tokens: the model's turns are generated and trained.
    for t in run_agent(tok, engine, {"pad": 300, "problems": 1}, max_turns=1):
        assert len(t.prompt_ids) > 300 and sum(t.loss_mask) >= 1
        assert t.info["end_reason"] != "context"
    # Turn after turn the context grows until the window is full: the episode ends "context",
    # past 128 tokens and never past 1,024 (~160 tokens a turn: six turns, each generating on
    # the whole context so far, rather than fifteen at 60).
    for t in run_agent(tok, engine, {"pad": 150, "problems": 1000}, max_turns=100):
        assert t.info["end_reason"] == "context"
        assert DEFAULT_POSITIONS < len(t.prompt_ids) + len(t.tokens) <= LONG
    # A first observation longer than the window: no token, the reason is the context.
    for t in run_agent(tok, engine, {"pad": LONG + 10, "problems": 1}, max_turns=3):
        assert t.info["end_reason"] == "context" and sum(t.loss_mask) == 0


def test_a_job_selects_the_window_and_a_bad_one_names_the_key_and_the_file(long_model, monkeypatch, tmp_path):
    from astraflow.actors.common import model_path
    from astraflow.actors.group_checks import limits_for
    from astraflow.config import load_config
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(long_model.parent.parent))
    cfg = load_config("examples/search_agent.yaml", {"model.max_positions": LONG})
    assert cfg.model.max_positions == LONG and model_path(cfg) == long_model
    assert limits_for(cfg, cfg.policy).max_positions == LONG  # the dataflow's content check knows the window
    assert load_config("examples/search_agent.yaml").model.max_positions is None
    with pytest.raises(ConfigError, match=r"search_agent\.yaml.*model\.max_positions.*\[16, 32768\]"):
        load_config("examples/search_agent.yaml", {"model.max_positions": 8})
    with pytest.raises(ConfigError, match=r"search_agent\.yaml.*model\.max_positions.*model\.path is set"):
        load_config("examples/search_agent.yaml", {"model.max_positions": LONG, "model.path": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"search_agent\.yaml.*model\.task.*unknown warm-start task 'serch'"):
        load_config("examples/search_agent.yaml", {"model.task": "serch"})


def test_model_init_builds_and_reports_the_window(long_model, tmp_path, capsys):
    cache = tmp_path / "models"
    shutil.copytree(long_model, cache / long_model.name)  # cached: init reuses it (no full build in a test)
    out = tmp_path / "copy"
    assert model_command(["init", "--task", "search", "--max-positions", str(LONG), "--cache-dir", str(cache),
                 "--out", str(out)]) == 0
    assert f"positions: {LONG}" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == LONG
    assert model_command(["init", "--task", "search", "--max-positions", "4", "--cache-dir", str(cache)]) == 2
    assert "--max-positions" in capsys.readouterr().err


def test_search_wide_is_the_agents_exact_text_after_wide_searches_past_128_tokens():
    """The named 1,024-position warm start: the search agent's turns when a search shows five
    documents, as the agent workflow writes them; some need more than 128 positions; its
    questions are train ones; the job that uses it shows the documents the same way."""
    from astraflow.config import load_config
    from astraflow.models.warm_start import SEARCH_WIDE, get_task
    from astraflow.workflows.environments import EnvTask
    from astraflow.workflows.search_env import SearchEnv, search_prompts, split_of

    spec = default_spec("search_wide")
    assert spec.max_positions == LONG and spec.key(0, "search_wide").startswith("tiny-qwen3-search_wide-p1024-s0-")
    ex = get_task("search_wide").examples(120, 0, "train")
    rows = {p.text: p for p in search_prompts(2000, 0, "train")}
    for prompt, action in ex:
        question = prompt.split("<a>", 1)[0]
        assert split_of(question) == "train"
        row, env = rows[question], SearchEnv(**SEARCH_WIDE)
        text = env.reset(EnvTask("e", row.text, row.answer, dict(row.metadata))) + "<a>"
        for step in row.metadata["solution"].split(";"):
            if text == prompt:
                assert action == step + "</a>"
                break
            obs, _, _, _ = env.step(step)
            text += f"{step}</a> {obs}<a>"
        else:
            raise AssertionError(f"{prompt!r} is not a prefix of a shortest solution's text")
    widths = [len(p) + len(a) + 1 for p, a in ex]  # characters are tokens; +1 for <eos>
    assert max(widths) > DEFAULT_POSITIONS and max(widths) <= LONG
    held = {p.split("<a>", 1)[0] for p, _ in get_task("search_wide").examples(60, 0, "heldout")}
    assert held and not held & {p.split("<a>", 1)[0] for p, _ in ex}

    job = load_config("examples/search_agent_long.yaml")
    assert job.model.task == "search_wide" and dict(job.workflow.params["env_params"]) == SEARCH_WIDE
    assert model_shape(None, 0, "search_wide").max_positions == LONG


def test_model_init_builds_what_a_job_resolves_for_a_task_with_its_own_step_cap(tmp_path, monkeypatch, capsys):
    """``search_wide``'s spec caps its steps: ``model init`` without ``--max-steps`` must build
    under the key a job with ``model.task: search_wide`` looks up (a cached copy stands in)."""
    from astraflow.actors.common import model_path
    from astraflow.config import load_config
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path))
    key = default_spec("search_wide").key(0, "search_wide")
    cached = tmp_path / "models" / key
    cached.mkdir(parents=True)
    (cached / MARKER).write_text(json.dumps({"task": "search_wide", "parameters": 1, "sft_steps": 1,
                                             "heldout_accuracy_greedy": 0.7, "heldout_accuracy_t0.6_k4": 0.7,
                                             "val_accuracy": 0.7, "spec": {"target_accuracy": 0.6,
                                                                           "max_steps": 600, "max_positions": LONG}}))
    from astraflow.models import build
    monkeypatch.setattr(build, "build_tiny_model", lambda *a, **k: pytest.fail(f"model init built {k}"))
    assert model_command(["init", "--task", "search_wide"]) == 0  # found in the cache: nothing is built
    assert str(cached) in capsys.readouterr().out
    assert model_path(load_config("examples/search_agent_long.yaml")) == cached
