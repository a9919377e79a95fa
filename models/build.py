"""Building one tiny model: a Qwen3 causal LM warm-started on a task, saved as a Hugging Face directory.

:func:`build_tiny_model` makes a tiny Qwen3 causal LM (~2.4 M parameters) with the local
character tokenizer, trains it by a short, deterministic supervised run on a warm-start
task (``warm_start.py``: ``arithmetic``, the demo's solver, by default; ``verifier``, the
code roles, ...) and **stops early**, as soon as a validation set drawn from the training
split reaches the spec's ``target_accuracy``: RL then starts from a policy that solves some
but not most of its role's work. For a task that names its examples' problems
(``WarmStartTask.problem``) the validation problems are kept out of the training pool, so
the early stop measures what the job will see (problems the model never trained on); a
build that misses its target says so (:mod:`.target`). The result is a plain Hugging Face
directory (safetensors + config + tokenizer) plus ``bootstrap.json`` (task, spec, seed,
measured held-out accuracy, build time). Nothing is downloaded.

It builds into the directory it is given: where builds are cached, and when one is
needed, is :mod:`.bootstrap`'s business.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from astraflow.engines.cpu import CpuEngine

from . import char_tokenizer
from .measure import distinct_examples, mean_score
from .spec import FORMAT_VERSION, MARKER, TinyModelSpec, default_spec
from .target import target_of, target_warning
from .warm_start import DEFAULT_TASK, WarmStartTask, get_task

__all__ = ["add_legacy_config_keys", "build_tiny_model"]


def build_tiny_model(out_dir: str | Path, seed: int = 0, spec: TinyModelSpec | None = None, log=print,
                     task: str = DEFAULT_TASK, pool_size: int = 20_000) -> dict:
    """Build, warm-start on ``task`` and save the model into ``out_dir``; return the report
    that is also written to ``out_dir/bootstrap.json``. ``pool_size``: training examples
    drawn (the cache only holds default builds; a test's few-step build needs few)."""
    warm = get_task(task)
    spec = spec or default_spec(task)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        char_tokenizer.save_tokenizer(out, model_max_length=spec.max_positions)
        tokenizer = AutoTokenizer.from_pretrained(str(out))
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(_model_config(spec))
        n_params = sum(p.numel() for p in model.parameters())

        knobs = {"max_digits": spec.max_digits, "ops": spec.ops}
        pool = warm.training_pool(pool_size, seed, **knobs)
        val = distinct_examples(warm, spec.eval_problems, seed + 1, "train", knobs)
        pool, kept_out = without_validation_problems(warm, pool, val)
        inputs, labels = _encode_pool(pool, tokenizer, spec.max_positions, task)

        opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.98), weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / spec.warmup_steps))
        gen = torch.Generator().manual_seed(seed)
        engine = CpuEngine(model)
        val_acc, step, curve = 0.0, 0, []
        while step < spec.max_steps:
            model.train()
            idx = torch.randint(len(pool), (spec.batch_size,), generator=gen)
            loss = _sft_loss(model, inputs[idx], labels[idx], tokenizer.pad_token_id)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            if step % spec.eval_every == 0:
                model.eval()
                val_acc = mean_score(warm, engine, tokenizer, val, k=1, temperature=0.0)
                curve.append((step, round(loss.item(), 4), val_acc))
                log(f"bootstrap step {step:5d} loss {loss.item():.4f} val exact-match {val_acc:.3f}")
                if val_acc >= spec.target_accuracy:
                    break

        model.eval()
        heldout = distinct_examples(warm, spec.heldout_problems, seed, "heldout", knobs)
        greedy = mean_score(warm, engine, tokenizer, heldout, k=1, temperature=0.0)
        sampled = mean_score(warm, engine, tokenizer, heldout, k=4, temperature=0.6, seed=seed)
        model.save_pretrained(str(out), safe_serialization=True)
        add_legacy_config_keys(out)
        report = {
            "name": spec.name,
            "task": task,
            "key": spec.key(seed, task),
            "seed": seed,
            "spec": dataclasses.asdict(spec),
            "parameters": n_params,
            "sft_steps": step,
            "val_accuracy": val_acc,
            # True: validated on problems kept out of training (an honest early stop); False:
            # on training problems (tasks without ``problem``: their validation is optimistic)
            "val_problems_kept_out": warm.problem is not None,
            "train_examples_kept_out": kept_out,
            "heldout_accuracy_greedy": greedy,
            "heldout_accuracy_t0.6_k4": sampled,
            "curve": curve,
            "build_seconds": round(time.perf_counter() - started, 1),
            "format_version": FORMAT_VERSION,
        }
        report["target"] = target_of(report)
        (out / MARKER).write_text(json.dumps(report, indent=2))
        log(f"bootstrap done ({task}): {n_params} params, {step} steps, held-out greedy {greedy:.3f}, "
            f"t=0.6 {sampled:.3f}, {report['build_seconds']} s -> {out}")
        if warning := target_warning(report):
            log(warning)
        return report
    finally:
        torch.set_num_threads(prev_threads)


