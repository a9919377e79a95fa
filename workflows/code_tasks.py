"""Program synthesis from examples: the code task, its hidden tests and their reward.

Owns problem generation and the ``code_hidden_tests`` reward. A problem shows a few
input/output examples of a small integer function ``f`` of one or two arguments
(``f(1)=3;f(2)=5;f(4)=9;f=``); the answer is one Python expression over ``x`` (and ``y``),
e.g. ``x*2+1``, ``x%3``, ``max(x,4)``, ``x*y+2``, which becomes ``def f(x): return <expr>``
and is run on hidden test cases in :mod:`astraflow.sandbox`, never in this process.

Problems are drawn deterministically from a seed out of a fixed family of expressions.
Each is *identifiable*: every expression of the family that fits the visible examples
agrees with the reference on the hidden tests (a fourth example is shown when three leave
room for doubt), so a hidden-test failure always means the answer contradicts what the
prompt shows or lies outside the family. Train and held-out problems never overlap: the
split is a hash of the prompt text (:func:`~astraflow.workflows.arithmetic.split_of`).

It knows nothing about Kafka, engines or training.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from astraflow.errors import DataError
from astraflow.sandbox import CheckResult, Limits, SandboxSettings, check_function
from astraflow.topics import Prompt

from .arithmetic import split_of
from .registry import reward

__all__ = ["Case", "CodeProblem", "CodeTaskError", "generate_code_problems", "code_prompts", "program_of",
           "expression_of", "format_cases", "parse_cases", "hidden_tests", "reference_of", "run_cases",
           "family", "evaluate_expr", "probe_inputs", "hidden_tests_reward", "use_sandbox", "check_program", "ENTRY",
           "LIMITS"]

Case = tuple[tuple[int, ...], int]  #: ``(args, expected)``
ENTRY = "f"  #: the function every program defines
PARAMS = ("x", "y")
INPUTS = range(10)  #: every argument is a digit, so a case prints short
N_VISIBLE, N_HIDDEN = 3, 5
MAX_PROMPT_CHARS = 40
MAX_EXPR_CHARS = 40  #: longer completions are not expressions worth running
TWO_ARG_SHARE = 0.3

# (template, values of {a}, values of {b}); {a}/{b} absent means no parameter.
_ONE_ARG = (
    ("x+{a}", range(1, 10), None), ("x-{a}", range(1, 10), None), ("{a}-x", range(1, 10), None),
    ("x*{a}", range(2, 6), None), ("x*{a}+{b}", range(2, 5), range(1, 10)), ("x*{a}-{b}", range(2, 5), range(1, 10)),
    ("x%{a}", range(2, 6), None), ("x//{a}", range(2, 5), None), ("max(x,{a})", range(2, 8), None),
    ("min(x,{a})", range(2, 8), None), ("x*x", None, None), ("x*x+{a}", range(1, 6), None),
    ("x*x-{a}", range(1, 6), None), ("abs(x-{a})", range(2, 8), None),
)
_TWO_ARG = (
    ("x+y", None, None), ("x-y", None, None), ("y-x", None, None), ("x*y", None, None), ("max(x,y)", None, None),
    ("min(x,y)", None, None), ("abs(x-y)", None, None), ("x+y+{a}", range(1, 6), None),
    ("x*y+{a}", range(1, 6), None), ("x*y-{a}", range(1, 6), None), ("x*{a}+y", range(2, 4), None),
    ("x+y*{a}", range(2, 4), None),
)
# The order in which a test writer probes inputs it has not been shown (warm-start targets).
_PROBES = {1: tuple((x,) for x in (0, 5, 1, 7, 3, 9, 2, 8, 4, 6)),
           2: ((0, 3), (4, 1), (2, 2), (5, 0), (1, 6), (3, 3), (6, 2), (0, 0), (7, 1), (2, 5))}


class CodeTaskError(DataError, ValueError):
    """A code prompt's tests or reference are missing or malformed; the message names the key."""


