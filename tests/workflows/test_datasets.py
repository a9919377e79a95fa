import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from astraflow.errors import DataError, fatal_cause
from astraflow.workflows.datasets import BadRow, DatasetError, bad_row_handler, load_prompts


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
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: needs string 'prompt' and 'answer'"):
        load_prompts("bad.jsonl", None, base_dir=tmp_path)
    (tmp_path / "broken.jsonl").write_text('{"prompt": \n')
    with pytest.raises(DatasetError, match=r"broken.jsonl:1: not JSON"):
        load_prompts("broken.jsonl", None, base_dir=tmp_path)
    with pytest.raises(DatasetError, match="does not exist"):
        load_prompts("missing.jsonl", None, base_dir=tmp_path)


def test_bad_data_is_a_fatal_error(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\nnot json\n')
    with pytest.raises(DataError) as e:
        load_prompts("d.jsonl", None, base_dir=tmp_path)
    assert fatal_cause(e.value) is e.value and not e.value.retriable


def test_parquet_bad_row_is_named_by_row_number(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"prompt": "5+5=", "answer": "10"}, {"prompt": None, "answer": "1"}]),
                   tmp_path / "d.parquet")
    with pytest.raises(DatasetError, match=r"d.parquet: row 2: needs string 'prompt'"):
        load_prompts("d.parquet", None, base_dir=tmp_path)


def test_on_bad_row_skips_bad_rows_and_names_their_lines(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{oops\n\n{"q": 1}\n'
                                      '{"prompt": "2+2=", "answer": "4"}\n')
    bad: list[BadRow] = []
    got = load_prompts("d.jsonl", None, base_dir=tmp_path, on_bad_row=bad.append)
    assert [p.text for p in got] == ["1+1=", "2+2="]
    assert [(b.line, b.raw) for b in bad] == [(2, b"{oops"), (4, b'{"q": 1}')]
    assert "d.jsonl:2: not JSON" in str(bad[0].error) and "d.jsonl:4: needs string 'prompt'" in str(bad[1].error)
    # Ids stay those of the rows' positions, skipped or not, so a rerun names the same prompts.
    assert [p.prompt_id for p in got] == ["d-0", "d-3"]
    # ``n`` counts good prompts only.
    assert [p.text for p in load_prompts("d.jsonl", 2, base_dir=tmp_path, on_bad_row=bad.append)] == ["1+1=", "2+2="]


def test_skipped_rows_reach_the_dead_letter_topic(tmp_path, bootstrap, job_topics, make_producer):
    from astraflow.topics import DeadLetter, DeadLetters
    from astraflow.topics.replay import read_topic

    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\nnot json\n')
    dead = DeadLetters(make_producer(), job_topics.dlq, "dataflow.policy")
    got = load_prompts("d.jsonl", None, base_dir=tmp_path, on_bad_row=bad_row_handler("skip", dead))
    assert bad_row_handler("fail", dead) is None
    assert len(got) == 1
    [letter] = [m for _, _, m in read_topic(bootstrap, job_topics.dlq) if isinstance(m, DeadLetter)]
    assert (letter.source_topic, letter.offset, letter.error_type) == (f"file:{tmp_path / 'd.jsonl'}", 2,
                                                                        "DatasetError")
    assert "d.jsonl:2: not JSON" in letter.error
