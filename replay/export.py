"""``astraflow export``: a job's recorded trajectories as a Parquet dataset for other tools.

One row per sample of every committed trajectory group (failed groups have no samples
and are only counted), joined from the job's topics: the group on ``trajectories``, its
prompt text and answer from the task on ``tasks.<policy>``, the step of the batch that
trained it (and of the batches that replayed it) from ``batches.<policy>``, or the reason
it was dropped from ``drops.<policy>``. :data:`COLUMNS` documents every column;
``_export.json`` beside the ``part-*.parquet`` files records the job, the counts and the
end offsets the export read up to. Nothing is written to the job's topics.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from astraflow.replay.recorded import RecordError, check_job, end_offsets, iter_records, policies
from astraflow.topics import Batch, JobTopics, Task, TrajectoryGroup
from astraflow.topics.messages import GroupDrop

__all__ = ["COLUMNS", "export_trajectories"]

#: name -> (arrow type name, meaning)
COLUMNS: dict[str, tuple[str, str]] = {
    "job": ("string", "the job"),
    "policy": ("string", "the policy that generated the sample"),
    "task_id": ("string", "the task (one GRPO group)"),
    "prompt_id": ("string", "the prompt on the prompts topic"),
    "sample_index": ("int32", "the sample's index in its group"),
    "node_id": ("string", "the RaaS node that rolled it out"),
    "prompt": ("string", "prompt text (from the task; decoded with --tokenizer when the task is gone)"),
    "answer": ("string", "reference answer the reward compared with"),
    "prompt_token_ids": ("list<int32>", "prompt token ids"),
    "completion_token_ids": ("list<int32>", "generated token ids"),
    "completion_text": ("string", "generated text (as the node decoded it, else --tokenizer's decoding)"),
    "reward": ("float64", "the sample's reward"),
    "finish_reason": ("string", "stop, length or context (the model's window was full)"),
    "token_versions": ("list<int64>", "policy version that generated each completion token"),
    "behaviour_logprobs": ("list<float64>", "log-prob of each completion token under the behaviour policy"),
    "min_version": ("int64", "oldest version among the tokens (null: no tokens)"),
    "max_version": ("int64", "newest version among the tokens (null: no tokens)"),
    "scheduled_version": ("int64", "policy version the dataflow saw when it scheduled the task"),
    "batch_step": ("int64", "the training step (batch) that trained the group fresh; null: not trained"),
    "replay_steps": ("list<int64>", "steps of batches that trained it again as a replay"),
    "drop_reason": ("string", "why the dataflow dropped the group instead (null: not dropped)"),
    "trajectory_partition": ("int32", "where the group lies on the trajectories topic"),
    "trajectory_offset": ("int64", "its offset there"),
    "started_at": ("float64", "rollout start (unix seconds)"),
    "finished_at": ("float64", "rollout end (unix seconds)"),
}


def _schema():
    import pyarrow as pa
    types = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(),
             "list<int32>": pa.list_(pa.int32()), "list<int64>": pa.list_(pa.int64()),
             "list<float64>": pa.list_(pa.float64())}
    return pa.schema([pa.field(name, types[t]) for name, (t, _) in COLUMNS.items()])


def export_trajectories(bootstrap: str, job: str, out: str | Path, *, policy: list[str] | None = None,
                        tokenizer: str | None = None, rows_per_group: int = 50_000) -> dict:
    """Write the dataset into ``out`` (a new or empty directory); returns what ``_export.json`` holds
    (its leading underscore keeps dataset readers from taking it for data)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    topics = JobTopics(job=job)
    check_job(bootstrap, topics, None)
    wanted = list(policy or policies(bootstrap, topics))
    for p in wanted:
        check_job(bootstrap, topics, p)
    out = Path(out)
    if out.exists() and any(out.glob("*.parquet")):
        raise RecordError(f"{out} already holds an export (part-*.parquet); give another --out or remove it")
    out.mkdir(parents=True, exist_ok=True)
    offsets = end_offsets(bootstrap, topics)
    decode = _decoder(tokenizer)
    tasks = {m.task_id: m for p in wanted for _, _, m in iter_records(bootstrap, topics.tasks(p))
             if isinstance(m, Task)}
    trained, replays, dropped = _settlements(bootstrap, topics, wanted)
    schema = _schema()
    counts: Counter = Counter()
    cols: dict[str, list] = {name: [] for name in COLUMNS}
    started = time.time()
    with pq.ParquetWriter(out / "part-00000.parquet", schema) as writer:
        for part, offset, g in iter_records(bootstrap, topics.trajectories):
            if not isinstance(g, TrajectoryGroup) or g.policy not in wanted:
                continue
            counts["groups"] += 1
            if g.status != "ok":
                counts["groups_failed"] += 1
                continue
            coord = (part, offset)
            counts["groups_trained" if coord in trained else "groups_dropped" if coord in dropped
                   else "groups_untrained"] += 1
            task = tasks.get(g.task_id)
            prompt = task.prompt if task is not None else decode(g.prompt_ids)
            for i, s in enumerate(g.samples):
                row = {
                    "job": job, "policy": g.policy, "task_id": g.task_id, "prompt_id": g.prompt_id,
                    "sample_index": i, "node_id": g.node_id, "prompt": prompt,
                    "answer": task.answer if task is not None else None, "prompt_token_ids": list(g.prompt_ids),
                    "completion_token_ids": list(s.tokens), "completion_text": s.text or decode(s.tokens),
                    "reward": float(s.reward), "finish_reason": s.finish_reason,
                    "token_versions": list(s.versions), "behaviour_logprobs": [float(x) for x in s.logprobs],
                    "min_version": min(s.versions) if s.versions else None,
                    "max_version": max(s.versions) if s.versions else None,
                    "scheduled_version": g.scheduled_version, "batch_step": trained.get(coord),
                    "replay_steps": replays.get(coord, []), "drop_reason": dropped.get(coord),
                    "trajectory_partition": part, "trajectory_offset": offset,
                    "started_at": g.started_at, "finished_at": g.finished_at,
                }
                for name, value in row.items():
                    cols[name].append(value)
                counts["rows"] += 1
            if len(cols["job"]) >= rows_per_group:
                writer.write_table(pa.table(cols, schema=schema))
                cols = {name: [] for name in COLUMNS}
        if cols["job"] or not counts["rows"]:
            writer.write_table(pa.table(cols, schema=schema))
    meta = {"job": job, "policies": wanted, **{k: counts[k] for k in (
        "rows", "groups", "groups_failed", "groups_trained", "groups_dropped", "groups_untrained")},
        "read_up_to": offsets, "columns": {k: v[1] for k, v in COLUMNS.items()},
        "export_s": round(time.time() - started, 2), "created_at": time.time()}
    (out / "_export.json").write_text(json.dumps(meta, indent=2))
    return meta


