"""Single-turn RL with verifiable rewards: one prompt in, ``n`` scored completions out.

The workflow contract is one method, :meth:`RLVRWorkflow.run`: a list of tasks and an
engine in, one :class:`~astraflow.topics.TrajectoryGroup` per task out. Every sample draws
from its own seed (:mod:`.seeds`), so its tokens do not depend on which tasks share the
call. All samples of all tasks go into one ``generate`` call, unless ``batch_invariant``:
then each task gets a call of its own, because batched kernels change their reduction
order with the row count, and a group's logprob bits are reproducible only if the rows it
shares a call with are its own (opt-in, as in SGLang and vLLM: it costs ~2.5x CPU
tokens/s). It knows nothing about Kafka; the rollout actor owns consuming tasks and
producing the groups.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from opentelemetry import trace

from astraflow.engines.base import Generation, RolloutEngine, SamplingParams
from astraflow.topics import Sample, Task, TrajectoryGroup

from . import arithmetic
from .seeds import task_seeds

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
        batch_invariant: one ``generate`` call per task (see the module docstring).
    """

    def __init__(self, tokenizer, node_id: str, reward: RewardFn = arithmetic.reward,
                 tracer: trace.Tracer | None = None, batch_invariant: bool = False) -> None:
        self.tokenizer, self.node_id, self.reward = tokenizer, node_id, reward
        self.tracer = tracer or trace.get_tracer(__name__)
        self.batch_invariant = batch_invariant

    def run(self, tasks: Sequence[Task], engine: RolloutEngine, seed: int = 0,
            spans: Sequence[trace.Span] | None = None) -> list[TrajectoryGroup]:
        """Roll out ``tasks``; ``seed`` is the job seed (sample ``j`` of task ``t`` draws
        from ``sample_seed(seed, t.task_id, j)``)."""
        if not tasks:
            return []
        prompt_ids = [self.tokenizer.encode(t.prompt, add_special_tokens=False) for t in tasks]
        started = time.time()
        calls = self._generate(tasks, prompt_ids, engine, seed)
        spans = list(spans or [None] * len(tasks))
        groups = []
        for task, ids, span, (gens, t0, t1, rows) in zip(tasks, prompt_ids, spans, calls):
            ctx = trace.set_span_in_context(span) if span is not None else None
            gen_span = self.tracer.start_span("raas.generate", context=ctx, start_time=t0,
                                              attributes={"batch.rows": rows, "task.samples": task.n_samples})
            gen_span.end(end_time=t1)
            with self.tracer.start_as_current_span("raas.reward", context=ctx):
                samples = []
                for g in gens:
                    text = self.tokenizer.decode(list(g.tokens), skip_special_tokens=True)
                    samples.append(Sample(list(g.tokens), list(g.logprobs), [g.version] * len(g.tokens),
                                          float(self.reward(text, task.answer)), g.finish_reason, text))
            groups.append(TrajectoryGroup(task.task_id, task.prompt_id, task.policy, self.node_id, list(ids),
                                          samples, task.scheduled_version, started, time.time()))
        return groups

    def _generate(self, tasks: Sequence[Task], prompt_ids: list[list[int]], engine: RolloutEngine,
                  seed: int) -> list[tuple[list[Generation], int, int, int]]:
        """Per task: its generations, the start/end (ns) and row count of the call that made them."""
        seeds = [task_seeds(seed, t.task_id, t.n_samples) for t in tasks]
        if self.batch_invariant:
            out = []
            for task, ids, task_seed in zip(tasks, prompt_ids, seeds):
                t0 = time.time_ns()
                gens = engine.generate([ids] * task.n_samples, self._params(task), seeds=task_seed)
                out.append((gens, t0, time.time_ns(), task.n_samples))
            return out
        if any(t.sampling != tasks[0].sampling for t in tasks):
            raise ValueError("tasks batched into one generate call must share sampling params")
        rows = [ids for t, ids in zip(tasks, prompt_ids) for _ in range(t.n_samples)]
        t0 = time.time_ns()
        gens = engine.generate(rows, self._params(tasks[0]), seeds=[s for task_seed in seeds for s in task_seed])
        t1 = time.time_ns()
        out, i = [], 0
        for t in tasks:
            out.append((gens[i:i + t.n_samples], t0, t1, len(rows)))
            i += t.n_samples
        return out

    def _params(self, task: Task) -> SamplingParams:
        s = task.sampling
        return SamplingParams(temperature=float(s.get("temperature", 1.0)), top_p=float(s.get("top_p", 1.0)),
                              top_k=int(s.get("top_k", 0)), max_new_tokens=int(s.get("max_new_tokens", 8)),
                              stop_token_ids=(self.tokenizer.eos_token_id,))
