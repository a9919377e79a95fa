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


def install_from_env() -> list[str]:
    """Install the handlers this process's environment asks for; returns their points."""
    installed = []
    if os.environ.get(HANG_IN_TXN):
        fault_points.install(fault_points.IN_TRANSACTION, hang_in_transaction)
        installed.append(fault_points.IN_TRANSACTION)
    return installed
