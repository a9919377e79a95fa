"""Single-turn RL with verifiable rewards: one prompt in, ``n`` scored completions out.

The workflow contract is one method, :meth:`RLVRWorkflow.run`: a list of tasks and an
engine in, one :class:`~astraflow.topics.TrajectoryGroup` per task out. It batches all
samples of all tasks into one ``generate`` call. It knows nothing about Kafka; the
rollout actor owns consuming tasks and producing the groups.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from opentelemetry import trace

from astraflow.engines.base import RolloutEngine, SamplingParams
from astraflow.topics import Sample, Task, TrajectoryGroup

from . import arithmetic

RewardFn = Callable[[str, str], float]
REWARDS: dict[str, RewardFn] = {"exact_match": arithmetic.reward}


class RLVRWorkflow:
    """Generate ``task.n_samples`` completions per task and score them.

    Args:
        tokenizer: an HF tokenizer (``encode``/``decode``, ``eos_token_id``).
        node_id: recorded in every group.
        reward: a reward function ``(completion_text, answer) -> float``.
        tracer: spans ``raas.generate`` / ``raas.reward`` are opened under each task's
            span in ``spans`` (the rollout actor's ``raas.rollout``).
    """

    def __init__(self, tokenizer, node_id: str, reward: RewardFn = arithmetic.reward,
                 tracer: trace.Tracer | None = None) -> None:
        self.tokenizer, self.node_id, self.reward = tokenizer, node_id, reward
        self.tracer = tracer or trace.get_tracer(__name__)

    def run(self, tasks: Sequence[Task], engine: RolloutEngine, seed: int | None = None,
            spans: Sequence[trace.Span] | None = None) -> list[TrajectoryGroup]:
        if not tasks:
            return []
        first = tasks[0].sampling
        if any(t.sampling != first for t in tasks):
            raise ValueError("tasks batched into one generate call must share sampling params")
        params = SamplingParams(
            temperature=float(first.get("temperature", 1.0)), top_p=float(first.get("top_p", 1.0)),
            top_k=int(first.get("top_k", 0)), max_new_tokens=int(first.get("max_new_tokens", 8)),
            stop_token_ids=(self.tokenizer.eos_token_id,), seed=seed)
        prompt_ids = [self.tokenizer.encode(t.prompt, add_special_tokens=False) for t in tasks]
        rows = [ids for t, ids in zip(tasks, prompt_ids) for _ in range(t.n_samples)]
        started = time.time()
        t0 = time.time_ns()
        gens = engine.generate(rows, params)
        t1 = time.time_ns()
        spans = list(spans or [None] * len(tasks))
        groups, i = [], 0
        for task, ids, span in zip(tasks, prompt_ids, spans):
            ctx = trace.set_span_in_context(span) if span is not None else None
            # One batched call served every task; each task's span records that call.
            gen_span = self.tracer.start_span("raas.generate", context=ctx, start_time=t0,
                                              attributes={"batch.rows": len(rows), "task.samples": task.n_samples})
            gen_span.end(end_time=t1)
            with self.tracer.start_as_current_span("raas.reward", context=ctx):
                samples = []
                for g in gens[i:i + task.n_samples]:
                    text = self.tokenizer.decode(list(g.tokens), skip_special_tokens=True)
                    samples.append(Sample(list(g.tokens), list(g.logprobs), [g.version] * len(g.tokens),
                                          float(self.reward(text, task.answer)), g.finish_reason, text))
            i += task.n_samples
            groups.append(TrajectoryGroup(task.task_id, task.prompt_id, task.policy, self.node_id, list(ids),
                                          samples, task.scheduled_version, started, time.time()))
        return groups
