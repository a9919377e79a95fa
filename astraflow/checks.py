"""Pre-flight checks of a job's inputs: its data source and its model path.

``astraflow config check`` runs both, and ``astraflow node`` / ``astraflow run`` check
the model before starting anything, so a typo fails in a second with its cause instead
of after restarts. The data check uses the dataflow's own loader on every row, so a
file that passes here is a file the dataflow can publish. This module reads files only;
it knows nothing about Kafka.
"""

from __future__ import annotations

from pathlib import Path

from astraflow.config import GENERATORS, JobConfig
from astraflow.errors import DataError, ModelError


def data_base_dir(cfg: JobConfig) -> str:
    """Relative ``data.source`` paths are relative to the config file, as in the dataflow."""
    return cfg.config_dir


def check_data(cfg: JobConfig) -> str:
    """Load every row of the data source; raises :class:`~astraflow.errors.DataError`.

    With ``data.on_bad_row: skip`` bad rows are counted, not raised: the job will skip them.
    """
    from astraflow.workflows.datasets import BadRow, load_prompts

    d = cfg.data
    # The generator yields as many prompts as asked; a file is read to its last row.
    generated = d.source in GENERATORS
    n = (d.num_prompts or 1) if generated else None
    bad: list[BadRow] = []
    try:
        prompts = load_prompts(d.source, n, seed=d.seed, max_digits=d.max_digits, ops=d.ops, base_dir=data_base_dir(cfg),
                               on_bad_row=bad.append if d.on_bad_row == "skip" else None)
    except DataError as e:  # the job file too: the row's file alone does not say which config chose it
        raise DataError(f"{cfg.source}: {e}") from None
    if not prompts:
        raise DataError(f"data.source {d.source}: no usable rows" + (f" (first bad row: {bad[0].error})" if bad else ""))
    held = _check_heldout(cfg, prompts if not generated else None) + _check_eval_sets(cfg)
    if generated:
        return f"synthetic {d.source} generator{held}"
    skipped = f", {len(bad)} bad rows to skip into the dlq (first: {bad[0].error})" if bad else ""
    return f"{d.source}: {len(prompts)} rows{skipped}{held}"


def _check_eval_sets(cfg: JobConfig) -> str:
    """``eval.dataset``'s sets read from their packages (a missing package is a one-line
    :class:`DataError` naming it, now rather than at the evaluator's first measurement)."""
    if not cfg.eval.datasets:
        return ""
    from astraflow.workflows.eval_sets import load_eval_set
    sizes = [f"{name} {len(load_eval_set(name, cfg.eval.dataset_problems))} items" for name in cfg.eval.datasets]
    return f"; benchmark sets (eval.dataset): {', '.join(sizes)}"


def _check_heldout(cfg: JobConfig, rows: list | None) -> str:
    """What the evaluator holds out of ``rows`` (a file's; None for a generator), as the
    dataflow and evaluator will split them (:mod:`astraflow.actors.heldout`); raises
    :class:`DataError` when no training row would be left or ``eval.data`` is unusable."""
    from astraflow.workflows.datasets import load_prompts, split_heldout, without

    if cfg.eval.data is not None:
        try:
            held = load_prompts(cfg.eval.data, None, base_dir=data_base_dir(cfg),
                                on_bad_row=(lambda bad: None) if cfg.data.on_bad_row == "skip" else None)
        except DataError as e:
            raise DataError(f"{cfg.source}: {str(e).replace('(data.source)', '(eval.data)')}") from None
        if not held:
            raise DataError(f"{cfg.source}: eval.data {cfg.eval.data}: no usable rows")
        if rows is not None and not without(rows, held):
            raise DataError(f"{cfg.source}: every prompt of data.source {cfg.data.source} is also in eval.data "
                            f"{cfg.eval.data}: no training rows are left")
        return f"; held out: eval.data {cfg.eval.data}, {len(held)} rows"
    if rows is None:
        return ""
    train, held = split_heldout(rows, cfg.heldout_fraction, cfg.eval.split_seed)
    if not train:
        raise DataError(f"{cfg.source}: eval.holdout {cfg.heldout_fraction:g} holds out all {len(held)} rows of "
                        f"data.source {cfg.data.source}: no training rows are left (lower eval.holdout, or give "
                        f"the held-out rows as eval.data)")
    return f"; {len(held)} held out for evaluation (eval.holdout {cfg.heldout_fraction:g})"


def check_model(cfg: JobConfig) -> str:
    """The configured model dir exists and holds a loadable HF config; raises :class:`ModelError`."""
    if cfg.model.name and not cfg.model.path:
        from astraflow.models.bootstrap import cache_root
        from astraflow.models.pretrained import MARKER, fetched_path, pretrained, source_file
        entry = pretrained(cfg.model.name)
        where = fetched_path(entry.name, cache_root())
        if (where / MARKER).exists():
            return f"{entry.name} (fetched: {where})"
        source_file(entry)  # the package that ships it is installed, or a one-line error now
        return f"{entry.name} (fetched into {where} on first use, from the package {entry.package})"
    if not cfg.model.path:
        from astraflow.models.spec import default_spec
        spec = default_spec(cfg.model.task, cfg.model.max_positions)
        return (f"tiny bootstrapped model (task {cfg.model.task}, seed {cfg.model.seed}, {spec.max_positions} positions; "
                f"built and cached on first use as {spec.key(cfg.model.seed, cfg.model.task)})")
    path = Path(cfg.model.path).expanduser()
    if not path.is_dir():
        raise ModelError(f"model.path {path}: no such directory; run `astraflow model init --out {path}` "
                         f"or fix the path")
    if not (path / "config.json").is_file():
        raise ModelError(f"model.path {path}: no config.json (not a Hugging Face model directory)")
    try:
        from transformers import AutoConfig
        config = AutoConfig.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - any load failure is the same verdict: unusable model
        raise ModelError(f"model.path {path}: config.json does not load: {type(e).__name__}: {e}") from e
    from astraflow.workflows.chat import has_chat_template
    if cfg.data.chat_template == "on" and not has_chat_template(path):
        raise ModelError(f"data.chat_template is on, but the tokenizer in model.path {path} has no chat template "
                         f"(set data.chat_template: auto or off to send prompts as raw text)")
    return f"{path} ({config.model_type})"
