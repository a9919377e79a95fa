"""A LoRA policy (``trainer.engine.lora``) on the real DeepSpeed trainer and the real CPU engine:
only the adapter trains, the KL reference is the base with the adapter disabled, checkpoints
resume the adapter and its optimizer state, and the engine serving an adapter reports the
log-probs the peft model computes (so the trainer's agreement check holds)."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from astraflow.engines.base import SamplingParams, TrainBatch, TrainSample
from astraflow.engines.config import LoraConfig, TrainerConfig
from astraflow.engines.lora import is_adapter_name, published_name, wrap

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "up_proj"))


def make_trainer(path, **overrides):
    from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer

    cfg = TrainerConfig(**{"lr": 1e-2, "seed": 0, "grad_clip": 1.0, "lora": LORA, **overrides})
    return DeepSpeedTrainer(path, cfg)


def rollout(engine, tokenizer, seed: int = 3) -> TrainBatch:
    """Eight rows of the engine on four prompts (two per group, rewarded 0 and 1)."""
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("What is 3+4?", "Say hi.", "12+7=", "Count:")]
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=seed)
    gens = engine.generate(prompts * 2, params)
    return TrainBatch(tuple(TrainSample(g.prompt_ids, g.tokens, g.logprobs, reward=float(i // 4), group_id=i % 4,
                                        version=g.version, token_versions=(g.version,) * len(g.tokens))
                            for i, g in enumerate(gens)))


@pytest.fixture(scope="module")
def smol_tokenizer(smol_random):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smol_random))


@pytest.fixture(scope="module")
def base_batch(smol_random, smol_tokenizer):
    from astraflow.engines.cpu import CpuEngine

    return rollout(CpuEngine(smol_random), smol_tokenizer)


def _base_state(trainer) -> dict[str, torch.Tensor]:
    """The frozen base's parameters (gathered whole under ZeRO-3)."""
    import deepspeed

    out = {}
    for name, p in trainer.engine.module.named_parameters():
        if not is_adapter_name(name):
            with deepspeed.zero.GatheredParameters([p]) if hasattr(p, "ds_id") else contextlib.nullcontext():
                out[name] = p.detach().clone()
    return out


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_only_the_adapter_trains_and_the_base_is_unchanged(smol_random, base_batch, zero):
    trainer = make_trainer(smol_random, zero_stage=zero, kl_coef=0.05 if zero == 3 else 0.0)
    module = trainer.engine.module
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all(is_adapter_name(n) for n in trainable)
    # 3 targets x 2 layers x (A, B)
    assert len(trainable) == 12
    adapter_elems = sum(p.numel() for n, p in module.named_parameters() if n in trainable)
    if zero == 0:  # the optimizer holds the adapter's parameters and nothing else
        held = [p for g in trainer.engine.optimizer.param_groups for p in g["params"]]
        assert sum(p.numel() for p in held) == adapter_elems
    base = _base_state(trainer)
    assert base and all(t.numel() for t in base.values())
    before = trainer.named_weights()
    assert set(before) == {published_name(n) for n in trainable}
    assert all(".default." not in n and n.startswith("base_model.model.") for n in before)
    assert all(float(t.abs().sum()) == 0 for n, t in before.items() if ".lora_B." in n)  # starts as the base

    trainer.train_step(base_batch)
    trainer.train_step(base_batch)
    after = trainer.named_weights()
    assert all(not torch.equal(after[n], before[n]) for n in before if ".lora_B." in n), "an adapter did not train"
    for name, t in _base_state(trainer).items():
        assert torch.equal(t, base[name]), f"base weight {name} changed"


