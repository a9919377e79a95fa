"""``astraflow replay``: re-train a job from its recorded batches, with no rollout.

The trainer reads ``batches.<policy>`` by offset, so the topic is the whole record of
training: the same batches in the same order into the same DeepSpeed trainer give the
same weights. A replay runs that trainer (one process, one rank) over the recorded
batches from version 0, from a checkpoint (``--from-checkpoint``) or from step ``k``
(``--from-step``: the steps before ``k`` are retrained with the recorded settings, which
rebuilds the optimizer state exactly), into a run directory of its own (checkpoints,
``metrics.jsonl``, ``summary.json``, ``plot.png``).

* **Unchanged settings** (verify): after every step the weights, cast to the published
  dtype, are compared bit for bit with the digest the job announced for that version
  (:mod:`.recorded`); the first divergence stops the replay and names the step,
  the version and, where the payload still holds per-tensor hashes, the tensors.
* **Changed settings** (``--set trainer.engine.KEY=VALUE``: LR, loss, KL, clipping; a
  what-if): the same batches train a new lineage from the branch step on, off-policy
  with respect to the weights that generated them, with its own checkpoints, metrics and
  held-out evaluation (the evaluator's code, without Kafka) beside the recorded ones.

A replay only reads the job's topics: no consumer group, no commit, no write; its
checkpoints carry the job and the lineage they belong to. It does not publish weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from astraflow.config import JobConfig
from astraflow.engines.checkpoints import CheckpointError, CheckpointStore
from astraflow.replay.recorded import (RecordedVersion, RecordError, batch_span, check_job, check_kept, read_batches,
                                recorded_metrics, recorded_versions)

__all__ = ["ReplayRequest", "replay", "changed_settings", "WHAT_IF_PREFIXES", "RECORDED"]

#: ``--set`` keys a replay takes: the batches fix everything else (data, rollout, dataflow).
WHAT_IF_PREFIXES = ("trainer.engine.", "eval.")
#: Engine keys that change how fast a step runs, not what it computes.
_NEUTRAL = frozenset({"threads", "collective_timeout_s", "token_budget"})
#: The lineage id of a replay that reproduces the job's own history.
RECORDED = "recorded"


@dataclass(frozen=True)
class ReplayRequest:
    """What to replay. ``recorded`` is the job's config as it ran; ``cfg`` the replay's
    (``recorded`` with the ``--set`` changes); both name the job whose topics are read."""

    recorded: JobConfig
    cfg: JobConfig
    bootstrap: str
    from_step: int = 0
    from_checkpoint: Path | None = None
    to_step: int | None = None  #: last version to reach (None: every recorded batch)
    run_dir: Path | None = None
    evaluate: bool = True


def changed_settings(recorded: JobConfig, cfg: JobConfig) -> dict[str, list]:
    """``{trainer.engine.KEY: [recorded, replay]}`` for every trainer setting that changes the arithmetic."""
    a, b = dataclasses.asdict(recorded.trainer.engine), dataclasses.asdict(cfg.trainer.engine)
    return {f"trainer.engine.{k}": [a[k], b[k]] for k in a if a[k] != b[k] and k not in _NEUTRAL}


def replay(req: ReplayRequest, say: Callable[[str], None] = print) -> dict:
    """Run the replay; returns its summary (also written to the run directory)."""
    from astraflow.topics import job_topics
    from astraflow.actors.common import set_threads

    cfg, job, policy = req.cfg, req.cfg.job, req.cfg.policy
    topics = job_topics(cfg)
    check_job(req.bootstrap, topics, policy)
    if req.to_step is not None and req.to_step <= req.from_step:
        raise RecordError(f"--to-step {req.to_step} must be after the starting step {req.from_step}")
    begin, _, last = batch_span(req.bootstrap, topics.batches(policy))
    if req.from_checkpoint is None:
        if last is None:
            raise RecordError(f"{topics.batches(policy)} holds no batch: job {job} never trained")
        check_kept(topics.batches(policy), 0, begin, 0)
        if req.from_step > last:
            raise RecordError(f"--from-step {req.from_step}: job {job} recorded batches only up to step {last}")
    changes = changed_settings(req.recorded, cfg)
    recorded = recorded_versions(req.bootstrap, topics, policy)
    run_dir = Path(req.run_dir or Path(cfg.run_dir) / f"{job}-replay-{time.strftime('%Y%m%d-%H%M%S')}")
    store = CheckpointStore(run_dir / "checkpoints" / policy, keep=cfg.trainer.keep_checkpoints)
    if store.latest() is not None:
        raise RecordError(f"{run_dir} already holds a replay's checkpoints; give another --run-dir")
    set_threads(cfg.trainer.engine.threads)
    started = time.time()
    run = _Run(req, topics, recorded, store, changes, say)
    try:
        run.start()
        say(f"replaying job {job} ({policy}) from v{run.start_version} into {run_dir}: "
            + ("unchanged settings, checking every version against the recorded weights" if not changes else
               f"what-if lineage {run.lineage_id} from step {run.branch}: "
               + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items())))
        regrouped = [k for k in ("threads", "token_budget")
                     if getattr(req.recorded.trainer.engine, k) != getattr(cfg.trainer.engine, k)]
        if (cfg.trainer.ranks > 1 or regrouped) and not changes:
            why = (f"trainer.ranks={cfg.trainer.ranks} in the job" if cfg.trainer.ranks > 1 else
                   "changed trainer.engine." + " and ".join(regrouped))
            say(f"note: {why} sums in another order than the recorded trainer did, so bits may differ "
                "where the mathematics agrees")
        run.train()
    finally:
        run.close()
    summary = run.summary(run_dir, time.time() - started)
    from astraflow.replay.outputs import write_outputs
    write_outputs(run_dir, summary, run.rows, recorded_metrics(req.bootstrap, topics, policy))
    return summary


class _Run:
    """One replay's engine, position in the batches, checks and metrics."""

    def __init__(self, req: ReplayRequest, topics, recorded: dict[int, RecordedVersion], store: CheckpointStore,
                 changes: dict, say: Callable[[str], None]) -> None:
        self.req, self.cfg, self.topics, self.recorded = req, req.cfg, topics, recorded
        self.store, self.changes, self.say = store, changes, say
        self.lineage_id = RECORDED
        self.engine = None
        self.offset, self.lineage, self.branch = 0, [], req.from_step
        self.steps: list[dict] = []
        self.rows: list[dict] = []
        self.accuracy: dict[int, float] = {}
        self.first_divergence: dict | None = None
        self.failed = False  #: the recorded history was not reproduced
        self.evaluator = None

    # -- where the replay starts ---------------------------------------------------
    def start(self) -> None:
        if self.req.from_checkpoint is not None:
            self._start_from_checkpoint(Path(self.req.from_checkpoint))
        else:
            # Before the branch step the recorded settings retrain the recorded history.
            self.engine = self._engine(self.req.recorded if self.req.from_step else self.cfg)
            weights = self._weights()
            self._check_start(0, weights, "the model's initial weights", "the job's model (model.path, model.seed)")
        self.start_version = self.engine.step
        if self.changes:
            # Named by what makes it: the same branch of the same job with the same settings
            # is the same lineage (on CPU, the same weights).
            self.lineage_id = "whatif-" + hashlib.sha256(json.dumps(
                [self.cfg.job, self.cfg.policy, self.branch, self.changes], sort_keys=True, default=str).encode()
            ).hexdigest()[:10]

    def _start_from_checkpoint(self, path: Path) -> None:
        ckpt = _open_checkpoint(path)
        state = ckpt.state
        job = state.get("job")
        if job is not None and job != self.cfg.job:
            raise RecordError(f"checkpoint {ckpt.path} belongs to job {job!r}, not {self.cfg.job!r}")
        if state.get("lineage_id", RECORDED) != RECORDED:
            raise RecordError(f"checkpoint {ckpt.path} is of lineage {state['lineage_id']} (a what-if replay of "
                              f"{self.cfg.job}), not of the job's recorded lineage; replay from the job trainer's "
                              "checkpoints or from an unchanged replay's")
        for key in ("step", "batches_offset", "lineage"):
            if key not in state:
                raise RecordError(f"checkpoint {ckpt.path}: its state.json has no {key!r}; it is not a trainer "
                                  "checkpoint")
        self.engine = self._engine(self.cfg)
        self.engine.load_checkpoint(ckpt.path)
        self._apply_optimizer_settings()
        self.offset, self.lineage, self.branch = int(state["batches_offset"]), [list(x) for x in state["lineage"]], \
            self.engine.step
        self._check_start(self.engine.step, self._weights(), f"checkpoint {ckpt.path}",
                          "another job or lineage: replay from one of this job's checkpoints")

    def _check_start(self, version: int, weights: dict, what: str, hint: str) -> None:
        from astraflow.weights.codec import weights_digest
        rec = self.recorded.get(version)
        digest = weights_digest(weights)
        if rec is None:
            self.say(f"version {version}: the job's digest is no longer recorded; {what} cannot be checked")
        elif rec.digest != digest:
            raise RecordError(f"{what} holds version {version} with weights {digest[:16]}…, but job {self.cfg.job} "
                              f"announced {rec.digest[:16]}… for it: it belongs to {hint}")

    def _engine(self, cfg: JobConfig):
        from astraflow.actors.common import make_train_engine, model_path
        return make_train_engine(cfg, model_path(cfg))

    def _apply_optimizer_settings(self) -> None:
        """Loading a checkpoint restores the optimizer's hyper-parameters as saved; a what-if
        that changes them must win (the LR is set by the engine every step)."""
        e = self.cfg.trainer.engine
        if not {"trainer.engine.betas", "trainer.engine.weight_decay"} & set(self.changes):
            return
        for group in self.engine.engine.optimizer.param_groups:
            group["betas"], group["weight_decay"] = tuple(e.betas), e.weight_decay

    def _branch(self) -> None:
        """Leave the recorded history at this step: checkpoint it, reload into the what-if's engine."""
        step = self.engine.step
        if (latest := self.store.latest()) is None or latest.step != step:
            self._checkpoint(RECORDED)
        self.engine.close()
        self.engine = self._engine(self.cfg)
        self.engine.load_checkpoint(self.store.latest().path)
        self._apply_optimizer_settings()
        self.say(f"step {step}: branching from the recorded lineage into {self.lineage_id}")

    # -- the replay ------------------------------------------------------------------
    def train(self) -> None:
        from astraflow.actors.common import to_train_batch
        from astraflow.weights.codec import tensor_hashes, weights_digest

        if self.req.evaluate and not self.req.from_step:  # else at the branch step
            self._evaluate(self._weights())
        batches = read_batches(self.req.bootstrap, self.topics.batches(self.cfg.policy), offset=self.offset,
                               step=self.engine.step, to_step=self.req.to_step)
        for offset, batch in batches:
            if batch.step == self.branch and self.changes and self.req.from_checkpoint is None and self.branch:
                self._branch()
                if self.req.evaluate:
                    self._evaluate(self._weights())
            out = self.engine.train_step(to_train_batch(batch))
            self.offset = offset + 1
            self.lineage.append([batch.step, offset])
            version = self.engine.step
            weights = self._weights()
            hashes = tensor_hashes(weights)
            check = self._compare(batch.step, version, weights_digest(weights, hashes), hashes, offset)
            self._record(version, out, check)
            if check["status"] == "diverged" and not self._expected(version):
                self.failed = True  # its weights are of no known lineage: no checkpoint, no evaluation
                break
            if version % self.cfg.trainer.checkpoint_every == 0:
                self._checkpoint()
            if self.req.evaluate and self._eval_due(version):
                self._evaluate(weights)
        self.end_version = self.engine.step
        if self.failed:
            return
        latest = self.store.latest()
        if self.end_version > self.start_version and (latest is None or latest.step != self.end_version):
            self._checkpoint()
        if self.req.evaluate and self.end_version not in self.accuracy:
            self._evaluate(self._weights())

    def _expected(self, version: int) -> bool:
        """A divergence at ``version`` is the what-if's own doing (not a failure to reproduce)."""
        return bool(self.changes) and version > self.branch

    def _compare(self, step: int, version: int, digest: str, hashes: dict[str, bytes], offset: int) -> dict:
        rec = self.recorded.get(version)
        check = {"step": step, "version": version, "batch_offset": offset, "digest": digest,
                 "recorded_digest": rec.digest if rec else None}
        where = f"step {step} -> v{version}:"
        if self.first_divergence is not None:
            check["status"] = "branched"
        elif rec is None:
            check["status"] = "unrecorded"
            self.say(f"{where} no recorded digest (compacted from versions, trimmed from weights)")
        elif rec.digest == digest:
            check["status"] = "match"
            self.say(f"{where} weights {digest[:12]}… match the recorded version bit for bit")
        else:
            tensors = [n for n in hashes if rec.tensors is not None and rec.tensors.get(n) != hashes[n].hex()]
            check.update(status="diverged", tensors=tensors if rec.tensors is not None else None)
            self.first_divergence = dict(check)
            expected = self._expected(version)
            named = (f"tensors {', '.join(tensors[:3])}" + (f" (+{len(tensors) - 3} more)" if len(tensors) > 3 else "")
                     if tensors else "tensor hashes no longer recorded for this version")
            self.say(f"{where} {'diverges from' if expected else 'DIVERGED from'} the recorded weights "
                     f"({rec.digest[:12]}… recorded, {digest[:12]}… replayed); {named}"
                     + (" (expected: changed settings)" if expected else ""))
        self.steps.append(check)
        return check

    def _record(self, version: int, out: dict, check: dict) -> None:
        now = time.time()
        comp = f"trainer.{self.cfg.policy}"
        self.rows += [{"ts": now, "component": comp, "name": f"trainer.{k}", "value": float(v), "step": version}
                      for k, v in out.items() if isinstance(v, (int, float))]
        if check["status"] in ("match", "diverged"):
            self.rows.append({"ts": now, "component": "replay", "name": "replay.match",
                              "value": float(check["status"] == "match"), "step": version})

    def _weights(self) -> dict:
        """The weights as the trainer published them (``trainer.publish_dtype``): what ``versions`` digests."""
        import torch
        dtype = getattr(torch, self.cfg.trainer.publish_dtype)
        return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in self.engine.named_weights().items()}

    def _checkpoint(self, lineage_id: str | None = None) -> None:
        """Save this step; its lineage is the recorded one up to the branch, the what-if's after it."""
        if lineage_id is None:
            lineage_id = self.lineage_id if self._expected(self.engine.step) else RECORDED
        state = {"step": self.engine.step, "batches_offset": self.offset, "lineage": self.lineage, "world_size": 1,
                 "job": self.cfg.job, "policy": self.cfg.policy, "lineage_id": lineage_id,
                 "changes": self.changes if lineage_id != RECORDED else {}}
        self.store.save(self.engine.step, lambda d: self.engine.save_checkpoint(d, state), state)

    # -- held-out evaluation -----------------------------------------------------------
    def _eval_due(self, version: int) -> bool:
        every = self.cfg.eval.every
        return bool(every) and version % every == 0

    def _evaluate(self, weights: dict) -> None:
        from astraflow.actors.common import make_rollout_engine, model_path, set_threads
        from astraflow.actors.evaluator import heldout_accuracy, heldout_problems

        version = self.engine.step
        if self.evaluator is None:
            from transformers import AutoTokenizer
            path = model_path(self.cfg)
            self.evaluator = (make_rollout_engine(self.cfg, path, kind="cpu"),
                              AutoTokenizer.from_pretrained(str(path)), heldout_problems(self.cfg))
        engine, tokenizer, problems = self.evaluator
        set_threads(self.cfg.eval.threads)
        try:
            engine.load_weights(weights, version)
            acc = heldout_accuracy(self.cfg, engine, tokenizer, problems)
        finally:
            set_threads(self.cfg.trainer.engine.threads)
        self.accuracy[version] = acc
        self.rows.append({"ts": time.time(), "component": f"eval.{self.cfg.policy}", "name": "eval.accuracy",
                          "value": acc, "step": version})
        self.say(f"v{version}: held-out accuracy {acc:.3f} ({len(problems)} problems x {self.cfg.eval.k})")

    # -- results ---------------------------------------------------------------------
    def summary(self, run_dir: Path, wall_s: float) -> dict:
        compared = [s for s in self.steps if s["status"] in ("match", "diverged")]
        matched = sum(1 for s in compared if s["status"] == "match")
        return {
            "job": self.cfg.job, "policy": self.cfg.policy, "config": self.cfg.source, "run_dir": str(run_dir),
            "mode": "what-if" if self.changes else "verify", "lineage": self.lineage_id, "changes": self.changes,
            "start_version": self.start_version, "branch_step": self.branch if self.changes else None,
            "steps_trained": getattr(self, "end_version", self.start_version),
            "steps_replayed": len(self.steps), "versions_compared": len(compared), "versions_matched": matched,
            "versions_unrecorded": sum(1 for s in self.steps if s["status"] == "unrecorded"),
            # Verify mode: every recorded version matched (None when none was left to compare).
            "bit_exact": (not self.failed and matched == len(compared)) if compared and not self.changes else None,
            "reproduced_recorded_history": not self.failed,
            "first_divergence": self.first_divergence,
            "accuracy_by_version": dict(sorted(self.accuracy.items())),
            "wall_s": round(wall_s, 2), "steps": self.steps,
        }

    def close(self) -> None:
        for e in (self.engine, self.evaluator[0] if self.evaluator else None):
            if e is not None:
                e.close()


def _open_checkpoint(path: Path):
    """A checkpoint store's newest checkpoint (a directory with ``LATEST``) or one ``step_N`` directory."""
    from astraflow.engines.checkpoints import Checkpoint
    if (path / "LATEST").exists():
        try:
            ckpt = CheckpointStore(path).latest()
        except CheckpointError as e:
            raise RecordError(str(e)) from None
        if ckpt is not None:
            return ckpt
    try:
        state = json.loads((path / "state.json").read_text())
    except (OSError, ValueError) as e:
        raise RecordError(f"--from-checkpoint {path}: not a checkpoint (no LATEST pointer and no readable "
                          f"state.json: {type(e).__name__})") from None
    return Checkpoint(int(state.get("step", -1)), path, state)

