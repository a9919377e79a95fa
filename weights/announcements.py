"""The ``versions`` topic read back: which record is a policy's announcement, which is newest.

Both ends of weight transfer read announcements: the publisher once at start (the head it
resumes from or fences), a subscriber continuously (the head it moves to). This module owns
what they share: :func:`announcement_of` (a record is a policy's announcement, or it is
passed over, undecodable ones logged and dead-lettered), :func:`newer` (the order of
lineage epochs and versions) and :func:`read_latest_announcement` (the newest one on the
topic now, optionally only among the signed ones).

It knows nothing about payloads, chunks or tensors, and keeps no state: following the
topic is the subscriber's job.
"""

from __future__ import annotations

import logging
import time

from astraflow.topics import DeadLetters, TopicPartition, VersionAnnouncement
from astraflow.topics import security
from astraflow.topics.codec import decode
from astraflow.topics.exceptions import DecodeError

from .signing import AnnouncementVerifier, SignatureError

__all__ = ["announcement_of", "newer", "read_latest_announcement"]

log = logging.getLogger(__name__)


def read_latest_announcement(bootstrap_servers: str, versions_topic: str, policy: str,
                             timeout: float = 30.0,
                             verifier: AnnouncementVerifier | None = None,
                             security_setting: security.ClientSecurity | None = None) -> VersionAnnouncement | None:
    """The newest announcement of ``policy`` on the ``versions`` topic, or None (read with
    ``security_setting``, default the process's client setting).

    With ``verifier``, only announcements it accepts count (:mod:`.signing`); the others
    are logged and passed over, so a forged head cannot set the epoch a trainer resumes in.
    """
    tp = TopicPartition(versions_topic, 0)
    kc = security.consumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False,
                           client_id=f"astraflow-versions-{policy}", max_partition_fetch_bytes=8 * 1024 * 1024,
                           security=security_setting)
    latest: VersionAnnouncement | None = None
    try:
        kc.assign([tp])
        kc.seek_to_beginning(tp)
        end = kc.end_offsets([tp])[tp]
        deadline = time.monotonic() + timeout
        while kc.position(tp) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {versions_topic} up to offset {end} took over {timeout}s; "
                                   "is the broker reachable?")
            for r in kc.poll(timeout_ms=500).get(tp, []):
                ann = announcement_of(r, policy)
                if ann is not None and verifier is not None and not _verified(verifier, r, ann):
                    continue
                if ann is not None and (latest is None or newer(ann, latest)):
                    latest = ann
    finally:
        kc.close()
    return latest


def announcement_of(record, policy: str, dead_letters: DeadLetters | None = None) -> VersionAnnouncement | None:
    """The record's announcement if it is one for ``policy``; undecodable ones are logged and
    passed over, and dead-lettered when ``dead_letters`` is given."""
    if record.key is not None and record.key.decode("utf-8", "replace") != policy:
        return None
    try:
        msg = decode(record.value, record.headers)
    except DecodeError as e:
        log.warning("skipping undecodable record %s[%d]@%d: %s", record.topic, record.partition, record.offset, e)
        if dead_letters is not None:
            dead_letters.put(record.topic, record.partition, record.offset, record.key, record.value,
                             record.headers, e)
        return None
    return msg if isinstance(msg, VersionAnnouncement) and msg.policy == policy else None


def newer(a: VersionAnnouncement, b: VersionAnnouncement) -> bool:
    """Whether ``a`` is a newer head than ``b``."""
    # A newer epoch wins whatever its version (the fence); a snapshot version is announced
    # twice and the second (its own snapshot) is the newer head.
    return (a.epoch, a.version, a.snapshot_version) > (b.epoch, b.version, b.snapshot_version)


def _verified(verifier: AnnouncementVerifier, record, ann: VersionAnnouncement) -> bool:
    try:
        verifier.check(record.topic, record.value, record.headers)
    except SignatureError as e:
        log.warning("%s: passing over the announcement at %s[%d]@%d (version %s of epoch %s): %s", ann.policy,
                    record.topic, record.partition, record.offset, ann.version, ann.epoch, e)
        return False
    return True