@dataclass(frozen=True, slots=True)
class CodeProblem:
    """One problem.

    Attributes:
        prompt: the visible examples and the slot for the answer, e.g. ``"f(1)=3;f(2)=5;f(4)=9;f="``.
        reference: a correct expression, e.g. ``"x*2+1"``.
        visible: the examples the prompt shows.
        hidden: the cases an answer is scored on (inputs the prompt does not show).
    """

    prompt: str
    reference: str
    visible: tuple[Case, ...]
    hidden: tuple[Case, ...]

    @property
    def arity(self) -> int:
        return len(self.visible[0][0])

    def program(self, expr: str | None = None) -> str:
        """The Python program of ``expr`` (default: the reference)."""
        return program_of(self.reference if expr is None else expr, self.arity)


def program_of(expr: str, arity: int) -> str:
    """``def f(x): return <expr>`` (``f(x, y)`` for two arguments)."""
    return f"def {ENTRY}({', '.join(PARAMS[:arity])}):\n    return {expr}\n"


def expression_of(completion: str) -> str | None:
    """The expression a completion states, or None when it is not one line of sensible length."""
    expr = completion.strip()
    if not expr or "\n" in expr or len(expr) > MAX_EXPR_CHARS:
        return None
    return expr


def format_cases(cases: Sequence[Case]) -> str:
    """``f(1)=3;f(2,4)=6``: how examples, generated tests and feedback are written."""
    return ";".join(f"{ENTRY}({','.join(map(str, args))})={expected}" for args, expected in cases)


# Bounded sizes keep a retry prompt that echoes the cases within the tiny model's 128 positions.
_CASE = re.compile(r"\s*f\((-?\d{1,2})(?:,\s*(-?\d{1,2}))?\)\s*=\s*(-?\d{1,4})\s*")


def parse_cases(text: str, arity: int, limit: int = 2) -> list[Case]:
    """The first ``limit`` well-formed cases of ``arity`` arguments in ``f(4)=9;f(0)=1``;
    segments that do not parse (or have the wrong arity) are skipped, as is a repeated input."""
    out: list[Case] = []
    seen: set[tuple[int, ...]] = set()
    for part in text.split(";"):
        m = _CASE.fullmatch(part)
        if m is None:
            continue
        args = (int(m[1]),) if m[2] is None else (int(m[1]), int(m[2]))
        if len(args) != arity or args in seen:
            continue
        seen.add(args)
        out.append((args, int(m[3])))
        if len(out) == limit:
            break
    return out


def family(arity: int) -> tuple[str, ...]:
    """Every expression problems of ``arity`` arguments are drawn from."""
    out = []
    for template, avals, bvals in (_ONE_ARG if arity == 1 else _TWO_ARG):
        for a in avals or (None,):
            for b in bvals or (None,):
                out.append(template.format(a=a, b=b))
    return tuple(out)


_SAFE = {"__builtins__": {}, "max": max, "min": min, "abs": abs}


def evaluate_expr(expr: str, args: Sequence[int]) -> int:
    """Evaluate one of *our own* expressions (from :func:`family`) in this process.
    Model-written code never comes here: it runs through :func:`run_cases`."""
    return eval(expr, _SAFE, dict(zip(PARAMS, args)))  # noqa: S307 - trusted family strings only


def _inputs(arity: int) -> list[tuple[int, ...]]:
    return [(x,) for x in INPUTS] if arity == 1 else [(x, y) for x in INPUTS for y in INPUTS]


_TABLES: dict[int, dict[str, dict[tuple[int, ...], int]]] = {}


def _table(arity: int) -> dict[str, dict[tuple[int, ...], int]]:
    """Each family expression's value on every input (computed once per arity)."""
    if arity not in _TABLES:
        _TABLES[arity] = {e: {args: evaluate_expr(e, args) for args in _inputs(arity)} for e in family(arity)}
    return _TABLES[arity]


