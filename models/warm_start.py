"""Warm-start tasks: what each role's tiny model is supervised on before RL starts.

Owns the registry of warm-start tasks by name. A task gives ``(prompt, target)`` pairs
(``examples``), deterministic from a seed, with a train split to learn from and a
held-out split to measure on, and says how a greedy completion scores against its target
(``score``; by default the completion must equal the target). Each task also carries its
default early-stop accuracy: the bootstrap stops the supervised run as soon as the model
reaches it, so RL starts from a policy that solves some but not most of its role's work.

Tasks:

* ``arithmetic`` — the solver of the demo (``12+7=`` -> ``19``), exactly the data the
  bootstrap has always trained on.
* ``arithmetic_long_tail`` — the same problems, the answer followed by a run of dots of
  long-tailed length (``12+7=`` -> ``19.....``): the long-tailed demo's solver.
* ``verifier`` — checks a proposed answer by a test easier than solving: it writes the
  units digit the sum must end in, then its verdict, ``<A>`` (accept) when the answer ends
  in it, ``<R>`` (reject) otherwise: ``12+7=19|`` -> ``9<A>``, ``12+7=18|`` -> ``9<R>``.
  Half the candidates are right; the others are near misses of the kind a tiny solver makes
  (off by 1-10, swapped or slipped digits). The check is sound (it never rejects a right
  answer) but not complete (a near miss with the right units digit passes). Why this check
  and not the full sum (revision 1, kept in the module's history): a tiny model learns the
  100 units-digit sums, which every held-out problem shares with the training ones, while a
  verdict on the whole answer needs the whole sum, which it only learns by heart for the
  training problems; revision 1 scored 0.67 on its (training) problems and 0.525 held out,
  and was at chance on the solver's real answers (TPR 0.53, TNR 0.51). The tiny solver's
  wrong answers end in a wrong digit 83% of the time (its held-out samples at t=0.6).
* ``text_game`` — the agent of the text game: each turn of a shortest solution, given the
  episode's exact text so far (observations included), as the agent workflow writes it.
* ``search`` — the search agent, the same way: each turn of a shortest solution
  (``search zob``, ``search tam``, ``answer north``) after the episode's exact text so far.
* ``search_wide`` — the same turns when a search shows up to five documents (the search
  environment's ``top_k: 5, max_chars: 160``: a town search shows its region and the people who
  live there), for a model of 1,024 positions: a two-hop episode takes up to ~190 tokens, past
  the default window of 128.
* ``code_solver``, ``selector``, ``test_generator`` — the roles of the code workflows;
  their examples come from ``astraflow.workflows.code_workflows.warm_start_examples``,
  looked up by name when a model is built.

It knows nothing about models, tokenizers or training (``bootstrap.py`` does that).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from dataclasses import dataclass

from astraflow.errors import FatalError
from astraflow.workflows.arithmetic import generate_problems
from astraflow.workflows.arithmetic import TAIL, tail_length, tail_reward
from astraflow.workflows.arithmetic import reward as arithmetic_reward

__all__ = ["Example", "WarmStartTask", "WarmStartError", "TASKS", "DEFAULT_TASK", "get_task", "task_names",
           "exact_match", "pick_score", "code_problem", "near_miss", "units_check", "arithmetic_problem", "ACCEPT",
           "REJECT", "SEARCH_WIDE"]

Example = tuple[str, str]  #: (prompt, target completion)
SPLITS = ("train", "heldout")
DEFAULT_TASK = "arithmetic"
ACCEPT, REJECT = "<A>", "<R>"  #: the verifier's two verdicts
CODE_WORKFLOWS = "astraflow.workflows.code_workflows"


class WarmStartError(FatalError):
    """An unknown warm-start task, or one whose examples cannot be produced."""


def exact_match(completion: str, target: str) -> float:
    """1.0 iff the completion text equals the target, else 0.0 (the default score)."""
    return 1.0 if completion == target else 0.0


@dataclass(frozen=True)
class WarmStartTask:
    """One warm-start task.

    Attributes:
        name: the registry name (``astraflow model init --task NAME``).
        doc: one line for ``--list``.
        make: ``(n, seed, split, max_digits, ops) -> examples``; see :meth:`examples`.
        target_accuracy: default early-stop accuracy of the bootstrap (greedy, on a
            validation set from the train split; with ``problem`` set, on problems kept
            out of its training). Low on purpose where RL needs room.
        score: ``(completion text, target) -> reward in [0, 1]``.
        max_new_tokens: generation budget when measuring; ``None`` means the longest
            target of the measured set plus one token for ``<eos>``.
        mix: tasks whose train examples share the training pool equally with this task's
            own (the model is still measured on this task alone).
        revision: bump when the task's examples change, so cached models are rebuilt
            (part of the cache key of every task but the default one).
        spec: ``(field, value)`` pairs of the bootstrap's ``TinyModelSpec`` this task
            builds with by default (hashed into its cache key like any spec field).
        problem: prompt -> the problem it is about (for every task in the training pool,
            ``mix`` included). When set, the bootstrap keeps its validation problems out of
            the training pool, so the early stop measures what the model does on problems it
            never saw, as in the job; ``None`` (the tasks built before it existed, whose
            cache keys must not change) validates on training problems.
    """

    name: str
    doc: str
    make: Callable[[int, int, str, int, str], list[Example]]
    target_accuracy: float
    score: Callable[[str, str], float] = exact_match
    max_new_tokens: int | None = 8
    mix: tuple[str, ...] = ()
    revision: int = 1
    spec: tuple[tuple[str, object], ...] = ()
    problem: Callable[[str], str] | None = None

    def examples(self, n: int, seed: int, split: str = "train", *, max_digits: int = 2, ops: str = "+") -> list[Example]:
        """``n`` ``(prompt, target)`` pairs of ``split`` (``train`` or ``heldout``), drawn
        deterministically from ``seed``. A prompt may repeat; the first ``n`` of a larger
        draw are the draw of ``n``. ``max_digits`` / ``ops`` are the arithmetic knobs of the
        model spec; tasks not built on arithmetic ignore them."""
        if split not in SPLITS:
            raise ValueError(f"warm-start task {self.name!r}: split must be one of {SPLITS}, got {split!r}")
        out = self.make(n, seed, split, max_digits, ops)
        if len(out) != n or not all(isinstance(e, tuple) and len(e) == 2 and all(isinstance(s, str) and s for s in e)
                                    for e in out):
            raise WarmStartError(f"warm-start task {self.name!r}: examples({n}, {seed}, {split!r}) must return {n} "
                                 f"(prompt, target) pairs of non-empty strings")
        return out

    def training_pool(self, n: int, seed: int, **knobs) -> list[Example]:
        """``n`` train examples: this task's own, or equal shares of it and its ``mix``."""
        if not self.mix:
            return self.examples(n, seed, "train", **knobs)
        share = n // (1 + len(self.mix))
        pool = self.examples(n - share * len(self.mix), seed, "train", **knobs)
        for name in self.mix:
            pool += get_task(name).examples(share, seed, "train", **knobs)
        return pool


