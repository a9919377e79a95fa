"""Chat prompts: rendered once with the model's real template, carried as token ids, read back exactly.

On ``smol_random`` (SmolLM2-135M-Instruct's real tokenizer, ChatML template and generation
config on a 2-layer random Llama): the ids a task carries are what ``apply_chat_template``
gives; dataset rows with ``messages`` (and ``system``) become those conversations; a task's
ids survive the topic codec; an episode samples from them (never from re-encoded text); a
model without a template leaves raw prompts alone.
"""

from __future__ import annotations

import orjson
import pytest
from transformers import AutoTokenizer

from astraflow.actors.tasks import make_task
from astraflow.config import load_config
from astraflow.engines.cpu import CpuEngine
from astraflow.topics import Task
from astraflow.topics.codec import InvalidRecord, decode, encode
from astraflow.workflows.api import EngineRole, Episode, get_workflow, run_episode
from astraflow.workflows.arithmetic import chat_question, generate_problems
from astraflow.workflows.chat import ChatTemplateError, PromptRenderer, has_chat_template, render
from astraflow.workflows.datasets import DatasetError, load_prompts
from astraflow.workflows.math_answers import last_number

EXAMPLE = "examples/smollm2_chat_arithmetic.yaml"


@pytest.fixture(scope="module")
def tok(smol_random):
    return AutoTokenizer.from_pretrained(str(smol_random))


def _reference(tok, messages) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_the_rendered_ids_are_what_apply_chat_template_gives(tok, smol_random):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    ids = render(tok, messages)
    assert ids == _reference(tok, messages)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>") and text.endswith("<|im_start|>assistant\n")
    assert has_chat_template(smol_random) and tok.eos_token == "<|im_end|>"