def _identifiable(reference: str, visible: Sequence[tuple[int, ...]], hidden: Sequence[tuple[int, ...]],
                  table: Mapping[str, Mapping[tuple[int, ...], int]]) -> bool:
    ref = table[reference]
    for values in table.values():
        if all(values[a] == ref[a] for a in visible) and any(values[a] != ref[a] for a in hidden):
            return False
    return True


def _draw(rng: random.Random) -> CodeProblem | None:
    """One candidate problem, or None when no unambiguous short prompt came of the draw."""
    arity = 2 if rng.random() < TWO_ARG_SHARE else 1
    table = _table(arity)
    reference = rng.choice(family(arity))
    inputs = rng.sample(_inputs(arity), N_VISIBLE + 1 + N_HIDDEN)
    shown, spare, hidden = inputs[:N_VISIBLE], inputs[N_VISIBLE], inputs[N_VISIBLE + 1:]
    if not _identifiable(reference, shown, hidden, table):
        shown = shown + [spare]
        if not _identifiable(reference, shown, hidden, table):
            return None
    values = table[reference]
    visible = tuple((a, values[a]) for a in shown)
    prompt = format_cases(visible) + f";{ENTRY}="
    if len(prompt) > MAX_PROMPT_CHARS:
        return None
    return CodeProblem(prompt, reference, visible, tuple((a, values[a]) for a in hidden))


