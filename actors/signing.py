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

The same holds for a policy's RaaS pool (``rollout.*``): its nodes sign the trajectory groups
they write (``<run dir>/keys/raas-<policy>.ed25519`` by default), and the dataflow
(:class:`GroupGate`) and the conservation audit count only groups the lead policy's pool
signed.

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

__all__ = ["with_run_keys", "unkeyed", "run_key_paths", "signer_for", "verifier_for", "trainer_keys", "group_signer_for",
           "group_verifier_for", "VersionGate", "GroupGate"]

log = logging.getLogger(__name__)


def run_key_paths(run_dir: str | Path, policy: str) -> tuple[Path, Path]:
    """Where a run keeps the key pair of ``policy`` when none is configured."""
    keys = Path(run_dir) / "keys"
    return keys / f"{policy}.ed25519", keys / f"{policy}.ed25519.pub"


#: The sections whose key pairs a run fills in: trainer (announcements), rollout (groups).
_KEYED = {"trainer": "", "rollout": "raas-"}


def with_run_keys(cfg: JobConfig, run_dir: str | Path) -> JobConfig:
    """``cfg`` with the run's own key pairs, created under ``run_dir/keys`` if absent, for every
    policy's trainer (``<policy>.ed25519``: its announcements) and RaaS pool
    (``raas-<policy>.ed25519``: its trajectory groups) that requires signatures and has no key
    configured."""
    for section, prefix in _KEYED.items():
        filled: dict[str, object] = {}
        for policy, sec in _unkeyed_sections(cfg, section):
            private, public = run_key_paths(run_dir, prefix + policy)
            if ensure_key_pair(private, public):
                log.info("policy %s: generated the %s signing key %s (key %s); readers check %s", policy, section,
                         private, key_id(load_public_key(public)), public)
            filled[policy] = dataclasses.replace(sec, signing_key=str(private.resolve()),
                                                 verify_key=str(public.resolve()))
        if filled:
            cfg = _with_sections(cfg, section, filled)
    return cfg


def unkeyed(cfg: JobConfig) -> list[str]:
    """The config keys (``trainer.signing_key``, ``policies.<p>.rollout.signing_key``) of every
    key pair :func:`with_run_keys` would make up in a run dir: fine where every component shares
    that run dir (one host), a job that never trains where hosts each have their own (each
    host's pair differs, so every reader on another host refuses what its writers sign)."""
    return [_key(cfg.view(policy), "signing_key", section) for section in _KEYED
            for policy, _ in _unkeyed_sections(cfg, section)]


def _unkeyed_sections(cfg: JobConfig, section: str):
    """(policy, its ``section``) for every policy whose ``section`` requires signatures and
    has no key configured."""
    for policy in cfg.policy_names:
        sec = getattr(cfg.view(policy), section)
        if sec.require_signatures and not (sec.signing_key or sec.verify_key):
            yield policy, sec


def _with_sections(cfg: JobConfig, section: str, filled: dict[str, object]) -> JobConfig:
    if not cfg.policies:
        return dataclasses.replace(cfg, **{section: filled[cfg.policy]})
    policies = {p: dataclasses.replace(pc, **{section: filled[p]}) if p in filled else pc
                for p, pc in cfg.policies.items()}
    # A policy's view carries its sections at the top level too.
    top = getattr(cfg, section)
    if top == getattr(cfg.policies[cfg.policy], section):
        top = filled.get(cfg.policy, top)
    return dataclasses.replace(cfg, policies=policies, **{section: top})


def _key(cfg: JobConfig, name: str, section: str = "trainer") -> str:
    return f"policies.{cfg.policy}.{section}.{name}" if cfg.policies else f"{section}.{name}"


