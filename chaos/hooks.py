"""Test-only fault hooks that components call at the one point where a fault must land.

A chaos test can kill a process at any time, but some faults matter only at a precise
moment (a RaaS node dying while its transaction is open). A hook does nothing unless its
environment variable names the calling node, so production runs never reach the fault.
"""

from __future__ import annotations

import logging
import os
import time

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