def generate_code_problems(n: int, seed: int = 0, split: str = "train", unique: bool = False) -> list[CodeProblem]:
    """``n`` problems of ``split`` (``train`` or ``heldout``) drawn deterministically from
    ``seed``; the first ``n`` of a larger draw are the draw of ``n``. ``unique=True`` never
    repeats a prompt (use it for evaluation sets)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"code-{seed}-{split}")
    out: list[CodeProblem] = []
    seen: set[str] = set()
    draws = 0
    while len(out) < n:
        draws += 1
        if draws > 1000 * (n + 10):
            raise ValueError(f"cannot draw {n} {'unique ' if unique else ''}{split} code problems (got {len(out)})")
        p = _draw(rng)
        if p is None or split_of(p.prompt) != split or (unique and p.prompt in seen):
            continue
        seen.add(p.prompt)
        out.append(p)
    return out


def code_prompts(n: int, seed: int = 0, split: str = "train") -> list[Prompt]:
    """``n`` problems as :class:`~astraflow.topics.Prompt` records for the ``prompts`` topic.

    ``answer`` is the hidden tests as JSON (so a reward that sees only ``(text, answer)``,
    as ``rlvr`` calls it, can score); ``metadata`` holds them again as ``tests``
    (``[[args, expected], ...]``) with the ``reference`` expression the code workflows need.
    """
    out = []
    for i, p in enumerate(generate_code_problems(n, seed=seed, split=split)):
        tests = [[list(args), expected] for args, expected in p.hidden]
        out.append(Prompt(f"code-{seed}-{split}-{i}", p.prompt, orjson.dumps(tests).decode(), "code",
                          {"tests": tests, "reference": p.reference}))
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _cases_from(raw: Any, where: str) -> list[Case]:
    if isinstance(raw, (str, bytes)):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise CodeTaskError(f"{where}: not JSON test cases: {e}") from None
    cases: list[Case] = []
    if not isinstance(raw, list) or not raw:
        raise CodeTaskError(f"{where}: expected a non-empty list of [args, expected], got {raw!r:.120}")
    for i, case in enumerate(raw):
        ok = (isinstance(case, (list, tuple)) and len(case) == 2 and isinstance(case[0], (list, tuple))
              and case[0] and all(_is_int(a) for a in case[0]) and _is_int(case[1]))
        if not ok or len(case[0]) != len(raw[0][0]):
            raise CodeTaskError(f"{where}[{i}]: expected [args, expected] with integer args of one arity, "
                                f"got {case!r:.120}")
        cases.append((tuple(case[0]), case[1]))
    return cases


def hidden_tests(answer: str, metadata: Mapping[str, Any] | None = None) -> list[Case]:
    """The hidden cases of a code prompt: ``metadata["tests"]`` when present, else the
    answer read as the same JSON. :class:`CodeTaskError` names what is malformed."""
    if metadata and "tests" in metadata:
        return _cases_from(metadata["tests"], "metadata 'tests'")
    return _cases_from(answer, "answer (code prompts carry their hidden tests as JSON)")


def reference_of(metadata: Mapping[str, Any] | None) -> str:
    """``metadata["reference"]``, the known-correct expression of a code prompt."""
    ref = (metadata or {}).get("reference")
    if not isinstance(ref, str) or not ref.strip():
        raise CodeTaskError(f"metadata 'reference': a code prompt needs its reference expression, got {ref!r:.80}")
    return ref.strip()


#: Enough for any one-line expression; a runaway one is stopped after a second of CPU. The
#: wall clock is generous: on a loaded machine the sandbox's own start takes seconds.
LIMITS = Limits(cpu_s=1.0, wall_s=10.0, memory_mb=256, processes=8, file_mb=1.0, output_kb=16)


#: The job's sandbox settings in this process (:func:`use_sandbox`). A reward is called with
#: a completion, an answer and metadata only, so the job's ``sandbox`` section cannot travel
#: with the call; refused without namespaces until a component binds its job's.
_sandbox_settings = SandboxSettings()


def use_sandbox(settings: SandboxSettings) -> None:
    """Bind the job's sandbox settings for this process's code runs: a component calls it
    once, before any episode runs (:func:`astraflow.actors.common.configure_sandbox`)."""
    global _sandbox_settings
    if not isinstance(settings, SandboxSettings):
        raise TypeError(f"use_sandbox: settings must be SandboxSettings, got {type(settings).__name__}")
    _sandbox_settings = settings


def run_cases(expr: str | None, cases: Sequence[Case], limits: Limits = LIMITS,
              settings: SandboxSettings | None = None) -> tuple[list[bool], str]:
    """Per case, whether ``expr`` (a completion's expression, or None) returns the expected
    value, run in the sandbox with ``settings`` (default: the ones :func:`use_sandbox`
    bound); and the sandbox's reason (``"not an expression"`` for None, without a run)."""
    if not cases:
        return [], "no cases"
    if expr is None:
        return [False] * len(cases), "not an expression"
    result = check_program(program_of(expr, len(cases[0][0])), ENTRY, cases, limits=limits, settings=settings)
    return [bool(p) for p in result.passed], result.reason


def check_program(program: str, entry: str, cases: Sequence[tuple[Sequence[Any], Any]], limits: Limits = LIMITS,
                  settings: SandboxSettings | None = None) -> CheckResult:
    """Model-written ``program``'s ``entry`` called on ``cases`` in the sandbox
    (:func:`~astraflow.sandbox.check_function`) with ``settings`` (default: the ones
    :func:`use_sandbox` bound): how every shipped reward runs code."""
    return check_function(program, entry, cases, limits=limits, settings=settings or _sandbox_settings)


def probe_inputs(visible: Sequence[Case], arity: int, k: int = 2) -> list[tuple[int, ...]]:
    """The first ``k`` inputs, in a fixed order, that the examples do not show: what a
    warm-started test writer learns to probe."""
    shown = {args for args, _ in visible}
    return [a for a in _PROBES[arity] if a not in shown][:k]


@reward("code_hidden_tests")
def hidden_tests_reward(completion_text: str, answer: str, metadata: Mapping[str, Any] | None = None) -> float:
    """1.0 iff the completion's expression passes every hidden test of the prompt, else 0.0."""
    passed, _ = run_cases(expression_of(completion_text), hidden_tests(answer, metadata))
    return 1.0 if passed and all(passed) else 0.0