def _arithmetic(n: int, seed: int, split: str, max_digits: int, ops: str) -> list[Example]:
    return [(p.prompt, p.answer) for p in generate_problems(n, seed=seed, split=split, max_digits=max_digits, ops=ops)]


def _arithmetic_long_tail(n: int, seed: int, split: str, max_digits: int, ops: str) -> list[Example]:
    """The demo's problems, each answer followed by a tail of long-tailed length (``19.....``)."""
    rng = random.Random(f"tail-{seed}-{split}")
    return [(p, a + TAIL * tail_length(rng)) for p, a in _arithmetic(n, seed, split, max_digits, ops)]


def tail_score(completion: str, target: str) -> float:
    """The long-tailed task's score: its answer right, whatever the length of the runs after it."""
    return tail_reward(completion, target.rstrip(TAIL))


def near_miss(answer: str, rng: random.Random) -> str:
    """A wrong answer close to ``answer``, as a tiny solver gets it wrong: off by 1-10
    (60%), two adjacent digits swapped (20%) or one digit slipped (20%). Never equal to
    ``answer``; never negative when ``answer`` is not."""
    value = int(answer)
    while True:
        digits = list(str(abs(value)))
        kind = rng.random()
        if kind < 0.6 or (len(digits) < 2 and kind < 0.8):  # nothing to swap in one digit
            cand = value + rng.choice((-1, 1)) * rng.randint(1, 10)
        elif kind < 0.8:
            i = rng.randrange(len(digits) - 1)
            digits[i], digits[i + 1] = digits[i + 1], digits[i]
            cand = int("".join(digits)) * (-1 if value < 0 else 1)
        else:
            i = rng.randrange(len(digits))
            digits[i] = rng.choice([d for d in "0123456789" if d != digits[i]])
            cand = int("".join(digits)) * (-1 if value < 0 else 1)
        if cand != value and (cand >= 0 or value < 0):
            return str(cand)


