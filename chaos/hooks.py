"""Test-only faults that land at one named moment of a component (:mod:`astraflow.actors.fault_points`).

A chaos test asks for a fault through the environment the node processes inherit; the
node process calls :func:`install_from_env` at start, which installs this module's
handler for that point. A handler acts only for the node its variable names, so the other
nodes of the same job (which inherit the same environment) run as usual.
"""

from __future__ import annotations

import logging
import os
import time

from astraflow.actors import fault_points

#: ``ASTRAFLOW_TEST_HANG_IN_TXN=<node id>``: that node blocks inside its first open transaction.
HANG_IN_TXN = "ASTRAFLOW_TEST_HANG_IN_TXN"
#: What the node logs as it starts to hang, so a test knows the transaction is open.
HANG_MARK = "chaos hook: hanging inside an open transaction"


def hang_in_transaction(node_id: str) -> None:
    """Block forever (until killed) when ``$ASTRAFLOW_TEST_HANG_IN_TXN`` names ``node_id``."""
    if os.environ.get(HANG_IN_TXN) != node_id:
        return
    logging.getLogger(__name__).warning("%s (%s)", HANG_MARK, node_id)
    while True:
        time.sleep(60)


#: ``ASTRAFLOW_TEST_SLOW_TOKENS=<node id or *>:<seconds>``: that node's engine (every node's with
#: ``*``) waits this long between two tokens of a call, so new versions land mid-generation
#: (partial rollouts) on a model that would otherwise finish its rows first.
SLOW_TOKENS = "ASTRAFLOW_TEST_SLOW_TOKENS"


def slow_tokens(node_id: str) -> None:
    who, _, seconds = os.environ.get(SLOW_TOKENS, "").rpartition(":")
    if who in ("*", node_id):
        time.sleep(float(seconds))


def install_from_env() -> list[str]:
    """Install the handlers this process's environment asks for; returns their points."""
    installed = []
    if os.environ.get(HANG_IN_TXN):
        fault_points.install(fault_points.IN_TRANSACTION, hang_in_transaction)
        installed.append(fault_points.IN_TRANSACTION)
    if os.environ.get(SLOW_TOKENS):
        fault_points.install(fault_points.BETWEEN_TOKENS, slow_tokens)
        installed.append(fault_points.BETWEEN_TOKENS)
    return installed
