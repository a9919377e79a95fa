#!/usr/bin/env bash
# GPU check for a lent H100/H200 (or any CUDA GPU): one prepared, self-checking run.
#
# Stages (AF_GPU_STAGES, default "real_shape sglang profile"; each prints PASS/FAIL/SKIP):
# - real_shape (benchmarks/gpu_real_shape.py): the project's DeepSpeed trainer, made as a job makes
#   it (engines.factory.make_train_engine; NCCL, bf16, ZeRO-2), on a random-init model of
#   SmolLM2-135M's shape (its config.json is in that file; nothing downloaded): step time,
#   tokens/s and peak GPU memory on GRPO batches; then the weight codec (weights/codec.py) on
#   the trained weights as CUDA tensors: bytes, encode/decode time, where the tensors are.
#   Needs only PyTorch on the machine: DeepSpeed and the rest travel as wheels (below).
# - sglang: builds a small random-init Qwen3 model locally (character tokenizer), starts SGLang on
#   it through engines/sglang.py, generates with logprobs and checks them against an HF forward
#   pass, runs DeepSpeed steps on the GPU (NCCL, bf16, ZeRO-2), pushes the trained weights to
#   SGLang via /update_weights_from_disk, checks the reported weight version and that generation
#   follows the new weights. A data-parallel part starts the trainer with torch's launcher
#   (NCCL): 2 ranks at ZeRO-2 and ZeRO-3 with >= 2 GPUs (every rank must end with the same
#   weights), or 1 rank at ZeRO-3 with the 2-rank part printed as skipped on 1 GPU. Needs sglang
#   importable: its wheels (sglang, sgl-kernel, flashinfer) are hundreds of MB and cannot be
#   carried to a machine without a package index, so there it is SKIPPED, and the JSON says so.
# - profile (benchmarks/gpu_profile.py): the emulation profile's efficiencies on this GPU into
#   benchmarks/results/gpu_profile.json (up to 5 min).
# Output: benchmarks/results/gpu_check.json ("stages", "gpu", "torch", "ok"; the real_shape
# stage's numbers under "real_shape"; what could not run under "not_run") and gpu_check.txt.
# Without CUDA every stage prints "skipped: no CUDA", nothing is written, and it exits 0.
#
# A machine with a package index: pip install -e '.[gpu]', then  bash benchmarks/gpu_check.sh
# A machine with PyTorch and no package index (docs/gpu-quickstart.md):
#   here:  make gpu-wheels                  # .gpu-wheels/: DeepSpeed (built, ~2 MB) and the rest, ~29 MB for Python 3.12
#   copy the checkout with .gpu-wheels/ to the GPU machine, then from its root:
#          AF_GPU_STAGES=real_shape bash benchmarks/gpu_check.sh python3
#   (benchmarks/gpu_env.py installs the wheels the machine lacks into a temp folder and, where
#   astraflow is not installed, puts this checkout on the path as the package.)
# Usage: bash benchmarks/gpu_check.sh [python]   (budget: real_shape ~2 min; all stages ~8-12 min)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-${PYTHON:-python3}}"
[ -x .venv/bin/python ] && [ -z "${1:-}" ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
STAGES="${AF_GPU_STAGES:-real_shape sglang profile}"
OUT_DIR="$PWD/benchmarks/results"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1  # a stage cut by its timeout still leaves what it printed in gpu_check.txt
WORK="$(mktemp -d /tmp/af-gpu-check-XXXX)"
trap 'rm -rf "$WORK"' EXIT
asked() { case " $STAGES " in *" $1 "*) return 0;; *) return 1;; esac; }
for s in $STAGES; do
  case "$s" in real_shape|sglang|profile) ;; *) echo "FAIL: unknown stage '$s' in AF_GPU_STAGES (real_shape, sglang, profile)"; exit 2;; esac
done

echo "== preflight"
if ! command -v nvidia-smi >/dev/null || ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  for s in $STAGES; do echo "SKIP $s: skipped: no CUDA (no nvidia-smi, or $PY's torch sees no CUDA device)"; done
  echo "nothing written"
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
env_out=$("$PY" benchmarks/gpu_env.py --wheels "${AF_GPU_WHEELS:-.gpu-wheels}" --site "$WORK/site" --tree "$WORK/pkg") \
  || { echo "FAIL: bringing the environment (benchmarks/gpu_env.py)"; exit 2; }
