"""The held-out split of a dataset file, and rewards that see the row's metadata."""

from __future__ import annotations

import math
import random

import pytest

from astraflow.topics import Prompt
from astraflow.workflows.api import EngineRole, Episode, get_scorer, get_workflow, reward, run_episode, takes_metadata
from astraflow.workflows.datasets import split_heldout, without


def _rows(n: int) -> list[Prompt]:
    return [Prompt(f"r{i}", f"{i}+{i % 7}=", str(i + i % 7), "d.jsonl", {"i": i}) for i in range(n)]


def test_the_split_is_seeded_deterministic_and_disjoint():
    rows = _rows(50)
    train, held = split_heldout(rows, 0.2, seed=3)
    assert (train, held) == split_heldout(list(rows), 0.2, seed=3)
    assert len(held) == 10 and len(train) == 40
    assert not {p.text for p in train} & {p.text for p in held}
    assert sorted(p.prompt_id for p in train + held) == sorted(p.prompt_id for p in rows)
    assert [p.prompt_id for p in train] == [p.prompt_id for p in rows if p in train]  # file order kept
    other = split_heldout(rows, 0.2, seed=4)[1]
    assert {p.text for p in other} != {p.text for p in held}  # the seed chooses the rows


def test_the_split_depends_on_the_texts_not_the_order_or_the_count_read():
    rows = _rows(40)
    held = {p.text for p in split_heldout(rows, 0.25, seed=0)[1]}
    shuffled = list(rows)
    random.Random(1).shuffle(shuffled)
    assert {p.text for p in split_heldout(shuffled, 0.25, seed=0)[1]} == held
    # held-out rows come in the seeded ranking's order: a prefix is a sample of the whole
    first = [p.text for p in split_heldout(rows, 0.25, seed=0)[1]][:3]
    assert first == [p.text for p in split_heldout(shuffled, 0.25, seed=0)[1]][:3]


def test_a_repeated_prompt_is_never_on_both_sides():
    rows = _rows(10)
    dup = [*rows, *(Prompt(f"dup{i}", p.text, p.answer, "d.jsonl") for i, p in enumerate(rows))]
    for seed in range(20):
        train, held = split_heldout(dup, 0.3, seed=seed)
        assert len({p.text for p in held}) == math.ceil(0.3 * 10)
        assert not {p.text for p in train} & {p.text for p in held}
        assert len(held) == 2 * len({p.text for p in held})


def test_fractions_round_up_and_zero_holds_nothing():
    rows = _rows(7)
    assert len(split_heldout(rows, 0.1, 0)[1]) == 1
    assert split_heldout(rows, 0.0, 0) == (rows, [])
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        split_heldout(rows, 1.0, 0)


def test_without_drops_rows_by_text():
    rows = _rows(5)
    assert [p.prompt_id for p in without(rows, [Prompt("x", rows[1].text, "")])] == ["r0", "r2", "r3", "r4"]


# -- rewards that see the row's metadata --------------------------------------------------------

@reward("test_split_meta_positional")
def _meta_positional(text: str, answer: str, meta) -> float:
    return float(meta.get("weight", 0)) if text.strip() == answer else -1.0


@reward("test_split_meta_keyword")
def _meta_keyword(text: str, answer: str, *, meta=None) -> float:
    return float((meta or {}).get("weight", 0))


@reward("test_split_two_args")
def _two_args(text: str, answer: str) -> float:
    return 1.0 if text == answer else 0.0


def test_get_scorer_passes_metadata_only_to_rewards_that_take_it():
    assert takes_metadata(_meta_positional) == 2 and takes_metadata(_meta_keyword) == "meta"
    assert takes_metadata(_two_args) is None
    assert get_scorer("test_split_meta_positional")("4", "4", {"weight": 0.5}) == 0.5
    assert get_scorer("test_split_meta_positional")("5", "4", {"weight": 0.5}) == -1.0
    assert get_scorer("test_split_meta_keyword")("", "", {"weight": 2}) == 2.0
    assert get_scorer("test_split_meta_keyword")("", "") == 0.0  # no metadata: an empty mapping
    assert get_scorer("test_split_two_args")("4", "4", {"weight": 9}) == 1.0  # the old contract, unchanged
    assert get_scorer("exact_match")(" 12 ", "12", {"anything": 1}) == 1.0


def test_the_rlvr_episode_scores_with_the_rows_metadata(tokenizer_and_engine):
    tok, engine = tokenizer_and_engine
    role = EngineRole("solver", "policy", engine, tok, {"temperature": 1.0, "max_new_tokens": 4})
    ep = Episode("t1", "2+2=", "4", 3, {"solver": role}, tok, {"reward": "test_split_meta_keyword"},
                 {"weight": 0.25})
    result = run_episode(get_workflow("rlvr"), ep, job_seed=0)
    assert [t.reward for t in result.trajectories["solver"]] == [0.25, 0.25, 0.25]
    assert result.team_reward == 0.25
