"""``dataflow.algorithms`` in a job config file: parsed strictly, errors name the file and the key."""

from __future__ import annotations

import pytest
import yaml

from astraflow.config import ConfigError, load_config


def _load(tmp_path, algorithms, **dataflow):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"job": "j", "dataflow": {"groups_per_batch": 8, "algorithms": algorithms,
                                                             **dataflow}}))
    return path, load_config(path)


def test_a_composition_parses_in_order(tmp_path):
    _, cfg = _load(tmp_path, [{"name": "curriculum", "levels": [1, 2]}, "greso", "dynamic_sampling",
                              {"name": "replay", "ratio": 0.3}, "edf"])
    specs = cfg.dataflow.algorithms
    assert [s.name for s in specs] == ["curriculum", "greso", "dynamic_sampling", "replay", "edf"]
    assert specs[0].params.levels == (1.0, 2.0) and specs[3].params.ratio == 0.3
    assert specs[1].params.target_hard == 0.167  # the reference defaults


def test_the_default_config_has_no_algorithm(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("job: j\n")
    assert load_config(path).dataflow.algorithms == ()


@pytest.mark.parametrize("algorithms, key, problem", [
    (["greso", "gerso"], "dataflow.algorithms[1].name", "unknown algorithm 'gerso'"),
    ([{"name": "greso", "p_easy": 0.3}], "dataflow.algorithms[0].p_easy", "unknown key"),
    ([{"name": "replay", "ratio": "half"}], "dataflow.algorithms[0].ratio", "expected float"),
    ([{"name": "replay", "ratio": 1.2}], "dataflow.algorithms[0].ratio", "must be in (0, 1), got 1.2"),
    ([{"name": "replay", "ratio": 0.05}], "dataflow.algorithms[0]", "rounds to 0 replayed groups"),
    ([{"name": "replay", "sampling": "lifo"}], "dataflow.algorithms[0].sampling", "must be one of"),
    ([{"name": "mixing", "sources": {"a.jsonl": 1}}], "dataflow.algorithms[0]", "at least two sources"),
    (["edf", "greso", "fifo"], "dataflow.algorithms[2]", "edf and fifo"),
    (["greso", "greso"], "dataflow.algorithms[1]", "already configured"),
    ([{"ratio": 0.5}], "dataflow.algorithms[0].name", "needs a name"),
])
def test_bad_entries_name_the_file_and_the_key(tmp_path, algorithms, key, problem):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, algorithms)
    assert e.value.file == str(tmp_path / "job.yaml") and e.value.key == key
    assert problem in e.value.problem


def test_cross_section_checks_name_the_algorithm(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"job": "j", "rollout": {"n_samples": 1},
                                    "dataflow": {"algorithms": ["greso", "dynamic_sampling"]}}))
    with pytest.raises(ConfigError, match=r"job.yaml: dataflow.algorithms\[1\]: dynamic_sampling needs "
                                          r"rollout.n_samples >= 2"):
        load_config(path)


def test_the_example_config_loads():
    from pathlib import Path
    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "arithmetic_data_algorithms.yaml")
    assert [s.name for s in cfg.dataflow.algorithms] == ["curriculum", "greso", "dynamic_sampling", "replay", "edf"]
    assert cfg.trainer.engine.loss == "decoupled_ppo"  # replayed samples are stale


def _team(tmp_path, policies, **top):
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump({"job": "t", "policies": policies, **top,
                                    "workflow": {"name": "solver_verifier",
                                                 "roles": {"solver": "solver", "verifier": "verifier"}}}))
    return path, load_config(path)


def test_each_policy_of_a_team_has_its_own_filters_and_composers(tmp_path):
    _, cfg = _team(tmp_path, {"solver": {"dataflow": {"algorithms": [{"name": "replay", "ratio": 0.25}]}},
                              "verifier": {"dataflow": {"algorithms": ["dynamic_sampling"]}}})
    assert [s.name for s in cfg.view("solver").dataflow.algorithms] == ["replay"]
    assert [s.name for s in cfg.view("verifier").dataflow.algorithms] == ["dynamic_sampling"]


def test_a_curator_only_a_non_lead_policy_has_is_refused_naming_its_key(tmp_path):
    with pytest.raises(ConfigError) as e:
        _team(tmp_path, {"solver": {}, "verifier": {"dataflow": {"algorithms": ["dynamic_sampling", "greso"]}}})
    assert e.value.key == "policies.verifier.dataflow.algorithms[1]"
    assert "greso is a prompt curator" in e.value.problem and "lead policy 'solver'" in e.value.problem


def test_a_policy_s_algorithms_are_checked_against_its_own_sections(tmp_path):
    # the verifier samples once per prompt: dynamic sampling cannot run in its lane (the solver's is fine)
    with pytest.raises(ConfigError) as e:
        _team(tmp_path, {"solver": {"dataflow": {"algorithms": ["dynamic_sampling"]}},
                         "verifier": {"rollout": {"n_samples": 1}, "dataflow": {"algorithms": ["dynamic_sampling"]}}})
    assert e.value.key == "policies.verifier.dataflow.algorithms[0]" and "n_samples >= 2" in e.value.problem