def test_two_lora_trainers_in_one_process_hold_the_base_once_and_train_their_own_adapters(smol_random,
                                                                                         base_batch):
    """``trainer.process``: a process training two policies' adapters of one base. The second
    trainer's frozen base parameters are the first one's tensors (adapters on other modules
    too), each adapter trains alone, the base stays, and the second trains exactly as it would
    alone in a process of its own."""
    import gc

    other = LoraConfig(rank=2, alpha=4.0, target_modules=("q_proj", "o_proj"))
    gc.collect()  # (trainers of earlier tests, gone: the first here registers the base)
    first = make_trainer(smol_random)
    second = make_trainer(smol_random, lora=other)
    frozen = lambda tr: {n.replace(".base_layer.", "."): p for n, p in tr.engine.module.named_parameters()  # noqa: E731
                         if not p.requires_grad}
    a, b = frozen(first), frozen(second)
    assert set(a) == set(b) and second.shared_base_params == len(b) > 0
    assert all(a[n].data_ptr() == b[n].data_ptr() for n in a), "the base is held twice"
    base = {n: p.detach().clone() for n, p in a.items()}
    first_before, second_before = first.named_weights(), second.named_weights()
    second.train_step(base_batch)
    assert first.named_weights().keys() == first_before.keys()
    assert all(torch.equal(first.named_weights()[n], t) for n, t in first_before.items())  # untouched
    first.train_step(base_batch)
    assert all(torch.equal(p, base[n]) for n, p in frozen(second).items())
    # the same adapter trained alone (its own base, nothing shared) reaches the same weights
    del first
    gc.collect()
    alone = make_trainer(smol_random, lora=other)
    alone.train_step(base_batch)
    got, want = second.named_weights(), alone.named_weights()
    assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in got)
    assert any(not torch.equal(got[n], second_before[n]) for n in got if ".lora_B." in n)


def test_kl_reference_is_the_base_with_the_adapter_disabled(smol_random, base_batch):
    from transformers import AutoModelForCausalLM

    from astraflow.engines.distributed import Ranks
    from astraflow.engines.trainer_logprobs import batch_logprobs

    trainer = make_trainer(smol_random, kl_coef=0.05)
    assert trainer.ref_model is None  # no second model
    for _ in range(2):
        metrics = trainer.train_step(base_batch)
    assert metrics["kl"] > 0  # the adapter moved the policy away from the base
    plan = trainer.prepare(base_batch)
    base = AutoModelForCausalLM.from_pretrained(str(smol_random), dtype=torch.float32)
    _, expected = batch_logprobs(base, base_batch.samples, trainer.cfg, Ranks(0, 1, torch.device("cpu")),
                                 torch.device("cpu"), full=True, sampled=False)
    for got, want in zip(plan.logp_ref, expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_resume_restores_the_adapter_and_its_optimizer_state(smol_random, base_batch, tmp_path):
    from astraflow.engines.deepspeed_checkpoint import CKPT_TAG

    straight = make_trainer(smol_random, warmup_steps=2)
    for _ in range(2):
        straight.train_step(base_batch)
    saved = straight.named_weights()
    moments = {n: {k: v.clone() for k, v in straight.engine.optimizer.state[p].items()}
               for n, p in straight.engine.module.named_parameters() if p.requires_grad}
    straight.save_checkpoint(tmp_path / "ckpt", {"batches_offset": 7})
    expected = straight.train_step(base_batch)
    expected_w = straight.named_weights()
    # The checkpoint holds the adapter, not the frozen base.
    [states] = (tmp_path / "ckpt" / CKPT_TAG).glob("*model_states.pt")
    module = torch.load(states, map_location="cpu", weights_only=False)["module"]
    assert module and all(is_adapter_name(k) for k in module)

    resumed = make_trainer(smol_random, warmup_steps=2)
    assert resumed.load_checkpoint(tmp_path / "ckpt") == {"batches_offset": 7} and resumed.step == 2
    for name, t in resumed.named_weights().items():
        assert torch.equal(t, saved[name]), name
    for n, p in resumed.engine.module.named_parameters():
        if p.requires_grad:
            state = resumed.engine.optimizer.state[p]
            assert set(state) == set(moments[n]), n
            for k, v in moments[n].items():
                assert torch.equal(state[k], v), (n, k)
    got = resumed.train_step(base_batch)
    assert got["loss"] == expected["loss"] and got["lr"] == expected["lr"]
    for name, t in resumed.named_weights().items():
        assert torch.equal(t, expected_w[name]), name

    # Only under the settings it was saved with, else one line naming the key.
    from astraflow.engines.deepspeed_checkpoint import CheckpointLayoutError

    with pytest.raises(CheckpointLayoutError, match=r'saved with trainer.engine.lora \{"rank": 4.*this trainer has '
                                                    r'\{"rank": 8'):
        make_trainer(smol_random, lora=LoraConfig(rank=8, target_modules=LORA.target_modules)).load_checkpoint(
            tmp_path / "ckpt")
    with pytest.raises(CheckpointLayoutError, match=r"this trainer has null \(full fine-tuning\)"):
        make_trainer(smol_random, lora=None).load_checkpoint(tmp_path / "ckpt")


def _peft_logprobs(base_dir, adapter: dict[str, torch.Tensor], batch: TrainBatch,
                   cfg: LoraConfig = LORA) -> list[torch.Tensor]:
    """A fresh forward pass of the peft model holding ``adapter`` (published names) on ``batch``'s rows."""
    from peft import set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from astraflow.engines.distributed import Ranks
    from astraflow.engines.trainer_logprobs import batch_logprobs

    model = wrap(AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32), cfg)
    result = set_peft_model_state_dict(model, {k: v for k, v in adapter.items()})
    assert not result.unexpected_keys
    logp, _ = batch_logprobs(model, batch.samples, TrainerConfig(), Ranks(0, 1, torch.device("cpu")),
                             torch.device("cpu"), full=False)
    return logp


