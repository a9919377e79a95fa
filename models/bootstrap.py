"""Tiny-model bootstrap: build, warm-start and cache a CPU policy for one role.

Owns ``astraflow model init`` (``main``), ``ensure_tiny_model`` and ``resolve_model_path``
(a job's model: its configured directory, or this cached tiny model). A tiny Qwen3 causal LM
(~2.4 M parameters) with a locally built character tokenizer is trained by a short,
deterministic supervised run on a warm-start task (``warm_start.py``: ``arithmetic``, the
demo's solver, by default; ``verifier``, the code roles, ...) and **stopped early**, as
soon as a validation set drawn from the training split reaches ``target_accuracy`` (each
task has its own default): RL then starts from a policy that solves some but not most of
its role's work. For a task that names its examples' problems (``WarmStartTask.problem``)
the validation problems are kept out of the training pool, so the early stop measures what
the job will see (problems the model never trained on); a build that misses its target
says so (``target_warning``: in its log, ``bootstrap.json`` and ``astraflow model init``). The result is a plain Hugging Face directory (safetensors + config +
tokenizer) plus ``bootstrap.json`` (task, spec, seed, measured held-out accuracy, build
time). Nothing is downloaded.

Cache: ``$ASTRAFLOW_CACHE/models`` (default ``~/.cache/astraflow/models``), one directory
per ``<name>[-<task>][-p<positions>]-s<seed>-<hash of spec, seed and task>``; the default task keeps the
key it had before tasks existed. Builds are atomic and serialised by a file lock.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from . import char_tokenizer
from .warm_start import DEFAULT_TASK, WarmStartTask, get_task, task_names

if TYPE_CHECKING:  # the cache lookup (every launcher and node) needs no torch; building does
    import torch

__all__ = ["TinyModelSpec", "default_spec", "check_positions", "DEFAULT_POSITIONS", "ensure_tiny_model", "resolve_model_path", "build_tiny_model", "cache_root",
           "add_legacy_config_keys", "target_of", "target_warning", "model_warning", "main"]

FORMAT_VERSION = 2  # bump when the build procedure changes, so old caches are not reused
MARKER = "bootstrap.json"
DEFAULT_POSITIONS = 128  #: the tiny model's window unless a job or ``--max-positions`` asks for another
MIN_POSITIONS, MAX_POSITIONS = 16, 32_768  #: the windows a build accepts (RoPE: no weights depend on it)


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture, task knobs and warm-start schedule of the tiny model (all hashed into
    the cache key, with the seed and the warm-start task)."""

    name: str = "tiny-qwen3"
    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = DEFAULT_POSITIONS
    # Arithmetic knobs (workflows/arithmetic.py), used by the tasks built on arithmetic.
    max_digits: int = 2
    ops: str = "+"
    # Warm start.
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 20
    max_steps: int = 2000
    eval_every: int = 25
    eval_problems: int = 200
    target_accuracy: float = 0.25
    heldout_problems: int = 400
    threads: int = 2  # fixed so a seed reproduces the same weights on this box

    def key(self, seed: int, task: str = DEFAULT_TASK) -> str:
        payload = {"spec": dataclasses.asdict(self), "seed": seed, "v": FORMAT_VERSION}
        name = self.name
        if task != DEFAULT_TASK:  # the default task keeps the key it had before tasks existed
            payload["task"], payload["task_revision"] = task, get_task(task).revision
            name = f"{self.name}-{task}"
        elif get_task(task).revision != 1:  # ... until its examples or their validation change
            payload["task_revision"] = get_task(task).revision
        if self.max_positions != DEFAULT_POSITIONS:  # a longer window says so in its name (the hash has it anyway)
            name = f"{name}-p{self.max_positions}"
        blob = json.dumps(payload, sort_keys=True)
        return f"{name}-s{seed}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def default_spec(task: str = DEFAULT_TASK, max_positions: int | None = None) -> TinyModelSpec:
    """The default spec with the task's own early-stop accuracy and spec fields;
    ``max_positions`` (None: the default, 128) sets the model's window. The window is part of
    the cache key, so a longer-context build is cached apart and the default keys stay."""
    warm = get_task(task)
    spec = dataclasses.replace(TinyModelSpec(), target_accuracy=warm.target_accuracy, **dict(warm.spec))
    if max_positions is not None:
        check_positions(max_positions)
        spec = dataclasses.replace(spec, max_positions=int(max_positions))
    return spec


