"""The solver-verifier team on a chat model: every prompt is the chat template's, and a retry
continues the solver's own conversation token-exact.

On ``smol_random`` (SmolLM2-135M-Instruct's real tokenizer and ChatML template on a 2-layer
random Llama, served by the real CPU engine): the verifier's prompt is what
``apply_chat_template`` gives for its conversation; a rejected first answer is continued as
the task's ids + the reply's tokens as generated (end-of-turn appended when cut) + the
template's rendering of the feedback turn, and only the retry's own tokens train; verdicts
are read from chat-style replies; the example config loads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from astraflow.config import load_config
from astraflow.engines.cpu import CpuEngine
from astraflow.workflows.api import EngineRole, Episode, get_workflow, run_episode
from astraflow.workflows.chat import ChatTemplateError, prompt_messages, render
from astraflow.workflows.solver_verifier import (chat_verdict_of, continuation_ids, feedback_message,
                                                 verifier_messages)
from astraflow.workflows.types import ENV, Turn

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2_solver_verifier.yaml"
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 6}
PROBLEM, ANSWER = "What is 23+45? Answer with the number only.", "68"


@pytest.fixture(scope="module")
def tok(smol_random):
    return AutoTokenizer.from_pretrained(str(smol_random))


@pytest.fixture(scope="module")
def engine(smol_random):
    engine = CpuEngine(smol_random, threads=1)
    yield engine
    engine.close()


def _template(tok, messages, add_generation_prompt=True) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


class SaysNo:
    """A verifier whose policy rejects every answer ("No, ..."), which a random-init model never
    says: what the workflow does with a rejection is under test, not the verifier's judgement.
    Its turns are real tokenizer tokens, ending with the end-of-turn token as an engine's do."""

    def __init__(self, tok, text: str = "No, that is wrong. The answer is 70.") -> None:
        self.name = self.policy = "verifier"
        self.tok, self.text, self.prompts = tok, text, []
        self.sampling = {"max_new_tokens": 16}

    def generate(self, prompts, *, seeds, max_new_tokens=None, temperature=None, stop=None):
        self.prompts += [list(p) for p in prompts]
        tokens = (*self.tok.encode(self.text, add_special_tokens=False), self.tok.eos_token_id)
        return [Turn(tuple(p), tokens, (0.0,) * len(tokens), 0, "stop", self.text, self.name, self.policy)
                for p in prompts]


def chat_episode(tok, engine, verifier=None, params=None, n=4, seed=3):
    roles = {"solver": EngineRole("solver", "solver", engine, tok, SAMPLING),
             "verifier": verifier or EngineRole("verifier", "verifier", engine, tok, {**SAMPLING, "max_new_tokens": 4})}
    ids = tuple(render(tok, prompt_messages(PROBLEM)))
    ep = Episode(f"t{seed:07d}", PROBLEM, ANSWER, n, roles, tok,
                 {"reward": "last_number", **(params or {}), "_job_seed": seed}, prompt_ids=ids)
    return ids, run_episode(get_workflow("solver_verifier"), ep, seed)


def test_the_solver_answers_the_chat_prompt_and_the_verifier_gets_its_own_rendered_conversation(tok, engine):
    ids, result = chat_episode(tok, engine)
    firsts = [t for t in result.trajectories["solver"] if t.info["attempt"] == 1]
    assert len(firsts) == 4 and all(list(t.prompt_ids) == list(ids) for t in firsts)
    for answer, check in zip(firsts, result.trajectories["verifier"]):
        messages = verifier_messages(PROBLEM, answer.text)
        assert list(check.prompt_ids) == _template(tok, messages)
        text = tok.decode(check.prompt_ids)
        assert text.startswith("<|im_start|>system\n")  # the template's default system message
        assert f"Problem: {PROBLEM}\nProposed answer: {answer.text.strip()}\n" in text
        assert text.endswith("Answer Yes or No.<|im_end|>\n<|im_start|>assistant\n")
        assert set(check.loss_mask) == {1} and set(check.token_roles) == {"verifier"}


