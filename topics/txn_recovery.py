"""Transactional requests that follow a coordinator to its new broker instead of being dropped.

kafka-python 3.0.12's producer loses a pending transactional request when the broker of the
coordinator it goes to has died; the request's result is then never answered, and
:meth:`~astraflow.topics.producer.Producer._await` gives up on the producer after
``max_block_ms`` (60 s). That is what made losing one broker of three stall rollout 75–83 s:
every RaaS node's ``TxnOffsetCommit`` went to the group coordinator on the dead broker,
hung for the full bound, and the supervisor restarted the actor. Two places drop it:

1. **A coordinator that is not ready.** The sender (``Sender._maybe_send_pending_request``)
   looks up the cached coordinator and asks ``client.await_ready(node)``; it was written for
   a client that answers ``False`` when the node cannot be reached, and then looks the
   coordinator up again and re-queues the request. kafka-python 3.0's ``KafkaNetClient``
   raises ``KafkaConnectionError`` instead; the sender's ``except`` branch schedules the
   lookup but, the target node being set already, never re-queues the request.
2. **A request that timed out on the client.** ``TxnRequestHandler.on_complete`` re-queues
   (after a coordinator lookup) only on ``KafkaConnectionError``; any other client-side
   failure of the request (``RequestTimedOutError`` from a connection closed on its request
   timeout, ``NodeNotReadyError``, ``KafkaTimeoutError``) is a *fatal* producer error,
   though the Java client treats a timed-out request like a disconnect and retries it.

:func:`install` fixes both without touching kafka-python's files:

1. the sender of every idempotent or transactional producer sees its network client
   through :class:`_SenderClient`, whose ``await_ready`` answers ``False`` for a node that
   cannot be reached (after the sender's retry backoff, so a coordinator still reported on
   the dead broker is not asked again in a tight loop), and whose ``send`` hands back a
   failed future (a disconnect: the transactional handler, or a produce request's batches,
   take their retry path) instead of raising; the sender's own not-ready branch then looks
   the coordinator up again and re-queues the request, as it was written to;
2. ``TxnRequestHandler.on_complete`` sees a retriable client-side failure (other than
   ``Cancelled``, which closing the client reports) as the disconnect it is: look up the
   coordinator, re-queue.

A re-queued ``TxnOffsetCommit`` goes to whichever broker ``FindCoordinator`` names once the
controller has moved the group's ``__consumer_offsets`` partition (``EndTxn``,
``AddOffsetsToTxn`` and ``AddPartitionsToTxn`` likewise to the new transaction
coordinator), under the same producer id and epoch: the transaction completes, no producer
is closed, no actor restarts. :mod:`astraflow.topics` installs this at import, only on the
kafka-python versions it was written against (:data:`SUPPORTED`; another version keeps its
stock behaviour, with a warning). ``ASTRAFLOW_KAFKA_STOCK_TXN=1`` keeps the stock behaviour
(``benchmarks/broker_loss.py --stock`` measures it).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

__all__ = ["SUPPORTED", "install", "installed", "uninstall"]

log = logging.getLogger(__name__)

SUPPORTED = ("3.0.12",)  #: kafka-python versions whose sender and transaction handlers this patches

_stock: dict[str, Any] = {}


class _SenderClient:
    """The producer's network client as its sender thread sees it (everything delegated,
    but a node that cannot be reached is ``False`` from :meth:`await_ready`, a failed future
    from :meth:`send`)."""

    __slots__ = ("_inner", "_backoff_s")

    def __init__(self, inner: Any, retry_backoff_ms: float) -> None:
        self._inner = inner
        self._backoff_s = retry_backoff_ms / 1000

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def await_ready(self, node_id, timeout_ms: int = 30000) -> bool:
        from kafka import errors

        try:
            return self._inner.await_ready(node_id, timeout_ms=timeout_ms)
        except (errors.KafkaConnectionError, errors.NodeNotReadyError, errors.UnknownBrokerIdError) as e:
            log.debug("node %s not ready for a transactional request (%s); looking its coordinator up again",
                      node_id, e)
            time.sleep(self._backoff_s)
            return False

    def send(self, node_id, request, **kwargs):
        from kafka import errors
        from kafka.future import Future

        try:
            return self._inner.send(node_id, request, **kwargs)
        except (errors.KafkaConnectionError, errors.NodeNotReadyError, errors.UnknownBrokerIdError) as e:
            return Future().failure(errors.KafkaConnectionError(f"node {node_id}: {type(e).__name__}: {e}"))


def _sender_init(stock):
    def __init__(self, client, metadata, accumulator, **configs):
        stock(self, client, metadata, accumulator, **configs)
        if self.config.get("transaction_manager") is not None:
            backoff_ms = self.config.get("retry_backoff_ms", configs.get("retry_backoff_ms", 100))
            self._client = _SenderClient(client, backoff_ms)

    __init__.__qualname__ = "astraflow_sender_init"
    return __init__


def _on_complete(stock):
    def on_complete(self, correlation_id, response_or_exc):
        from kafka import errors

        if (isinstance(response_or_exc, errors.RetriableError)
                and not isinstance(response_or_exc, (errors.KafkaConnectionError, errors.Cancelled))):
            log.info("transactional request %s failed on the client (%s: %s); retrying it like a disconnect",
                     type(self).__name__, type(response_or_exc).__name__, response_or_exc)
            response_or_exc = errors.KafkaConnectionError(f"{type(response_or_exc).__name__}: {response_or_exc}")
        return stock(self, correlation_id, response_or_exc)

    on_complete.__qualname__ = "astraflow_txn_on_complete"
    return on_complete


def install() -> bool:
    """Patch the sender and the transaction handlers (idempotent); False when kept stock.

    Producers created afterwards get the fix (a sender wraps its client when it is made).
    """
    if _stock:
        return True
    if os.environ.get("ASTRAFLOW_KAFKA_STOCK_TXN") == "1":
        return False
    import kafka
    from kafka.producer import sender, transaction_manager

    if kafka.__version__ not in SUPPORTED:
        log.warning("kafka-python %s: keeping its transactional request handling (astraflow's coordinator-loss "
                    "fix was written for %s); a dead coordinator's broker may stall transactions up to max_block_ms",
                    kafka.__version__, ", ".join(SUPPORTED))
        return False
    _stock["sender_init"] = sender.Sender.__dict__["__init__"]
    _stock["on_complete"] = transaction_manager.TxnRequestHandler.__dict__["on_complete"]
    sender.Sender.__init__ = _sender_init(_stock["sender_init"])
    transaction_manager.TxnRequestHandler.on_complete = _on_complete(_stock["on_complete"])
    return True


def installed() -> bool:
    """Whether the fix is in place."""
    return bool(_stock)


def uninstall() -> None:
    """Put kafka-python's own code back for producers created afterwards (benchmarks, tests)."""
    if not _stock:
        return
    from kafka.producer import sender, transaction_manager

    sender.Sender.__init__ = _stock.pop("sender_init")
    transaction_manager.TxnRequestHandler.on_complete = _stock.pop("on_complete")
