"""What every component process shares: its engines and its model (its topics: :func:`astraflow.topics.job_topics`).

Small helpers that turn a :class:`~astraflow.config.JobConfig` into the objects the actors
use, so each actor module reads like its algorithm. The job-level ``model`` section is
the single source of the model path; it overrides the engine sections' ``model_path``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Collection
from pathlib import Path

from astraflow.config import JobConfig
from astraflow.sandbox import SandboxSettings
from astraflow.topics import Batch
from astraflow.workflows.chat import PromptRenderer
from astraflow.workflows.code_tasks import use_sandbox


def model_path(cfg: JobConfig) -> Path:
    """The policy's initial HF model dir (the cached tiny bootstrapped model unless configured)."""
    from astraflow.models.bootstrap import resolve_model_path
    return Path(resolve_model_path(cfg.model.path or "", cfg.model.seed, cfg.model.task, cfg.model.max_positions,
                                   cfg.model.name))


def prompt_renderer(cfg: JobConfig, tokenizer=None) -> PromptRenderer:
    """How the policy's prompts become token ids: its model's chat template (``data.chat_template``,
    ``data.system``), or raw text for a model without one. ``tokenizer``: the model's, when the
    caller has loaded it (else the renderer loads it on first use)."""
    # The tiny bootstrapped models have no template: their renderer is off without resolving (building) them.
    path = model_path(cfg) if cfg.model.path or cfg.model.name else None
    return PromptRenderer(path, cfg.data.chat_template, cfg.data.system, tokenizer)


def make_rollout_engine(cfg: JobConfig, path: Path, kind: str | None = None, device=None, name: str = "raas",
                        run_dir: str | Path | None = None):
    """The rollout engine of ``cfg`` (``kind`` overrides the engine kind), on ``device``
    (default ``rollout.device``): an emulated device wraps it (:mod:`astraflow.emulation`);
    devices it shares with the policy's trainer (``device.share``) meet in ``run_dir``."""
    from astraflow.engines.factory import make_rollout_engine as make
    engine_cfg = dataclasses.replace(cfg.rollout.engine, model_path=str(path), kind=kind or cfg.rollout.engine.kind)
    engine = make(engine_cfg, lora=cfg.trainer.engine.lora)
    device = device or cfg.rollout.device
    if device.emulated:
        from astraflow.emulation import EmulatedDevice, EmulatedRolloutEngine
        engine = EmulatedRolloutEngine(engine, EmulatedDevice(device, name, share_dir=run_dir,
                                                              lora=cfg.trainer.engine.lora))
    return engine


def make_pool_engines(cfg: JobConfig, path: Path, name: str = "raas", run_dir: str | Path | None = None) -> dict:
    """Policy -> its engine, for every policy this node's pool serves (``cfg.pool_policies``):
    its own policy's engine alone, or on a pool shared by LoRA policies of one base, one engine
    (the CPU engine or one SGLang server, ``rollout.engine.kind``) holding the base once and
    each policy's adapter (``host.adapter(policy)``), on an emulated device when the pool's is one."""
    policies = cfg.pool_policies(cfg.policy) or (cfg.policy,)
    if len(policies) == 1:
        return {cfg.policy: make_rollout_engine(cfg, path, name=name, run_dir=run_dir)}
    from astraflow.engines.factory import make_adapter_host  # (torch: a RaaS node's start-up only)
    loras = {p: cfg.view(p).trainer.engine.lora for p in policies}
    host = make_adapter_host(dataclasses.replace(cfg.rollout.engine, model_path=str(path)), loras)
    if not cfg.rollout.device.emulated:
        return {p: host.adapter(p) for p in policies}
    # on emulated devices: one device (one clock) for every adapter's rows, each adapter's loads
    # priced as its own adapter on the modelled shape
    from astraflow.emulation import EmulatedDevice, EmulatedRolloutEngine
    emulated = EmulatedRolloutEngine(host, EmulatedDevice(cfg.rollout.device, name, share_dir=run_dir,
                                                          lora=cfg.trainer.engine.lora))
    return {p: emulated.adapter(p, loras[p]) for p in policies}


def base_model(cfg: JobConfig, path: Path) -> str:
    """What the policy's versions apply to: for a LoRA policy (``trainer.engine.lora``) the
    digest of its base model directory ``path`` (``weights.adapters.base_digest``, computed
    once per process); "" when its versions are full weights. The trainer's publisher names
    it in every announcement; the nodes' subscribers refuse versions for anything else."""
    if cfg.trainer.engine.lora is None:
        return ""
    from astraflow.weights.adapters import base_digest
    return base_digest(path)