def test_a_retry_continues_the_solvers_conversation_token_exact_and_trains_only_its_own_tokens(tok, engine):
    eot = tok.eos_token_id
    says_no = SaysNo(tok)
    ids, result = chat_episode(tok, engine, verifier=says_no)
    solver = result.trajectories["solver"]
    firsts = [t for t in solver if t.info["attempt"] == 1]
    retries = [t for t in solver if t.info["attempt"] == 2]
    assert len(retries) == len(firsts) == 4  # every first answer rejected: every sample retried
    assert result.metrics["retries"] == 1.0 and all(v.info["verdict"] == "reject" for v in result.trajectories["verifier"])
    for first, retry in zip(firsts, retries):
        reply = list(first.tokens) if first.tokens[-1] == eot else [*first.tokens, eot]  # cut turns are closed
        feedback = continuation_ids(tok, [*prompt_messages(PROBLEM), {"role": "assistant", "content": first.text}],
                                    [feedback_message(PROBLEM, says_no.text)])
        assert tok.decode(feedback) == ("\n<|im_start|>user\nA checker reviewed your answer and rejected it (it said: "
                                        f"\"{says_no.text}\"). Try again. {PROBLEM}<|im_end|>\n<|im_start|>assistant\n")
        # the trajectory: the task's ids, then the first reply exactly as generated, the feedback, the retry
        assert list(retry.prompt_ids) == list(ids)
        context = len(reply) + len(feedback)
        assert list(retry.tokens[:context]) == reply + feedback
        assert retry.loss_mask == (0,) * context + (1,) * (len(retry.tokens) - context)
        assert retry.token_roles == ("solver",) * len(reply) + (ENV,) * len(feedback) + \
            ("solver",) * (len(retry.tokens) - context)
        assert set(retry.logprobs[:context]) == {0.0} and len(retry.tokens) > context


def test_the_continuation_after_kept_tokens_is_what_a_fresh_render_of_the_conversation_gives(tok):
    """When the generated reply is the canonical tokenization of its text, the kept tokens + the
    continuation equal ``apply_chat_template`` of the whole conversation, with the template's
    default system message once."""
    convo = prompt_messages(PROBLEM)
    reply = {"role": "assistant", "content": "23 + 45 = 68"}
    new = [feedback_message(PROBLEM, "No, it is 67.")]
    kept = _template(tok, convo) + tok.encode(reply["content"], add_special_tokens=False) + [tok.eos_token_id]
    assert kept + continuation_ids(tok, [*convo, reply], new) == _template(tok, [*convo, reply, *new])
    assert tok.decode(kept + continuation_ids(tok, [*convo, reply], new)).count("<|im_start|>system") == 1
    # with a system message of the task's own, the same continuation (it does not depend on earlier turns)
    with_system = [{"role": "system", "content": "You add numbers."}, *convo]
    assert continuation_ids(tok, [*with_system, reply], new) == continuation_ids(tok, [*convo, reply], new)


def test_a_template_that_rerenders_history_cannot_be_continued(tok):
    class Dropping:  # renders only the last message: earlier turns change once more follow
        eos_token_id, chat_template = tok.eos_token_id, "x"

        @staticmethod
        def apply_chat_template(messages, **kw):
            return tok.apply_chat_template(messages[-1:], **kw)
    with pytest.raises(ChatTemplateError, match="cannot be appended"):
        continuation_ids(Dropping, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                         [{"role": "user", "content": "c"}])


def test_a_fresh_chat_retry_is_asked_the_tasks_own_ids(tok, engine):
    ids, result = chat_episode(tok, engine, verifier=SaysNo(tok), params={"retry": "fresh"})
    retries = [t for t in result.trajectories["solver"] if t.info["attempt"] == 2]
    assert len(retries) == 4
    assert all(list(t.prompt_ids) == list(ids) and set(t.loss_mask) == {1} for t in retries)


@pytest.mark.parametrize("reply, verdict", [
    ("Yes", True), ("Yes.", True), ("yes, 23 + 45 = 68.", True), ("APPROVE", True), ("Approved.", True),
    ("No", False), ("No, the proposed answer is incorrect. The correct answer is 68. Yes.", False),
    ("REJECT", False), ("I reject it.", False), ("The answer is rejected", False),
    ("Yes or No: no", False),  # the options repeated back are not a verdict
    ("APPROVE or REJECT? APPROVE", True), ("Yes/No", None),
    ("The proposed answer is not correct.", None), ("", None), ("Nobody knows; yesterday", None)])
def test_verdicts_are_read_from_chat_style_replies(reply, verdict):
    assert chat_verdict_of(reply) is verdict


def test_the_example_config_loads_with_both_policies_on_smollm2():
    cfg = load_config(EXAMPLE)
    assert cfg.policy_names == ("solver", "verifier") and cfg.lead_policy == "solver"
    for p in cfg.policy_names:
        view = cfg.view(p)
        assert view.model.name == "smollm2-135m-instruct"
        assert view.trainer.engine.token_budget == 2048
    assert cfg.view("solver").rollout.max_new_tokens == 24 and cfg.view("verifier").rollout.max_new_tokens == 16
    assert cfg.data.source == "arithmetic_chat" and cfg.workflow.params["reward"] == "last_number"
