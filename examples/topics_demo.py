"""The foundation demo: a real broker, a job's topics, typed records there and back.

Shows what the end-to-end job will use: a transactional write of a task's trajectory
group, a read_committed consumer that decodes typed messages, and a bad record going
to the dead-letter topic instead of vanishing.
"""

from __future__ import annotations

import contextlib
import time
import uuid

from astraflow.topics import (Consumer, DeadLetters, EmbeddedBroker, Heartbeat, JobTopics, Producer, Prompt,
                              Sample, Task, TrajectoryGroup, ensure_topics)


def run(bootstrap_servers: str | None = None) -> int:
    with contextlib.ExitStack() as stack:
        if bootstrap_servers is None:
            t0 = time.monotonic()
            broker = stack.enter_context(EmbeddedBroker())
            bootstrap_servers = broker.bootstrap_servers
            print(f"embedded Kafka up at {bootstrap_servers} in {time.monotonic() - t0:.1f}s "
                  f"(data dir {broker.data_dir})")
        topics = JobTopics(job=f"roundtrip-{uuid.uuid4().hex[:6]}")
        created = ensure_topics(bootstrap_servers, topics.specs())
        print(f"created {len(created)} topics with prefix {topics.prefix}")

        producer = stack.enter_context(Producer(bootstrap_servers, client_id="demo",
                                                transactional_id=f"{topics.job}-demo"))
        prompt = Prompt("p-0", "17+25=", "42", source="synthetic")
        task = Task("t-0", prompt.prompt_id, "policy", prompt.text, prompt.answer, n_samples=2,
                    sampling={"temperature": 1.0, "max_new_tokens": 4}, created_at=time.time())
        group = TrajectoryGroup(task.task_id, prompt.prompt_id, "policy", "raas-demo", [1, 7, 8, 2, 5, 3],
                                [Sample([4, 2, 0], [-0.3, -0.9, -0.01], [0, 0, 0], 1.0, "stop", "42"),
                                 Sample([4, 3, 0], [-0.3, -1.7, -0.02], [0, 0, 0], 0.0, "stop", "43")])
        with producer.transaction():
            producer.send(topics.prompts, prompt, key=prompt.prompt_id)
            producer.send(topics.tasks("policy"), task, key=task.task_id)
            producer.send(topics.trajectories, group, key=task.task_id)
            producer.send(topics.control, Heartbeat("raas-demo", "raas", "policy", 0, ts=time.time()),
                          key="raas-demo")
        plain = stack.enter_context(Producer(bootstrap_servers, client_id="demo-plain"))
        # A record no decoder accepts: it must end up in the dead-letter topic, not vanish.
        plain.send_raw(topics.trajectories, b"\x00not-json", key="t-bad",
                       headers=[("af-type", b"trajectory-group")])
        plain.flush()

        dlq = DeadLetters(plain, topics.dlq, consumer_name="demo")
        consumer = stack.enter_context(Consumer(
            bootstrap_servers, topics=[topics.prompts, topics.tasks("policy"), topics.trajectories,
                                       topics.control], group_id="demo", dead_letters=dlq))
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < 4 and time.monotonic() < deadline:
            seen.extend(consumer.poll(1000))
        consumer.commit()
        for d in sorted(seen, key=lambda d: d.topic):
            print(f"{d.topic}[{d.partition}]@{d.offset} key={d.key} {type(d.message).__name__}: {d.message}")
        print(f"dead letters written: {dlq.count} (see {topics.dlq})")
        ok = len(seen) == 4 and dlq.count == 1
        print("roundtrip:", "OK" if ok else "FAILED")
        return 0 if ok else 1