echo "$env_out" | grep -v '^PYTHONPATH=' | sed 's/^/  /'
extra=$(echo "$env_out" | sed -n 's/^PYTHONPATH=//p')
if [ -n "$extra" ]; then export PYTHONPATH="$extra${PYTHONPATH:+:$PYTHONPATH}"; fi
# The link tree must win over the checkout's own astraflow/ folder (the top package alone).
case ":$extra:" in *":$WORK/pkg:"*) export PYTHONSAFEPATH=1;; esac
"$PY" - <<'PY' || { echo "FAIL: preflight imports (make gpu-wheels and carry .gpu-wheels/, or pip install -e '.[gpu]')"; exit 2; }
import importlib
for m in ("deepspeed", "transformers", "zstandard", "blake3", "astraflow.engines.factory", "astraflow.weights.codec"):
    mod = importlib.import_module(m)
    print(f"  {m} {getattr(mod, '__version__', '')}")
PY
sglang_ok=0
"$PY" -c 'import sglang' 2>/dev/null && sglang_ok=1

export AF_GPU_WORK="$WORK" AF_GPU_OUT="$OUT_DIR" AF_GPU_STAGES="$STAGES"
: > "$OUT_DIR/gpu_check.txt"
export AF_RS_RC="" AF_RS_S="" AF_SG_RC="" AF_SG_SKIP=""
if asked real_shape; then
  echo "== real shape: DeepSpeed trainer + weight codec (benchmarks/gpu_real_shape.py)" | tee -a "$OUT_DIR/gpu_check.txt"
  t0=$SECONDS
  rc=0
  timeout 420 "$PY" -m astraflow.benchmarks.gpu_real_shape --out "$WORK/real_shape.json" 2>&1 \
    | tee -a "$OUT_DIR/gpu_check.txt" || rc=$?
  export AF_RS_RC=$rc AF_RS_S=$((SECONDS - t0))
fi

if ! asked sglang; then
  export AF_SG_SKIP="not asked (AF_GPU_STAGES=\"$STAGES\")"
elif [ "$sglang_ok" -eq 0 ]; then
  export AF_SG_SKIP="sglang is not importable"
  echo "SKIP sglang: sglang is not importable (its wheels are hundreds of MB: they cannot be carried to a machine without a package index)" | tee -a "$OUT_DIR/gpu_check.txt"
else
echo "== sglang" | tee -a "$OUT_DIR/gpu_check.txt"
rc=0
timeout 560 "$PY" - <<'PY' 2>&1 | tee -a "$OUT_DIR/gpu_check.txt" || rc=$?
import json, math, os, sys, time, traceback
from pathlib import Path

import torch

work = Path(os.environ["AF_GPU_WORK"])
results = {"stages": {}, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
failed = False


def stage(name):
    def wrap(fn):
        global failed
        t0 = time.perf_counter()
        try:
            info = fn() or {}
            results["stages"][name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 2), **info}
            print(f"PASS {name} ({time.perf_counter() - t0:.1f} s) {json.dumps(info)}", flush=True)
        except Exception as err:  # report and continue to the summary
            failed = True
            results["stages"][name] = {"ok": False, "error": repr(err)[:2000]}
            print(f"FAIL {name}: {err!r}", flush=True)
            traceback.print_exc()
        return fn
    return wrap


from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
from astraflow.engines import char_tokenizer
from astraflow.models.build import add_legacy_config_keys
from astraflow.engines.base import SamplingParams, TrainBatch, TrainSample
from astraflow.engines.config import SGLangConfig, TrainerConfig

model_dir = work / "qwen3-small"
state = {}


@stage("build random-init Qwen3")
def _():
    torch.manual_seed(0)
    char_tokenizer.save_tokenizer(model_dir)
    v = char_tokenizer.vocab()
    cfg = Qwen3Config(vocab_size=128, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=1024,
                      tie_word_embeddings=True, pad_token_id=v["<pad>"], eos_token_id=v["<eos>"], bos_token_id=v["<bos>"],
                      dtype="bfloat16")
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(model_dir), safe_serialization=True)
    add_legacy_config_keys(model_dir)  # SGLang may pin transformers 4.x
    state["tok"] = AutoTokenizer.from_pretrained(str(model_dir))
    return {"parameters": sum(p.numel() for p in model.parameters())}