def test_the_engine_serving_an_adapter_agrees_with_the_peft_model_and_the_trainer(smol_random, smol_tokenizer,
                                                                                   base_batch):
    from astraflow.engines.cpu import CpuEngine

    trainer = make_trainer(smol_random)
    engine = CpuEngine(smol_random, lora=LORA)
    base_weights = {k: v.clone() for k, v in engine.model.state_dict().items()}
    versions = {}
    for _ in range(2):
        trainer.train_step(base_batch)
        versions[trainer.step] = trainer.named_weights()
    for v in (1, 2):  # version 2 applies to the base, not on top of version 1
        engine.load_weights(versions[v], v)
    fresh = CpuEngine(smol_random, lora=LORA)
    fresh.load_weights(versions[2], 2)
    for name, t in fresh.model.state_dict().items():
        assert torch.equal(engine.model.state_dict()[name], t), name

    batch = rollout(engine, smol_tokenizer, seed=5)
    assert {s.version for s in batch.samples} == {2}
    for got, want in zip(_peft_logprobs(smol_random, versions[2], batch), batch.samples):
        torch.testing.assert_close(got, torch.tensor(want.behaviour_logprobs), atol=1e-4, rtol=0)
    # The trainer's own check, on tokens of the version it trains now.
    assert trainer.train_step(batch)["train_inference_logp_gap"] < 1e-4

    # Back to version 0 (B = 0: the base itself) restores the base exactly.
    engine.load_weights(trainer_v0(smol_random), 3)
    for name, t in engine.model.state_dict().items():
        assert torch.equal(t, base_weights[name]), name


def trainer_v0(path) -> dict[str, torch.Tensor]:
    return make_trainer(path).named_weights()


#: a second policy's adapter: another rank, scale and set of modules than LORA's
OTHER = LoraConfig(rank=2, alpha=3.0, target_modules=("q_proj", "o_proj", "down_proj"))


def random_adapter(path, cfg: LoraConfig, seed: int) -> dict[str, torch.Tensor]:
    """An adapter of ``cfg`` whose ``B`` is not zero (published names), drawn from ``seed``."""
    from transformers import AutoModelForCausalLM

    from astraflow.engines.lora import ADAPTER

    model = wrap(AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32), cfg)
    g = torch.Generator().manual_seed(seed)
    return {published_name(n): (torch.randn(p.shape, generator=g) * 0.2 if ".lora_B." in n else p.detach().clone())
            for n, p in model.named_parameters() if f".{ADAPTER}." in n}


