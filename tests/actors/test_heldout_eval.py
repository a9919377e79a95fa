"""The evaluator's functions on the tiny model: the job's reward with each row's metadata, the
demo's number unchanged, per-policy and team rewards of a multi-policy job, and the
training prompts a dataflow may publish (never a held-out one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml

from astraflow.actors.evaluator import heldout_accuracy, heldout_problems, team_evaluation
from astraflow.actors.heldout import training_prompts
from astraflow.config import load_config
from astraflow.topics import Prompt
from astraflow.workflows.api import reward
from astraflow.workflows.datasets import DatasetError

ROOT = Path(__file__).resolve().parents[2]


@reward("test_eval_row_score")
def row_score(completion_text: str, answer: str, meta) -> float:
    return float(meta["score"])


@pytest.fixture(scope="module")
def tok_engine():
    from transformers import AutoTokenizer

    from astraflow.engines.cpu import CpuEngine
    from astraflow.models.bootstrap import ensure_tiny_model

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    path = ensure_tiny_model()
    engine = CpuEngine(path)
    yield AutoTokenizer.from_pretrained(str(path)), engine
    engine.close()


def _cfg(tmp_path: Path, example: str = "arithmetic_grpo.yaml", **sections):
    data = yaml.safe_load((ROOT / "examples" / example).read_text())
    for key, value in sections.items():
        data[key] = {**(data.get(key) or {}), **value}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def _scored(n: int) -> list[Prompt]:
    return [Prompt(f"s{i}", f"{i}+{i}=", str(2 * i), "x", {"score": (i + 1) / 8}) for i in range(n)]


def test_the_demo_heldout_number_is_the_one_the_evaluator_gave_before(tmp_path, tok_engine):
    """The arithmetic demo: same problems, same samples, same exact-match score as the
    evaluator's arithmetic-only loop (written out here as it was)."""
    from astraflow.engines.base import SamplingParams
    from astraflow.workflows.arithmetic import generate_problems, reward as exact

    tok, engine = tok_engine
    cfg = _cfg(tmp_path, eval={"problems": 24, "k": 2})
    problems = heldout_problems(cfg)
    before = generate_problems(24, seed=cfg.seed + 1000, split="heldout", max_digits=cfg.data.max_digits,
                               ops=cfg.data.ops, unique=True)
    assert [(p.text, p.answer) for p in problems] == [(p.prompt, p.answer) for p in before]
    rows = [(i, tok.encode(p.prompt, add_special_tokens=False)) for i, p in enumerate(before) for _ in range(2)]
    gens = engine.generate([ids for _, ids in rows],
                           SamplingParams(temperature=cfg.eval.temperature, max_new_tokens=cfg.rollout.max_new_tokens,
                                          stop_token_ids=(tok.eos_token_id,), seed=cfg.seed))
    old = sum(exact(tok.decode(g.tokens, skip_special_tokens=True), before[i].answer)
              for (i, _), g in zip(rows, gens)) / len(rows)
    assert heldout_accuracy(cfg, engine, tok, problems) == old


def test_the_lead_accuracy_is_scored_by_the_jobs_reward_with_the_rows_metadata(tmp_path, tok_engine):
    tok, engine = tok_engine
    cfg = _cfg(tmp_path, workflow={"params": {"reward": "test_eval_row_score"}}, eval={"k": 3})
    rows = _scored(5)
    assert heldout_accuracy(cfg, engine, tok, rows) == pytest.approx(sum(r.metadata["score"] for r in rows) / 5)


def test_a_multi_policy_job_gets_team_and_per_policy_rewards_from_its_rows(tmp_path, tok_engine):
    tok, engine = tok_engine
    cfg = _cfg(tmp_path, "solver_verifier.yaml", workflow={"params": {"reward": "test_eval_row_score"}},
               eval={"k": 2})
    rows = _scored(4)
    team, by_policy = team_evaluation(cfg, {"solver": engine, "verifier": engine}, tok, rows)
    # the team's final answer is scored by the row's own score, retried or not
    assert team == pytest.approx(sum(r.metadata["score"] for r in rows) / 4)
    assert set(by_policy) == {"solver", "verifier"}
    assert min(r.metadata["score"] for r in rows) <= by_policy["solver"] <= max(r.metadata["score"] for r in rows)
    assert 0.0 <= by_policy["verifier"] <= 1.0


def test_the_dataflow_publishes_no_heldout_row(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(f'{{"prompt": "{i}*2=", "answer": "{2 * i}"}}\n' for i in range(40)))
    cfg = _cfg(tmp_path, data={"source": "d.jsonl", "num_prompts": None}, eval={"holdout": 0.25})
    train = training_prompts(cfg, "d.jsonl", None)
    held = heldout_problems(cfg)
    assert len(held) == 10 and len(train) == 30 and not {p.text for p in train} & {p.text for p in held}
    # reading fewer rows (data.num_prompts) takes training rows only: the split is of the whole file
    assert training_prompts(cfg, "d.jsonl", 12) == train[:12]
    # eval.problems caps what is evaluated, not what is held out
    capped = _cfg(tmp_path, data={"source": "d.jsonl"}, eval={"holdout": 0.25, "problems": 4})
    assert heldout_problems(capped) == held[:4] and training_prompts(capped, "d.jsonl", None) == train


def test_eval_data_rows_are_left_out_of_training(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(f'{{"prompt": "{i}*2=", "answer": "{2 * i}"}}\n' for i in range(6)))
    (tmp_path / "e.jsonl").write_text('{"prompt": "1*2=", "answer": "2", "unit": "none"}\n'
                                      '{"prompt": "9*9=", "answer": "81"}\n')
    cfg = _cfg(tmp_path, data={"source": "d.jsonl"}, eval={"data": "e.jsonl"})
    assert [p.text for p in heldout_problems(cfg)] == ["1*2=", "9*9="]
    assert heldout_problems(cfg)[0].metadata == {"unit": "none"}
    assert [p.text for p in training_prompts(cfg, "d.jsonl", None)] == ["0*2=", "2*2=", "3*2=", "4*2=", "5*2="]
    # and a generator's prompts too
    plain = [p.text for p in training_prompts(_cfg(tmp_path), "arithmetic", 50)]
    (tmp_path / "e.jsonl").write_text(f'{{"prompt": "{plain[3]}", "answer": "0"}}\n')
    cfg = _cfg(tmp_path, eval={"data": "e.jsonl"})
    assert [p.text for p in training_prompts(cfg, "arithmetic", 50)] == [t for t in plain if t != plain[3]]


def test_a_split_that_leaves_no_training_row_stops_the_dataflow(tmp_path):
    (tmp_path / "one.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    cfg = _cfg(tmp_path, data={"source": "one.jsonl"})
    with pytest.raises(DatasetError, match="holds out all 1 of its rows: no training rows"):
        training_prompts(cfg, "one.jsonl", None)