def add_legacy_config_keys(model_dir: str | Path) -> None:
    """Also write ``rope_theta`` / ``torch_dtype`` at the top level of ``config.json``.

    transformers 5 saves them as ``rope_parameters`` / ``dtype``; servers pinned to
    transformers 4.x (SGLang) would silently fall back to defaults without the old keys.
    """
    path = Path(model_dir) / "config.json"
    cfg = json.loads(path.read_text())
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" in rope:
        cfg.setdefault("rope_theta", rope["rope_theta"])
    if "dtype" in cfg:
        cfg.setdefault("torch_dtype", cfg["dtype"])
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def without_validation_problems(warm: WarmStartTask, pool: list[tuple[str, str]],
                                val: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], int]:
    """``pool`` without the examples about a validation problem (``warm.problem``; none are
    dropped for a task without it), and how many were dropped."""
    if warm.problem is None:
        return pool, 0
    held = {warm.problem(p) for p, _ in val}
    kept = [e for e in pool if warm.problem(e[0]) not in held]
    if not kept:
        raise ValueError(f"warm-start task {warm.name!r}: every training example is about a validation problem")
    return kept, len(pool) - len(kept)


def _model_config(spec: TinyModelSpec) -> Qwen3Config:
    vocab = char_tokenizer.vocab()
    return Qwen3Config(
        # Rounded up to a multiple of 8 for friendlier GPU kernels; extra rows are unused.
        vocab_size=int(math.ceil(len(vocab) / 8) * 8),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        pad_token_id=vocab[char_tokenizer.PAD],
        eos_token_id=vocab[char_tokenizer.EOS],
        bos_token_id=vocab[char_tokenizer.BOS],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def _encode_pool(pool: list[tuple[str, str]], tokenizer, max_positions: int,
                 task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt + target + <eos>`` rows; labels are -100 on the prompt."""
    # One batched call: encoding 20k strings one by one costs seconds.
    prompts = tokenizer([p for p, _ in pool], add_special_tokens=False)["input_ids"]
    answers = tokenizer([t for _, t in pool], add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    width = max(len(p) + len(a) + 1 for p, a in zip(prompts, answers))
    if width > max_positions:
        raise ValueError(f"warm-start task {task!r}: an example takes {width} tokens with <eos>, more than the "
                         f"model's max_positions {max_positions}; shorten the examples or raise max_positions")
    inputs = torch.full((len(pool), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(pool), width), -100, dtype=torch.long)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        row = p + a + [eos]
        inputs[i, : len(row)] = torch.tensor(row)
        labels[i, len(p) : len(row)] = torch.tensor(a + [eos])
    return inputs, labels


def _sft_loss(model, inputs: torch.Tensor, labels: torch.Tensor, pad_id: int) -> torch.Tensor:
    # Trim all-padding columns of this batch; right padding needs no attention mask
    # because causal attention never looks right.
    width = int((inputs != pad_id).sum(-1).max())
    logits = model(input_ids=inputs[:, :width]).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:width].reshape(-1))
