"""The math_answer reward: numbers numerically, everything else through math-verify, never raising."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest

from astraflow.workflows.api import get_reward
from astraflow.workflows.math_answers import math_answer, number_of

pytest.importorskip("math_verify")


def test_registered():
    assert get_reward("math_answer") is math_answer


@pytest.mark.parametrize("text,answer,want", [
    ("42", "42", 1.0), (" 42\n", "42", 1.0), ("43", "42", 0.0), ("-7", "-7", 1.0),
    ("42.0", "42", 1.0), ("0.1", "1e-1", 1.0), ("3.14159", "3.14160", 0.0), ("0.3333333", "1/3", 1.0),
    ("3/4", "0.75", 1.0), ("6/8", "3/4", 1.0), ("2/3", "3/4", 0.0), ("1/0", "5", 0.0),
])
def test_plain_numbers_compare_numerically(text, answer, want):
    assert math_answer(text, answer) == want


def test_number_of_reads_only_plain_numbers():
    assert number_of("12") == 12 and number_of("3/4") == Fraction(3, 4) and number_of("2.5") == 2.5
    assert number_of("x=3") is None and number_of("\\frac{1}{2}") is None and number_of("1 2") is None


@pytest.mark.parametrize("text,answer,want", [
    ("\\frac{1}{2}", "1/2", 1.0),
    ("\\boxed{\\frac12}", "\\frac{1}{2}", 1.0),
    ("The answer is $\\frac{1}{2}$.", "0.5", 1.0),
    ("\\sqrt{8}", "2\\sqrt{2}", 1.0),
    ("1+x", "x+1", 1.0),
    ("\\dfrac{3}{4}", "0.75", 1.0),
    ("x = 3", "3", 1.0),
    ("\\frac{1}{3}", "\\frac{1}{2}", 0.0),
    ("2\\sqrt{3}", "2\\sqrt{2}", 0.0),
])
def test_latex_and_expressions_go_through_math_verify(text, answer, want):
    assert math_answer(text, answer) == want


@pytest.mark.parametrize("text,answer", [
    ("", "3"), ("3", ""), ("garbage", "\\frac{1}{2}"), ("\\frac{", "1/2"), ("}}}{{{", "\\sqrt{"), (None, "3"),
])
def test_unparsable_scores_zero(text, answer):
    assert math_answer(text, answer) == 0.0


def test_works_off_the_main_thread():
    """math-verify's own timeouts need the main thread; rollout actors call from others."""
    out = []
    t = threading.Thread(target=lambda: out.append((math_answer("\\frac{2}{4}", "\\frac12"),
                                                    math_answer("\\frac{1}{3}", "\\frac12"))))
    t.start()
    t.join(60)
    assert out == [(1.0, 0.0)]


def test_a_dead_helper_is_replaced():
    from astraflow.workflows import math_answers

    assert math_answer("\\frac{2}{4}", "\\frac12") == 1.0
    math_answers._HELPER._proc.kill()  # as a timeout or a crash leaves it
    math_answers._HELPER._proc.wait()
    assert math_answer("\\frac{2}{4}", "\\frac12") == 1.0


def test_missing_math_verify_is_an_error_not_a_zero(monkeypatch):
    from astraflow.workflows import math_answers

    math_answers._HELPER.close()
    monkeypatch.setattr(math_answers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(math_answers.MathVerifyMissing, match="pip install math-verify==0.9.0"):
        math_answer("\\frac{2}{4}", "\\frac12")
    assert math_answer("2", "2") == 1.0  # plain numbers need no package
