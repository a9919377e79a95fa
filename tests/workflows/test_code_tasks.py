"""The code task: deterministic, split by prompt hash, identifiable, scored in the real sandbox."""

from __future__ import annotations

import orjson
import pytest

from astraflow.topics import Prompt
from astraflow.workflows.api import get_reward
from astraflow.workflows.arithmetic import split_of
from astraflow.workflows.code_tasks import (MAX_PROMPT_CHARS, CodeTaskError, evaluate_expr, expression_of, family,
                                            format_cases, generate_code_problems, code_prompts, hidden_tests,
                                            parse_cases, program_of, reference_of, run_cases)


def test_problems_are_deterministic_and_prefix_stable():
    a = generate_code_problems(60, seed=3)
    assert a == generate_code_problems(60, seed=3)
    assert generate_code_problems(20, seed=3) == a[:20]
    assert [p.prompt for p in generate_code_problems(60, seed=4)] != [p.prompt for p in a]


def test_train_and_heldout_never_overlap():
    train = {p.prompt for seed in range(3) for p in generate_code_problems(400, seed=seed)}
    held = {p.prompt for seed in range(3) for p in generate_code_problems(60, seed=seed, split="heldout")}
    assert held and not train & held
    assert all(split_of(p) == "heldout" for p in held) and all(split_of(p) == "train" for p in train)
    assert len(generate_code_problems(50, seed=0, split="heldout", unique=True)) == 50
    with pytest.raises(ValueError, match="split"):
        generate_code_problems(1, split="test")


def test_a_problem_is_short_consistent_and_identifiable():
    problems = generate_code_problems(300, seed=0)
    assert {p.arity for p in problems} == {1, 2}
    for p in problems:
        assert len(p.prompt) <= MAX_PROMPT_CHARS and p.prompt == format_cases(p.visible) + ";f="
        assert not {a for a, _ in p.visible} & {a for a, _ in p.hidden}
        for args, want in p.visible + p.hidden:
            assert evaluate_expr(p.reference, args) == want
        # Every expression of the family that fits what the prompt shows passes the hidden tests.
        for expr in family(p.arity):
            if all(evaluate_expr(expr, a) == w for a, w in p.visible):
                assert all(evaluate_expr(expr, a) == w for a, w in p.hidden), (p.prompt, expr)


def test_reference_solutions_pass_their_hidden_tests_in_the_sandbox():
    problems = generate_code_problems(40, seed=1)
    picked = [next(p for p in problems if p.arity == 1), next(p for p in problems if p.arity == 2)]
    for p in picked:
        assert p.program() == program_of(p.reference, p.arity)
        assert run_cases(p.reference, p.hidden) == ([True] * len(p.hidden), "ok")
    p = picked[0]
    wrong = next(e for e in family(1) if any(evaluate_expr(e, a) != w for a, w in p.hidden))
    passed, reason = run_cases(wrong, p.hidden)
    assert reason == "wrong_answer" and not all(passed)
    assert run_cases("x*", p.hidden) == ([False] * len(p.hidden), "syntax_error")
    assert run_cases(expression_of("x\nimport os"), p.hidden) == ([False] * len(p.hidden), "not an expression")


def test_code_prompts_carry_the_hidden_tests_and_reference():
    prompts = code_prompts(5, seed=2)
    problems = generate_code_problems(5, seed=2)
    for prompt, p in zip(prompts, problems):
        assert isinstance(prompt, Prompt) and prompt.text == p.prompt and prompt.source == "code"
        assert orjson.loads(orjson.dumps(prompt.metadata)) == prompt.metadata  # JSON all the way
        assert prompt.metadata["reference"] == p.reference == reference_of(prompt.metadata)
        assert hidden_tests(prompt.answer) == hidden_tests("", prompt.metadata) == list(p.hidden)
    assert len({p.prompt_id for p in prompts}) == 5


def test_the_hidden_tests_reward_runs_the_completion():
    score = get_reward("code_hidden_tests")
    prompt = code_prompts(1, seed=5)[0]
    ref = prompt.metadata["reference"]
    assert score(f" {ref} ", prompt.answer) == 1.0  # (text, answer) as rlvr calls it
    assert score(ref, "", prompt.metadata) == 1.0
    assert score(ref + "+1", prompt.answer) == 0.0
    assert score("", prompt.answer) == 0.0


def test_malformed_tests_or_reference_name_the_key():
    with pytest.raises(CodeTaskError, match="metadata 'tests'"):
        hidden_tests("", {"tests": [[[1], "3"]]})
    with pytest.raises(CodeTaskError, match="metadata 'tests'"):
        hidden_tests("", {"tests": [[[1], 3], [[1, 2], 3]]})
    with pytest.raises(CodeTaskError, match="answer"):
        hidden_tests("x*2+1")
    with pytest.raises(CodeTaskError, match="metadata 'reference'"):
        reference_of({"tests": []})


def test_parse_cases_keeps_well_formed_cases_of_the_arity():
    assert parse_cases("f(4)=9;f(0)=1", 1) == [((4,), 9), ((0,), 1)]
    assert parse_cases(" f(4) = -9 ;junk;f(1,2)=3;f(4)=5;f(7)=1;f(8)=2", 1) == [((4,), -9), ((7,), 1)]
    assert parse_cases("f(1,2)=3;f(3)=1", 2, limit=3) == [((1, 2), 3)]
    assert parse_cases("f(123)=1;f(1)=99999", 1) == []  # out of the bounded sizes
    assert parse_cases("", 1) == []
