"""Test helpers for consumer groups on a real broker."""

from kafka.coordinator.base import MemberState


def settled(consumer) -> bool:
    """Whether our ``consumer`` (:class:`astraflow.topics.Consumer`) holds a settled member:
    a generation, stable, no rejoin pending, and assigned on the metadata it now has (a member
    that joined before its topic's metadata arrived rejoins once it does: a second generation)."""
    coordinator = consumer.raw._coordinator
    return (consumer.group_metadata().generation_id >= 0 and bool(consumer.assignment())
            and coordinator.state is MemberState.STABLE and not coordinator.need_rejoin()
            and bool(coordinator._assignment_snapshot)
            and coordinator._assignment_snapshot == coordinator._metadata_snapshot)


def settle(consumer, polls: int = 240, timeout_ms: int = 250) -> list:
    """Poll ``consumer`` until :func:`settled` (at most ``polls`` polls: 60 s, as a loaded machine
    running the suite on three workers has needed more than 20 s); the deliveries it polled,
    or an ``AssertionError`` when it never settled."""
    got: list = []
    for _ in range(polls):
        got += consumer.poll(timeout_ms)
        if settled(consumer):
            return got
    raise AssertionError(f"the consumer never settled in {polls} polls of {timeout_ms} ms")