def check_positions(max_positions: object) -> None:
    """``ValueError`` unless ``max_positions`` is an int in [MIN_POSITIONS, MAX_POSITIONS]."""
    if (not isinstance(max_positions, int) or isinstance(max_positions, bool)
            or not MIN_POSITIONS <= max_positions <= MAX_POSITIONS):
        raise ValueError(f"max_positions must be an int in [{MIN_POSITIONS}, {MAX_POSITIONS}], got {max_positions!r}")


def cache_root() -> Path:
    env = os.environ.get("ASTRAFLOW_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "astraflow"
    return base / "models"


def resolve_model_path(model_path: str, seed: int = 0, task: str = DEFAULT_TASK,
                       max_positions: int | None = None) -> Path:
    """``model_path`` if set (checked: :func:`astraflow.engines.factory.model_dir`), else the
    cached tiny model warm-started on ``task`` with a window of ``max_positions`` (None: the
    default) (built on first use)."""
    if model_path:
        from astraflow.engines.factory import model_dir
        return model_dir(model_path)
    return ensure_tiny_model(seed=seed, task=task, spec=default_spec(task, max_positions))


class ModelShape(NamedTuple):
    """What a sequence must fit of a model, read cheaply (its ``config.json``, never its weights)."""

    vocab_size: int  #: token ids are in ``[0, vocab_size)``
    max_positions: int | None  #: the longest sequence (context + completion); None: not declared


def shape_of_config(cfg: dict, where: str) -> ModelShape:
    """The :class:`ModelShape` in a Hugging Face ``config.json`` (``text_config`` for a
    multimodal one); ``ValueError`` naming ``where`` when it names no vocabulary size."""
    text = cfg.get("text_config") or {}
    vocab = cfg.get("vocab_size") or text.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
        raise ValueError(f"{where} names no vocab_size (a positive int): token ids cannot be bounded")
    positions = cfg.get("max_position_embeddings") or text.get("max_position_embeddings")
    return ModelShape(vocab, positions if isinstance(positions, int) and positions > 0 else None)


def model_shape(model_path: str | None, seed: int = 0, task: str = DEFAULT_TASK,
                max_positions: int | None = None) -> ModelShape:
    """The shape of the model a job configures: ``model_path``'s ``config.json``, or the cached
    tiny model's (of window ``max_positions``, None: the default); a tiny model not built yet is
    described by its spec (what its build writes), so a reader of the shape never builds or
    loads a model."""
    if model_path:
        from astraflow.engines.factory import model_dir
        path = model_dir(model_path) / "config.json"
        return shape_of_config(json.loads(path.read_text()), str(path))
    spec = default_spec(task, max_positions)
    built = cache_root() / spec.key(seed, task) / "config.json"
    if (built.parent / MARKER).exists():
        return shape_of_config(json.loads(built.read_text()), str(built))
    return ModelShape(int(math.ceil(len(char_tokenizer.vocab()) / 8) * 8), spec.max_positions)


def ensure_tiny_model(cache_dir: str | Path | None = None, seed: int = 0, spec: TinyModelSpec | None = None,
                      task: str = DEFAULT_TASK) -> Path:
    """Path of the cached tiny model warm-started on ``task`` for ``seed``, building it
    first if absent. ``spec`` defaults to :func:`default_spec` of the task."""
    get_task(task)  # an unknown task fails here, before the cache is touched
    spec = spec or default_spec(task)
    key = spec.key(seed, task)
    root = Path(cache_dir) if cache_dir else cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    if (final / MARKER).exists():
        return final
    with _file_lock(root / f".{key}.lock"):
        if (final / MARKER).exists():  # another process built it while we waited
            return final
        tmp = root / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        build_tiny_model(tmp, seed=seed, spec=spec, task=task)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    return final


@contextmanager
def _file_lock(path: Path):
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _model_config(spec: TinyModelSpec):
    from transformers import Qwen3Config

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


def build_tiny_model(out_dir: str | Path, seed: int = 0, spec: TinyModelSpec | None = None, log=print,
                     task: str = DEFAULT_TASK, pool_size: int = 20_000) -> dict:
    """Build, warm-start on ``task`` and save the model into ``out_dir``; return the report
    that is also written to ``out_dir/bootstrap.json``. ``pool_size``: training examples
    drawn (the cache only holds default builds; a test's few-step build needs few)."""
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from astraflow.engines.cpu import CpuEngine

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
        val = _distinct(warm, spec.eval_problems, seed + 1, "train", knobs)
        pool, kept_out = _without_validation_problems(warm, pool, val)
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
                val_acc = _measure(warm, engine, tokenizer, val, k=1, temperature=0.0)
                curve.append((step, round(loss.item(), 4), val_acc))
                log(f"bootstrap step {step:5d} loss {loss.item():.4f} val exact-match {val_acc:.3f}")
                if val_acc >= spec.target_accuracy:
                    break

        model.eval()
        heldout = _distinct(warm, spec.heldout_problems, seed, "heldout", knobs)
        greedy = _measure(warm, engine, tokenizer, heldout, k=1, temperature=0.0)
        sampled = _measure(warm, engine, tokenizer, heldout, k=4, temperature=0.6, seed=seed)
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


def target_of(report: dict) -> dict:
    """Whether a build met its warm-start target: the validation accuracy reached it (the
    early stop fired before ``max_steps``) *and* the held-out greedy accuracy is at least it.

    Returns ``{"accuracy", "reached_on_validation", "heldout_greedy", "met", "missed_by"}``
    (``missed_by``: how far the held-out greedy accuracy is below the target, 0 when not).
    Works on reports written before the field existed (it reads ``val_accuracy`` and the spec).
    """
    want = float(report["spec"]["target_accuracy"])
    val, greedy = float(report["val_accuracy"]), float(report["heldout_accuracy_greedy"])
    reached = val >= want
    return {"accuracy": want, "reached_on_validation": reached, "heldout_greedy": greedy,
            "met": reached and greedy >= want, "missed_by": round(max(0.0, want - greedy), 4)}


def target_warning(report: dict) -> str | None:
    """One ``WARNING:`` line when the build missed its warm-start target, else None."""
    t = report.get("target") or target_of(report)
    if t["met"]:
        return None
    why = []
    if not t["reached_on_validation"]:
        why.append(f"validation accuracy {report['val_accuracy']:.3f} never reached it in "
                   f"{report['sft_steps']} steps (max_steps {report['spec']['max_steps']})")
    if t["heldout_greedy"] < t["accuracy"]:
        why.append(f"held-out greedy accuracy is {t['heldout_greedy']:.3f}")
    return (f"WARNING: warm start of task {report.get('task', DEFAULT_TASK)!r} missed its target accuracy "
            f"{t['accuracy']:.2f}: {'; '.join(why)}. RL starts from a weaker policy than intended "
            f"(raise --max-steps or lower --target-accuracy)")


def model_warning(model_dir: str | Path) -> str | None:
    """:func:`target_warning` of the warm start in ``model_dir`` (its ``bootstrap.json``);
    None for a model that met its target or was not built by this bootstrap (a configured
    Hugging Face directory, or a trained export, has no marker)."""
    marker = Path(model_dir) / MARKER
    if not marker.exists():
        return None
    try:
        return target_warning(json.loads(marker.read_text()))
    except (ValueError, KeyError, TypeError):  # a marker of another shape judges nothing
        return None


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


def _without_validation_problems(warm: WarmStartTask, pool: list[tuple[str, str]],
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


def _distinct(warm: WarmStartTask, n: int, seed: int, split: str, knobs: dict) -> list[tuple[str, str]]:
    """``n`` examples with distinct prompts, for measuring: the first distinct ones of an
    ever longer draw (a task's draw of ``n`` is the start of a larger draw)."""
    draw = n
    while True:
        out: dict[str, str] = {}
        for prompt, target in warm.examples(draw, seed, split, **knobs):
            out.setdefault(prompt, target)
            if len(out) == n:
                return list(out.items())
        if draw >= 64 * n:
            raise ValueError(f"warm-start task {warm.name!r}: fewer than {n} distinct {split} prompts in "
                             f"{draw} examples; measure on fewer (eval_problems / heldout_problems)")
        draw *= 2


def _measure(warm: WarmStartTask, engine, tokenizer, examples: list[tuple[str, str]], k: int = 1,
             temperature: float = 0.6, seed: int = 0, batch_size: int = 256) -> float:
    """Mean of the task's score over ``k`` completions per example (``temperature=0``:
    greedy)."""
    from astraflow.engines.base import SamplingParams

    prompts = [tokenizer.encode(p, add_special_tokens=False) for p, _ in examples]
    budget = warm.max_new_tokens or 1 + max(len(tokenizer.encode(t, add_special_tokens=False)) for _, t in examples)
    rows = [(i, ids) for i, ids in enumerate(prompts) for _ in range(k)]
    total = 0.0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        params = SamplingParams(temperature=temperature, max_new_tokens=budget,
                                stop_token_ids=(tokenizer.eos_token_id,), seed=seed + start)
        for (i, _), gen in zip(chunk, engine.generate([ids for _, ids in chunk], params)):
            total += warm.score(tokenizer.decode(gen.tokens, skip_special_tokens=True), examples[i][1])
    return total / len(rows)


def _encode_pool(pool: list[tuple[str, str]], tokenizer, max_positions: int, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt + target + <eos>`` rows; labels are -100 on the prompt."""
    import torch
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
    import torch
    # Trim all-padding columns of this batch; right padding needs no attention mask
    # because causal attention never looks right.
    width = int((inputs != pad_id).sum(-1).max())
    logits = model(input_ids=inputs[:, :width]).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:width].reshape(-1))


def main(argv: list[str] | None = None) -> int:
    """``astraflow model init|info``."""
    parser = argparse.ArgumentParser(prog="astraflow model", description="Tiny-model bootstrap.")
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="build (or reuse from cache) the warm-started tiny model of a task")
    init.add_argument("--task", default=DEFAULT_TASK, help=f"warm-start task (default {DEFAULT_TASK}; see --list)")
    init.add_argument("--list", action="store_true", help="print the warm-start tasks and exit")
    init.add_argument("--out", type=Path, help="also copy the model to this directory")
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--cache-dir", type=Path, help="models cache (default $ASTRAFLOW_CACHE/models)")
    init.add_argument("--target-accuracy", type=float, help="early-stop accuracy (default: the task's own)")
    init.add_argument("--max-steps", type=int, default=None, help="SFT step cap (default: the task's spec's)")
    init.add_argument("--max-positions", type=int, default=None,
                      help=f"the model's window in tokens (default {DEFAULT_POSITIONS}); another window is another "
                           f"cache entry (a job selects it with model.max_positions)")
    init.add_argument("--force", action="store_true", help="rebuild even if cached")
    info = sub.add_parser("info", help="print a model directory's bootstrap report")
    info.add_argument("path", type=Path)
    args = parser.parse_args(argv)

    if args.command == "info":
        marker = args.path / MARKER
        if not marker.exists():
            print(f"{marker} not found: not a bootstrapped model directory", file=sys.stderr)
            return 2
        print(marker.read_text())
        return 0

    if args.list:
        for name in task_names():
            t = get_task(name)
            print(f"{name:16s} target accuracy {t.target_accuracy:.2f}  {t.doc}")
        return 0
    if args.task not in task_names():
        print(f"--task: unknown warm-start task {args.task!r}; tasks: {', '.join(task_names())}", file=sys.stderr)
        return 2
    try:
        spec = default_spec(args.task, args.max_positions)
        if args.max_steps is not None:  # (the default keeps the task's own cap, so init builds what a job resolves)
            spec = dataclasses.replace(spec, max_steps=args.max_steps)
    except ValueError as e:
        print(f"--max-positions: {e}", file=sys.stderr)
        return 2
    if args.target_accuracy is not None:
        spec = dataclasses.replace(spec, target_accuracy=args.target_accuracy)
    root = args.cache_dir or cache_root()
    if args.force:
        shutil.rmtree(Path(root) / spec.key(args.seed, args.task), ignore_errors=True)
    path = ensure_tiny_model(root, seed=args.seed, spec=spec, task=args.task)
    if args.out:
        if args.out.exists() and any(args.out.iterdir()):
            print(f"--out {args.out} exists and is not empty; choose an empty directory", file=sys.stderr)
            return 2
        shutil.copytree(path, args.out, dirs_exist_ok=True)
        path = args.out
    report = json.loads((path / MARKER).read_text())
    print(f"model: {path}  task: {report.get('task', DEFAULT_TASK)}  "
          f"positions: {report['spec'].get('max_positions', DEFAULT_POSITIONS)}")
    print(f"parameters: {report['parameters']}  sft steps: {report['sft_steps']}  "
          f"held-out exact match: greedy {report['heldout_accuracy_greedy']:.3f}, "
          f"t=0.6 {report['heldout_accuracy_t0.6_k4']:.3f}")
    target = report.get("target") or target_of(report)
    if warning := target_warning(report):
        print(warning)
    else:
        print(f"target accuracy {target['accuracy']:.2f}: met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
