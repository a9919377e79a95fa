"""The job's dataset on ``prompts``: published once, every source in proportion to its weight.

The dataflow publishes the training prompts (:func:`.heldout.training_prompts`: the
evaluator's held-out rows never) in one transaction, all of them or none, the first time
it starts; a restarted dataflow finds them there. Several sources (dataset mixing) are
interleaved by weight (:func:`interleave`). It knows nothing about tasks or the schedule.
"""

from __future__ import annotations

import logging

from astraflow.config import GENERATORS, JobConfig
from astraflow.topics import DeadLetters, JobTopics, Producer, Prompt, TopicPartition
from astraflow.topics import security
from astraflow.workflows.datasets import bad_row_handler

from .heldout import training_prompts

log = logging.getLogger(__name__)


def end_offset(bootstrap: str, topic: str) -> int:
    """The end of partition 0 of ``topic``, committed records only."""
    probe = security.consumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        tp = TopicPartition(topic, 0)
        return probe.end_offsets([tp])[tp]
    finally:
        probe.close()


def publish_prompts(cfg: JobConfig, bootstrap: str, topics: JobTopics, txn: Producer, dead: DeadLetters,
                    sources: dict[str, float]) -> None:
    """Publish the dataset to ``prompts`` unless it is there: ``sources`` (spec -> weight, as
    the lead lane's curators mix them; empty: ``data.source`` alone), interleaved."""
    if end_offset(bootstrap, topics.prompts) > 0:
        return
    needed = cfg.data.num_prompts or 2 * cfg.trainer.steps * cfg.dataflow.groups_per_batch
    sources = sources or {cfg.data.source: 1.0}
    loaded = {spec: training_prompts(cfg, spec, needed if spec in GENERATORS else cfg.data.num_prompts,
                                     bad_row_handler(cfg.data.on_bad_row, dead))
              for spec in sources}
    prompts = interleave(loaded, sources)
    with txn.transaction():
        for p in prompts:
            txn.send(topics.prompts, p, key=p.prompt_id, trace=False)
    log.info("dataflow: published %d prompts to %s", len(prompts), topics.prompts)


def interleave(loaded: dict[str, list[Prompt]], weights: dict[str, float]) -> list[Prompt]:
    """One list of every source's prompts, each source spread in proportion to its weight
    (the source furthest behind its share goes next; exhausted sources drop out)."""
    if len(loaded) == 1:
        return next(iter(loaded.values()))
    queues = {s: list(reversed(p)) for s, p in loaded.items()}
    taken = dict.fromkeys(loaded, 0)
    out: list[Prompt] = []
    while any(queues.values()):
        live = [s for s in queues if queues[s]]
        total = sum(weights[s] for s in live)
        s = max(live, key=lambda s: weights[s] / total * (len(out) + 1) - taken[s])
        out.append(queues[s].pop())
        taken[s] += 1
    return out