def make_train_engine(cfg: JobConfig, path: Path, run_dir: str | Path | None = None):
    from astraflow.engines.factory import make_train_engine as make
    e = cfg.trainer.engine
    # The trainer's logprobs must be those of the distribution the rollout sampled from.
    engine_cfg = dataclasses.replace(e, model_path=str(path), temperature=cfg.rollout.temperature,
                                     top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                                     seed=e.seed or cfg.seed,
                                     total_steps=e.total_steps or cfg.trainer.steps)
    engine = make(engine_cfg)
    if cfg.trainer.device.emulated:
        from astraflow.emulation import EmulatedDevice, EmulatedTrainEngine
        share = cfg.trainer.device.share
        engine = EmulatedTrainEngine(engine, EmulatedDevice(cfg.trainer.device, f"trainer.{cfg.policy}",
                                                            share_dir=run_dir, lora=e.lora),
                                     swap=not share or share in cfg.pool_device_shares())
    return engine


def to_train_batch(batch: Batch):
    """A topic ``Batch`` as the engine's ``TrainBatch`` (GRPO groups = tasks)."""
    from astraflow.engines.base import TrainBatch, TrainSample
    samples = [TrainSample(prompt_ids=tuple(s.prompt_ids or g.prompt_ids), completion_ids=tuple(s.tokens),
                           behaviour_logprobs=tuple(s.logprobs), reward=s.reward, group_id=g.group_key,
                           version=min(s.own_versions(), default=0), token_versions=tuple(s.versions),
                           loss_mask=tuple(s.loss_mask), context_generated=s.context_generated)
               # Groups arrive in poll order; training them in task order keeps a step's float
               # sums, and so the weights, independent of arrival timing.
               for g in sorted(batch.groups, key=lambda g: g.group_key) for s in g.samples if s.tokens and s.trained()]
    return TrainBatch(tuple(samples), step=batch.step)


def configure_sandbox(cfg: JobConfig) -> None:
    """Before any episode runs: whether model-written code may run without namespaces here
    (``sandbox.allow_unisolated``; the sandbox refuses by default)."""
    use_sandbox(SandboxSettings(allow_unisolated=cfg.sandbox.allow_unisolated))


def set_threads(n: int) -> None:
    """Keep a process to its share of the cores (torch intra-op and OpenMP)."""
    import torch
    if n > 0:
        torch.set_num_threads(n)
        os.environ["OMP_NUM_THREADS"] = str(n)


def lower_priority(increment: int, keep: Collection[int] = ()) -> None:
    """Add ``increment`` to the niceness of every thread of this process but those in ``keep``
    (OS thread ids) — 0 leaves it alone — like ``renice``; threads started later inherit their
    starter's. Raising niceness needs no privilege.

    Linux keeps niceness per thread, so each of ``/proc/self/task`` is set; elsewhere only the
    calling thread is (and a refusal is logged, not raised: the node runs as before).
    """
    if increment <= 0:
        return
    import threading
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [threading.get_native_id()]
    _renice([t for t in tids if t not in keep], increment)


def lower_thread_priority(increment: int) -> None:
    """Add ``increment`` to the calling thread's niceness alone (Linux keeps it per thread);
    the threads it starts afterwards inherit it, the process's other threads keep theirs."""
    if increment > 0:
        import threading
        _renice([threading.get_native_id()], increment)


def niceness(tid: int | None = None) -> int:
    """A thread's niceness (the calling thread's by default): what it runs at after
    :func:`lower_priority` / :func:`lower_thread_priority`, reported in metrics."""
    import threading
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id() if tid is None else tid)


def _renice(tids: list[int], increment: int) -> None:
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment))
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except (OSError, AttributeError) as e:
            logging.getLogger(__name__).warning("could not lower thread %d's CPU priority by %d: %s", tid,
                                                increment, e)
            return


def close_quietly(*resources) -> None:
    """Close clients/engines on the way out; one failing close must not keep the others open."""
    for r in resources:
        if r is None:
            continue
        try:
            r.close()
        except Exception:  # noqa: BLE001 - best effort during teardown
            logging.getLogger(__name__).warning("closing %s failed", type(r).__name__, exc_info=True)
