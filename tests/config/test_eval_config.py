"""The evaluation keys (`eval.data`, `eval.holdout`, `eval.split_seed`): loaded strictly, and
checked against the data before a job starts (a split that leaves no training row fails)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from astraflow.checks import check_data
from astraflow.config import ConfigError, load_config
from astraflow.errors import DataError

ROOT = Path(__file__).resolve().parents[2]


def _rows(path: Path, n: int) -> str:
    path.write_text("".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(n)))
    return path.name


def _cfg(tmp_path: Path, **sections):
    data = yaml.safe_load((ROOT / "examples" / "arithmetic_grpo.yaml").read_text())
    for key, value in sections.items():
        data[key] = {**(data.get(key) or {}), **value}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_defaults_hold_out_a_tenth_of_a_file_and_nothing_of_a_generator(tmp_path):
    assert _cfg(tmp_path).heldout_fraction == 0.0  # the demo: the generator's own held-out split
    name = _rows(tmp_path / "d.jsonl", 20)
    assert _cfg(tmp_path, data={"source": name}).heldout_fraction == 0.1
    assert _cfg(tmp_path, data={"source": name}, eval={"holdout": 0.25}).heldout_fraction == 0.25
    _rows(tmp_path / "e.jsonl", 3)
    assert _cfg(tmp_path, data={"source": name}, eval={"data": "e.jsonl"}).heldout_fraction == 0.0


@pytest.mark.parametrize(("sections", "key", "message"), [
    ({"eval": {"holdout": 1.0}}, "eval.holdout", "[0, 1)"),
    ({"eval": {"holdout": -0.1}}, "eval.holdout", "[0, 1)"),
    ({"eval": {"holdout": "a lot"}}, "eval.holdout", ""),
    ({"eval": {"split_seed": -1}}, "eval.split_seed", ""),
    ({"eval": {"holdout": 0.2}}, "eval.holdout", "generator"),  # the demo's arithmetic source
    ({"eval": {"data": "arithmetic"}}, "eval.data", "JSONL or Parquet file"),
    ({"data": {"source": "d.jsonl"}, "eval": {"holdout": 0.2, "data": "e.jsonl"}}, "eval.holdout", "not both"),
    ({"data": {"source": "d.jsonl"}, "eval": {"holdout": 0}}, "eval.holdout", "nothing would be evaluated"),
    ({"eval": {"splits": 2}}, "eval.splits", "unknown"),
])
def test_invalid_values_name_the_key_and_the_file(tmp_path, sections, key, message):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, **sections)
    assert e.value.key == key and e.value.file == str(tmp_path / "job.yaml"), e.value
    assert message in str(e.value)


def test_a_split_that_leaves_no_training_row_fails_the_check(tmp_path):
    name = _rows(tmp_path / "one.jsonl", 1)
    with pytest.raises(DataError, match=r"job\.yaml: eval\.holdout 0\.1 holds out all 1 rows.*no training rows"):
        check_data(_cfg(tmp_path, data={"source": name}))
    name = _rows(tmp_path / "d.jsonl", 20)
    assert check_data(_cfg(tmp_path, data={"source": name})).endswith(
        "d.jsonl: 20 rows; 2 held out for evaluation (eval.holdout 0.1)")


def test_eval_data_is_checked_like_the_training_file(tmp_path):
    name = _rows(tmp_path / "d.jsonl", 5)
    with pytest.raises(DataError, match=r"job\.yaml: dataset file .*missing\.jsonl does not exist \(eval\.data\)"):
        check_data(_cfg(tmp_path, data={"source": name}, eval={"data": "missing.jsonl"}))
    with pytest.raises(DataError, match="every prompt of data.source d.jsonl is also in eval.data"):
        check_data(_cfg(tmp_path, data={"source": name}, eval={"data": name}))
    _rows(tmp_path / "e.jsonl", 2)
    assert check_data(_cfg(tmp_path, data={"source": name}, eval={"data": "e.jsonl"})).endswith(
        "held out: eval.data e.jsonl, 2 rows")