def _path(cfg: JobConfig, value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_absolute() and cfg.source != "<dict>":
        path = Path(cfg.source).parent / path
    return path


def signer_for(cfg: JobConfig) -> AnnouncementSigner | None:
    """The signer of ``cfg.policy``'s announcements; None when signatures are not required
    and no key is configured."""
    return _signer(cfg, "trainer", "announcements")


def verifier_for(cfg: JobConfig) -> AnnouncementVerifier:
    """What a reader of ``cfg.policy``'s announcements checks them with."""
    return _verifier(cfg, "trainer", "the trainer's announcements", "this policy's announcements")


def group_signer_for(cfg: JobConfig) -> AnnouncementSigner | None:
    """The signer of the trajectory groups ``cfg.policy``'s RaaS nodes write (the pool's identity)."""
    return _signer(cfg, "rollout", "trajectory groups")


def group_verifier_for(cfg: JobConfig) -> AnnouncementVerifier:
    """What the dataflow and the audit check the groups of ``cfg.policy``'s pool with."""
    return _verifier(cfg, "rollout", "the RaaS nodes' groups", f"the groups of policy {cfg.policy}'s RaaS pool")


def _signer(cfg: JobConfig, section: str, what: str) -> AnnouncementSigner | None:
    sec = getattr(cfg, section)
    if sec.signing_key:
        return AnnouncementSigner(load_private_key(_path(cfg, sec.signing_key)))
    if sec.require_signatures:
        raise ConfigError(cfg.source, _key(cfg, "signing_key", section),
                          f"not set, and require_signatures is true: every reader would refuse these {what}. Set "
                          "it to an Ed25519 PEM private key (`openssl genpkey -algorithm ed25519 -out FILE`), "
                          "start the component with `astraflow run` / `astraflow node` (they create one in the "
                          "run dir), or set require_signatures: false")
    return None


def _verifier(cfg: JobConfig, section: str, checked: str, what: str) -> AnnouncementVerifier:
    sec = getattr(cfg, section)
    path = sec.verify_key or sec.signing_key
    if path:
        return AnnouncementVerifier(load_public_key(_path(cfg, path)), require=sec.require_signatures, what=what)
    if sec.require_signatures:
        raise ConfigError(cfg.source, _key(cfg, "verify_key", section),
                          f"not set (nor signing_key), and require_signatures is true: there is no key to check "
                          f"{checked} with. Set it to the signer's public key (PEM), start this component with "
                          "`astraflow run` / `astraflow node` and the run dir, or set require_signatures: false")
    return AnnouncementVerifier(None, require=False, what=what)


def trainer_keys(cfg: JobConfig) -> tuple[AnnouncementSigner | None, AnnouncementVerifier]:
    """The trainer's signer and the verifier of its own announced head; refuses a pair that
    disagrees (the readers would refuse everything it announces)."""
    signer, verifier = signer_for(cfg), verifier_for(cfg)
    if signer is not None and verifier.public_key is not None and signer.key_id != verifier.key_id:
        raise ConfigError(cfg.source, _key(cfg, "verify_key"),
                          f"names key {verifier.key_id}, but signing_key is key {signer.key_id}: the readers "
                          "would refuse every announcement; give the public half of signing_key")
    return signer, verifier


class _SignedGate:
    """What both gates share: check a delivered record's signature, and refuse a record that
    fails it once per record and process (a topic read again after a rebalance is not
    refused twice): dead-lettered with its coordinates and reason, counted in ``rejected`` and
    in the gate's metric, logged."""

    metric = ""  #: the dataflow metric a refusal counts in
    what = "record"  #: what the log line calls the record

    def __init__(self, dead_letters, metrics) -> None:
        self.dead_letters, self.metrics = dead_letters, metrics
        self.rejected: dict[str, int] = {}  #: by reason
        self._judged: dict[tuple[str, int], int] = {}  # (topic, partition) -> newest offset checked

    def _admits(self, d, verifier: AnnouncementVerifier, about: str, **labels) -> bool:
        from astraflow.topics.codec import encode
        from astraflow.weights.signing import SignatureError
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
            log.warning("dataflow: refusing the %s at %s[%d]@%d (%s): %s", self.what, d.topic, d.partition, d.offset,
                        about, e)
            try:
                value = encode(d.message)[0]
            except (TypeError, ValueError):
                value = b""
            self.dead_letters.put(d.topic, d.partition, d.offset, d.key.encode() if d.key is not None else None,
                                  value, d.headers, e)
            self.metrics.emit(self.metric, 1, reason=e.reason, **labels)
            return False


class VersionGate(_SignedGate):
    """The dataflow's check of what it reads on ``versions``: a record counts only when its
    policy's trainer signed it; any other is dead-lettered (once per record and process: the
    compacted topic is read again after every rebalance) and counted in
    ``dataflow.versions_rejected``, and the dataflow keeps the lineage it follows."""

    metric, what = "dataflow.versions_rejected", "announcement"

    def __init__(self, cfg: JobConfig, dead_letters, metrics) -> None:
        super().__init__(dead_letters, metrics)
        self.verifiers = {p: verifier_for(cfg.view(p)) for p in cfg.policy_names}

    def admits(self, d) -> bool:
        """Whether the delivered announcement ``d`` may move its policy's version; False for
        another job's policy too (nothing follows it)."""
        policy = d.message.policy
        verifier = self.verifiers.get(policy) if isinstance(policy, str) else None
        if verifier is None:
            return False
        return self._admits(d, verifier, f"policy {policy}", policy=policy)


class GroupGate(_SignedGate):
    """The dataflow's check of the trajectory groups it reads: a group counts only when the
    RaaS pool that runs the job's episodes (the lead policy's) signed it. Anyone else who can
    write to ``trajectories`` (a forger who read a task id on ``tasks.<p>``) is dead-lettered
    (once per record and process) and counted in ``dataflow.groups_rejected``; the forged
    group settles nothing, so the task's real group, from the node it went to, is the one
    that counts."""

    metric, what = "dataflow.groups_rejected", "trajectory group"

    def __init__(self, cfg: JobConfig, dead_letters, metrics) -> None:
        super().__init__(dead_letters, metrics)
        self.verifier = group_verifier_for(cfg.view(cfg.lead_policy))

    def admits(self, d) -> bool:
        if not self.verifier.checks:
            return True
        g = d.message
        return self._admits(d, self.verifier, f"task {getattr(g, 'task_id', '?')}, from {getattr(g, 'node_id', '?')!r}",
                            policy=getattr(g, "policy", ""))
