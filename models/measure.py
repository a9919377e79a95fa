"""How well a model does a warm-start task: the score of its completions on distinct examples.

:func:`distinct_examples` draws examples with distinct prompts from a task's split, and
:func:`mean_score` scores ``k`` completions per example with the task's own scorer (greedy at
``temperature=0``). The bootstrap measures its early stop and held-out accuracy with them,
and the long-context benchmark measures built models the same way.

It knows nothing about building or caching a model: it takes any rollout engine and tokenizer.
"""

from __future__ import annotations

from astraflow.engines.base import SamplingParams

from .warm_start import WarmStartTask

__all__ = ["distinct_examples", "mean_score"]


def distinct_examples(warm: WarmStartTask, n: int, seed: int, split: str, knobs: dict) -> list[tuple[str, str]]:
    """``n`` examples with distinct prompts, for measuring: the first distinct ones of an
    ever longer draw (a task's draw of ``n`` is the start of a larger draw)."""
    draw = n
    while True:
        out: dict[str, str] = {}
        for prompt, target in warm.examples(draw, seed, split, **knobs):
            out.setdefault(prompt, target)
            if len(out) == n:
                return list(out.items())
        if draw >= 64 * n:
            raise ValueError(f"warm-start task {warm.name!r}: fewer than {n} distinct {split} prompts in "
                             f"{draw} examples; measure on fewer (eval_problems / heldout_problems)")
        draw *= 2


def mean_score(warm: WarmStartTask, engine, tokenizer, examples: list[tuple[str, str]], k: int = 1,
            temperature: float = 0.6, seed: int = 0, batch_size: int = 256) -> float:
    """Mean of the task's score over ``k`` completions per example (``temperature=0``:
    greedy)."""
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p, _ in examples]
    budget = warm.max_new_tokens or 1 + max(len(tokenizer.encode(t, add_special_tokens=False)) for _, t in examples)
    rows = [(i, ids) for i, ids in enumerate(prompts) for _ in range(k)]
    total = 0.0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        params = SamplingParams(temperature=temperature, max_new_tokens=budget,
                                stop_token_ids=(tokenizer.eos_token_id,), seed=seed + start)
        for (i, _), gen in zip(chunk, engine.generate([ids for _, ids in chunk], params)):
            total += warm.score(tokenizer.decode(gen.tokens, skip_special_tokens=True), examples[i][1])
    return total / len(rows)
