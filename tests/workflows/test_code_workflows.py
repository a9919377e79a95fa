"""The two code workflows: reward rules (scripted roles), masks, and real CPU-engine episodes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from astraflow.workflows.api import ENV, Episode, EngineRole, Turn, get_workflow, run_episode
from astraflow.workflows.code_tasks import (code_prompts, format_cases, generate_code_problems, hidden_tests,
                                           parse_cases, run_cases)
from astraflow.workflows.code_workflows import (ROLES, feedback_of, pick_of, retry_prompt, selector_prompt,
                                                generator_prompt, warm_start_examples)

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8}


@pytest.fixture(scope="module")
def tiny(tokenizer_and_engine):
    return tokenizer_and_engine


class ScriptedRole:
    """A role whose completions a test dictates: ``reply(call, row, prompt text) -> text``.
    The workflow logic is under test here, not an engine."""

    def __init__(self, name: str, tokenizer, reply) -> None:
        self.name, self.policy, self.tok, self.reply = name, f"policy-{name}", tokenizer, reply
        self.seen: list[list[str]] = []

    def generate(self, prompts, *, seeds, max_new_tokens=None, temperature=None) -> list[Turn]:
        texts = [self.tok.decode(list(p)) for p in prompts]
        call = len(self.seen)
        self.seen.append(texts)
        out = []
        for row, (ids, text) in enumerate(zip(prompts, texts)):
            reply = self.reply(call, row, text)
            tokens = tuple(self.tok.encode(reply, add_special_tokens=False)) + (self.tok.eos_token_id,)
            out.append(Turn(tuple(ids), tokens, (-0.5,) * len(tokens), 7, "stop", reply, self.name, self.policy))
        return out


def episode(prompt, n: int, roles, tokenizer) -> Episode:
    return Episode(prompt.prompt_id, prompt.text, prompt.answer, n, roles, tokenizer, {}, prompt.metadata)


def assert_masks(result) -> None:
    """Only a role's own tokens are trained on: every token another role or the
    environment wrote is masked, with logprob and version 0."""
    for role, trajs in result.trajectories.items():
        for t in trajs:
            assert any(t.loss_mask)
            for m, who, lp, v in zip(t.loss_mask, t.token_roles, t.logprobs, t.versions):
                if who != role:
                    assert m == 0
                if m == 0:
                    assert lp == 0.0 and v == 0


def test_selector_rewards_follow_the_rules(tiny):
    tok, _ = tiny
    prompt = code_prompts(1, seed=11)[0]
    ref = prompt.metadata["reference"]
    wrong = f"{ref}+1"
    attempts = [ref, wrong, wrong, ref, ref, ref, wrong, wrong]  # samples: (ok, bad) (bad, ok) (ok, ok) (bad, bad)
    solver = ScriptedRole("solver", tok, lambda call, row, _: attempts[row])
    selector = ScriptedRole("selector", tok, lambda call, row, _: ["A", "A", "B", "C"][row])
    result = run_episode(get_workflow("code_solver_selector"),
                         episode(prompt, 4, {"solver": solver, "selector": selector}, tok), job_seed=0)
    assert [t.reward for t in result.trajectories["solver"]] == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    # Picked the passing one; picked the failing one; both pass; unparsable.
    assert [t.reward for t in result.trajectories["selector"]] == [1.0, 0.0, 0.5, 0.0]
    assert [t.info["pick"] for t in result.trajectories["selector"]] == ["A", "A", "B", "unparsed"]
    assert result.team_reward == 0.5  # the selected attempt passes in samples 0 and 2
    assert solver.seen == [[prompt.text] * 8]
    assert selector.seen == [[selector_prompt(prompt.text, attempts[2 * i], attempts[2 * i + 1]) for i in range(4)]]
    assert_masks(result)


def test_testgen_rewards_retry_and_masks(tiny):
    tok, _ = tiny
    prompt = code_prompts(1, seed=12)[0]
    ref = prompt.metadata["reference"]
    wrong = f"{ref}+1"  # wrong on every input
    (a0, e0), (a1, e1) = hidden_tests(prompt.answer)[:2]
    right_cases = [(a0, e0), (a1, e1)]
    wrong_cases = [(a0, e0 + 1), (a1, e1 + 1)]  # what `wrong` computes
    mixed_cases = [(a0, e0), (a1, e1 + 1)]
    first = [ref, wrong, wrong, wrong, wrong]
    generated = [format_cases(right_cases), format_cases(right_cases), "hello", format_cases(wrong_cases),
                 format_cases(mixed_cases)]
    solver = ScriptedRole("solver", tok, lambda call, row, _: first[row] if call == 0 else ref)
    gen = ScriptedRole("test_generator", tok, lambda call, row, _: generated[row])
    result = run_episode(get_workflow("code_solver_testgen"),
                         episode(prompt, 5, {"solver": solver, "test_generator": gen}, tok), job_seed=0)
    # Sample 0: passes its tests, no retry. 1: fails both, retries right. 2: nothing parsed, no
    # retry. 3: the tests agree with the wrong attempt (and not the reference): no retry.
    # 4: fails one of two, retries right; the reference fails the other.
    assert gen.seen == [[generator_prompt(prompt.text, a) for a in first]]
    assert solver.seen[1] == [retry_prompt(prompt.text, wrong, feedback_of(right_cases, [False, False])),
                              retry_prompt(prompt.text, wrong, feedback_of(mixed_cases, [False, True]))]
    assert "FAIL" in solver.seen[1][1] and "PASS" in solver.seen[1][1]
    trajs = result.trajectories["solver"]
    assert [(t.info["sample"], t.info["attempt"], t.reward) for t in trajs] == [
        (0, 1, 1.0), (1, 1, 0.0), (1, 2, 1.0), (2, 1, 0.0), (3, 1, 0.0), (4, 1, 0.0), (4, 2, 1.0)]
    assert [t.reward for t in result.trajectories["test_generator"]] == [2.0, 2.0, 0.0, 0.0, 1.0]
    assert [t.info["cases"] for t in result.trajectories["test_generator"]] == [2, 2, 0, 2, 2]
    assert result.team_reward == pytest.approx(3 / 5)
    assert_masks(result)
    retry = trajs[2]
    own = [i for i, m in enumerate(retry.loss_mask) if m]
    assert tok.decode([retry.tokens[i] for i in own], skip_special_tokens=True) == ref
    context = retry.tokens[:own[0]]
    assert tok.decode(list(retry.prompt_ids) + list(context)) == solver.seen[1][0]
    assert set(retry.token_roles[:own[0]]) == {"solver", ENV}
    assert all(r == "solver" for r in retry.token_roles[:len(wrong)])  # attempt 1: context, not trained


def _testgen_episode(tok, params: dict):
    """Six samples: 0 right, tests valid; 1 wrong, valid tests catch it; 2 no tests; 3 tests that
    agree with the wrong attempt; 4 tests half wrong; 5 right, but tests the reference fails.
    Every retry answers the reference."""
    prompt = code_prompts(1, seed=12)[0]
    ref = prompt.metadata["reference"]
    wrong = f"{ref}+1"  # wrong on every input
    (a0, e0), (a1, e1) = hidden_tests(prompt.answer)[:2]
    right_cases, wrong_cases, mixed_cases = [(a0, e0), (a1, e1)], [(a0, e0 + 1), (a1, e1 + 1)], [(a0, e0), (a1, e1 + 1)]
    first = [ref, wrong, wrong, wrong, wrong, ref]
    generated = [format_cases(c) if c else "hello"
                 for c in (right_cases, right_cases, None, wrong_cases, mixed_cases, wrong_cases)]
    solver = ScriptedRole("solver", tok, lambda call, row, _: first[row] if call == 0 else ref)
    gen = ScriptedRole("test_generator", tok, lambda call, row, _: generated[row])
    ep = Episode(prompt.prompt_id, prompt.text, prompt.answer, 6, {"solver": solver, "test_generator": gen}, tok,
                 params, prompt.metadata)
    return prompt, solver, run_episode(get_workflow("code_solver_testgen"), ep, job_seed=0)


def test_testgen_generator_reward_rules(tiny):
    """``reference``: final passes + the reference passes the cases; ``verdict``: valid cases whose
    verdict on attempt 1 is the hidden tests' — the bogus cases of sample 5 that force a needless
    retry earn 1 under the reference rule (the retry happened to pass) and 0 under ``verdict``."""
    tok, _ = tiny
    _, _, ref_rule = _testgen_episode(tok, {})
    assert [t.reward for t in ref_rule.trajectories["test_generator"]] == [2.0, 2.0, 0.0, 0.0, 1.0, 1.0]
    _, _, verdict = _testgen_episode(tok, {"generator_reward": "verdict"})
    assert [t.reward for t in verdict.trajectories["test_generator"]] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    # The rule changes the generator's reward only: the same retries, solver rewards and team.
    assert ([t.reward for t in verdict.trajectories["solver"]] == [t.reward for t in ref_rule.trajectories["solver"]]
            == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    assert verdict.team_reward == ref_rule.team_reward == pytest.approx(4 / 6)
    # The verdict alone is right on 0, 1 and 4 (4's cases are half wrong: not valid, no reward).
    assert verdict.metrics["verdict_right"] == pytest.approx(3 / 6)


def test_testgen_fresh_retry_is_asked_the_plain_problem(tiny):
    tok, _ = tiny
    prompt, solver, result = _testgen_episode(tok, {"retry": "fresh"})
    assert solver.seen[1] == [prompt.text] * 3  # samples 1, 4, 5 failed a generated case
    retries = [t for t in result.trajectories["solver"] if t.info["attempt"] == 2]
    assert [t.info["sample"] for t in retries] == [1, 4, 5] and all(t.reward == 1.0 for t in retries)
    for t in retries:  # a plain answer: every token its own, the problem as its prompt
        assert all(t.loss_mask) and set(t.token_roles) == {"solver"}
        assert tok.decode(list(t.prompt_ids)) == prompt.text
    assert_masks(result)


@pytest.mark.parametrize("key,value", [("generator_reward", "balanced"), ("retry", "verdict")])
def test_testgen_bad_params_are_config_errors(bad_param_is_a_config_error, key, value):
    example = Path(__file__).resolve().parents[2] / "examples" / "code_solver_testgen.yaml"
    cfg = bad_param_is_a_config_error(example, key, value, {"generator_reward": "verdict", "retry": "feedback"})
    assert cfg.workflow.params["retry"] == "feedback"


def test_prompt_formats_and_pick_parsing():
    assert selector_prompt("f(1)=3;f=", "x+2", "x*3") == "f(1)=3;A=x+2;B=x*3;pick="
    assert generator_prompt("f(1)=3;f=", "x+2") == "f(1)=3;f=x+2;tests="
    assert retry_prompt("f(1)=3;f=", "x+2", feedback_of([((0,), 1)], [False])) == "f(1)=3;f=x+2;f(0)=1:FAIL;f="
    assert [pick_of(t) for t in ("A", " B\n", "AB", "", "a")] == ["A", "B", None, None, None]
    # After a check of values: the tag that ends it; a check that is not values is no pick.
    assert [pick_of(t) for t in ("3,5,9A", "-1,0B", "3,5,9", "3,5A9", "x3A", "3,5,9 A")] == \
           ["A", "B", None, None, None, None]


@pytest.mark.parametrize("role", ROLES)
def test_warm_start_examples_use_the_workflow_formats(role):
    ex = warm_start_examples(role, 200, seed=0)
    assert ex == warm_start_examples(role, 200, seed=0) and warm_start_examples(role, 50, seed=0) == ex[:50]
    assert all(len(p) + len(t) <= 100 for p, t in ex)
    held = warm_start_examples(role, 50, seed=0, split="heldout")
    assert not {p for p, _ in held} & {p for p, _ in ex}
    if role == "selector":
        assert {pick_of(t) for _, t in ex} == {"A", "B"} and all(p.endswith(";pick=") for p, _ in ex)
        for prompt, target in ex[:50]:  # the check is A's values at the visible inputs ...
            shown = [int(v) for v in re.findall(r"\)=(-?\d+)", prompt)]
            a = re.search(r";A=(.*?);B=", prompt)[1]
            check = [int(v) for v in target[:-1].split(",")]
            assert len(check) == len(shown)
            # ... so they are the examples' values exactly when A is the pick (the reference)
            assert (check == shown) == (target[-1] == "A"), (prompt, target, a)
    elif role == "test_generator":
        assert all(p.endswith(";tests=") and t.startswith("f(") for p, t in ex)
        for prompt, target in ex:  # revision 2: the problem's first two examples, valid by construction
            assert prompt.startswith(f"{target};") and len(parse_cases(target, target.count(",") // 2 + 1)) == 2
        problems = {q.prompt: q for q in generate_code_problems(200, seed=0)}
        for prompt, target in ex[:50]:
            q = problems[prompt[:prompt.index(";tests=")].rsplit(";f=", 1)[0] + ";f="]
            assert run_cases(q.reference, parse_cases(target, q.arity))[0] == [True, True]
    else:
        assert any("FAIL" in p for p, _ in ex) and all(p.endswith("f=") for p, _ in ex)
    with pytest.raises(ValueError, match="unknown role"):
        warm_start_examples("judge", 1, 0)


def engine_roles(tok, engine, names):
    return {name: EngineRole(name, f"policy-{name}", engine, tok, SAMPLING) for name in names}


def within_positions(result, limit: int = 128) -> bool:
    return all(len(t.prompt_ids) + len(t.tokens) <= limit for ts in result.trajectories.values() for t in ts)


def test_selector_workflow_runs_on_the_cpu_engine(tiny):
    tok, engine = tiny
    prompt = code_prompts(1, seed=13)[0]
    spec = get_workflow("code_solver_selector")
    runs = [run_episode(spec, episode(prompt, 3, engine_roles(tok, engine, spec.roles), tok), job_seed=5)
            for _ in range(2)]
    result = runs[0]
    assert len(result.trajectories["solver"]) == 6 and len(result.trajectories["selector"]) == 3
    assert {t.reward for t in result.trajectories["solver"]} <= {0.0, 1.0}
    assert {t.reward for t in result.trajectories["selector"]} <= {0.0, 0.5, 1.0}
    assert 0.0 <= result.team_reward <= 1.0 and within_positions(result)
    assert_masks(result)
    # Seeded: the same episode redone samples the same tokens.
    assert [[t.tokens for t in ts] for ts in runs[0].trajectories.values()] == \
           [[t.tokens for t in ts] for ts in runs[1].trajectories.values()]


def test_testgen_workflow_runs_on_the_cpu_engine(tiny):
    tok, engine = tiny
    prompt = code_prompts(1, seed=14)[0]
    spec = get_workflow("code_solver_testgen")
    result = run_episode(spec, episode(prompt, 3, engine_roles(tok, engine, spec.roles), tok), job_seed=5)
    assert len(result.trajectories["test_generator"]) == 3
    assert {t.reward for t in result.trajectories["test_generator"]} <= {0.0, 1.0, 2.0}
    assert within_positions(result) and 0.0 <= result.team_reward <= 1.0
    assert_masks(result)


def test_testgen_retry_on_the_cpu_engine_trains_on_the_retry_only(tiny):
    """A generator whose tests no code passes forces every sample to retry on the real engine."""
    tok, engine = tiny
    prompt = code_prompts(1, seed=15)[0]
    arity = len(hidden_tests(prompt.answer)[0][0])
    impossible = format_cases([((0,) * arity, 9999), ((1,) * arity, -9999)])
    roles = engine_roles(tok, engine, ["solver"])
    roles["test_generator"] = ScriptedRole("test_generator", tok, lambda call, row, _: impossible)
    result = run_episode(get_workflow("code_solver_testgen"), episode(prompt, 3, roles, tok), job_seed=6)
    retries = [t for t in result.trajectories["solver"] if t.info["attempt"] == 2]
    assert len(retries) == 3 and within_positions(result)
    assert_masks(result)
    for t in retries:
        own = [i for i, m in enumerate(t.loss_mask) if m]
        assert own == list(range(own[0], len(t.tokens)))  # only the retry's tokens are trained on
        assert all(v == engine.version for v in (t.versions[i] for i in own))
        assert "FAIL" in tok.decode(list(t.tokens[:own[0]]))


def test_the_selector_warm_start_is_scored_on_its_pick_alone():
    from astraflow.models.warm_start import get_task, pick_score
    assert get_task("selector").score is pick_score
    # a wrong check with the right tag is a right pick; the wrong tag, or no pick, is not
    assert [pick_score(c, "3,5,9A") for c in ("3,5,9A", "3,5,8A", "A", "3,5,9B", "3,5,9", "")] == \
           [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_the_selector_warm_start_validates_on_problems_it_never_trained_on():
    """Its early stop measures held-out-like problems: a prompt's problem is the examples it
    shows, the same for the solver's prompt and the selector's about it."""
    from astraflow.models.warm_start import code_problem, get_task
    p = code_prompts(1, seed=11)[0].text
    assert code_problem(p) == code_problem(selector_prompt(p, "x+1", "x*2")) == p.removesuffix("f=")
    assert get_task("selector").problem is code_problem
