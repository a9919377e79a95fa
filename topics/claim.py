"""An exclusive claim held on a Kafka cluster for as long as its holder lives.

One process at a time may run a given service against a cluster (a region's MirrorMaker 2:
two would each restart, report and stop it, and their copies would land in the same topics);
the processes may run on different hosts, so a local lock file cannot see the other. The claim
is **consumer-group membership** on the cluster itself:

* a group per claim (``group``) subscribed to one single-partition topic (:data:`CLAIM_TOPIC`,
  nothing is ever written to it); the member assigned its partition 0 holds the claim;
* the ``sticky`` assignor keeps that partition with its owner across rebalances, so a newcomer
  that joins while the holder lives is assigned nothing: it leaves and is refused, with the
  holder's identity (client id ``<name>@<host>:<pid>``, and the address the broker sees);
* the holder's membership lives by its heartbeats (a thread of this object polls, not an actor:
  the claim is taken before any supervisor starts, and must keep heartbeating while its owner
  blocks, e.g. on a MirrorMaker start-up of minutes): a holder
  that exits leaves the group at once, one that is SIGKILLed or cut off is expelled by the
  coordinator after ``session_timeout_ms``, and the next claimant gets the partition then. A
  claimant therefore waits up to ``wait_s`` (default: a session timeout and a margin) before it
  is refused, which is what makes "restart after a crash" work without anyone clearing a lock;
* a holder whose membership the coordinator expired (paused longer than its session) loses the
  partition to whoever claims next: :attr:`ExclusiveClaim.lost` is set and its owner must stop;
* a failed poll (a request timed out on a loaded broker) is retried: only failures lasting a whole
  session end the holder's claim (it must then assume it was expelled).

This module knows Kafka groups; nothing of what the claim protects.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass

from kafka import TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from kafka.errors import KafkaError

from . import security
from .exceptions import TopicsError
from .registry import DAY_MS, TopicSpec, ensure_topics

__all__ = ["CLAIM_TOPIC", "ClaimHolder", "ClaimRefused", "ExclusiveClaim"]

#: The topic every claim's group subscribes to (one partition; no record is ever written).
CLAIM_TOPIC = "astraflow.claims"
SESSION_TIMEOUT_MS = 10_000

log = logging.getLogger(__name__)


class ClaimRefused(TopicsError):
    """Another live process holds the claim; ``holders`` says who (client id, host, broker-seen address)."""

    def __init__(self, message: str, holders: list["ClaimHolder"]) -> None:
        super().__init__(message)
        self.holders = holders


@dataclass(frozen=True)
class ClaimHolder:
    """A member of a claim's group as the coordinator describes it."""

    client_id: str  #: ``<name>@<host>:<pid>`` for an :class:`ExclusiveClaim`
    address: str  #: where the broker sees the member's connection from
    holds: bool = False  #: assigned the claim's partition (as the group's last completed rebalance says)

    def describe(self) -> str:
        name, _, where = self.client_id.rpartition("@")
        host, _, pid = where.rpartition(":")
        if name and host and pid.isdigit():
            return f"{name} pid {pid} on host {host} (connected from {self.address})"
        return f"client {self.client_id!r} (connected from {self.address})"


class _Listener(ConsumerRebalanceListener):
    def __init__(self, claim: "ExclusiveClaim") -> None:
        self.claim = claim

    def on_partitions_revoked(self, revoked) -> None:  # eager: every rebalance; the outcome is what counts
        pass

    def on_partitions_assigned(self, assigned) -> None:
        self.claim._joined(TopicPartition(CLAIM_TOPIC, 0) in set(assigned))


