"""Which key signs a policy's announcements, and which key its readers check: from the job config.

Per policy (``trainer.*``, or ``policies.<p>.trainer.*``):

* ``signing_key`` — the trainer's Ed25519 private key (PEM);
* ``verify_key`` — the public key the RaaS nodes, the evaluator and the dataflow check
  against (default: the public half of ``signing_key``);
* ``require_signatures`` (default true) — readers refuse unsigned announcements. False
  accepts them too (a job written before signing, a test); with no key at all, nothing is
  checked.

With no key configured and signatures required, a process started with a run dir
(``astraflow run``, ``astraflow node``) uses ``<run dir>/keys/<policy>.ed25519`` and its
``.pub``, creating the pair if absent (:func:`with_run_keys`): every component of a run on
one host shares the run dir, so the demo needs no key setup. On several hosts, generate a
pair and configure it (the private key only on the trainer's host).

The cryptography is :mod:`astraflow.weights.signing`; this module only reads config.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from astraflow.config import JobConfig
from astraflow.typed_config import ConfigError
from astraflow.weights.signing import (AnnouncementSigner, AnnouncementVerifier, ensure_key_pair, key_id,
                                       load_private_key, load_public_key)

__all__ = ["with_run_keys", "run_key_paths", "signer_for", "verifier_for", "trainer_keys", "VersionGate"]

log = logging.getLogger(__name__)


def run_key_paths(run_dir: str | Path, policy: str) -> tuple[Path, Path]:
    """Where a run keeps the key pair of ``policy`` when none is configured."""
    keys = Path(run_dir) / "keys"
    return keys / f"{policy}.ed25519", keys / f"{policy}.ed25519.pub"


def with_run_keys(cfg: JobConfig, run_dir: str | Path) -> JobConfig:
    """``cfg`` with the run's own key pair for every policy that requires signatures and has no
    key configured (created under ``run_dir/keys`` if absent)."""
    filled: dict[str, object] = {}
    for policy in cfg.policy_names:
        trainer = cfg.view(policy).trainer
        if trainer.signing_key or trainer.verify_key or not trainer.require_signatures:
            continue
        private, public = run_key_paths(run_dir, policy)
        if ensure_key_pair(private, public):
            log.info("policy %s: generated the signing key %s (key %s); readers check %s", policy, private,
                     key_id(load_public_key(public)), public)
        filled[policy] = dataclasses.replace(trainer, signing_key=str(private.resolve()),
                                             verify_key=str(public.resolve()))
    if not filled:
        return cfg
    if not cfg.policies:
        return dataclasses.replace(cfg, trainer=filled[cfg.policy])
    policies = {p: dataclasses.replace(pc, trainer=filled[p]) if p in filled else pc
                for p, pc in cfg.policies.items()}
    # A policy's view carries its trainer section at the top level too.
    trainer = filled.get(cfg.policy, cfg.trainer) if cfg.trainer == cfg.policies[cfg.policy].trainer else cfg.trainer
    return dataclasses.replace(cfg, policies=policies, trainer=trainer)


def _key(cfg: JobConfig, name: str) -> str:
    return f"policies.{cfg.policy}.trainer.{name}" if cfg.policies else f"trainer.{name}"


def _path(cfg: JobConfig, value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_absolute() and cfg.source != "<dict>":
        path = Path(cfg.source).parent / path
    return path


def signer_for(cfg: JobConfig) -> AnnouncementSigner | None:
    """The signer of ``cfg.policy``'s announcements; None when signatures are not required
    and no key is configured."""
    t = cfg.trainer
    if t.signing_key:
        return AnnouncementSigner(load_private_key(_path(cfg, t.signing_key)))
    if t.require_signatures:
        raise ConfigError(cfg.source, _key(cfg, "signing_key"),
                          "not set, and require_signatures is true: every reader would refuse this trainer's "
                          "announcements. Set it to an Ed25519 PEM private key (`openssl genpkey -algorithm "
                          "ed25519 -out FILE`), start the trainer with `astraflow run` / `astraflow node` (they "
                          "create one in the run dir), or set require_signatures: false")
    return None


def verifier_for(cfg: JobConfig) -> AnnouncementVerifier:
    """What a reader of ``cfg.policy``'s announcements checks them with."""
    t = cfg.trainer
    path = t.verify_key or t.signing_key
    if path:
        return AnnouncementVerifier(load_public_key(_path(cfg, path)), require=t.require_signatures)
    if t.require_signatures:
        raise ConfigError(cfg.source, _key(cfg, "verify_key"),
                          "not set (nor signing_key), and require_signatures is true: there is no key to check "
                          "the trainer's announcements with. Set it to the trainer's public key (PEM), start "
                          "this component with `astraflow run` / `astraflow node` and the trainer's run dir, or "
                          "set require_signatures: false")
    return AnnouncementVerifier(None, require=False)


def trainer_keys(cfg: JobConfig) -> tuple[AnnouncementSigner | None, AnnouncementVerifier]:
    """The trainer's signer and the verifier of its own announced head; refuses a pair that
    disagrees (the readers would refuse everything it announces)."""
    signer, verifier = signer_for(cfg), verifier_for(cfg)
    if signer is not None and verifier.public_key is not None and signer.key_id != verifier.key_id:
        raise ConfigError(cfg.source, _key(cfg, "verify_key"),
                          f"names key {verifier.key_id}, but signing_key is key {signer.key_id}: the readers "
                          "would refuse every announcement; give the public half of signing_key")
    return signer, verifier


class VersionGate:
    """The dataflow's check of what it reads on ``versions``: a record counts only when its
    policy's trainer signed it; any other is dead-lettered (once per record and process: the
    compacted topic is read again after every rebalance) and counted in
    ``dataflow.versions_rejected``, and the dataflow keeps the lineage it follows."""

    def __init__(self, cfg: JobConfig, dead_letters, metrics) -> None:
        self.verifiers = {p: verifier_for(cfg.view(p)) for p in cfg.policy_names}
        self.dead_letters, self.metrics = dead_letters, metrics
        self.rejected: dict[str, int] = {}  #: by reason
        self._judged: dict[tuple[str, int], int] = {}  # (topic, partition) -> newest offset checked

    def admits(self, d) -> bool:
        """Whether the delivered announcement ``d`` may move its policy's version; False for
        another job's policy too (nothing follows it)."""
        from astraflow.topics.codec import encode
        from astraflow.weights.signing import SignatureError
        policy = d.message.policy
        verifier = self.verifiers.get(policy) if isinstance(policy, str) else None
        if verifier is None:
            return False
        tp = (d.topic, d.partition)
        seen = d.offset <= self._judged.get(tp, -1)  # read before this rebalance: handled then
        self._judged[tp] = max(d.offset, self._judged.get(tp, -1))
        try:
            verifier.check_message(d.topic, d.message, d.headers)
            return True
        except SignatureError as e:
            if seen:
                return False
            self.rejected[e.reason] = self.rejected.get(e.reason, 0) + 1
            log.warning("dataflow: refusing the announcement at %s[%d]@%d of policy %s: %s", d.topic, d.partition,
                        d.offset, policy, e)
            try:
                value = encode(d.message)[0]
            except (TypeError, ValueError):
                value = b""
            self.dead_letters.put(d.topic, d.partition, d.offset, d.key.encode() if d.key is not None else None,
                                  value, d.headers, e)
            self.metrics.emit("dataflow.versions_rejected", 1, policy=policy, reason=e.reason)
            return False