def _settlements(bootstrap: str, topics: JobTopics, wanted: list[str]):
    """Where each group record went: its fresh batch step, its replay steps, or its drop reason."""
    trained: dict[tuple[int, int], int] = {}
    replays: dict[tuple[int, int], list[int]] = {}
    dropped: dict[tuple[int, int], str] = {}
    for p in wanted:
        for _, _, b in iter_records(bootstrap, topics.batches(p)):
            if not isinstance(b, Batch):
                continue
            for j, src in enumerate(b.sources):
                coord = (src.partition, src.offset)
                if b.is_replay(j):
                    replays.setdefault(coord, []).append(b.step)
                else:
                    trained.setdefault(coord, b.step)
        for _, _, d in iter_records(bootstrap, topics.drops(p)):
            if isinstance(d, GroupDrop):
                dropped[(d.source.partition, d.source.offset)] = d.reason
    return trained, replays, dropped


def _decoder(tokenizer: str | None):
    """Token ids -> text with the given HF tokenizer; without one, None (the column stays null)."""
    if not tokenizer:
        return lambda ids: None
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(tokenizer)
    except (OSError, ValueError) as e:
        raise RecordError(f"--tokenizer {tokenizer}: not a loadable tokenizer ({type(e).__name__}: {e})") from None
    return lambda ids: tok.decode(list(ids), skip_special_tokens=True)
