"""Named moments at which a test may make a component fail; nothing happens otherwise.

A chaos test can kill a process at any time, but some faults matter only at one precise
moment (a RaaS node dying while its transaction is open). Components mark such a moment
with :func:`reach`; a handler runs there only if one was installed for that point. This
module owns the points and the installing, not the faults: the chaos layer's handlers
(:mod:`astraflow.chaos.hooks`) are installed by the node process at start when a test asks
for them (``astraflow node`` calls :func:`astraflow.chaos.hooks.install_from_env`), so the
components never import test code and a production run installs nothing.
"""

from __future__ import annotations

from collections.abc import Callable

#: A RaaS node's transaction is open: its trajectories are sent, its task offsets not yet.
IN_TRANSACTION = "raas.in_transaction"
#: A RaaS node's engine is between two tokens of a call and asks for newer weights (rollout.partial).
BETWEEN_TOKENS = "raas.between_tokens"
POINTS = (IN_TRANSACTION, BETWEEN_TOKENS)

Handler = Callable[[str], None]  #: called with the node id at the point
_handlers: dict[str, Handler] = {}


def install(point: str, handler: Handler) -> None:
    """Run ``handler(node_id)`` whenever a component reaches ``point`` (one handler per point)."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; points: {', '.join(POINTS)}")
    _handlers[point] = handler


def uninstall(point: str) -> None:
    _handlers.pop(point, None)


def reach(point: str, node_id: str) -> None:
    """The component ``node_id`` is at ``point``: run its handler, if one is installed."""
    handler = _handlers.get(point)
    if handler is not None:
        handler(node_id)