class ExclusiveClaim:
    """Hold the claim ``group`` on ``bootstrap`` while this object is open.

    Args:
        bootstrap: the cluster the claim lives on.
        group: the claim's identity (a consumer group id).
        name: what the holder is, for the refusal message (e.g. ``astraflow mirror eu-west``).
        security_setting: the clients' setting on that cluster (default: the process's).
        wait_s: how long :meth:`acquire` waits for its join to complete (a dead holder's claim to
            lapse) before refusing (default: the session timeout + 15 s).
    """

    def __init__(self, bootstrap: str, group: str, name: str, *, security_setting: security.ClientSecurity | None = None,
                 session_timeout_ms: int = SESSION_TIMEOUT_MS, wait_s: float | None = None) -> None:
        self.bootstrap, self.group, self.name = bootstrap, group, name
        self.security = security_setting
        self.session_timeout_ms = session_timeout_ms
        self.wait_s = wait_s if wait_s is not None else session_timeout_ms / 1000 + 15
        self.client_id = f"{name.replace(' ', '-')}@{socket.gethostname()}:{os.getpid()}"
        self.lost = threading.Event()  #: set when a held claim is taken away (this member was expelled)
        self._held = False
        self._outcome = threading.Event()  #: the first completed join (held or not)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self._held and not self.lost.is_set()

    def _joined(self, holds: bool) -> None:
        if self._held and not holds:
            self.lost.set()
        self._held = self._held or holds
        # A live holder keeps the partition (sticky); while a dead holder's membership has not
        # lapsed, the coordinator holds our join back. acquire() looks at each completed join.
        self._outcome.set()

    def acquire(self) -> "ExclusiveClaim":
        """Join the claim's group; return once this process holds the claim, or raise
        :class:`ClaimRefused` naming the holder when another member holds it (after at most
        ``wait_s``: a dead holder's membership lapses first, then the claim is this one's)."""
        ensure_topics(self.bootstrap, [TopicSpec(CLAIM_TOPIC, partitions=1, retention_ms=DAY_MS)],
                      security_setting=self.security)
        deadline = time.monotonic() + self.wait_s
        self._thread = threading.Thread(target=self._run, name=f"claim-{self.group}", daemon=True)
        self._thread.start()
        holders: list[ClaimHolder] = []
        while True:
            self._outcome.wait(max(0.0, deadline - time.monotonic()))
            if self.held:
                return self
            if self._error is not None or time.monotonic() >= deadline:
                break
            self._outcome.clear()
            # A join without the partition: another member holds it, or the assignment was made
            # before the claim topic's metadata was known (a rejoin follows): ask the coordinator
            # (which reports assignments only once the group is stable again: ask for a while).
            holders = [h for h in self._settled_holders(min(3.0, max(0.0, deadline - time.monotonic()))) if h.holds]
            if self.held:  # the rejoin that followed gave this claimant the partition while it asked
                return self
            if holders:
                break
        self.release()
        if self._error is not None:
            raise TopicsError(f"claim {self.group} on {self.bootstrap}: {self._error}") from self._error
        holders = holders or self._settled_holders(5.0)  # this claimant has left the group now
        who = "; ".join(h.describe() for h in holders) or "another member (the group was rebalancing)"
        raise ClaimRefused(f"{self.name} already runs: {who} holds claim {self.group!r} on {self.bootstrap}; stop "
                           f"it first (a holder that died releases it within {self.session_timeout_ms / 1000:.0f} s)",
                           holders)

    def _run(self) -> None:
        try:
            consumer = security.consumer(bootstrap_servers=self.bootstrap, group_id=self.group,
                                         client_id=self.client_id, enable_auto_commit=False,
                                         partition_assignment_strategy=(StickyPartitionAssignor,),
                                         session_timeout_ms=self.session_timeout_ms,
                                         heartbeat_interval_ms=max(1000, self.session_timeout_ms // 4),
                                         security=self.security)
        except BaseException as e:  # noqa: BLE001 - reported by acquire()
            self._error = e
            self._outcome.set()
            return
        try:
            consumer.partitions_for_topic(CLAIM_TOPIC)  # known before the first assignment is made
            consumer.subscribe([CLAIM_TOPIC], listener=_Listener(self))
            failing_since: float | None = None
            while not self._stop.is_set():
                try:
                    self._poll(consumer)
                    failing_since = None
                except KafkaError as e:
                    # A transient failure (a request timed out on a loaded broker, the coordinator
                    # moved) does not end the membership: the coordinator expels a member only after
                    # a session without heartbeats, and a rejoin that finds the partition gone sets
                    # `lost`. Keep polling until failures have lasted a whole session; then this
                    # holder must assume it was expelled. (Giving up at the first one left the
                    # group, and a live holder's claim passed to the next claimant.)
                    now = time.monotonic()
                    failing_since = failing_since if failing_since is not None else now
                    if now - failing_since >= self.session_timeout_ms / 1000:
                        raise
                    log.warning("claim %s: poll failed (%s: %s); retrying", self.group, type(e).__name__, e)
                    self._stop.wait(0.5)
        except BaseException as e:  # noqa: BLE001 - a holder that cannot poll may be expelled: say so
            self._error = e
            if self._held:
                self.lost.set()
            self._outcome.set()
        finally:
            consumer.close()  # leaves the group: the next claimant gets the partition at once

    def _poll(self, consumer) -> None:
        consumer.poll(timeout_ms=300)  # heartbeats, rebalances; the topic holds no record

    def holders(self) -> list[ClaimHolder]:
        """The group's members now (empty when none; call it once this claimant left the group)."""
        admin = security.admin(bootstrap_servers=self.bootstrap, client_id=f"{self.client_id}.describe",
                               security=self.security)
        try:
            desc = admin.describe_groups([self.group]).get(self.group) or {}
        finally:
            admin.close()
        out = []
        for m in desc.get("members") or ():
            assigned = (m.get("member_assignment") or {}).get("assigned_partitions") or ()
            holds = any(a.get("topic") == CLAIM_TOPIC and 0 in (a.get("partitions") or ()) for a in assigned)
            out.append(ClaimHolder(str(m.get("client_id")), str(m.get("client_host", "?")).lstrip("/"), holds))
        return out

    def _settled_holders(self, settle_s: float) -> list[ClaimHolder]:
        """The member holding the claim, asked for up to ``settle_s``: while the group rebalances
        (a member joined or left) the coordinator reports members without their assignments. If
        none is seen holding it by then, every member as it is (the holder is among them)."""
        deadline = time.monotonic() + settle_s
        while True:
            members = self.holders()
            holding = [h for h in members if h.holds]
            if holding or time.monotonic() >= deadline:
                return holding or members
            time.sleep(0.5)

    def release(self) -> None:
        """Leave the group (the claim passes to the next claimant at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self._held = False

    def __enter__(self) -> "ExclusiveClaim":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
