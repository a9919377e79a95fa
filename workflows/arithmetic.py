"""Synthetic arithmetic: the demo task, its exact-match reward and a pass@1 evaluator.

Owns problem generation (deterministic from a seed, with train / held-out splits that can
never overlap because a problem's split is a function of its text), the reward function,
and ``evaluate`` over any ``RolloutEngine``. It knows nothing about Kafka or training.

The ``arithmetic_chat`` source asks the same problems as a question (:func:`chat_question`)
for a chat model, whose reply the ``math_answer`` reward reads.

Difficulty knobs: ``max_digits`` (operand size; each operand first draws its digit count
uniformly from ``1..max_digits``, so easy and hard problems mix) and ``ops`` (which
operators appear). The default (up to two digits, ``+`` only) is where the bootstrapped
tiny model solves a minority of problems (mostly the one-digit ones) and has room to
improve under RL.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Problem",
    "generate_problems",
    "split_of",
    "reward",
    "evaluate",
    "answer_of",
    "chat_question",
    "TAIL",
    "tail_length",
    "tail_reward",
]

HELDOUT_BUCKETS = 10  # one bucket in ten is held out


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem.

    Attributes:
        prompt: what the model sees, e.g. ``"12+7="``.
        answer: the exact expected completion, e.g. ``"19"``.
    """

    prompt: str
    answer: str


#: how the ``arithmetic_chat`` source asks a problem of a chat model (the reply is read by ``math_answer``)
CHAT_QUESTION = "What is {expression}? Answer with the number only."


def chat_question(problem: Problem) -> str:
    """``problem`` asked as a chat model's user message: ``"12+7="`` becomes
    ``"What is 12+7? Answer with the number only."``; the train/held-out split stays the
    problem's own (:func:`split_of` of its ``prompt``)."""
    return CHAT_QUESTION.format(expression=problem.prompt.rstrip("="))


def answer_of(a: int, op: str, b: int) -> str:
    if op == "+":
        return str(a + b)
    if op == "-":
        return str(a - b)
    if op == "*":
        return str(a * b)
    raise ValueError(f"unknown operator {op!r}; use one of '+-*'")


def split_of(prompt: str) -> str:
    """``"heldout"`` or ``"train"``: a hash of the text, so no seed or size can make the
    splits overlap."""
    return "heldout" if zlib.crc32(prompt.encode()) % HELDOUT_BUCKETS == 0 else "train"


def generate_problems(
    n: int,
    seed: int = 0,
    split: str = "train",
    max_digits: int = 2,
    ops: str = "+",
    unique: bool = False,
) -> list[Problem]:
    """``n`` problems of ``split`` drawn deterministically from ``seed``.

    Each operand draws a digit count ``d`` uniformly from ``1..max_digits``, then a value
    uniform over the ``d``-digit numbers (``0..9`` for ``d = 1``); the operator is uniform
    over ``ops``. ``unique=True`` never repeats a prompt (use it for evaluation sets).
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if not ops or any(op not in "+-*" for op in ops):
        raise ValueError(f"ops must be a non-empty subset of '+-*', got {ops!r}")
    rng = random.Random(f"arith-{seed}-{split}-{max_digits}-{ops}")
    if max_digits < 1:
        raise ValueError(f"max_digits must be >= 1, got {max_digits}")
    space = 10 ** (2 * max_digits) * len(ops)
    if unique and n > space // (HELDOUT_BUCKETS * 2 if split == "heldout" else 2):
        raise ValueError(f"cannot draw {n} unique {split} problems from a space of {space}")

    def operand() -> int:
        d = rng.randint(1, max_digits)
        return rng.randrange(0 if d == 1 else 10 ** (d - 1), 10**d)

    out: list[Problem] = []
    seen: set[str] = set()
    while len(out) < n:
        a, b, op = operand(), operand(), rng.choice(ops)
        prompt = f"{a}{op}{b}="
        if split_of(prompt) != split or (unique and prompt in seen):
            continue
        seen.add(prompt)
        out.append(Problem(prompt, answer_of(a, op, b)))
    return out


def reward(completion_text: str, answer: str) -> float:
    """Exact match: 1.0 if the completion (surrounding whitespace ignored) equals the
    answer, else 0.0. The caller strips special tokens (decode with
    ``skip_special_tokens=True``)."""
    return 1.0 if completion_text.strip() == answer else 0.0


#: The long-tailed variant (``examples/arithmetic_long_tail.yaml``): after its answer the model
#: writes a run of this token, of a length it learnt from a long-tailed spread (``12+7=`` ->
#: ``19.....``), so the rows of one call end at very different steps, as a reasoning model's do,
#: and a call lasts as long as its longest row. The answer comes first so that learning it is
#: the demo's task unchanged (a tiny model does not learn to find the prompt again after a long
#: run of filler), and the greedy path, which writes the longest tail, still answers.
TAIL = "."


def tail_length(rng: random.Random, median: float = 6.0, sigma: float = 1.0, cap: int = 60) -> int:
    """A tail's length: log-normal around ``median`` (``sigma`` in log space), at most ``cap``.
    With the defaults one tail in 20 is over 30 tokens and one in 100 reaches the cap."""
    return min(cap, int(median * rng.lognormvariate(0.0, sigma)))


def tail_reward(completion_text: str, answer: str) -> float:
    """Exact match of what comes before the trailing run of :data:`TAIL` tokens (of any
    length, none included): the reward of the long-tailed variant."""
    return reward(completion_text.strip().rstrip(TAIL), answer)


def evaluate(
    engine,
    tokenizer,
    problems: Sequence[Problem],
    k: int = 1,
    temperature: float = 0.6,
    max_new_tokens: int = 8,
    seed: int = 0,
    batch_size: int = 256,
) -> float:
    """Pass@1 averaged over ``k`` samples per problem: the mean exact-match reward.

    ``temperature=0`` is greedy (then ``k`` > 1 adds nothing). ``engine`` is any
    ``RolloutEngine``; ``tokenizer`` any HF tokenizer with an ``eos_token_id``.
    """
    from .evaluation import pass_at_1

    if not problems:
        raise ValueError("evaluate() needs at least one problem")
    rows = [(p.prompt, p.answer, {}) for p in problems]
    return pass_at_1(engine, tokenizer, rows, lambda text, answer, _: reward(text, answer), k=k,
                     temperature=temperature, max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size)
