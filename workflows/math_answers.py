"""Answer checking for maths datasets: the ``math_answer`` and ``last_number`` rewards.

Owns how a completion's final answer is compared with a dataset's reference answer:

* both plain numbers (``42``, ``-3.5``, ``1e3``, ``3/4``): compared as numbers, exactly
  for integers and fractions, with a relative tolerance of 1e-6 once a decimal point or
  exponent is involved;
* anything else (LaTeX such as ``\\frac{1}{2}`` or ``2\\sqrt{2}``, ``\\boxed{..}``, prose
  around the answer, expressions): the ``math-verify`` package (``parse`` / ``verify``).
  A reference without ``$`` delimiters or ``\\boxed`` is read as LaTeX maths; the
  completion is read as it stands and, failing that, as LaTeX maths too.

A completion or answer that does not parse scores 0; the reward raises only when
math-verify is not installed.

math-verify bounds its own work with ``signal.alarm``, which only works on a process's main
thread, and workflows run on actor threads; sympy can also stall in C code (``2^{2^{99}}``),
where no signal lands. So every math-verify call runs in one helper process (a small
Python program started on first use, which imports math-verify and nothing of AstraFlow):
the caller waits at most :data:`TIMEOUT_S`, and on a timeout kills the helper (the next
call starts a new one) and scores 0. It knows nothing about workflows, Kafka or training.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
from fractions import Fraction

from astraflow.errors import FatalError

from .registry import reward

log = logging.getLogger(__name__)

__all__ = ["last_number", "math_answer", "number_of", "numbers_equal", "MathVerifyMissing", "TIMEOUT_S", "MATH_VERIFY_VERSION"]

MATH_VERIFY_VERSION = "0.9.0"  #: the pin this module is tested with
TIMEOUT_S = 10.0  #: longest wait for one math-verify comparison (the helper's start included)
REL_TOL = 1e-6
MAX_CHARS = 4000  #: longer texts are cut to their last MAX_CHARS characters (the answer comes last)

_INT = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_FRACTION = re.compile(r"([+-]?\d+)\s*/\s*(\d+)")


def number_of(text: str) -> int | Fraction | float | None:
    """``text`` as a number when it is exactly one plain number (integer, decimal, ``a/b``), else None."""
    t = text.strip()
    if _INT.fullmatch(t):
        return int(t)
    m = _FRACTION.fullmatch(t)
    if m:
        return Fraction(int(m[1]), int(m[2])) if int(m[2]) else None
    if _DECIMAL.fullmatch(t):
        value = float(t)
        return value if math.isfinite(value) else None
    return None


def numbers_equal(a: int | Fraction | float, b: int | Fraction | float) -> bool:
    """Exact for integers and fractions; relative tolerance :data:`REL_TOL` with a float."""
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=1e-12)
    return a == b


@reward("math_answer")
def math_answer(completion_text: str, answer: str) -> float:
    """1.0 if the completion's answer equals the reference ``answer``, else 0.0 (see the module).

    Raises :class:`MathVerifyMissing` only when a comparison needs math-verify and it is not
    installed (a broken environment must not pass for a policy that is always wrong)."""
    text = "" if completion_text is None else str(completion_text)[-MAX_CHARS:]
    gold = "" if answer is None else str(answer)[-MAX_CHARS:]
    a, b = number_of(text), number_of(gold)
    if a is not None and b is not None:
        return 1.0 if numbers_equal(a, b) else 0.0
    if not text.strip() or not gold.strip():
        return 0.0
    return 1.0 if _HELPER.verify(gold, text) else 0.0


#: a number as a reply writes it: optional minus, digits with optional thousands commas, decimals
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])-?\d+(?:\.\d+)?")


@reward("last_number")
def last_number(completion_text: str, answer: str) -> float:
    """1.0 if the last number written in the completion equals the (numeric) reference, else 0.0.

    What a chat model's reply to "What is 23+45? Answer with the number only." is read by:
    ``"23 + 45 = 78"``, ``"The answer is 78."`` and ``"78"`` all score 1. Unlike
    :func:`math_answer` it never evaluates an expression, so a reply that restates the
    question (``"23+45"``) scores 0 rather than being read as its value."""
    gold = number_of("" if answer is None else str(answer))
    found = _NUMBER_IN_TEXT.findall("" if completion_text is None else str(completion_text)[-MAX_CHARS:])
    if gold is None or not found:
        return 0.0
    value = number_of(found[-1].replace(",", ""))
    return 1.0 if value is not None and numbers_equal(value, gold) else 0.0


class MathVerifyMissing(FatalError):
    """The ``math-verify`` package is not installed in this interpreter."""


# -- the math-verify helper process -----------------------------------------------------------

# The helper's whole program: it imports math-verify only (not this package, not torch).
# One JSON line ``[gold, completion]`` in, ``1`` or ``0`` out. The reference is read as LaTeX
# maths unless it has delimiters; the completion as it stands, then as LaTeX maths.
_HELPER_SOURCE = r"""
import json, logging, sys
logging.disable(logging.WARNING)  # math-verify logs every text it cannot parse
from math_verify import parse, verify

def as_latex(text):
    marked = "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text
    return text if marked else "$" + text + "$"

def same(gold, pred):
    g = parse(as_latex(gold))
    if not g:
        return False
    for candidate in dict.fromkeys((pred, as_latex(pred))):
        p = parse(candidate)
        if p and verify(g, p):
            return True
    return False

for line in sys.stdin:
    try:
        gold, pred = json.loads(line)
        ok = same(gold, pred)
    except Exception:
        ok = False
    sys.stdout.write("1\n" if ok else "0\n")
    sys.stdout.flush()
"""


class _Helper:
    """One helper process shared by every thread of this process, one request at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def verify(self, gold: str, pred: str) -> bool:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                if importlib.util.find_spec("math_verify") is None:
                    raise MathVerifyMissing(f"the math_answer reward needs math-verify in {sys.executable}: "
                                            f"pip install math-verify=={MATH_VERIFY_VERSION}")
                try:
                    self._proc = subprocess.Popen([sys.executable, "-c", _HELPER_SOURCE], stdin=subprocess.PIPE,
                                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                except OSError as e:
                    log.warning("math_answer: cannot start the math-verify helper (%s); scoring 0", e)
                    self._proc = None
                    return False
            try:
                self._proc.stdin.write(json.dumps([gold, pred]).encode() + b"\n")
                self._proc.stdin.flush()
                reply = self._read_line(time.monotonic() + TIMEOUT_S)
            except OSError:
                reply = None
            if reply is None:  # stuck or dead: the next call starts a fresh helper
                self._stop()
                return False
            return reply == b"1"

    def _read_line(self, deadline: float) -> bytes | None:
        fd, buf = self._proc.stdout.fileno(), b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 64)
            if not chunk:
                return None
            buf += chunk
        return buf.strip()

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for f in (self._proc.stdin, self._proc.stdout):
                f.close()
        self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()


_HELPER = _Helper()
atexit.register(_HELPER.close)
