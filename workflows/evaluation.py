"""Pass@1 of a rollout engine on held-out rows, scored by a reward.

Owns one loop: each row's prompt sampled ``k`` times (batched across rows), each sample
scored by ``score(text, answer, metadata)`` (:func:`~astraflow.workflows.api.get_scorer`;
a sample repeated within a row is scored once), the mean returned. The batch starting at
sample ``start`` draws from seed ``seed + start``, so the same rows, seed and batch size
give the same number on any run.
It knows nothing about Kafka, configs or where the rows come from (the evaluator actor
chooses them: :mod:`astraflow.actors.heldout`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["pass_at_1"]

Row = tuple[str, str, Mapping[str, Any]]  #: (prompt text, reference answer, the row's metadata)


def pass_at_1(engine, tokenizer, rows: Sequence[Row], score: Callable[[str, str, Mapping[str, Any]], float], *,
              k: int = 1, temperature: float = 0.6, max_new_tokens: int = 8, seed: int = 0,
              batch_size: int = 256, prompt_ids: Sequence[Sequence[int]] | None = None,
              per_row: list[float] | None = None) -> float:
    """Mean reward over ``k`` samples of every row (pass@1 for a 0/1 reward).

    ``temperature=0`` is greedy (then ``k`` > 1 adds nothing). ``engine`` is any
    ``RolloutEngine``; ``tokenizer`` any HF tokenizer with an ``eos_token_id``.
    ``prompt_ids`` (one per row) are the rows' prompts already rendered (a chat model's
    template, :mod:`.chat`); without them each row's text is encoded as it is. ``per_row``,
    when given, receives each row's mean reward (for paired comparisons across versions).
    """
    from astraflow.engines.base import SamplingParams

    if not rows:
        raise ValueError("pass_at_1() needs at least one row")
    if prompt_ids is not None and len(prompt_ids) != len(rows):
        raise ValueError(f"pass_at_1(): {len(prompt_ids)} prompt_ids for {len(rows)} rows")
    prompts = ([list(ids) for ids in prompt_ids] if prompt_ids is not None
               else [tokenizer.encode(text, add_special_tokens=False) for text, _, _ in rows])
    row_total = [0.0] * len(rows)
    work = [(i, ids) for i, ids in enumerate(prompts) for _ in range(k)]
    # A reward is a function of its inputs: a repeated sample of a row (a tiny model's often
    # are) is scored once, which for code is one sandbox run instead of k.
    scores: dict[tuple[int, str], float] = {}
    total = 0.0
    for start in range(0, len(work), batch_size):
        chunk = work[start : start + batch_size]
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                                stop_token_ids=(tokenizer.eos_token_id,), seed=seed + start)
        gens = engine.generate([ids for _, ids in chunk], params)
        for (i, _), gen in zip(chunk, gens):
            text = tokenizer.decode(gen.tokens, skip_special_tokens=True)
            if (i, text) not in scores:
                _, answer, meta = rows[i]
                scores[(i, text)] = score(text, answer, meta)
            total += scores[(i, text)]
            row_total[i] += scores[(i, text)]
    if per_row is not None:
        per_row[:] = [t / k for t in row_total]
    return total / len(work)