@stage("DeepSpeed data parallel via torch's launcher (NCCL, ZeRO-2/3)")
def _():
    # The worker is benchmarks/trainer_scaling.py's, exercised on CPU by its tests.
    from astraflow.benchmarks.trainer_scaling import launch
    gpus = torch.cuda.device_count()
    if gpus >= 2:
        runs = [(2, 2), (2, 3)]
        skipped = None
    else:
        runs = [(1, 3)]
        skipped = f"2-rank step: only {gpus} GPU visible; NCCL needs one GPU per rank"
        print(f"SKIP {skipped}", flush=True)
    info = {"gpus": gpus}
    for ranks, zero in runs:
        row = launch(model_dir, ranks, zero, threads=1, steps=2, device="cuda", check=True, timeout_s=150)
        info[f"ranks{ranks}_zero{zero}"] = {"samples_per_s": round(row["samples_per_s"], 1),
                                            "peak_cuda_mb": round(row["peak_cuda_mb"]), "ranks_agree": row["ranks_agree"]}
    if skipped:
        info["skipped"] = skipped
    return info


@stage("start SGLang")
def _():
    from astraflow.engines.sglang import SGLangEngine
    cfg = SGLangConfig(mem_fraction_static=0.3, startup_timeout_s=300, extra_args=("--log-level", "warning"))
    state["sg"] = SGLangEngine(model_dir, cfg)
    return {"url": state["sg"].base_url, "server_version": state["sg"].server_version()}


def hf_logprobs(path, gens, temperature):
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).cuda().eval()
    worst = 0.0
    with torch.no_grad():
        for g in gens:
            ids = torch.tensor([list(g.prompt_ids) + list(g.tokens)], device="cuda")
            logits = model(input_ids=ids).logits[0, len(g.prompt_ids) - 1 : -1].float() / temperature
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.tokens, device="cuda")[:, None])[:, 0]
            worst = max(worst, (lp.cpu() - torch.tensor(g.logprobs)).abs().max().item())
    del model
    torch.cuda.empty_cache()
    return worst


@stage("SGLang generate + logprobs vs HF")
def _():
    tok, sg = state["tok"], state["sg"]
    prompts = [tok.encode(f"{a}+{b}=", add_special_tokens=False) for a, b in zip(range(10, 74), range(50, 114))]
    params = SamplingParams(temperature=1.0, max_new_tokens=64, stop_token_ids=(tok.eos_token_id,))
    sg.generate(prompts[:4], params)  # warm-up
    t0 = time.perf_counter()
    gens = sg.generate(prompts, params)
    secs = time.perf_counter() - t0
    n = sum(len(g.tokens) for g in gens)
    assert all(len(g.tokens) == len(g.logprobs) > 0 for g in gens), "token/logprob length mismatch"
    assert all(math.isfinite(x) and x <= 1e-3 for g in gens for x in g.logprobs), "logprobs not finite / > 0"
    worst = hf_logprobs(model_dir, gens[:8], 1.0)
    # bf16 server vs fp32 HF: loose bound; a wrong alignment would be off by nats.
    assert worst < 0.25, f"SGLang logprobs differ from HF forward by {worst:.3f} nats"
    state["gens"], state["prompts"] = gens, prompts
    return {"tokens": n, "tok_per_s": round(n / secs, 1), "max_abs_logprob_diff_vs_hf": round(worst, 4)}


@stage("DeepSpeed GPU steps (ZeRO-2, bf16, NCCL)")
def _():
    from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer
    gens = state["gens"]
    samples = tuple(TrainSample(g.prompt_ids, g.tokens, g.logprobs, reward=float(i % 2), group_id=i // 8) for i, g in enumerate(gens))
    tr = DeepSpeedTrainer(model_dir, TrainerConfig(zero_stage=2, lr=1e-3, device="cuda", bf16=True, token_budget=8192))
    before = tr.named_weights()
    steps = [tr.train_step(TrainBatch(samples)) for _ in range(5)]
    after = tr.named_weights()
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in steps), steps
    changed = sum(not torch.equal(before[k], after[k]) for k in before)
    assert changed > len(before) // 2, f"only {changed}/{len(before)} tensors changed"
    ckpt = work / "ckpt"
    tr.save_checkpoint(ckpt, {"offsets": {"batches": 5}})
    assert tr.load_checkpoint(ckpt) == {"offsets": {"batches": 5}}
    state["weights"] = after
    state["trained_dir"] = tr.export_hf(work / "trained")
    sps = [m["samples_per_s"] for m in steps[1:]]
    tr.close()
    return {"samples_per_s": round(sum(sps) / len(sps), 1), "loss_first": steps[0]["loss"], "loss_last": steps[-1]["loss"]}


@stage("SGLang weight update from disk + version")
def _():
    sg, prompts = state["sg"], state["prompts"][:8]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    before = sg.generate(prompts, greedy)
    t0 = time.perf_counter()
    sg.load_weights(state["weights"], version=1)
    update_s = time.perf_counter() - t0
    assert sg.server_version() == "1", f"server reports version {sg.server_version()!r}"
    after = sg.generate(prompts, greedy)
    assert [g.tokens for g in after] != [g.tokens for g in before], "generation did not change after the update"
    sampled = sg.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=16))
    worst = hf_logprobs(state["trained_dir"], sampled, 1.0)
    assert worst < 0.25, f"after update, SGLang logprobs differ from the exported weights by {worst:.3f} nats"
    return {"update_s": round(update_s, 2), "max_abs_logprob_diff_vs_hf": round(worst, 4)}


