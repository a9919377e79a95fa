"""Verdicts: how a run ended, and whether a checked function passed its cases.

:func:`run_result` reads a run's :class:`~astraflow.sandbox.process.Outcome` (the
launcher's report, the wall clock, the program's last stderr line) into a
:class:`RunResult` with one reason. :func:`check_result` reads the check harness's lines
strictly (a line carrying the run's nonce that is not a well-formed result makes the whole
run ``malformed_results``), decodes each value (:func:`astraflow.sandbox.child.encode` back
to plain data) and compares it with ``==`` in the caller. It knows nothing about how the
run was isolated or started.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from typing import Any

from .child import MAX_DEPTH
from .process import Limits, Outcome

_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
_HARNESS_ERRORS = ("syntax_error", "no_function")  #: what the harness reports instead of cases


@dataclass(frozen=True)
class RunResult:
    """How one sandboxed run ended.

    ``reason`` is one of ``"ok"``, ``"timeout"`` (wall clock), ``"cpu_limit"``,
    ``"memory_limit"`` (a ``MemoryError`` ended it), ``"file_limit"``, ``"crash"`` (SIGSEGV,
    SIGBUS, SIGILL, SIGFPE, SIGABRT), ``"exit_<code>"``, ``"signal_<NAME>"`` (any other
    signal), ``"no_isolation"`` (not run: no namespaces here and no opt-in) or
    ``"sandbox_error"`` (the sandbox itself failed; ``stderr`` says why).
    """

    ok: bool  #: exited 0 within every limit
    reason: str
    returncode: int | None  #: exit code, or minus the signal number; None on timeout/error
    stdout: str
    stderr: str
    duration_s: float
    network_isolated: bool  #: True when the child ran in its namespaces and private root


@dataclass(frozen=True)
class CheckResult:
    """The outcome of :func:`~astraflow.sandbox.api.check_function`.

    ``reason`` is ``"ok"`` (every case passed), ``"wrong_answer"``, ``"syntax_error"``,
    ``"no_function"``, ``"malformed_results"`` (a line with the run's nonce that is not a
    well-formed result: every case fails), or the :class:`RunResult` reason when the process
    did not end well (cases that finished before a timeout keep their result).
    """

    passed: list[bool]  #: one per case; False for all when the program could not run
    reason: str
    detail: str = ""  #: the first failure, a traceback tail, or the syntax error


def run_result(outcome: Outcome, limits: Limits, namespaces: bool) -> RunResult:
    """The verdict on one run: how it ended, from the launcher's report and the program's stderr."""
    stdout, stderr, report, duration = outcome.stdout, outcome.stderr, outcome.report, outcome.duration_s
    if outcome.setup_error:
        return RunResult(False, "sandbox_error", None, "", outcome.setup_error, duration, False)
    isolated = namespaces and report.get("isolated") is True

    def done(reason: str, code: int | None, err: str = stderr) -> RunResult:
        return RunResult(reason == "ok", reason, code, stdout, err, duration, isolated)

    if outcome.timed_out:
        return done("timeout", None)
    if "error" in report or "exit" not in report:
        why = report.get("error") or "the launcher ended without reporting the program's exit"
        return done("sandbox_error", None, f"sandbox: {why}\n{stderr}")
    code = report["exit"]
    if type(code) is not int:
        return done("sandbox_error", None, f"sandbox: the launcher reported exit {code!r:.40}\n{stderr}")
    if code < 0:
        signum = -code
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL
                                        and report.get("cpu_s", 0) >= limits.cpu_seconds):
            return done("cpu_limit", code)
        if signum == signal.SIGXFSZ:
            return done("file_limit", code)
        if signum in _CRASH_SIGNALS:
            return done("crash", code)
        return done(f"signal_{signal.Signals(signum).name}"
                    if signum in signal.valid_signals() else f"signal_{signum}", code)
    if code == 0:
        return done("ok", 0)
    last = tail(stderr, 1)
    if last.startswith("MemoryError"):
        return done("memory_limit", code)
    if "[Errno 27]" in last:  # EFBIG: Python ignores SIGXFSZ, so the write raises instead
        return done("file_limit", code)
    return done(f"exit_{code}", code)


def check_result(run: RunResult, lines: list[str], nonce: str, expected: list[Any]) -> CheckResult:
    """The verdict on a checked function: each case's result line from the harness (only lines
    carrying ``nonce`` count) against its ``expected`` value, and how the run ended."""
    failed = [False] * len(expected)
    got, error, malformed = _parse_results(lines, nonce, len(expected))
    if malformed:
        return CheckResult(failed, "malformed_results", malformed)
    if error:
        return CheckResult(failed, *error)
    passed, first_failure = [], ""
    for i, want in enumerate(expected):
        ok, why = _judge(got.get(i), want)
        passed.append(ok)
        if not ok and not first_failure:
            first_failure = f"case {i}: {why}"
    if run.reason != "ok":
        return CheckResult(passed, run.reason, tail(run.stderr) or first_failure)
    if all(passed):
        return CheckResult(passed, "ok")
    return CheckResult(passed, "wrong_answer", first_failure)


def _parse_results(lines: list[str], nonce: str, n: int) -> tuple[dict[int, dict], tuple[str, str] | None, str]:
    """The harness's lines, strictly: per-case messages, a harness error, or why a line that
    carries the nonce is malformed (then nothing else counts). Lines without it are ignored."""
    got: dict[int, dict] = {}
    error = None
    for line in lines:
        if nonce not in line:
            continue
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as e:
            return {}, None, f"a results line is not JSON ({type(e).__name__}): {line[:120]!r}"
        if type(message) is not dict or message.get("nonce") != nonce:
            return {}, None, f"a results line is not a result: {line[:120]!r}"
        keys = set(message)
        if "error" in message:
            if keys - {"nonce", "error", "detail"} or message["error"] not in _HARNESS_ERRORS \
                    or type(message.get("detail", "")) is not str:
                return {}, None, f"a malformed harness error: {line[:120]!r}"
            error = error or (message["error"], message.get("detail", ""))
            continue
        case, ok = message.get("case"), message.get("ok")
        well_formed = (type(case) is int and 0 <= case < n and case not in got and type(ok) is bool
                       and (keys == {"nonce", "case", "ok", "value"} if ok else
                            keys == {"nonce", "case", "ok", "detail"} and type(message["detail"]) is str))
        if not well_formed:
            return {}, None, f"a malformed or repeated case result: {line[:120]!r}"
        got[case] = message
    return got, error, ""


def _judge(message: dict | None, expected: Any) -> tuple[bool, str]:
    if message is None:
        return False, "no result (the program ended first)"
    if not message["ok"]:
        return False, message["detail"][:500]
    try:
        value = _decode(message["value"])
        if value == expected:
            return True, ""
        return False, f"returned {_short(value)}, expected {_short(expected)}"
    except Exception as e:  # a malformed, or maliciously deep, value is the program's failure
        return False, f"unreadable result: {type(e).__name__}: {e}"[:500]


def _short(value: Any) -> str:
    try:
        return f"{value!r:.200}"
    except Exception as e:
        return f"<unprintable: {type(e).__name__}>"


def _decode(value: Any, depth: int = 0) -> Any:
    """The harness's tagged JSON back to plain data (:func:`astraflow.sandbox.child.encode`), strictly."""
    if depth > MAX_DEPTH:
        raise ValueError("result nested too deeply")
    if isinstance(value, list):
        return [_decode(v, depth + 1) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ValueError(f"a tagged value has {len(value)} keys")
    (tag, items), = value.items()
    if tag == "bytes":
        return bytes.fromhex(items)
    if not isinstance(items, list):
        raise ValueError(f"tag {tag!r} holds a {type(items).__name__}")
    decoded = [_decode(v, depth + 1) for v in items]
    if tag == "tuple":
        return tuple(decoded)
    if tag == "set":
        return set(decoded)
    if tag == "frozenset":
        return frozenset(decoded)
    if tag == "dict":
        return dict(decoded)
    raise ValueError(f"unknown tag {tag!r}")


def tail(text: str, lines: int = 5) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
