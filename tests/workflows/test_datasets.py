import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from astraflow.workflows.datasets import DatasetError, load_prompts


def test_arithmetic_generator_is_deterministic_and_needs_a_count():
    a = load_prompts("arithmetic", 20, seed=3, ops="+")
    assert a == load_prompts("arithmetic", 20, seed=3, ops="+")
    assert all(p.text.endswith("=") and str(eval(p.text[:-1])) == p.answer for p in a)
    with pytest.raises(DatasetError, match="num_prompts"):
        load_prompts("arithmetic", None)


def test_jsonl_and_parquet_files(tmp_path):
    rows = [{"prompt": "2+2=", "answer": "4", "id": "a"}, {"prompt": "3+3=", "answer": 6}]
    (tmp_path / "d.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n\n")
    pq.write_table(pa.Table.from_pylist([{"prompt": "5+5=", "answer": "10"}]), tmp_path / "d.parquet")
    got = load_prompts("d.jsonl", None, base_dir=tmp_path)
    assert [(p.prompt_id, p.text, p.answer) for p in got] == [("a", "2+2=", "4"), ("d-1", "3+3=", "6")]
    assert [p.answer for p in load_prompts(str(tmp_path / "d.parquet"), None)] == ["10"]
    assert len(load_prompts("d.jsonl", 1, base_dir=tmp_path)) == 1


def test_bad_rows_name_file_and_row(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"question": "x"}\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl: row 1 needs string 'prompt' and 'answer'"):
        load_prompts("bad.jsonl", None, base_dir=tmp_path)
    (tmp_path / "broken.jsonl").write_text('{"prompt": \n')
    with pytest.raises(DatasetError, match=r"broken.jsonl:1: not JSON"):
        load_prompts("broken.jsonl", None, base_dir=tmp_path)
    with pytest.raises(DatasetError, match="does not exist"):
        load_prompts("missing.jsonl", None, base_dir=tmp_path)
