"""Chat models in multi-turn episodes (workflows/chat_turns.py): the OpenAI-compatible endpoint and
the agent workflow's ``action_format: chat`` on ``smol_random`` (SmolLM2's real tokenizer and
ChatML template on a random 2-layer Llama) and the real CPU engine, driven by the real
``openai`` client. Prompts are what ``apply_chat_template`` gives; the messages after a reply
are its ChatML rendering appended after the generated tokens (never re-tokenized); the
recorded logprobs are a fresh forward pass's; tool calls round-trip.

Where a test needs the model to say something definite (a tool call), its output head is
solved so that, given the exact tokens of the expected conversation, each expected reply
token gets a logit 30 above every other (:func:`taught`): the real engine then samples
exactly those tokens."""

from __future__ import annotations

import json
import os
import sys

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from astraflow.engines.cpu import CpuEngine
from astraflow.engines.sampling import sampling_logprobs
from astraflow.workflows.api import ENV, EngineRole, Episode, get_workflow, run_episode
from astraflow.workflows.chat_turns import ChatTurns, ChatTurnsError, parse_tool_calls, tools_system_text
from astraflow.workflows.text_game import TextGame, text_game_prompts

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 6}
HERE = sys.modules[__name__].__name__
EOS = 2  #: <|im_end|>, SmolLM2's end of turn
ADD = [{"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                         "parameters": {"type": "object", "properties": {
                                             "a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
QUESTION = "What is 2+3? Use the tool."
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
ANSWER = "2+3 is 5."
SEEN: dict[int, list] = {}  #: sample -> the conversation its agent sent (replies as returned)


def _ids(out) -> list[int]:
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=60)


def chatml(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


@pytest.fixture(scope="module")
def smol(smol_random):
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    engine = CpuEngine(smol_random)
    yield AutoTokenizer.from_pretrained(str(smol_random)), engine, smol_random
    engine.close()


def taught(model_dir, seq: list[int], mask: list[int], margin: float = 30.0) -> CpuEngine:
    """The model of ``model_dir`` with its output head solved so that at every position ``i``
    with ``mask[i + 1]`` the next token ``seq[i + 1]`` leads by ``margin`` logits (untied from
    the embeddings, which stay: the hidden states are the model's own)."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        hidden = model.model(input_ids=torch.tensor([seq])).last_hidden_state[0]
        at = [i - 1 for i, m in enumerate(mask) if m]
        onehot = torch.zeros(model.config.vocab_size, len(at))
        onehot[torch.tensor([seq[i + 1] for i in at]), torch.arange(len(at))] = 1.0
        model.lm_head.weight = torch.nn.Parameter(margin * onehot @ torch.linalg.pinv(hidden[at]).T)
    model.config.tie_word_embeddings = False
    model.requires_grad_(False)
    return CpuEngine(model)


def run(tok, engine, workflow: str, params: dict, n: int = 1, prompt: str = "", metadata=None, longest: int = 6):
    role = EngineRole("agent", "p", engine, tok, {**SAMPLING, "max_new_tokens": longest})
    ep = Episode("t0000001-p1", prompt, "", n, {"agent": role}, tok, params, metadata or {}, attempt="node/1")
    return run_episode(get_workflow(workflow), ep, 5)


def replay_logprobs(engine, t) -> torch.Tensor:
    """Each token's logprob under a fresh forward pass over the whole trajectory."""
    ids = torch.tensor([list(t.prompt_ids) + list(t.tokens)])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0]
    p = len(t.prompt_ids)
    logp = sampling_logprobs(logits[p - 1:p - 1 + len(t.tokens)], 1.0, 1.0, 0)
    return logp.gather(-1, torch.tensor(t.tokens).unsqueeze(-1)).squeeze(-1)


def spans(t) -> list[tuple[str, list[int]]]:
    """The trajectory's tokens as runs of one writer: ``[("agent", ids), ("env", ids), ...]``."""
    out: list[tuple[str, list[int]]] = []
    for tok_id, who in zip(t.tokens, t.token_roles):
        if out and out[-1][0] == who:
            out[-1][1].append(tok_id)
        else:
            out.append((who, [tok_id]))
    return out


# -- agents (run by the endpoint, one thread per sample) ------------------------------------

def three_turns(base_url, task):
    c = _client(base_url)
    msgs = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": task["prompt"]}]
    for follow in ("Are you sure?", "Say it once more.", None):
        r = c.chat.completions.create(model="m", messages=msgs, max_tokens=5)
        assert r.choices[0].finish_reason in ("stop", "length") and not r.choices[0].message.tool_calls
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
        if follow:
            msgs.append({"role": "user", "content": follow})
    SEEN[task["sample"]] = msgs
    return 0.0


def rewrites_history(base_url, task):
    c = _client(base_url)
    msgs = [{"role": "user", "content": task["prompt"]}]
    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=3)
    reply = {"role": "assistant", "content": r.choices[0].message.content}
    for bad, words in (([{"role": "user", "content": "hi"}, reply], "never re-tokenizes"),
                       ([msgs[0], {**reply, "content": reply["content"] + " "}], "never re-tokenizes"),
                       ([msgs[0], reply, {"role": "assistant", "content": "made up"}], "assistant"),
                       ([msgs[0], reply, {"role": "user", "content": "x"}], "tools must stay")):
        with pytest.raises(openai.BadRequestError, match=words):
            c.chat.completions.create(model="m", messages=bad, max_tokens=3,
                                      **({"tools": ADD} if words == "tools must stay" else {}))
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        c.chat.completions.create(model="m", messages=msgs + [reply, {"role": "user", "content": "x"}],
                                  tools=[], tool_choice="required")
    # the refusals left nothing: the conversation goes on from the reply
    c.chat.completions.create(model="m", messages=msgs + [reply, {"role": "user", "content": "x"}], max_tokens=3)
    return 0.5


