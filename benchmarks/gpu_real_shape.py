"""The real trainer step and the weight codec at a real model's shape (``gpu_check.sh``'s stage).

A random-initialised Llama of SmolLM2-135M's shape (:data:`SMOLLM2_135M`, its ``config.json``
written out here: nothing downloaded, no model files needed) is trained for a few steps on
a GRPO batch of the size ``examples/smollm2_chat_arithmetic.yaml`` trains on by the
project's DeepSpeed trainer, made the way a job makes it (``engines.factory.make_train_engine``):

* **trainer**: per batch shape, one warm-up step then ``--steps`` timed steps: step time,
  tokens/s (prompt + completion tokens through the model), samples/s, and the device's peak
  memory over the timed steps (``torch.cuda.max_memory_allocated``; peak RSS on the CPU);
* **codec**: the trained weights as published (``publish_dtype: bfloat16``), still on the
  device, through :mod:`astraflow.weights.codec`: snapshot and delta (one more step apart)
  bytes, encode and decode times, a delta applied in place into the device's tensors
  (bit-exact against the trainer's), and where the tensors are while that happens.

Every number is measured ``--repeats`` times (median, min, max). The section says which
device measured it; on a machine without CUDA ``--device cuda`` prints
``skipped: no CUDA`` and writes nothing. ``--device cpu --layers 2`` is the smoke test of
this script (real DeepSpeed, a 2-layer shape): its numbers are CPU numbers, written only
to an ``--out`` named explicitly, never into ``benchmarks/results/gpu_check.json``.

It owns the shape, the synthetic batch and the measurements; it does not know SGLang, Kafka
or the publisher (the codec is called directly, as the publisher calls it).

    python -m astraflow.benchmarks.gpu_real_shape                  # on a GPU: the section of gpu_check.json
    python -m astraflow.benchmarks.gpu_real_shape --device cpu --layers 2 --out /tmp/smoke.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

from astraflow.benchmarks.lib.results import load_now, write_section
from astraflow.benchmarks.lib.stats import fmt_spread, spread

# torch, transformers and DeepSpeed are imported inside the functions that use them: DeepSpeed picks
# its accelerator when imported (DS_ACCELERATOR must be set first on a CPU), and gpu_check.sh's summary
# step and --help import this module for its constants alone (seconds of imports saved).

GPU_CHECK = Path(__file__).resolve().parent / "results" / "gpu_check.json"
SECTION = "real_shape"
#: SmolLM2-135M(-Instruct)'s config.json (the fetched model's, read from its GGUF): the shape
#: this stage builds at random. ``rope_theta`` is the pre-5.x key; transformers 5 maps it.
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True,
    "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
    "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}
#: the trainer section of examples/smollm2_chat_arithmetic.yaml, at ZeRO-2 (a GPU job's stage,
#: docs/gpu-quickstart.md); device and bf16 are the trainer's: NCCL + bf16 on CUDA, gloo + fp32 on CPU
TRAINER = {"loss": "grpo", "lr": 5.0e-6, "zero_stage": 2, "token_budget": 8192, "seed": 1}
SGLANG_NOT_CARRIED = ("the SGLang engine: sglang and its CUDA kernels (sgl-kernel, flashinfer) are wheels of hundreds "
                      "of MB, which cannot be carried to a GPU machine without a package index; its stages run only "
                      "where sglang is installed (pip install -e '.[gpu]')")


def model_config(layers: int | None = None, vocab: int | None = None) -> dict:
    """SmolLM2-135M's config, with ``layers`` decoder layers and a ``vocab``-token vocabulary when
    given (the smoke test's shrink)."""
    return SMOLLM2_135M | ({"num_hidden_layers": layers} if layers else {}) | ({"vocab_size": vocab} if vocab else {})


def build_model(out: Path, shape: dict, seed: int) -> int:
    """A random-initialised model of ``shape`` (a config dict) as an HF directory (fp32 safetensors);
    its parameters."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**shape))
    model.save_pretrained(str(out), safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def grpo_batch(groups: int, samples: int, prompt_tokens: int, completion_tokens: int, vocab: int, seed: int):
    """A GRPO batch: ``groups`` prompts x ``samples`` completions of random tokens, lengths
    jittered like sampled replies (a quarter to all of ``completion_tokens``), rewards 0/1
    mixed in every group (non-zero advantages), behaviour log-probs as a sampler reports them."""
    from astraflow.engines.base import TrainBatch, TrainSample
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = tuple(rng.randrange(3, vocab) for _ in range(prompt_tokens))
        for s in range(samples):
            n = rng.randint(max(1, completion_tokens // 4), completion_tokens)
            out.append(TrainSample(prompt, tuple(rng.randrange(3, vocab) for _ in range(n)),
                                   tuple(-rng.uniform(0.5, 8.0) for _ in range(n)), reward=float(s % 2), group_id=g))
    return TrainBatch(tuple(out))


class _Clock:
    """Wall time of device work: synchronises CUDA on both ends (kernels run asynchronously)."""

    def __init__(self, device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn):
        import torch
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        value = fn()
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0, value


def measure_trainer(trainer, batches: list[dict], steps: int, device, vocab: int) -> list[dict]:
    """Per batch size (``grpo_batch``'s arguments): a warm-up step, then ``steps`` timed ones."""
    import torch
    clock, rows = _Clock(device), []
    for i, sizes in enumerate(batches):
        batch = grpo_batch(**sizes, vocab=vocab, seed=100 + i)
        tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in batch.samples)
        warmup_s, _ = clock(lambda: trainer.train_step(batch))  # allocator, kernels, DeepSpeed's first-step set-up
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times, losses = [], []
        for _ in range(steps):
            t, metrics = clock(lambda: trainer.train_step(batch))
            times.append(t)
            losses.append(metrics["loss"])
        row = {"batch": sizes | {"samples_total": len(batch.samples), "tokens": tokens,
                                 "trained_tokens": sum(s.trained_tokens for s in batch.samples)},
               "warmup_step_s": warmup_s, "step_s": spread(times),
               "tokens_per_s": spread([tokens / t for t in times]),
               "samples_per_s": spread([len(batch.samples) / t for t in times]), "loss": losses}
        if device.type == "cuda":
            row["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
            row["peak_gpu_reserved_mb"] = torch.cuda.max_memory_reserved(device) / 2**20
        else:
            row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rows.append(row)
    return rows


def published(trainer, dtype) -> dict:
    """The trainer's weights as rollout engines hold them, still where the trainer keeps them
    (a cast on the device; an alias of the module's own tensors where they already are ``dtype``)."""
    return {k: v.detach().to(dtype) for k, v in trainer.engine.module.state_dict().items()}


def measure_codec(trainer, batch, repeats: int, threads: int, device) -> dict:
    """Snapshot and delta of the published weights through the codec, from and into device tensors."""
    import torch
    from astraflow.weights import codec, native
    clock = _Clock(device)
    seen: dict[int, str] = {}
    # Names of one storage (tied embeddings): the trainer's named_weights, and so a publisher, sends each.
    tied = [k for k, v in trainer.engine.module.state_dict().items() if seen.setdefault(v.data_ptr(), k) != k]
    base = {k: v.clone() for k, v in published(trainer, torch.bfloat16).items()}
    trainer.train_step(batch)  # one version on: the delta a subscriber receives
    new = {k: v.clone() for k, v in published(trainer, torch.bfloat16).items()}
    to_host = [clock(lambda: {k: v.cpu() for k, v in new.items()})[0] for _ in range(repeats)]
    snap_enc = [clock(lambda: codec.encode_version(new, 1, threads=threads)) for _ in range(repeats)]
    snapshot = snap_enc[-1][1].to_bytes()
    delta_enc = [clock(lambda: codec.encode_version(new, 1, base=base, base_version=0, threads=threads))
                 for _ in range(repeats)]
    delta, stats = delta_enc[-1][1].to_bytes(), delta_enc[-1][1].stats
    snap_dec = [clock(lambda: codec.decode(snapshot, threads=threads)) for _ in range(repeats)]
    decoded = snap_dec[-1][1]
    to_device = [clock(lambda: {k: v.to(device) for k, v in decoded.items()})[0] for _ in range(repeats)]
    applies, exact, in_place = [], True, True
    for _ in range(repeats):
        held = {k: v.clone() for k, v in base.items()}  # a subscriber's copy on the device
        ptrs = {k: v.data_ptr() for k, v in held.items()}
        applies.append(clock(lambda: codec.apply_in_place(delta, held, threads=threads))[0])
        exact &= all(torch.equal(held[k], new[k]) for k in new)
        in_place &= all(v.device == new[k].device and v.data_ptr() == ptrs[k] for k, v in held.items())
    if not exact:
        raise AssertionError("a delta applied to the device's tensors differs from the trainer's weights")
    raw = sum(v.numel() * v.element_size() for v in new.values())
    first = next(iter(new.values()))
    on_device = first.device.type != "cpu"
    return {
        "dtype": "bfloat16", "tensors": len(new), "raw_bytes": raw, "threads": threads,
        "tied_duplicates": tied, "tied_duplicate_bytes": sum(new[k].numel() * new[k].element_size() for k in tied),
        "native_kernel": native.available(),
        "snapshot": {"bytes": len(snapshot), "over_raw": len(snapshot) / raw,
                     "encode_s": spread([t for t, _ in snap_enc]), "decode_s": spread([t for t, _ in snap_dec])},
        "delta": {"bytes": len(delta), "over_snapshot": len(delta) / len(snapshot),
                  "changed_fraction": stats.changed_fraction, "lr": TRAINER["lr"],
                  "encode_s": spread([t for t, _ in delta_enc]), "apply_in_place_s": spread(applies),
                  "bit_exact": exact},
        "device_to_host_s": spread(to_host), "host_to_device_s": spread(to_device),
        "copied_to_host": on_device,
        "where": {
            "input": f"{first.device.type} tensors",
            "encode": ("each tensor is copied to host memory (weights/format.tensor_bits) and encoded on the CPU; "
                       "device_to_host_s is that copy alone") if on_device else
                      "host tensors: the codec reads their bits where they are (no copy)",
            "decode": f"to new {decoded[next(iter(decoded))].device.type} tensors; host_to_device_s moves them",
            "apply_in_place": ("into the tensors' own storage" + (
                ": each decoded on the host, then copied back to the device" if on_device else ""))
                if in_place else "NOT in place: the tensors were replaced",
        },
        "apply_in_place_kept_storage": in_place,
    }


def run(args) -> dict:
    """The section: the model, the trainer's rows and the codec's numbers, labelled with the device."""
    import torch
    import deepspeed
    import transformers
    from astraflow.engines.factory import make_train_engine
    device = torch.device(args.device)
    batches = [{"groups": args.groups, "samples": args.samples, "prompt_tokens": args.prompt_tokens,
                "completion_tokens": c} for c in args.completion_tokens]
    shape = model_config(args.layers, args.vocab)
    with tempfile.TemporaryDirectory(prefix="af-real-shape-") as tmp:
        t0 = time.perf_counter()
        params = build_model(Path(tmp), shape, seed=0)
        build_s = time.perf_counter() - t0
        cfg = TRAINER | {"model_path": tmp, "device": args.device, "threads": args.threads}
        trainer = make_train_engine(cfg)
        try:
            resident = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else None
            rows = measure_trainer(trainer, batches, args.steps, device, shape["vocab_size"])
            codec_batch = grpo_batch(**batches[0], vocab=shape["vocab_size"], seed=99)
            codec_info = measure_codec(trainer, codec_batch, args.repeats, args.codec_threads, device)
        finally:
            trainer.close()
    cuda = device.type == "cuda"
    return {
        "ok": True, "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "measured_on": "gpu" if cuda else "cpu: a smoke test of this stage, not GPU numbers",
        "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                     "transformers": transformers.__version__},
        "model": {"shape": "SmolLM2-135M (LlamaForCausalLM), random init" + (
                      "" if shape == SMOLLM2_135M else ", shrunk (see config)"), "parameters": params,
                  "layers": shape["num_hidden_layers"], "full_shape": shape == SMOLLM2_135M,
                  "config": shape, "build_s": build_s},
        "trainer": {"engine": "engines.deepspeed_trainer.DeepSpeedTrainer via engines.factory.make_train_engine",
                    "config": {k: v for k, v in cfg.items() if k != "model_path"},
                    "precision": "bf16 (fp32 master weights)" if cuda else "fp32",
                    "resident_after_init_gpu_mb": resident, "timed_steps": args.steps, "rows": rows},
        "codec": codec_info,
        "not_run_here": {"sglang": SGLANG_NOT_CARRIED},
    }


def table(section: dict) -> str:
    lines = [f"real shape on {section['device_name']} ({section['measured_on']}): "
             f"{section['model']['parameters'] / 1e6:.1f} M parameters, {section['model']['layers']} layers",
             f"{'batch':>22} {'tokens':>7} {'step s':>22} {'tokens/s':>26} {'peak MB':>9}"]
    for r in section["trainer"]["rows"]:
        b = r["batch"]
        peak = r.get("peak_gpu_mb", r.get("peak_rss_mb"))
        lines.append(f"{b['groups']}x{b['samples']} p{b['prompt_tokens']} c<={b['completion_tokens']:>4} "
                     f"{b['tokens']:>7} {fmt_spread(r['step_s'], '.3f'):>22} "
                     f"{fmt_spread(r['tokens_per_s'], '.0f'):>26} {peak:>9.0f}")
    c = section["codec"]
    lines += [f"codec ({c['tensors']} bf16 tensors, {c['raw_bytes'] / 1e6:.1f} MB raw of which "
              f"{c['tied_duplicate_bytes'] / 1e6:.1f} MB tied duplicates {c['tied_duplicates']}, {c['threads']} threads):",
              f"  snapshot {c['snapshot']['bytes'] / 1e6:8.2f} MB  encode {fmt_spread(c['snapshot']['encode_s'], '.3f')} s"
              f"  decode {fmt_spread(c['snapshot']['decode_s'], '.3f')} s",
              f"  delta    {c['delta']['bytes'] / 1e6:8.2f} MB  encode {fmt_spread(c['delta']['encode_s'], '.3f')} s"
              f"  apply in place {fmt_spread(c['delta']['apply_in_place_s'], '.3f')} s"
              f"  ({c['delta']['changed_fraction']:.3f} changed, bit-exact {c['delta']['bit_exact']})",
              f"  device->host {fmt_spread(c['device_to_host_s'], '.3f')} s, host->device "
              f"{fmt_spread(c['host_to_device_s'], '.3f')} s; apply kept the device storage: "
              f"{c['apply_in_place_kept_storage']}"]
    return "\n".join(lines)


def parse(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the real 30)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the real 49152)")
    p.add_argument("--groups", type=int, default=8, help="prompts per batch (the example's groups_per_batch)")
    p.add_argument("--samples", type=int, default=8, help="completions per prompt (the example's n_samples)")
    p.add_argument("--prompt-tokens", type=int, default=40, help="prompt length (a chat-templated sum: ~40)")
    p.add_argument("--completion-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[24, 512],
                   help="longest completion per batch shape, comma-separated (24: the example's max_new_tokens)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per batch shape (after one warm-up)")
    p.add_argument("--repeats", type=int, default=3, help="repetitions of each codec measurement")
    p.add_argument("--codec-threads", type=int, default=1,
                   help="codec threads (1: what a job's publisher and subscribers use by default)")
    p.add_argument("--threads", type=int, default=0, help="trainer torch threads (0: torch's default)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"results file whose {SECTION!r} section this writes (default on CUDA: {GPU_CHECK})")
    args = p.parse_args(argv)
    if args.steps < 3 or args.repeats < 3:
        p.error("--steps and --repeats must be >= 3 (a spread needs repetitions)")
    if args.device == "cpu" and args.out is not None and args.out.resolve() == GPU_CHECK.resolve():
        p.error(f"CPU numbers are never written into {GPU_CHECK.name}: give another --out")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("SKIP real shape (DeepSpeed trainer + weight codec): skipped: no CUDA (nothing written)")
            return 0
        out = args.out or GPU_CHECK
    else:
        out = args.out
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed picks its accelerator at import
    load = load_now()
    section = run(args)
    print(table(section), flush=True)
    if out is not None:
        write_section(out, SECTION, section, load, benchmark="gpu_check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