def units_check(answer: str, candidate: str) -> str:
    """The verifier's target for ``candidate`` against the right ``answer``: the units digit
    the answer ends in, then ``<A>`` if the candidate ends in it too, else ``<R>``."""
    unit = answer[-1]
    return unit + (ACCEPT if candidate.endswith(unit) else REJECT)


def arithmetic_problem(prompt: str) -> str:
    """``12+7=`` of ``12+7=19|`` (a verifier prompt) or of ``12+7=`` (a solver prompt)."""
    return prompt[: prompt.index("=") + 1]


def _verifier(n: int, seed: int, split: str, max_digits: int, ops: str) -> list[Example]:
    # One stream per (seed, split, knobs), one draw per problem in order: prefix-stable.
    rng = random.Random(f"verifier-{seed}-{split}-{max_digits}-{ops}")
    out = []
    for p in generate_problems(n, seed=seed, split=split, max_digits=max_digits, ops=ops):
        candidate = p.answer if rng.random() < 0.5 else near_miss(p.answer, rng)
        out.append((f"{p.prompt}{candidate}|", units_check(p.answer, candidate)))
    return out


def _shortest_turns(n: int, seed: int, split: str, env_name: str, prompts, solution,
                    env_params: dict | None = None) -> list[Example]:
    """Per turn of a shortest solution of an environment's tasks: the episode's exact text so
    far (the first observation, then each action and observation as the agent workflow appends
    them in its ``tag`` format) -> the next action with its closing tag. ``prompts(n, seed,
    split)`` draws the tasks, ``solution(prompt)`` gives a shortest solution's actions;
    ``env_params`` are the environment's (a job's ``workflow.params.env_params``)."""
    from astraflow.workflows.api import get_environment
    from astraflow.workflows.environments import EnvTask
    out: list[Example] = []
    k = 0
    while len(out) < n:
        batch = prompts(max(8, n), seed + k, split)
        k += 1
        for p in batch:
            env = get_environment(env_name)(**(env_params or {}))
            text = env.reset(EnvTask(p.prompt_id, p.text, p.answer, dict(p.metadata))) + "<a>"
            for action in solution(p):
                out.append((text, action + "</a>"))
                obs, _, _, _ = env.step(action)
                text += f"{action}</a> {obs}<a>"
            env.close()
            if len(out) >= n:
                break
    return out[:n]


def _text_game(n: int, seed: int, split: str, max_digits: int, ops: str) -> list[Example]:
    from astraflow.workflows.text_game import text_game_prompts
    return _shortest_turns(n, seed, split, "text_game", text_game_prompts, lambda p: p.answer.split(";"))


