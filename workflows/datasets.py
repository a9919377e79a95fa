"""Dataset loaders: where the prompts of a job come from.

A loader returns :class:`~astraflow.topics.Prompt` records; the dataflow actor publishes
them to the job's ``prompts`` topic once. Sources: the synthetic arithmetic generator,
or a JSONL / Parquet file whose rows have ``prompt`` and ``answer`` (and optionally
``id``), or, for a chat model, ``messages`` (a conversation ending in a user message) and
``answer``; either may add a ``system`` message. A bad row raises :class:`DatasetError` naming it as ``file:line`` (JSONL) or
``file: row i`` (Parquet) — a fatal error, since re-reading the file cannot fix it — or,
with ``on_bad_row``, is handed to that callback and skipped. This module reads files; it
knows nothing about Kafka beyond the duck-typed dead-letter writer of
:func:`bad_row_handler`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable, NamedTuple

import orjson

from astraflow.errors import DataError
from astraflow.topics import Prompt

from .arithmetic import chat_question, generate_problems
from .chat import ChatTemplateError, check_messages, prompt_messages


class DatasetError(DataError, ValueError):
    """A dataset file or row is unusable; the message names the file and row."""


class BadRow(NamedTuple):
    """A row the loader could not use."""

    path: Path  #: the dataset file
    line: int  #: 1-based line (JSONL) or row number (Parquet)
    raw: bytes  #: the row as read (JSON bytes)
    error: DatasetError  #: why; its message starts with ``path:line``


def load_prompts(source: str, n: int | None, *, seed: int = 0, max_digits: int = 2, ops: str = "+-",
                 base_dir: str | Path = ".", on_bad_row: Callable[[BadRow], None] | None = None) -> list[Prompt]:
    """Up to ``n`` prompts (``None``: all rows of a file; required for the generator).

    Without ``on_bad_row`` the first bad row raises; with it, bad rows go to the callback
    and do not count towards ``n``.
    """
    if source == "arithmetic":
        if n is None:
            raise DatasetError("the arithmetic generator needs a prompt count (data.num_prompts)")
        problems = generate_problems(n, seed=seed, split="train", max_digits=max_digits, ops=ops)
        return [Prompt(f"arith-{seed}-{i}", p.prompt, p.answer, "arithmetic") for i, p in enumerate(problems)]
    if source == "arithmetic_chat":  # the same problems asked as a question, for a chat model
        if n is None:
            raise DatasetError("the arithmetic_chat generator needs a prompt count (data.num_prompts)")
        problems = generate_problems(n, seed=seed, split="train", max_digits=max_digits, ops=ops)
        return [Prompt(f"arith-{seed}-{i}", chat_question(p), p.answer, "arithmetic_chat")
                for i, p in enumerate(problems)]
    if source == "text_game":  # the agent workflow's shipped environment: generated games
        if n is None:
            raise DatasetError("the text_game task generator needs a prompt count (data.num_prompts)")
        from .text_game import text_game_prompts
        return text_game_prompts(n, seed)
    if source == "search":  # the agent workflow's search environment: generated questions over its corpus
        if n is None:
            raise DatasetError("the search task generator needs a prompt count (data.num_prompts)")
        from .search_env import search_prompts
        return search_prompts(n, seed)
    if source == "code":  # program synthesis: infer f from examples; hidden tests in the metadata
        if n is None:
            raise DatasetError("the code task generator needs a prompt count (data.num_prompts)")
        from .code_tasks import code_prompts
        return code_prompts(n, seed)
    path = Path(source)
    if not path.is_absolute():
        path = Path(base_dir) / path
    if not path.exists():
        raise DatasetError(f"dataset file {path} does not exist (data.source)")
    if not path.is_file():
        raise DatasetError(f"dataset file {path} is not a file (data.source: give a JSONL or Parquet file, or "
                           f"'arithmetic' / 'code')")
    out: list[Prompt] = []
    for index, (line, row, raw) in enumerate(_read_rows(path)):
        if n is not None and len(out) >= n:
            break
        try:
            if isinstance(row, DatasetError):
                raise row
            out.append(_prompt(path, line, index, row))
        except DatasetError as e:
            if on_bad_row is None:
                raise
            on_bad_row(BadRow(path, line, raw, e))
    return out


def split_heldout(prompts: list[Prompt], fraction: float, seed: int = 0) -> tuple[list[Prompt], list[Prompt]]:
    """``(training rows, held-out rows)``: ``fraction`` of the distinct prompt texts held out.

    The texts are ranked by a hash of ``seed`` and the text, and the first
    ``ceil(fraction * distinct texts)`` are held out; every row with a held-out text is held
    out, so a prompt that appears twice can never be trained on and evaluated on. Training
    rows keep the file's order; held-out rows come in the ranking's order, so the first
    ``m`` of them are a seeded sample whatever ``m`` is. The split depends on the texts and
    the seed only: not on row order, ids or how many rows a job reads.
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"the held-out fraction must be in [0, 1), got {fraction}")
    texts = list(dict.fromkeys(p.text for p in prompts))
    k = math.ceil(fraction * len(texts)) if fraction > 0 else 0
    held = set(sorted(texts, key=lambda t: _rank(seed, t))[:k])
    train = [p for p in prompts if p.text not in held]
    heldout = sorted((p for p in prompts if p.text in held), key=lambda p: _rank(seed, p.text))
    return train, heldout


