"""A deliberately broken component, for proving that the audit can fail.

``python -m astraflow.chaos.rogue --bootstrap-servers B --topic af.<job>.batches.<p>``
appends a copy of the newest batch as the next step: what a dataflow that sends a batch
twice would write. If the trainer reaches it first it trains those groups a second time;
if the real next batch comes first, the numbering breaks. Either way the conservation
audit must report the groups settled twice, and the chaos runner must exit 1. Nothing in
the system starts this process except the ``rogue_batch`` fault.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from astraflow.topics import Batch, Producer
from astraflow.topics.registry import BATCH_RECORD_MAX_BYTES
from astraflow.topics.replay import read_topic


def duplicate_last_batch(bootstrap: str, topic: str) -> int:
    """Append the newest batch again as ``step + 1``; the step written."""
    batches = [m for _, _, m in read_topic(bootstrap, topic, tail=1) if isinstance(m, Batch)]
    if not batches:
        raise SystemExit(f"rogue: no batch on {topic} yet")
    copy = dataclasses.replace(batches[-1], step=batches[-1].step + 1)
    producer = Producer(bootstrap, client_id="rogue", max_request_size=BATCH_RECORD_MAX_BYTES)
    try:
        producer.send_sync(topic, copy, key=str(copy.step), trace=False)
    finally:
        producer.close()
    return copy.step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="astraflow.chaos.rogue", description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap-servers", required=True)
    p.add_argument("--topic", required=True, help="the job's batches.<policy> topic")
    args = p.parse_args(argv)
    step = duplicate_last_batch(args.bootstrap_servers, args.topic)
    print(f"rogue: wrote a copy of batch {step - 1} as step {step} on {args.topic}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