def test_a_dataset_row_with_messages_becomes_the_right_prompt_tokens(tok, smol_random, tmp_path):
    rows = [{"id": "m", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                                     {"role": "user", "content": "What is 4+4?"}], "answer": "8", "system": "Terse."},
            {"prompt": "What is 1+1?", "answer": "2"},
            {"prompt": "What is 2+2?", "answer": "4", "system": "Answer in digits."}]
    (tmp_path / "d.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    prompts = load_prompts("d.jsonl", None, base_dir=tmp_path)
    assert prompts[0].text == "What is 4+4?" and prompts[0].messages[0] == {"role": "system", "content": "Terse."}
    cfg = load_config(EXAMPLE, {"model.name": None, "model.path": str(smol_random)})
    renderer = PromptRenderer(smol_random, "auto")
    tasks = [make_task(cfg, p, i, render=renderer) for i, p in enumerate(prompts)]
    assert tasks[0].prompt_ids == _reference(tok, rows[0]["messages"][:0] + [
        {"role": "system", "content": "Terse."}, *rows[0]["messages"]])
    assert tasks[1].prompt_ids == _reference(tok, [{"role": "user", "content": "What is 1+1?"}])
    assert tasks[2].prompt_ids == _reference(tok, [{"role": "system", "content": "Answer in digits."},
                                                   {"role": "user", "content": "What is 2+2?"}])
    # data.system applies to prompts that bring none, not to one that has its own
    sys_renderer = PromptRenderer(smol_random, "auto", system="You add numbers.")
    assert make_task(cfg, prompts[1], 1, render=sys_renderer).prompt_ids == _reference(
        tok, [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 1+1?"}])
    assert make_task(cfg, prompts[2], 2, render=sys_renderer).prompt_ids == tasks[2].prompt_ids


@pytest.mark.parametrize("row, message", [
    ({"messages": [], "answer": "1"}, r"d.jsonl:1: messages: a non-empty list"),
    ({"messages": [{"role": "wizard", "content": "x"}], "answer": "1"}, r"d.jsonl:1: messages\[0\]: needs a role"),
    ({"messages": [{"role": "user", "content": 3}], "answer": "1"}, r"messages\[0\]: content must be a string"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "answer": "1"},
     "not end with the assistant's"),
    ({"prompt": "q", "answer": "1", "system": 5}, "'system' must be a string"),
])
def test_bad_chat_rows_name_file_and_row(tmp_path, row, message):
    (tmp_path / "d.jsonl").write_bytes(orjson.dumps(row))
    with pytest.raises(DatasetError, match=message):
        load_prompts("d.jsonl", None, base_dir=tmp_path)


def test_a_task_carries_its_ids_through_the_codec_and_rejects_negative_ones(tok, smol_random):
    cfg = load_config(EXAMPLE, {"model.name": None, "model.path": str(smol_random)})
    prompt = load_prompts("arithmetic_chat", 1, seed=0)[0]
    task = make_task(cfg, prompt, 0, render=PromptRenderer(smol_random))
    value, headers = encode(task)
    back = decode(value, headers)
    assert isinstance(back, Task) and back.prompt_ids == task.prompt_ids and len(task.prompt_ids) > 20
    forged = orjson.loads(value)
    forged["prompt_ids"][3] = -1
    with pytest.raises(InvalidRecord, match="prompt_ids"):
        decode(orjson.dumps(forged), headers)


def test_an_episode_samples_from_the_rendered_ids_and_stops_at_the_end_of_turn(tok, smol_random):
    cfg = load_config(EXAMPLE, {"model.name": None, "model.path": str(smol_random), "rollout.max_new_tokens": 4})
    task = make_task(cfg, load_prompts("arithmetic_chat", 1, seed=0)[0], 0, render=PromptRenderer(smol_random))
    engine = CpuEngine(smol_random, threads=1)
    role = EngineRole("solver", "policy", engine, tok, task.sampling)
    assert role.params(None, None).stop_token_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)
    ep = Episode(task.task_id, task.prompt, task.answer, task.n_samples, {"solver": role}, tok,
                 {**task.params, "_job_seed": 0}, task.metadata, prompt_ids=tuple(task.prompt_ids))
    result = run_episode(get_workflow("rlvr"), ep, 0)
    trajs = result.trajectories["solver"]
    assert len(trajs) == task.n_samples
    assert all(list(t.prompt_ids) == task.prompt_ids for t in trajs)  # the chat rendering, not the raw text
    assert list(trajs[0].prompt_ids) != tok.encode(task.prompt, add_special_tokens=False)


def test_a_model_without_a_template_keeps_raw_prompts_and_refuses_chat_ones(tmp_path, smol_random):
    assert not PromptRenderer(None).active and PromptRenderer(None)("12+7=") is None
    with pytest.raises(ChatTemplateError, match="chat messages"):
        PromptRenderer(None)("q", [{"role": "user", "content": "q"}])
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        PromptRenderer(tmp_path, "on")
    assert not PromptRenderer(smol_random, "off").active
    with pytest.raises(ChatTemplateError, match="must be one of"):
        PromptRenderer(smol_random, "sometimes")


def test_chat_sums_keep_the_arithmetic_split_and_ask_a_question():
    raw = generate_problems(30, seed=1, split="heldout", max_digits=2, ops="+", unique=True)
    assert chat_question(raw[0]) == f"What is {raw[0].prompt[:-1]}? Answer with the number only."
    chat = load_prompts("arithmetic_chat", 30, seed=4, ops="+")
    plain = load_prompts("arithmetic", 30, seed=4, ops="+")
    assert [p.answer for p in chat] == [p.answer for p in plain]
    assert [p.text for p in chat] == [chat_question(type(raw[0])(p.text, p.answer)) for p in plain]


@pytest.mark.parametrize("reply, answer, score", [
    ("23 + 45 = 68", "68", 1.0), ("68", "68", 1.0), ("The answer is 68.", "68", 1.0), ("It is 1,234.", "1234", 1.0),
    ("x = -3", "-3", 1.0), ("3.50", "3.5", 1.0),
    ("23+45", "68", 0.0),  # a restated question is not its value (math-verify would evaluate it)
    ("68 apples, then 70", "68", 0.0), ("", "68", 0.0), ("no number", "68", 0.0)])
def test_last_number_reads_the_final_number_of_a_reply(reply, answer, score):
    assert last_number(reply, answer) == score


def test_chat_template_on_without_a_template_fails_before_the_job_starts(tmp_path, smol_random):
    from astraflow.checks import check_model
    from astraflow.errors import ModelError
    from astraflow.typed_config import ConfigError
    with pytest.raises(ConfigError, match=r"data.chat_template: is on, but model is the tiny bootstrapped model"):
        load_config("examples/arithmetic_grpo.yaml", {"data.chat_template": "on"})
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text((smol_random / "config.json").read_text())  # a model dir, no tokenizer files
    cfg = load_config(EXAMPLE, {"model.name": None, "model.path": str(plain), "data.chat_template": "on"})
    with pytest.raises(ModelError, match="data.chat_template is on, but the tokenizer in model.path .* has no chat"):
        check_model(cfg)
    assert "llama" in check_model(load_config(EXAMPLE, {"model.name": None, "model.path": str(smol_random),
                                                        "data.chat_template": "on"}))
