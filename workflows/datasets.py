"""Dataset loaders: where the prompts of a job come from.

A loader returns :class:`~astraflow.topics.Prompt` records; the dataflow actor publishes
them to the job's ``prompts`` topic once. Sources: the synthetic arithmetic generator,
or a JSONL / Parquet file whose rows have ``prompt`` and ``answer`` (and optionally
``id``). Bad rows raise an error naming the file and row.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from astraflow.topics import Prompt

from .arithmetic import generate_problems


class DatasetError(ValueError):
    """A dataset file or row is unusable; the message names the file and row."""


def load_prompts(source: str, n: int | None, *, seed: int = 0, max_digits: int = 2, ops: str = "+-",
                 base_dir: str | Path = ".") -> list[Prompt]:
    """Up to ``n`` prompts (``None``: all rows of a file; required for the generator)."""
    if source == "arithmetic":
        if n is None:
            raise DatasetError("the arithmetic generator needs a prompt count (data.num_prompts)")
        problems = generate_problems(n, seed=seed, split="train", max_digits=max_digits, ops=ops)
        return [Prompt(f"arith-{seed}-{i}", p.prompt, p.answer, "arithmetic") for i, p in enumerate(problems)]
    path = Path(source)
    if not path.is_absolute():
        path = Path(base_dir) / path
    if not path.exists():
        raise DatasetError(f"dataset file {path} does not exist (data.source)")
    rows = _read_rows(path)
    out = []
    for i, row in enumerate(rows[:n] if n is not None else rows):
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or "answer" not in row:
            raise DatasetError(f"{path}: row {i} needs string 'prompt' and 'answer' fields, got {row!r:.200}")
        out.append(Prompt(str(row.get("id", f"{path.stem}-{i}")), row["prompt"], str(row["answer"]), path.name))
    return out


def _read_rows(path: Path) -> list:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DatasetError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
        return pq.read_table(path).to_pylist()
    rows = []
    for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
        if line.strip():
            try:
                rows.append(orjson.loads(line))
            except orjson.JSONDecodeError as e:
                raise DatasetError(f"{path}:{lineno}: not JSON: {e}") from None
    return rows