def _search(n: int, seed: int, split: str, max_digits: int, ops: str) -> list[Example]:
    from astraflow.workflows.search_env import search_prompts
    return _shortest_turns(n, seed, split, "search", search_prompts, lambda p: p.metadata["solution"].split(";"))


#: the search environment's settings the ``search_wide`` warm start (and a job that uses its
#: model, examples/search_agent_long.yaml) shows documents with
SEARCH_WIDE = {"top_k": 5, "max_chars": 160}


def _search_wide(n: int, seed: int, split: str, max_digits: int, ops: str) -> list[Example]:
    from astraflow.workflows.search_env import search_prompts
    return _shortest_turns(n, seed, split, "search", search_prompts, lambda p: p.metadata["solution"].split(";"),
                           SEARCH_WIDE)


def code_problem(prompt: str) -> str:
    """The problem a code role's prompt is about: the code workflows' own reading of their
    formats (:func:`astraflow.workflows.code_workflows.problem_of`)."""
    from astraflow.workflows.code_workflows import problem_of
    return problem_of(prompt)


def pick_score(completion: str, target: str) -> float:
    """1.0 iff the completion's pick (its tag, after any check) is the target's: what the
    selector's reward pays for, whatever its check says."""
    from astraflow.workflows.code_workflows import pick_of
    pick = pick_of(completion)
    return 1.0 if pick is not None and pick == pick_of(target) else 0.0


def _code_role(role: str) -> Callable[[int, int, str, int, str], list[Example]]:
    def make(n: int, seed: int, split: str, max_digits: int, ops: str) -> list[Example]:
        try:
            fn = getattr(importlib.import_module(CODE_WORKFLOWS), "warm_start_examples")
        except (ImportError, AttributeError) as e:
            raise WarmStartError(f"warm-start task {role!r} needs {CODE_WORKFLOWS}.warm_start_examples, which is not "
                                 f"available ({type(e).__name__}: {e}); build another task or add that function") from e
        return [tuple(e) for e in fn(role, n, seed, split)]

    return make


_ONE_THREAD = (("threads", 1),)
VERIFIER_TARGET = 0.9  #: exact match of digit and verdict on problems kept out of its training

