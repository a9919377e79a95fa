"""The sandbox's public entry: run a program, or check a function against cases, in a separate process.

:func:`run_python` runs a source text in a limited, isolated process and says how it ended;
:func:`check_function` defines a function from a program and calls it on test cases in one
such run. Whether code may run where the kernel gives no user/mount/network namespaces is
the caller's :class:`SandboxSettings`, passed to each call (refused by default); whether the
kernel gives them is a fact of the machine, probed once per process
(:func:`namespaces_available`).

It knows nothing about workflows, rewards, Kafka or training, nor how the isolation is built
(:mod:`~astraflow.sandbox.isolation`), how a run is started, bounded and killed
(:mod:`~astraflow.sandbox.process`) or how a verdict is reached
(:mod:`~astraflow.sandbox.results`). Threat model, and what it does not stop:
``docs/security.md`` (Sandbox).
"""

from __future__ import annotations

import logging
import pickle
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from . import process
from .process import Limits
from .results import CheckResult, RunResult, check_result, run_result, tail

__all__ = ["SandboxSettings", "Limits", "RunResult", "CheckResult", "run_python", "check_function",
           "namespaces_available"]

_log = logging.getLogger(__name__)
_REFUSAL = ("sandbox: this machine gives no user/mount/network namespaces, so model-written code does not "
            "run (score 0). To run it anyway with rlimits, an audit hook and uid 65534 only, set "
            "sandbox.allow_unisolated: true in the job config (docs/security.md, Sandbox)")


@dataclass(frozen=True)
class SandboxSettings:
    """What a job allows the sandbox (its config's ``sandbox`` section, as the sandbox reads it)."""

    #: run code where there are no namespaces, with rlimits, an audit hook and (as root) uid
    #: 65534 only; False: such a run ends ``"no_isolation"`` without running
    allow_unisolated: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.allow_unisolated, bool):
            raise TypeError(f"SandboxSettings: allow_unisolated must be a bool, got {self.allow_unisolated!r}")


@cache
def namespaces_available() -> bool:
    """Whether runs get their namespaces and private root here (probed once)."""
    result = _run(["-c", "pass"], stdin="", limits=Limits(), namespaces=True)
    if result.ok and result.network_isolated:
        return True
    why = tail(result.stderr, 2) or result.reason
    _log.warning("sandbox: no user/mount/network namespaces here (%s); model-written code does not run unless "
                 "sandbox.allow_unisolated is set, and then with rlimits and an audit hook only", why)
    return False


def _isolation(settings: SandboxSettings) -> bool | None:
    """True: namespaces; False: the opted-in fallback; None: refuse to run."""
    if namespaces_available():
        return True
    return False if settings.allow_unisolated else None


def run_python(source: str, *, stdin: str = "", limits: Limits = Limits(),
               settings: SandboxSettings = SandboxSettings()) -> RunResult:
    """Run ``source`` as a program in the sandbox, with ``stdin`` as its standard input."""
    if not isinstance(source, str):
        raise TypeError(f"run_python: source must be str, got {type(source).__name__}")
    isolated = _isolation(settings)
    if isolated is None:
        return RunResult(False, "no_isolation", None, "", _REFUSAL, 0.0, False)
    return _run(["program.py"], stdin=stdin, limits=limits, files={"program.py": source}, namespaces=isolated)


def check_function(program: str, entry: str, cases: Sequence[tuple[Sequence[Any], Any]],
                   *, limits: Limits = Limits(), settings: SandboxSettings = SandboxSettings()) -> CheckResult:
    """Define ``program``, call ``entry(*args)`` for every ``(args, expected)`` case.

    All cases run in ONE sandboxed process. A case passes when the call returns plain data
    (None, bool, int, float, str, bytes, list, tuple, dict, set, frozenset, nested) that
    equals ``expected`` (``==`` in the caller, so a tuple never equals a list); a case that
    raises, or returns anything else, fails. ``args`` must be picklable. Bad arguments of
    the caller raise ``ValueError``; nothing the program does makes this raise: every run
    is a result and a reason.
    """
    if not isinstance(entry, str) or not entry.isidentifier():
        raise ValueError(f"check_function: entry must be a function name, got {entry!r}")
    try:
        case_list = [(tuple(args), expected) for args, expected in cases]
    except (TypeError, ValueError) as e:
        raise ValueError(f"check_function: each case must be (args, expected): {e}") from None
    try:
        cases_blob = pickle.dumps([args for args, _ in case_list])
    except Exception as e:
        raise ValueError(f"check_function: case arguments must be picklable: {e}") from None
    failed = [False] * len(case_list)
    if not isinstance(program, str):
        return CheckResult(failed, "syntax_error", f"the program is a {type(program).__name__}, not text")
    isolated = _isolation(settings)
    if isolated is None:
        return CheckResult(failed, "no_isolation", _REFUSAL)
    try:
        nonce = secrets.token_hex(16)
        run, lines = _run(["-", "--check", "program.py", entry, "cases.pkl"], stdin=nonce + "\n", limits=limits,
                          files={"program.py": program}, blobs={"cases.pkl": cases_blob}, namespaces=isolated,
                          with_results=True)
        return check_result(run, lines, nonce, [expected for _, expected in case_list])
    except Exception as e:  # a bug of ours must not fail the episode either: a score and a reason
        _log.exception("sandbox: check_function failed")
        return CheckResult(failed, "sandbox_error", f"{type(e).__name__}: {e}"[:500])


def _run(args: list[str], *, stdin: str, limits: Limits, namespaces: bool,
         files: dict[str, str] | None = None, blobs: dict[str, bytes] | None = None,
         with_results: bool = False):
    """One run (:func:`astraflow.sandbox.process.run`) and its :class:`RunResult`; with
    ``with_results`` also the lines of its results pipe. ``namespaces`` False is the
    unisolated fallback: the entries above decide, tests call it directly."""
    outcome = process.run(args, stdin=stdin, limits=limits, namespaces=namespaces, files=files, blobs=blobs,
                          with_results=with_results)
    result = run_result(outcome, limits, namespaces)
    return (result, outcome.results) if with_results else result