def calls_a_tool(base_url, task):
    c = _client(base_url)
    msgs = [{"role": "user", "content": QUESTION}]
    r = c.chat.completions.create(model="m", messages=msgs, tools=ADD, max_tokens=40)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "add"
    args = json.loads(call.function.arguments)
    assert args == {"a": 2, "b": 3}
    msgs += [choice.message, {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}]
    r = c.chat.completions.create(model="m", messages=msgs, tools=ADD, max_tokens=40)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == ANSWER
    assert r.choices[0].message.tool_calls is None
    return 1.0


# -- the endpoint ---------------------------------------------------------------------------

def test_three_turns_through_the_openai_client_are_token_exact(smol):
    tok, engine, _ = smol
    res = run(tok, engine, "openai_agent", {"agent": f"{HERE}:three_turns"}, n=2, prompt="What is 12+7?")
    for t in res.trajectories["agent"]:
        msgs = SEEN[t.info["sample"]]
        assert t.info["turns"] == 3 and t.info["end_reason"] == "done"
        # the first prompt is apply_chat_template's
        assert list(t.prompt_ids) == _ids(tok.apply_chat_template(msgs[:2], tokenize=True, add_generation_prompt=True))
        # then: reply, the template's rendering of the next user message, reply, ..., reply
        parts = spans(t)
        assert [w for w, _ in parts] == ["agent", ENV, "agent", ENV, "agent"]
        users = [m["content"] for m in msgs if m["role"] == "user"][1:]
        for k, (who, ids) in enumerate(parts):
            if who == ENV:
                ended = parts[k - 1][1][-1] == EOS  # a reply's own end of turn is not written twice
                text = ("" if ended else "<|im_end|>") + "\n" + chatml("user", users[k // 2]) + \
                    "<|im_start|>assistant\n"
                assert ids == tok.encode(text, add_special_tokens=False)
        # ... which is a fresh render of the whole conversation, the replies as the model wrote them
        replies = [tok.decode(ids[:-1] if ids[-1] == EOS else ids, skip_special_tokens=False)
                   for w, ids in parts if w == "agent"]
        convo, k = [], 0
        for m in msgs:
            convo.append({**m, "content": replies[k]} if m["role"] == "assistant" else m)
            k += m["role"] == "assistant"
        fresh = tok.apply_chat_template(convo[:-1], tokenize=False, add_generation_prompt=True) + \
            tok.decode(parts[-1][1], skip_special_tokens=False)
        assert tok.decode(list(t.prompt_ids) + list(t.tokens), skip_special_tokens=False) == fresh
        # every generated token's behaviour logprob is a fresh forward pass's over the final sequence
        own = [i for i, m in enumerate(t.loss_mask) if m]
        assert all(t.token_roles[i] == "agent" for i in own)
        assert all(t.loss_mask[i] == 0 and t.logprobs[i] == 0.0 for i, w in enumerate(t.token_roles) if w == ENV)
        torch.testing.assert_close(replay_logprobs(engine, t)[own], torch.tensor([t.logprobs[i] for i in own]),
                                   atol=1e-4, rtol=1e-4)


def test_a_rewritten_history_or_changed_tools_are_refused(smol):
    tok, engine, _ = smol
    res = run(tok, engine, "openai_agent", {"agent": f"{HERE}:rewrites_history"}, prompt="What is 1+1?")
    (t,) = res.trajectories["agent"]
    assert t.reward == 0.5 and t.info["turns"] == 2
    parts = spans(t)
    assert [w for w, _ in parts] == ["agent", ENV, "agent"]  # one message appended, once
    closing = "" if parts[0][1][-1] == EOS else "<|im_end|>"
    assert tok.decode(parts[1][1], skip_special_tokens=False) == \
        closing + "\n" + chatml("user", "x") + "<|im_start|>assistant\n"


def test_tool_calls_round_trip_through_the_openai_client(smol):
    tok, _, model_dir = smol
    prompt = _ids(tok.apply_chat_template([{"role": "system", "content": tools_system_text(ADD)},
                                           {"role": "user", "content": QUESTION}],
                                          tokenize=True, add_generation_prompt=True))
    call = tok.encode(CALL, add_special_tokens=False) + [EOS]
    result = tok.encode("\n" + chatml("tool", "5") + "<|im_start|>assistant\n", add_special_tokens=False)
    answer = tok.encode(ANSWER, add_special_tokens=False) + [EOS]
    engine = taught(model_dir, prompt + call + result + answer,
                    [0] * len(prompt) + [1] * len(call) + [0] * len(result) + [1] * len(answer))
    try:
        res = run(tok, engine, "openai_agent", {"agent": f"{HERE}:calls_a_tool"}, prompt=QUESTION, longest=40)
    finally:
        engine.close()
    (t,) = res.trajectories["agent"]
    # SmolLM2's template ignores tools: they are described in the system message, and the
    # tool's result is the template's `tool` message after the call's own end of turn
    assert list(t.prompt_ids) == prompt and list(t.tokens) == call + result + answer
    assert t.loss_mask == (1,) * len(call) + (0,) * len(result) + (1,) * len(answer)
    assert t.reward == 1.0 and t.info["turns"] == 2


# -- the agent workflow's chat format --------------------------------------------------------

def test_the_agent_workflow_plays_a_game_in_chat_format_with_tool_calls(smol):
    tok, _, model_dir = smol
    game = next(p for p in text_game_prompts(40) if p.metadata["room"] == 0)  # the key lies in the hall
    colour = game.metadata["colour"]
    prompt = _ids(tok.apply_chat_template([{"role": "system", "content": tools_system_text(TextGame.tools)},
                                           {"role": "user", "content": game.text}],
                                          tokenize=True, add_generation_prompt=True))
    take = tok.encode('<tool_call>{"name": "take", "arguments": {}}</tool_call>', add_special_tokens=False) + [EOS]
    held = tok.encode("\n" + chatml("tool", f"you hold the {colour} key") + "<|im_start|>assistant\n",
                      add_special_tokens=False)
    open_ = tok.encode('<tool_call>{"name": "open", "arguments": {}}</tool_call>', add_special_tokens=False) + [EOS]
    engine = taught(model_dir, prompt + take + held + open_,
                    [0] * len(prompt) + [1] * len(take) + [0] * len(held) + [1] * len(open_))
    try:
        res = run(tok, engine, "agent", {"env": "text_game", "action_format": "chat", "max_turns": 4,
                                         "max_tokens_per_turn": 40}, n=2, prompt=game.text, metadata=game.metadata,
                  longest=40)
    finally:
        engine.close()
    for t in res.trajectories["agent"]:
        assert list(t.prompt_ids) == prompt and list(t.tokens) == take + held + open_
        assert t.info["end_reason"] == "done" and t.info["actions"] == 2 and t.info["malformed"] == 0
        assert t.reward == 1.0
    assert res.metrics["success"] == 1.0


def test_the_agent_workflow_in_chat_format_on_a_random_model_answers_malformed_turns_as_user_messages(smol):
    tok, engine, _ = smol
    game = text_game_prompts(1)[0]
    res = run(tok, engine, "agent", {"env": "text_game", "action_format": "chat", "max_turns": 3,
                                     "system": "Play the game."}, n=2, prompt=game.text, metadata=game.metadata)
    system = "Play the game.\n\n" + tools_system_text(TextGame.tools)
    for t in res.trajectories["agent"]:
        assert list(t.prompt_ids) == _ids(tok.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": game.text}], tokenize=True,
            add_generation_prompt=True))
        parts = spans(t)
        assert t.info["turns"] == 3 and [w for w, _ in parts] == ["agent", ENV, "agent", ENV, "agent"]
        for k in (1, 3):  # six tokens: no end of turn, no tool call: the turn is malformed
            assert parts[k - 1][1][-1] != EOS
            assert parts[k][1] == tok.encode("<|im_end|>\n" + chatml("user", "error: end the turn") +
                                             "<|im_start|>assistant\n", add_special_tokens=False)
        own = [i for i, m in enumerate(t.loss_mask) if m]
        torch.testing.assert_close(replay_logprobs(engine, t)[own], torch.tensor([t.logprobs[i] for i in own]),
                                   atol=1e-4, rtol=1e-4)


# -- the pieces ------------------------------------------------------------------------------

def test_a_reply_is_closed_by_the_template_without_doubling_the_generated_end_of_turn(smol):
    tok = smol[0]
    chat = ChatTurns(tok)
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "whatever was generated"}]
    new = [{"role": "tool", "content": "42", "tool_call_id": "call_1"}, {"role": "user", "content": "and?"}]
    tail = chatml("tool", "42") + chatml("user", "and?") + "<|im_start|>assistant\n"
    assert chat.after_reply(history, new, EOS) == tok.encode("\n" + tail, add_special_tokens=False)
    assert chat.after_reply(history, new, 300) == tok.encode("<|im_end|>\n" + tail, add_special_tokens=False)
    # a template that renders a past reply differently (reasoning dropped, trimmed) changes nothing:
    # replies are never re-rendered
    dropping = AutoTokenizer.from_pretrained(str(smol[2]))
    dropping.chat_template = tok.chat_template.replace("message['content']",
                                                       "message['content'].split('</think>')[-1]|trim")
    assert ChatTurns(dropping).after_reply(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>hm</think> 4 "}], new, EOS) == \
        tok.encode("\n" + tail, add_special_tokens=False)
    # one whose earlier text changes once messages follow cannot grow token-exact: refused, named
    counting = AutoTokenizer.from_pretrained(str(smol[2]))
    counting.chat_template = "{{ messages|length }}" + tok.chat_template
    with pytest.raises(ChatTurnsError, match="cannot grow token-exact"):
        ChatTurns(counting).after_reply(history, new, EOS)


def test_tool_calls_are_parsed_from_the_reply_and_the_rest_is_its_text():
    text = f'Let me add. {CALL} and <tool_call>{{"name": "mul", "arguments": {{}}}}</tool_call> <tool_call>oops' \
           f'</tool_call>'
    rest, calls = parse_tool_calls(text, ["add"])
    assert calls == [{"name": "add", "arguments": {"a": 2, "b": 3}}]
    assert rest == 'Let me add.  and <tool_call>{"name": "mul", "arguments": {}}</tool_call> <tool_call>oops' \
                   '</tool_call>'
    assert [c["name"] for c in parse_tool_calls(text)[1]] == ["add", "mul"]  # no declared names: any call
    assert parse_tool_calls('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>')[1] == \
        [{"name": "add", "arguments": {"a": 1}}]


def test_a_chat_turns_action_is_its_first_tool_call_else_its_ended_text():
    from astraflow.workflows.agent import chat_action
    assert chat_action(f"{CALL} {CALL}", False, ["add"]) == ({"name": "add", "arguments": {"a": 2, "b": 3}}, "")
    assert chat_action(" go 3 ", True) == ("go 3", "")
    assert chat_action("go 3", False) == (None, "end the turn")
    action, why = chat_action('<tool_call>{"name": "jump"}</tool_call>', True, ["go", "take"])
    assert action is None and "go, take" in why


def test_a_task_prompt_rendered_at_task_creation_is_what_a_workflow_samples_from(smol):
    tok, engine, _ = smol
    ids = _ids(tok.apply_chat_template([{"role": "user", "content": "What is 1+2?"}], tokenize=True,
                                       add_generation_prompt=True))
    role = EngineRole("solver", "p", engine, tok, SAMPLING)
    ep = Episode("t0000002-p1", "What is 1+2?", "3", 2, {"solver": role}, tok, {}, {}, prompt_ids=tuple(ids))
    res = run_episode(get_workflow("rlvr"), ep, 5)
    assert all(list(t.prompt_ids) == ids for t in res.trajectories["solver"])


@pytest.mark.parametrize("params,key,words", [
    ({"agent": "astraflow.examples.chat_agent:run", "chat_template": "yes"}, "chat_template", "auto, on or off"),
])
def test_bad_endpoint_params_name_the_key(params, key, words):
    from astraflow.workflows.openai_endpoint import OpenAIAgentParams
    from astraflow.workflows.registry import WorkflowParamError
    with pytest.raises(WorkflowParamError) as e:
        OpenAIAgentParams.of(params)
    assert e.value.key == key and words in str(e.value)


def test_bad_agent_tools_name_the_key():
    from astraflow.workflows.agent import AgentParams
    from astraflow.workflows.registry import WorkflowParamError
    with pytest.raises(WorkflowParamError) as e:
        AgentParams.of({"env": "text_game", "action_format": "chat", "tools": [{"name": "go"}]})
    assert e.value.key == "tools" and "tools[0]" in str(e.value)