def test_rows_of_two_adapters_in_one_batch_each_get_their_own_adapters_logprobs(smol_random, smol_tokenizer,
                                                                                 base_batch):
    from astraflow.engines.cpu import CpuEngine

    trainer = make_trainer(smol_random)
    for _ in range(2):
        trainer.train_step(base_batch)
    own = {"solver": (trainer.named_weights(), LORA, 2), "verifier": (random_adapter(smol_random, OTHER, 1), OTHER, 7)}
    engine = CpuEngine(smol_random, adapters={"solver": LORA, "verifier": OTHER})
    base_weights = {k: v.clone() for k, v in engine.model.state_dict().items()}
    for name, (adapter, _, version) in own.items():
        engine.adapter(name).load_weights(adapter, version)
    assert (engine.adapter("solver").version, engine.adapter("verifier").version) == (2, 7)

    prompts = [tokenizer_ids for tokenizer_ids in (smol_tokenizer.encode(t, add_special_tokens=False)
                                                   for t in ("What is 3+4?", "Say hi.", "12+7=", "Count:"))]
    names = ["solver", "verifier", "verifier", "solver", "solver", "verifier", "solver", "verifier"]
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=11)
    first = engine.generate(prompts * 2, params, adapters=names)
    # Stop on a token one verifier row samples third: rows leave the batch while others go on.
    stop = first[1].tokens[2]
    gens = engine.generate(prompts * 2, dataclasses.replace(params, stop_token_ids=(stop,)), adapters=names)
    assert len({len(g.tokens) for g in gens}) > 1 and gens[1].finish_reason == "stop"
    for name, (adapter, cfg, version) in own.items():
        rows = [g for g, n in zip(gens, names) if n == name]
        assert {g.version for g in rows} == {version}
        batch = TrainBatch(tuple(TrainSample(g.prompt_ids, g.tokens, g.logprobs) for g in rows))
        for got, want in zip(_peft_logprobs(smol_random, adapter, batch, cfg), batch.samples):
            torch.testing.assert_close(got, torch.tensor(want.behaviour_logprobs), atol=2e-5, rtol=0)
    # A mixed call leaves the base weights as they were (the updates are added per row).
    for name, t in engine.model.state_dict().items():
        assert torch.equal(t, base_weights[name]), name

    # A call of one adapter takes the merged path: what an engine serving that adapter alone gives.
    alone = CpuEngine(smol_random, lora=LORA)
    alone.load_weights(own["solver"][0], 2)
    want = alone.generate(prompts, params)
    for got in (engine.adapter("solver").generate(prompts, params), engine.generate(prompts, params)):
        assert [(g.tokens, g.logprobs, g.version) for g in got] == [(g.tokens, g.logprobs, g.version) for g in want]
    # ... and a new version of the merged adapter replaces the merge (applies to the base).
    engine.adapter("solver").load_weights(trainer_v0(smol_random), 3)
    for name, t in engine.model.state_dict().items():
        assert torch.equal(t, base_weights[name]), name
    with pytest.raises(KeyError, match="no adapter 'critic'"):
        engine.generate(prompts[:1], params, adapters=["critic"])
    with pytest.raises(ValueError, match="1 adapters for 2 prompts"):
        engine.generate(prompts[:2], params, adapters=["solver"])


def test_an_engine_refuses_what_is_not_a_whole_adapter_of_its_model(smol_random):
    from astraflow.engines.cpu import CpuEngine

    engine = CpuEngine(smol_random, lora=LORA)
    adapter = trainer_v0(smol_random)
    one = next(n for n in adapter if ".lora_A." in n)
    with pytest.raises(ValueError, match="has lora_A but not both"):
        engine.load_weights({one: adapter[one]}, 1)
    with pytest.raises(KeyError, match="not an adapter tensor"):
        engine.load_weights({"model.norm.weight": torch.ones(64)}, 1)
    with pytest.raises(ValueError, match="rank-2 adapter"):
        CpuEngine(smol_random, lora=LoraConfig(rank=2, target_modules=LORA.target_modules)).load_weights(adapter, 1)
    assert engine.version == 0


def test_lora_settings_are_checked_by_key(smol_random, tmp_path):
    from astraflow.config import ConfigError, load_config

    path = tmp_path / "job.yaml"
    for text, match in (("rank: 0", r"trainer.engine.lora.rank: must be in \[1, 4096\], got 0"),
                        ("dropout: 1.0", r"trainer.engine.lora.dropout: must be in \[0, 1\), got 1.0"),
                        ("alpha: 0", r"trainer.engine.lora.alpha: must be in \(0, 1000000\], got 0"),
                        ("target_modules: []", r"trainer.engine.lora: trainer.engine.lora.target_modules must list"),
                        ("ranks: 8", r"trainer.engine.lora.ranks: unknown key")):
        path.write_text(f"job: j\ntrainer:\n  engine:\n    lora:\n      {text}\n")
        with pytest.raises(ConfigError, match=match):
            load_config(path)
    path.write_text("job: j\nrollout:\n  engine:\n    kind: sglang\ntrainer:\n  engine:\n    lora: {rank: 8}\n")
    assert load_config(path).trainer.engine.lora == LoraConfig(rank=8)  # SGLang serves adapters (contract-tested)
    path.write_text("job: j\n")
    assert load_config(path).trainer.engine.lora is None
    cfg = load_config(path, {"trainer.engine.lora.rank": 16})
    assert cfg.trainer.engine.lora == LoraConfig(rank=16)
    with pytest.raises(ValueError, match="target_modules"):
        make_trainer(smol_random, lora=LoraConfig(target_modules=("no_such_proj",)))
