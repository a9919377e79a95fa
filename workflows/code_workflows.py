"""The two code workflows (rules as in the reference system) and their warm-start data.

``code_solver_selector`` (roles ``solver``, ``selector``): per sample the solver writes two
attempts; the selector sees the examples and both attempts and answers ``A`` or ``B``, after
an optional check: attempt A's values at the visible inputs (``3,5,9A``), which its warm start
writes first. The idea: a tiny model cannot judge an expression at a glance, but it might learn
the value of each expression of the finite family at each input (a table shared by training
and held-out problems) and compare those with the examples shown: A when they agree, else B.
Measured so far, it learns a shortcut instead (it copies the examples' outputs as its check) and
picks at about chance (docs/workflows.md, "Measured runs").

* solver: per attempt, 1 iff it passes the hidden tests;
* selector: 0 if its answer does not parse, 0.5 if both attempts pass or both fail, else
  1 iff it picked the passing one;
* team: the selected attempt passes.

``code_solver_testgen`` (roles ``solver``, ``test_generator``): per sample the solver
writes attempt 1; the test generator sees the problem and attempt 1 and writes test cases;
attempt 1 runs on them, and if it fails any the solver retries with the per-case PASS/FAIL
feedback as context.

* solver: per attempt, 1 iff it passes the hidden tests (the retry's trajectory trains on
  the retry only: attempt 1 and the feedback are context);
* test generator: int(the final code passes the hidden tests) + int(the reference solution
  passes the generated cases; at least one case must parse);
* team: the final code passes.

Two ``workflow.params`` of ``code_solver_testgen`` change those rules (the defaults are the
reference's):

* ``generator_reward``: ``reference`` (above) or ``verdict``: 1 iff the generated cases are
  valid (the reference passes them) *and* their verdict on attempt 1 (all pass, or not) agrees
  with the hidden tests', else 0. What makes a retry help is exactly that: a retry when, and
  only when, attempt 1 is wrong. Under the reference rule a generator is also paid for the
  solver's retry, which it does not write.
* ``retry``: ``feedback`` (above) or ``fresh``: the retry is asked the problem alone (an
  independent second sample, the solver's own distribution), so the team is a best of two
  gated by the generated tests; the retry trains as a plain answer.

Formats (for ``f(1)=3;f(2)=5;f(4)=9;f=``; :func:`warm_start_examples` teaches them):

* solver ``f(1)=3;f(2)=5;f(4)=9;f=`` -> ``x*2+1``;
* selector ``f(1)=3;f(2)=5;f(4)=9;A=x*2+1;B=x+2;pick=`` -> ``3,5,9A`` (or just ``A``);
* test generator ``f(1)=3;f(2)=5;f(4)=9;f=x+2;tests=`` -> ``f(1)=3;f(2)=5`` (its warm start restates the
  examples; any cases parse);
* solver retry ``f(1)=3;f(2)=5;f(4)=9;f=x+2;f(0)=1:FAIL;f(5)=11:FAIL;f=`` -> ``x*2+1``.

Code only runs in the sandbox (:func:`~astraflow.workflows.code_tasks.run_cases`). The
hidden tests and the reference come from the prompt's metadata (``tests``, ``reference``;
:func:`~astraflow.workflows.code_tasks.code_prompts`). Knows nothing about Kafka.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from .code_tasks import (ENTRY, Case, CodeProblem, evaluate_expr, expression_of, family, format_cases,
                         generate_code_problems, hidden_tests, parse_cases, probe_inputs, reference_of, run_cases)
from .registry import RuleChoices, workflow
from .types import ENV, Episode, EpisodeResult, Trajectory, Turn

__all__ = ["code_solver_selector", "code_solver_testgen", "warm_start_examples", "pick_of", "feedback_of",
           "problem_of", "selector_check", "selector_prompt", "generator_prompt", "retry_prompt", "ROLES",
           "TESTGEN_RULES", "generator_reward"]

PICK, TESTS = ";pick=", ";tests="
PASS, FAIL = "PASS", "FAIL"
MAX_GENERATED = 2  #: generated cases beyond this are ignored (keeps the retry prompt within 128 positions)
# Generation budgets (``workflow.params`` of the job config overrides them).
DEFAULT_TOKENS = {"code_tokens": 12, "pick_tokens": 16, "test_tokens": 24}  # a pick: up to 4 values, the tag, eos
ROLES = ("code_solver", "selector", "test_generator")  #: warm-start roles of :func:`warm_start_examples`
#: ``code_solver_testgen``'s rule params -> their values; the first is the default (the reference's)
TESTGEN_RULES = RuleChoices({"generator_reward": ("reference", "verdict"), "retry": ("feedback", "fresh")})


def generator_reward(rule: str, *, valid: bool, verdict: bool, first_passed: bool, final_passed: bool) -> float:
    """The test generator's reward for one sample (``rule``: the module docstring's).
    ``valid``: its cases parsed and the reference passes them; ``verdict``: attempt 1 passed
    them all."""
    if rule == "verdict":
        return 1.0 if valid and verdict == first_passed else 0.0
    return float(final_passed) + float(valid)


# -- prompt formats (text), shared by the workflows and the warm-start examples -------------

def _examples(prompt: str) -> str:
    """The examples of a problem prompt without its answer slot (``...;f=`` -> ``...;``)."""
    return prompt.removesuffix(f"{ENTRY}=")


def selector_prompt(prompt: str, a: str, b: str) -> str:
    return f"{_examples(prompt)}A={a};B={b}{PICK}"


def generator_prompt(prompt: str, attempt: str) -> str:
    return f"{prompt}{attempt}{TESTS}"


def feedback_of(cases: Sequence[Case], passed: Sequence[bool]) -> str:
    """``f(0)=1:FAIL;f(5)=11:PASS``: each generated case and the verdict of attempt 1 on it."""
    return ";".join(f"{format_cases([c])}:{PASS if ok else FAIL}" for c, ok in zip(cases, passed))


def retry_prompt(prompt: str, attempt: str, feedback: str) -> str:
    return f"{prompt}{attempt};{feedback};{ENTRY}="


def problem_of(prompt: str) -> str:
    """The examples a code prompt of any role shows (``f(1)=3;f(2)=5;``): what a selector
    prompt (``...;A=x+2;B=x*2;pick=``) and a solver prompt (``...;f=``, a retry's too) are about."""
    if prompt.endswith(PICK):
        return prompt[: prompt.index("A=")]
    return prompt[: prompt.index(f";{ENTRY}=") + 1]


_PICK = re.compile(r"[-\d,]*([AB])")  #: an optional check (values, commas) and the tag


def pick_of(text: str) -> str | None:
    """``"A"``, ``"B"`` or None: the tag that ends a pick, after an optional check of values
    (``3,5,9A`` -> ``"A"``); anything else (``AB``, ``a``, prose) is no pick."""
    m = _PICK.fullmatch(text.strip())
    return m[1] if m else None


def selector_check(visible: Sequence[Case], attempt: str) -> str:
    """What the selector writes before its tag: ``attempt``'s values at the visible inputs,
    ``3,5,9`` (``None`` where it cannot be evaluated). Only our own family expressions come
    here (the warm start's): model-written code never runs in this process."""
    return ",".join(str(_value(attempt, args)) for args, _ in visible)


# -- episodes -------------------------------------------------------------------------------

class _Runs:
    """Sandbox runs of one episode, memoised: samples of a tiny model repeat themselves."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str | None, tuple[Case, ...]], tuple[list[bool], str]] = {}

    def __call__(self, expr: str | None, cases: Sequence[Case]) -> tuple[list[bool], str]:
        key = (expr, tuple(cases))
        if key not in self._memo:
            self._memo[key] = run_cases(expr, cases)
        return self._memo[key]

    def passes(self, expr: str | None, cases: Sequence[Case]) -> bool:
        passed, _ = self(expr, cases)
        return bool(passed) and all(passed)


def _ids(ep: Episode, turn: Turn) -> list[int]:
    """A turn's tokens without its stop token (context must not contain an end of sequence)."""
    eos = ep.tokenizer.eos_token_id
    return [t for t in turn.tokens if t != eos]


def _budget(ep: Episode, key: str) -> int:
    return int(ep.params.get(key, DEFAULT_TOKENS[key]))


def _turn_tokens(params, max_new_tokens: int) -> int:
    """The longest turn of a code workflow: its calls pass their own budgets."""
    return max([max_new_tokens] + [int(params.get(k, v)) for k, v in DEFAULT_TOKENS.items()])


# Rewards as the module docstring gives them: the solver and the selector in [0, 1] (the
# hidden tests, whatever workflow.params.reward names), the test generator in [0, 2].
@workflow("code_solver_selector", roles=("solver", "selector"), reward="code_hidden_tests",
          reward_ranges={"solver": (0.0, 1.0), "selector": (0.0, 1.0)}, group_sizes={"solver": (2, 2)},
          turn_tokens=_turn_tokens)
def code_solver_selector(ep: Episode) -> EpisodeResult:
    """The solver writes two attempts per sample; the selector picks one."""
    n, runs = ep.n_samples, _Runs()
    tests = hidden_tests(ep.answer, ep.metadata)
    problem = ep.encode(ep.prompt)
    attempts = ep.roles["solver"].generate([problem] * (2 * n), max_new_tokens=_budget(ep, "code_tokens"))
    passed = [runs.passes(expression_of(t.text), tests) for t in attempts]
    examples = ep.encode(_examples(ep.prompt))
    rows = [examples + ep.encode("A=") + _ids(ep, attempts[2 * i]) + ep.encode(";B=")
            + _ids(ep, attempts[2 * i + 1]) + ep.encode(PICK) for i in range(n)]
    picks = ep.roles["selector"].generate(rows, max_new_tokens=_budget(ep, "pick_tokens"))
    solver, selector, team = [], [], []
    for i in range(n):
        pa, pb = passed[2 * i], passed[2 * i + 1]
        for k, tag in ((2 * i, "A"), (2 * i + 1, "B")):
            solver.append(Trajectory.of(attempts[k], float(passed[k]), sample=i, attempt=tag, passed=passed[k]))
        pick = pick_of(picks[i].text)
        chosen = None if pick is None else (pa if pick == "A" else pb)
        if pick is None:
            r = 0.0
        elif pa == pb:
            r = 0.5
        else:
            r = 1.0 if chosen else 0.0
        selector.append(Trajectory.of(picks[i], r, sample=i, pick=pick or "unparsed", passed=[pa, pb]))
        team.append(1.0 if chosen else 0.0)
    return EpisodeResult({"solver": solver, "selector": selector}, team_reward=sum(team) / n,
                         metrics={"attempt_pass": sum(passed) / (2 * n),
                                  "pick_parsed": sum(pick_of(p.text) is not None for p in picks) / n,
                                  "selector_reward": sum(t.reward for t in selector) / n})


@workflow("code_solver_testgen", roles=("solver", "test_generator"), reward="code_hidden_tests",
          check=TESTGEN_RULES, reward_ranges={"solver": (0.0, 1.0), "test_generator": (0.0, 2.0)},
          group_sizes={"solver": (1, 2)}, turn_tokens=_turn_tokens)
def code_solver_testgen(ep: Episode) -> EpisodeResult:
    """Attempt 1; generated tests; on a failed generated test, a retry with the verdicts."""
    n, runs = ep.n_samples, _Runs()
    tests = hidden_tests(ep.answer, ep.metadata)
    reference, arity = reference_of(ep.metadata), len(tests[0][0])
    problem = ep.encode(ep.prompt)
    first = ep.roles["solver"].generate([problem] * n, max_new_tokens=_budget(ep, "code_tokens"))
    rows = [problem + _ids(ep, t) + ep.encode(TESTS) for t in first]
    gens = ep.roles["test_generator"].generate(rows, max_new_tokens=_budget(ep, "test_tokens"))
    cases = [parse_cases(g.text, arity, MAX_GENERATED) for g in gens]
    pass1, verdicts = [], []
    for t, c in zip(first, cases):
        # One sandbox run per attempt: the hidden tests and the generated ones together.
        ok, _ = runs(expression_of(t.text), list(tests) + c)
        pass1.append(all(ok[:len(tests)]))
        verdicts.append(ok[len(tests):])
    retry = [i for i in range(n) if cases[i] and not all(verdicts[i])]
    fresh = TESTGEN_RULES.rule(ep.params, "retry") == "fresh"
    feedback = {i: ep.encode(f";{feedback_of(cases[i], verdicts[i])};{ENTRY}=") for i in retry}
    contexts = {i: problem if fresh else problem + _ids(ep, first[i]) + feedback[i] for i in retry}
    second = dict(zip(retry, ep.roles["solver"].generate([contexts[i] for i in retry],
                                                         max_new_tokens=_budget(ep, "code_tokens"))
                      if retry else []))
    solver, generator, final = [], [], []
    for i in range(n):
        solver.append(Trajectory.of(first[i], float(pass1[i]), sample=i, attempt=1, passed=pass1[i]))
        done = pass1[i]
        if i in second:
            done = runs.passes(expression_of(second[i].text), tests)
            if fresh:  # a plain second answer to the problem
                solver.append(Trajectory.of(second[i], float(done), sample=i, attempt=2, passed=done))
            else:  # attempt 1 already trains in its own trajectory; here it and the feedback are context
                solver.append(Trajectory.chain(problem, [("solver", _ids(ep, first[i])), (ENV, feedback[i]),
                                                         second[i]], "solver", float(done), sample=i, attempt=2,
                                               passed=done))
        ref_ok = bool(cases[i]) and runs.passes(reference, cases[i])
        r = generator_reward(TESTGEN_RULES.rule(ep.params, "generator_reward"), valid=ref_ok, verdict=all(verdicts[i]),
                             first_passed=pass1[i], final_passed=done)
        generator.append(Trajectory.of(gens[i], r, sample=i, cases=len(cases[i]),
                                       reference_passes=ref_ok, retried=i in second, final_passed=done))
        final.append(1.0 if done else 0.0)
    return EpisodeResult({"solver": solver, "test_generator": generator}, team_reward=sum(final) / n,
                         metrics={"first_pass": sum(pass1) / n, "retries": len(retry) / n,
                                  "cases_parsed": sum(bool(c) for c in cases) / n,
                                  "cases_valid": sum(t.info["reference_passes"] for t in generator) / n,
                                  # the generated tests' verdict on attempt 1 agrees with the hidden tests'
                                  "verdict_right": sum(bool(cases[i]) and all(verdicts[i]) == pass1[i]
                                                       for i in range(n)) / n})


# -- warm-start data -------------------------------------------------------------------------

_NUMBER = re.compile(r"\d+")


def _value(expr: str, args: tuple[int, ...]) -> int | None:
    try:
        return evaluate_expr(expr, args)
    except ArithmeticError:
        return None


def _wrong(p: CodeProblem, rng: random.Random) -> str:
    """An attempt a tiny solver might write that contradicts a visible example: the
    reference with one constant off by one, or another expression of the family."""
    while True:
        consts = list(_NUMBER.finditer(p.reference))
        if consts and rng.random() < 0.5:
            m = rng.choice(consts)
            cand = f"{p.reference[:m.start()]}{int(m[0]) + rng.choice((-1, 1))}{p.reference[m.end():]}"
        else:
            cand = rng.choice(family(p.arity))
        if any(_value(cand, args) != want for args, want in p.visible):
            return cand


def _generated(p: CodeProblem, wrong: str) -> list[Case]:
    """The cases a good test writer adds: the probe inputs (one replaced, if need be, by an
    input where ``wrong`` goes wrong, so attempt 1 fails one)."""
    inputs = probe_inputs(p.visible, p.arity)
    ref = {a: evaluate_expr(p.reference, a) for a in inputs}
    if all(_value(wrong, a) == ref[a] for a in inputs):
        shown = [args for args, _ in p.visible]
        inputs[-1] = next(a for a in shown if _value(wrong, a) != evaluate_expr(p.reference, a))
    return [(a, evaluate_expr(p.reference, a)) for a in inputs]


def warm_start_examples(role: str, n: int, seed: int, split: str = "train") -> list[tuple[str, str]]:
    """``n`` ``(prompt, target completion)`` pairs for ``role`` (``code_solver``,
    ``selector``, ``test_generator``), in exactly the formats the workflows use; drawn
    deterministically from ``seed`` and ``split``'s problems; prefix-stable in ``n``.

    * ``code_solver``: the problem -> the reference; one in four is a retry (a wrong
      attempt 1 and its PASS/FAIL feedback on generated cases) -> the reference;
    * ``selector``: the reference and a wrong attempt, in random order -> attempt A's values
      at the visible inputs, then the tag of the reference (``3,5,9A``: A's values are the
      examples'; ``3,6,9B``: they are not). Never both passing or both failing: the target
      must be definite;
    * ``test_generator`` (revision 2): the problem and attempt 1 (right two times in five) ->
      the problem's first two examples as test cases (``f(1)=3;f(2)=5``). Revision 1 asked for
      the reference's values at two inputs the prompt does not show: computing those is
      solving the problem, and the warm-started generator's cases were valid (the reference
      passes them) 0.15 of the time on held-out problems, about as often as the solver is
      right, so its verdicts on attempt 1 were mostly noise. The examples are always valid
      and fail any attempt that contradicts them; an attempt that fits them and fails the
      hidden tests passes them.
    """
    if role not in ROLES:
        raise ValueError(f"warm_start_examples: unknown role {role!r}; roles: {', '.join(ROLES)}")
    rng = random.Random(f"code-warm-{role}-{seed}-{split}")
    out = []
    for p in generate_code_problems(n, seed=seed, split=split):
        wrong = _wrong(p, rng)
        if role == "code_solver":
            if rng.random() < 0.25:
                cases = _generated(p, wrong)
                passed = [_value(wrong, a) == want for a, want in cases]
                out.append((retry_prompt(p.prompt, wrong, feedback_of(cases, passed)), p.reference))
            else:
                out.append((p.prompt, p.reference))
        elif role == "selector":
            a, b, tag = (p.reference, wrong, "A") if rng.random() < 0.5 else (wrong, p.reference, "B")
            out.append((selector_prompt(p.prompt, a, b), selector_check(p.visible, a) + tag))
        else:
            attempt = p.reference if rng.random() < 0.4 else wrong
            out.append((generator_prompt(p.prompt, attempt), format_cases(p.visible[:MAX_GENERATED])))
    return out