def without(prompts: list[Prompt], heldout: Iterable[Prompt]) -> list[Prompt]:
    """``prompts`` less every row whose text is one of ``heldout``'s."""
    texts = {p.text for p in heldout}
    return [p for p in prompts if p.text not in texts]


def _rank(seed: int, text: str) -> bytes:
    return hashlib.blake2b(f"{int(seed)}\x1f{text}".encode(), digest_size=8).digest()


def bad_row_handler(setting: str, dead_letters: Any) -> Callable[[BadRow], None] | None:
    """The ``on_bad_row`` for the ``data.on_bad_row`` setting: None (``fail``: raise), or one
    that writes each bad row to the job's DLQ (``skip``).

    The dead letter's source is ``file:<path>`` and its offset the row's line, so the DLQ
    names the row as precisely as the error would have.
    """
    if setting == "fail":
        return None
    if setting != "skip":
        raise DatasetError(f"data.on_bad_row must be 'fail' or 'skip', got {setting!r}")

    def put(bad: BadRow) -> None:
        dead_letters.put(f"file:{bad.path}", 0, bad.line, None, bad.raw, None, bad.error)
    return put


def _prompt(path: Path, line: int, index: int, row: Any) -> Prompt:
    if isinstance(row, dict) and "messages" in row and "answer" in row:
        return _chat_prompt(path, line, index, row)
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or "answer" not in row:
        raise DatasetError(f"{_where(path, line)}: needs string 'prompt' and 'answer' fields (or a 'messages' list "
                           f"and 'answer'), got {row!r:.200}")
    messages = []
    if row.get("system") is not None:  # a system message makes the prompt a conversation
        if not isinstance(row["system"], str):
            raise DatasetError(f"{_where(path, line)}: 'system' must be a string, got {row['system']!r:.80}")
        messages = prompt_messages(row["prompt"], (), row["system"])
    return Prompt(str(row.get("id", f"{path.stem}-{index}")), row["prompt"], str(row["answer"]), path.name,
                  _extra(row), messages)


def _chat_prompt(path: Path, line: int, index: int, row: dict) -> Prompt:
    """A row whose prompt is a conversation: ``messages`` (and an optional ``system``) with a
    last user message, which is the prompt's ``text``."""
    try:
        messages = check_messages(row["messages"], f"{_where(path, line)}: messages")
        if row.get("system") is not None and not isinstance(row["system"], str):
            raise ChatTemplateError(f"{_where(path, line)}: 'system' must be a string, got {row['system']!r:.80}")
    except ChatTemplateError as e:
        raise DatasetError(str(e)) from None
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users or messages[-1]["role"] == "assistant":
        raise DatasetError(f"{_where(path, line)}: messages must hold a user message and not end with the "
                           f"assistant's (the model writes the reply)")
    convo = prompt_messages(users[-1], messages, row.get("system"))
    return Prompt(str(row.get("id", f"{path.stem}-{index}")), users[-1], str(row["answer"]), path.name, _extra(row),
                  convo)


def _extra(row: dict) -> dict:
    """Other scalar columns travel as metadata (e.g. a difficulty column a curriculum schedules by)."""
    return {k: v for k, v in row.items()
            if k not in ("id", "prompt", "answer", "messages", "system") and isinstance(v, (str, int, float, bool))}


def _where(path: Path, line: int) -> str:
    return f"{path}: row {line}" if path.suffix == ".parquet" else f"{path}:{line}"


def _read_rows(path: Path) -> list[tuple[int, Any, bytes]]:
    """``(line, row or the DatasetError that row raised, raw bytes)`` per non-empty row."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DatasetError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - any read failure is an unusable file
            raise DatasetError(f"{path}: not a readable Parquet file: {e}") from None
        return [(i, row, orjson.dumps(row, default=str)) for i, row in enumerate(table.to_pylist(), 1)]
    rows: list[tuple[int, Any, bytes]] = []
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DatasetError(f"dataset file {path} cannot be read: {e.strerror or e} (data.source)") from None
    for lineno, line in enumerate(data.splitlines(), 1):
        if line.strip():
            try:
                rows.append((lineno, orjson.loads(line), line))
            except orjson.JSONDecodeError as e:
                rows.append((lineno, DatasetError(f"{path}:{lineno}: not JSON: {e}"), line))
    return rows