TASKS: dict[str, WarmStartTask] = {t.name: t for t in (
    # Revision 2 validates on problems kept out of its training pool. Revision 1 validated on
    # problems it trained on: it stopped at 0.36 there (step 425) and was 0.212 held out, below
    # its own target, so every demo run started with a warning. Revision 2 (seed 0): step 350,
    # 0.265 on the kept-out problems, 0.300 held out (greedy).
    WarmStartTask("arithmetic", "solve a+b= (the demo's solver)", _arithmetic, 0.25,
                  score=arithmetic_reward, max_new_tokens=8, revision=2, problem=arithmetic_problem),
    # The long-tailed demo (examples/arithmetic_long_tail.yaml): the same problems, each answer
    # followed by a run of dots whose length the model learns from a log-normal spread (median 6,
    # one in 20 over 30, capped at 60), so its sampled lengths have the long tail partial rollouts
    # are for. (Revision 1 put the run before the answer: at step 1,125 of a build the model had
    # not learnt to find the prompt again after it, 0.000-0.005 exact match.)
    WarmStartTask("arithmetic_long_tail", "solve a+b=, then a long-tailed run of dots (19......)",
                  _arithmetic_long_tail, 0.25, score=tail_score, max_new_tokens=None, revision=2,
                  problem=arithmetic_problem),
    # Revision 1 judged the whole answer (a+b=c| -> <A>/<R>, half its pool arithmetic) and
    # validated on the problems it trained on: 0.67 there, at chance on the solver's answers.
    WarmStartTask("verifier", "check a+b=c| by its units digit: 9<A> (ends right) or 9<R>; half are near misses",
                  _verifier, VERIFIER_TARGET, revision=2, problem=arithmetic_problem, spec=_ONE_THREAD),
    # Table 2's arm (d) (benchmarks/multi_policy_lora.py): both policies LoRA adapters of ONE base
    # on one shared pool, so the base plays both roles. Measured on the verifier's task (the
    # later one learnt); the solver's problems are half its training pool.
    WarmStartTask("team", "both roles of the solver-verifier team on one base: a+b= and a+b=c| -> 9<A> or 9<R>",
                  _verifier, VERIFIER_TARGET, mix=("arithmetic",), problem=arithmetic_problem, spec=_ONE_THREAD),
    # The code roles build on one thread: on a shared 2-core box two intra-op threads wait
    # on each other behind other processes (a selector build made 25 steps in 17 minutes).
    # Per-turn greedy accuracy; an episode of 2-3 turns then wins about a third of the time.
    # 367 train and 33 held-out games of 2-3 turns: measured on the distinct turns they have.
    # "take" and "open" are two thirds of the turns and are learnt first: at 0.6 the model
    # had not learnt to read the room off the task (held-out games won 0.08, RL flat); at
    # 0.8 it goes to the right room some of the time, and RL has successes to reinforce.
    WarmStartTask("text_game", "the text game's actions, turn by turn (<a>go 3</a>, take, open)", _text_game, 0.8,
                  max_new_tokens=None, revision=2,
                  spec=(("eval_problems", 120), ("heldout_problems", 60), ("threads", 1))),
    # 378 train and 54 held-out questions of 2-3 turns (928 and 128 distinct turns).
    WarmStartTask("search", "the search agent's commands, turn by turn (<a>search zob</a>, answer tam)", _search,
                  0.6, max_new_tokens=None, spec=(("eval_problems", 120), ("heldout_problems", 100), ("threads", 1))),
    # The same questions and turns; a town search shows five documents, so an episode takes up
    # to ~190 positions: the model has 1,024 (the default 128 would end those episodes).
    WarmStartTask("search_wide", "the search agent's commands when a search shows 5 documents (1,024 positions)",
                  _search_wide, 0.6, max_new_tokens=None,
                  spec=(("max_positions", 1024), ("eval_problems", 120), ("heldout_problems", 100), ("threads", 1),
                        ("max_steps", 600))),
    WarmStartTask("code_solver", "write an expression for f from examples (code workflows)",
                  _code_role("code_solver"), 0.2, max_new_tokens=None, spec=_ONE_THREAD),
    # A chance-level selector picks right half the time: its bar sits just above that.
    # Revision 2 writes a check before its tag, attempt A's values at the visible inputs
    # (``3,5,9A``), and is scored on its tag alone (:func:`pick_score`). Revision 1 answered the
    # tag alone and sat at chance (0.51 at step 100 and 150, 0.48 held out): nothing in a bare
    # tag tells the model which attempt fits the examples.
    # It validates on problems kept out of its training pool (``code_problem``): revision 2's
    # first build, validated on training problems, stopped at 0.62 there (step 550) and was
    # 0.497 held out.
    WarmStartTask("selector", "pick the passing one of two attempts after checking A (3,5,9A; code workflows)",
                  _code_role("selector"), 0.6, score=pick_score, max_new_tokens=None, revision=2,
                  spec=_ONE_THREAD, problem=code_problem),
    # Revision 2 writes the problem's own examples as its cases: revision 1 wrote the
    # reference's values at unseen inputs (held-out greedy 0.223 at its 0.2 bar, 675 steps),
    # which is solving the problem, and its cases were valid 0.15 of the time in the team.
    WarmStartTask("test_generator", "write test cases for f: the problem's examples (code workflows)",
                  _code_role("test_generator"), 0.95, max_new_tokens=None, revision=2, spec=_ONE_THREAD),
)}


def task_names() -> list[str]:
    return sorted(TASKS)


def get_task(name: str) -> WarmStartTask:
    """The registered task ``name``; :class:`WarmStartError` listing the tasks otherwise."""
    try:
        return TASKS[name]
    except KeyError:
        raise WarmStartError(f"unknown warm-start task {name!r}; tasks: {', '.join(task_names())}") from None
