"""Noticing a group consumer that is stuck outside its group, by asking the broker.

Seen in CI (kafka-python 3.0.12, a loaded 2-core box): a RaaS node's task consumer kept
polling for minutes while the broker had no such group at all, and the client itself
reported a generation and a member id — so nothing the client says can be trusted to
reveal it. The group coordinator is the source of truth: :class:`MembershipWatch` asks it
(DescribeGroups) whether the consumer's member id is in its group whenever the client's own
view is suspicious (not a stable member for ``unsettled_s``) or the consumer has handed out
nothing for ``idle_s`` (a member the broker has dropped gets no records).
:meth:`MembershipWatch.renew` replaces the consumer when the broker does not list it; a fresh
consumer resumes from the committed offsets, so an owner that commits everything it handed
out before calling it loses nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from . import security
from .consumer import Consumer

log = logging.getLogger(__name__)


class MembershipWatch:
    """Says when a subscribed :class:`Consumer` should be recreated.

    ``check(consumer)`` is cheap while the consumer is a stable member that handed out
    records within ``idle_s``; otherwise it asks the broker, at most once per ``idle_s``,
    and returns the reason to recreate (``None`` when the broker lists the member, e.g. in
    a rebalance another member is holding up). ``member_of`` answers "is this member in this
    group?"; the default asks the cluster at ``bootstrap``.
    """

    def __init__(self, bootstrap: str, client_id: str, *, unsettled_s: float = 45.0, idle_s: float = 30.0,
                 member_of: Callable[[str, str], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.bootstrap, self.client_id = bootstrap, client_id
        self.unsettled_s, self.idle_s = unsettled_s, idle_s
        self._member_of = member_of or self._ask_broker
        self._clock = clock
        self._admin: KafkaAdminClient | None = None
        self._last_records = self._last_probe = clock()
        self.probes = 0
        self.renewals = 0  #: consumers replaced by :meth:`renew`

    def saw_records(self) -> None:
        """The consumer handed out records: it is fetching, no need to ask for a while."""
        self._last_records = self._clock()

    def reset(self) -> None:
        """A new consumer replaced the old one: start its clocks afresh."""
        self._last_records = self._last_probe = self._clock()

    def check(self, consumer: Consumer) -> str | None:
        now = self._clock()
        unsettled = consumer.seconds_outside_group()
        if unsettled <= self.unsettled_s and now - self._last_records <= self.idle_s:
            return None
        if now - self._last_probe < self.idle_s:
            return None
        self._last_probe = now
        meta = consumer.group_metadata()
        if not meta.member_id:
            return f"no member id after {unsettled:.0f} s" if unsettled > self.unsettled_s else None
        self.probes += 1
        try:
            known = self._member_of(meta.group_id, meta.member_id)
        except (KafkaError, OSError) as e:
            log.warning("%s: could not ask the broker about group %s: %s", self.client_id, meta.group_id, e)
            self._close_admin()
            # Cannot verify: act only on the client's own evidence of being stuck.
            return f"not a stable member for {unsettled:.0f} s (broker unreachable)" \
                if unsettled > self.unsettled_s else None
        if known:
            return None
        return (f"the broker does not list member {meta.member_id} (generation {meta.generation_id}, "
                f"{'not stable for %.0f s' % unsettled if unsettled else 'stable as far as the client knows'}, "
                f"nothing handed out for {now - self._last_records:.0f} s)")

    def renew(self, consumer: Consumer, make: Callable[[], Consumer]) -> Consumer:
        """``consumer`` while :meth:`check` finds nothing; otherwise it is closed and a new one
        from ``make`` is returned (the caller must have committed what it handed out)."""
        reason = self.check(consumer)
        if reason is None:
            return consumer
        self.renewals += 1
        log.warning("%s: consumer of group %s is stuck: %s; recreating it (renewal %d)", self.client_id,
                    consumer.group_metadata().group_id, reason, self.renewals)
        try:
            consumer.close()
        except Exception:  # noqa: BLE001 - a stuck client may fail to leave; the new one joins anyway
            log.warning("%s: closing the stuck consumer failed", self.client_id, exc_info=True)
        fresh = make()
        self.reset()
        return fresh

    def _ask_broker(self, group_id: str, member_id: str) -> bool:
        if self._admin is None:
            self._admin = security.admin(bootstrap_servers=self.bootstrap, client_id=f"{self.client_id}.watch",
                                         request_timeout_ms=10_000)
        desc = self._admin.describe_groups([group_id]).get(group_id) or {}
        return any(m.get("member_id") == member_id for m in desc.get("members") or ())

    def _close_admin(self) -> None:
        if self._admin is not None:
            try:
                self._admin.close()
            except Exception:  # noqa: BLE001 - best effort on a client already in trouble
                pass
            self._admin = None

    def close(self) -> None:
        self._close_admin()