if "sg" in state:
    state["sg"].close()

results["ok"] = not failed
(work / "sglang_stages.json").write_text(json.dumps(results, indent=2, default=str))
sys.exit(1 if failed else 0)
PY
export AF_SG_RC=$rc
fi

# gpu_check.json: the stages that ran, the real-shape section, and what was not run and why.
assemble_rc=0
"$PY" - <<'PY' 2>&1 | tee -a "$OUT_DIR/gpu_check.txt" || assemble_rc=$?
import json, os, sys
from pathlib import Path

import torch

from astraflow.benchmarks.gpu_real_shape import SECTION, SGLANG_NOT_CARRIED

work, out = Path(os.environ["AF_GPU_WORK"]), Path(os.environ["AF_GPU_OUT"])
env = os.environ
results = {"stages": {}, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
not_run = {}
if env["AF_RS_RC"]:
    name, rc = "real shape: DeepSpeed trainer + weight codec (SmolLM2-135M, random init)", int(env["AF_RS_RC"])
    section = work / "real_shape.json"
    if rc == 0 and section.is_file():
        results[SECTION] = json.loads(section.read_text())[SECTION]
        results["stages"][name] = {"ok": True, "seconds": float(env["AF_RS_S"])}
    else:
        results["stages"][name] = {"ok": False, "error": f"exit {rc}" + (" (timed out)" if rc == 124 else "")
                                   + "; see gpu_check.txt"}
else:
    not_run["real_shape"] = f"not asked (AF_GPU_STAGES={env['AF_GPU_STAGES']!r})"
if env["AF_SG_SKIP"]:
    not_run["sglang"] = (SGLANG_NOT_CARRIED if env["AF_SG_SKIP"].startswith("sglang is not importable")
                         else env["AF_SG_SKIP"])
else:
    stages = work / "sglang_stages.json"
    if stages.is_file():
        results["stages"].update(json.loads(stages.read_text())["stages"])
    else:
        rc = int(env["AF_SG_RC"])
        results["stages"]["sglang"] = {"ok": False, "error": f"exit {rc}" + (" (timed out)" if rc == 124 else "")}
results["ok"] = all(r["ok"] for r in results["stages"].values())
if not_run:
    results["not_run"] = not_run

print()
print(f"{'stage':45} {'ok':>4} {'seconds':>8}  details")
for name, r in results["stages"].items():
    details = {k: v for k, v in r.items() if k not in ("ok", "seconds")}
    print(f"{name[:45]:45} {'yes' if r['ok'] else 'NO':>4} {r.get('seconds', float('nan')):8.1f}  {json.dumps(details)[:120]}")
for name, why in not_run.items():
    print(f"{name:45} {'SKIP':>4} {'':>8}  {why[:120]}")
(out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
print(f"wrote {out / 'gpu_check.json'}; overall: {'PASS' if results['ok'] else 'FAIL'}")
sys.exit(0 if results["ok"] else 1)
PY

# The emulation profile's efficiencies measured on this GPU (decode bandwidth share, prefill
# and training FLOPs shares, weight load): benchmarks/results/gpu_profile.json, which the
# emulated devices then prefer to the estimates of emulation/profiles.yaml.
profile_rc=0
if asked profile; then
  echo "== emulation profile (benchmarks/gpu_profile.py)"
  timeout 300 "$PY" benchmarks/gpu_profile.py 2>&1 | tee "$OUT_DIR/gpu_profile.txt" || profile_rc=$?
  [ "$profile_rc" -eq 0 ] && echo "PASS emulation profile" || echo "FAIL emulation profile (rc $profile_rc)"
else
  echo "SKIP profile: not asked (AF_GPU_STAGES=\"$STAGES\")"
fi
exit $(( assemble_rc != 0 || profile_rc != 0 ))
