"""What a task is made of and what it is named: one place for the dataflow and the baseline.

:func:`make_task` turns the prompt at an offset of ``prompts`` into the task (an episode of
the job's workflow) the dataflow schedules on ``tasks.<lead>``; the in-process baseline
(``benchmarks/inprocess_loop.py``) builds its tasks with it too, so both roll out the very
same tasks. A task is named after its prompt's offset, the pass over the prompts (from the
second) and the prompt's id; :func:`published` reads a name back. It knows nothing about
Kafka or the schedule: the caller says at which versions and for which roles.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable

from astraflow.config import JobConfig
from astraflow.topics import Prompt, Task

#: what the dataflow names its tasks: prompt offset, pass (from the 2nd), prompt id
_TASK_ID = re.compile(r"t(\d+)(?:\.(\d+))?-(.*)", re.S)


def task_id(offset: int, prompt_id: str, prompt_epoch: int = 0) -> str:
    """A prompt's offset names its task within a pass; later passes add the pass number."""
    return f"t{offset:07d}-{prompt_id}" if prompt_epoch == 0 else f"t{offset:07d}.{prompt_epoch}-{prompt_id}"


def make_task(cfg: JobConfig, prompt: Prompt, offset: int, *, prompt_epoch: int = 0, version: int = 0,
              versions: dict[str, int] | None = None, train: Iterable[str] = (),
              render: Callable[[str, list], list[int] | None] | None = None) -> Task:
    """The task for ``prompt`` at ``offset`` of ``prompts`` in pass ``prompt_epoch``, scheduled
    at the lead policy's ``version``, with the lead policy's sampling settings. An episode of
    several roles also names every role's policy, the roles it trains (``train``) and each
    policy's version (``versions``). ``render`` (a :class:`~astraflow.workflows.chat.PromptRenderer`)
    gives the prompt's token ids under the model's chat template, or None for a raw prompt."""
    ids = render(prompt.text, prompt.messages) if render is not None else None
    lead, wf, roles = cfg.view(cfg.lead_policy), cfg.workflow, cfg.role_policies
    r, multi = lead.rollout, len(roles) > 1
    return Task(task_id=task_id(offset, prompt.prompt_id, prompt_epoch), prompt_id=prompt.prompt_id,
                policy=lead.policy, prompt=prompt.text, answer=prompt.answer, n_samples=r.n_samples,
                sampling={"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k,
                          "max_new_tokens": r.max_new_tokens},
                scheduled_version=version, created_at=time.time(), workflow=wf.name, role=next(iter(roles)),
                roles=dict(roles) if multi else {}, train=sorted(train) if multi else [], params=dict(wf.params),
                metadata=dict(prompt.metadata), scheduled_versions=dict(versions or {}) if multi else {},
                prompt_ids=list(ids or ()))


def published(task: str, prompt_id: str, prompt_epoch: int, prompts_end: int) -> bool:
    """Whether ``task`` may name a task scheduled for ``prompt_id``: a name :func:`task_id`
    writes, at an offset below ``prompts_end`` in a pass begun (up to ``prompt_epoch``)."""
    m = _TASK_ID.fullmatch(task)
    if m is None or m[3] != prompt_id:
        return False
    offset, epoch = int(m[1]), int(m[2] or 0)
    if f"{offset:07d}" != m[1] or (m[2] is not None and (epoch == 0 or str(epoch) != m[2])):
        return False
    return epoch <= prompt_epoch and offset < prompts_end
