"""Which rows a job trains on and which it holds out: the dataflow's and the evaluator's one answer.

A job's held-out set comes from its own data:

* ``eval.data`` (a JSONL / Parquet file): its rows; training rows with one of its prompt
  texts are left out of training;
* else each dataset file of the job (``data.source``, or the mixing curator's sources) is
  split by :func:`~astraflow.workflows.datasets.split_heldout` (``eval.holdout`` of its
  distinct prompts, seeded by ``eval.split_seed``): the dataflow publishes only the
  training rows, the evaluator measures on the held-out ones;
* a generator (``arithmetic``, ``code``) draws ``eval.problems`` problems of its own
  held-out split (a hash of the text, disjoint from its training split by construction):
  the demo's held-out set, unchanged.

Both sides call the functions here with the same config, so the split cannot drift
between the process that trains and the one that evaluates; a split that leaves a source
no training row is a :class:`~astraflow.workflows.datasets.DatasetError`. The held-out
rows are :class:`~astraflow.topics.Prompt` records: text, answer and the row's metadata,
which the job's reward sees (:func:`~astraflow.workflows.api.get_scorer`).
"""

from __future__ import annotations

from collections.abc import Callable

from astraflow.config import GENERATORS, JobConfig
from astraflow.topics import Prompt

__all__ = ["training_prompts", "heldout_problems", "heldout_label", "eval_reward"]


def _load(cfg: JobConfig, spec: str, n: int | None, on_bad_row: Callable | None) -> list[Prompt]:
    from astraflow.workflows.datasets import load_prompts
    return load_prompts(spec, n, seed=cfg.data.seed, max_digits=cfg.data.max_digits, ops=cfg.data.ops,
                        base_dir=cfg.config_dir, on_bad_row=on_bad_row)


def _quiet(cfg: JobConfig) -> Callable | None:
    """The evaluator re-reads files the dataflow already checked: bad rows it skips silently
    (``skip``: the dataflow dead-letters them) or raises on (``fail``)."""
    return (lambda bad: None) if cfg.data.on_bad_row == "skip" else None


def _eval_rows(cfg: JobConfig) -> list[Prompt]:
    from astraflow.workflows.datasets import DatasetError
    try:
        return _load(cfg, cfg.eval.data, None, _quiet(cfg))
    except DatasetError as e:
        raise DatasetError(str(e).replace("(data.source)", "(eval.data)")) from None


def training_prompts(cfg: JobConfig, spec: str, n: int | None, on_bad_row: Callable | None = None) -> list[Prompt]:
    """Up to ``n`` training prompts of source ``spec`` (``None``: all of a file): its rows less
    the held-out ones. Raises :class:`DatasetError` when nothing is left to train on."""
    from astraflow.workflows.datasets import DatasetError, split_heldout, without
    if spec in GENERATORS:
        rows = _load(cfg, spec, n, on_bad_row)
    else:  # the split is of the whole file, so it does not depend on how many rows the job reads
        rows, held = split_heldout(_load(cfg, spec, None, on_bad_row), cfg.heldout_fraction, cfg.eval.split_seed)
        if rows == [] and held:
            raise DatasetError(f"{cfg.source}: eval.holdout {cfg.heldout_fraction} of {spec} holds out all "
                               f"{len(held)} of its rows: no training rows are left (lower eval.holdout, or give "
                               f"the held-out rows as eval.data)")
    if cfg.eval.data is not None:
        before = len(rows)
        rows = without(rows, _eval_rows(cfg))
        if before and not rows:
            raise DatasetError(f"{cfg.source}: every prompt of {spec} is also in eval.data {cfg.eval.data}: no "
                               f"training rows are left")
    return rows if n is None or spec in GENERATORS else rows[:n]


def heldout_problems(cfg: JobConfig) -> list[Prompt]:
    """The job's fixed held-out set (the same for every version, run and replay of the job):
    at most ``eval.problems`` rows, one per distinct prompt text."""
    from astraflow.workflows.datasets import DatasetError, split_heldout
    if cfg.eval.data is not None:
        per_source = [_eval_rows(cfg)]
    else:
        per_source = []
        for spec in cfg.data_sources:
            if spec in ("arithmetic", "arithmetic_chat"):
                from astraflow.workflows.arithmetic import chat_question, generate_problems
                problems = generate_problems(cfg.eval.problems, seed=cfg.seed + 1000, split="heldout",
                                             max_digits=cfg.data.max_digits, ops=cfg.data.ops, unique=True)
                ask = chat_question if spec == "arithmetic_chat" else (lambda p: p.prompt)
                per_source.append([Prompt(f"heldout-{i}", ask(p), p.answer, spec) for i, p in enumerate(problems)])
            elif spec == "code":
                from astraflow.workflows.code_tasks import code_prompts
                per_source.append(code_prompts(cfg.eval.problems, cfg.seed + 1000, split="heldout"))
            elif spec == "text_game":
                from astraflow.workflows.text_game import text_game_prompts
                per_source.append(text_game_prompts(cfg.eval.problems, cfg.seed + 1000, split="heldout"))
            elif spec == "search":
                from astraflow.workflows.search_env import search_prompts
                per_source.append(search_prompts(cfg.eval.problems, cfg.seed + 1000, split="heldout"))
            else:
                per_source.append(split_heldout(_load(cfg, spec, None, _quiet(cfg)), cfg.heldout_fraction,
                                                cfg.eval.split_seed)[1])
    out, seen = [], set()
    for row in _round_robin(per_source):  # mixed sources take turns, so a cap keeps every one
        if row.text not in seen:
            seen.add(row.text)
            out.append(row)
    if not out:
        raise DatasetError(f"{cfg.source}: the held-out set is empty ({heldout_label(cfg)}); set eval.holdout "
                           f"or eval.data")
    return out[:cfg.eval.problems]


def heldout_label(cfg: JobConfig) -> str:
    """What the held-out set is, for the metrics' labels and logs."""
    if cfg.eval.data is not None:
        return f"eval.data {cfg.eval.data}"
    return ", ".join(f"{s} held-out split" if s in GENERATORS else f"{s} holdout {cfg.heldout_fraction:g}"
                     for s in cfg.data_sources)


def eval_reward(cfg: JobConfig) -> str:
    """The reward the lead policy's answers are scored by: ``workflow.params.reward``, else the
    workflow's own (:attr:`~astraflow.workflows.api.WorkflowSpec.reward`)."""
    from astraflow.workflows.api import get_workflow
    spec = get_workflow(cfg.workflow.name)
    if spec.episode_eval:
        return f"{spec.name} episode reward"
    return str(cfg.workflow.params.get("reward") or spec.reward)


def _round_robin(lists: list[list]) -> list:
    out = []
    for i in range(max((len(x) for x in lists), default=0)):
        out += [x[i] for x in lists if i < len(x)]
    return out
