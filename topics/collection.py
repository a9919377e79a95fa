"""The garbage collector around decoding a polled batch.

A polled batch is tens of thousands of new containers that outlive the poll (2,000
trajectory records: ~50,000 lists, dicts and messages holding ~900,000 numbers). Collected
while they are made, they are traversed again and again: by the young collections every
700 of them, by the middle generation's, and by the full collections their growth sets
off, each of which walks every long-lived object of the process too. So
:class:`~.client.Consumer` parses and decodes what is already fetched with automatic
collection paused (:func:`pause`, :func:`resume`): never while it waits for the broker or
writes a dead letter.

Paused, the collector would still meet a large batch once, in the young collection that
the first allocation after :func:`resume` sets off: one traversal of every list, ~20 µs a
trajectory record, as much as decoding it. A batch is data its reader keeps for a while,
not young garbage, so a large one skips the young generations (:func:`sweep` before the
decode, ``promote`` on resume): the young generations are collected first, while they
hold only what was there before the poll (so no garbage of the application's is promoted
with it; a reader of large batches sweeps before kafka-python parses the fetch, so the
sweep does not traverse the fetched records either), and what the poll made then goes
straight to the oldest generation (``gc.freeze()`` then ``gc.unfreeze()``: two list
splices, no traversal), where full collections still meet it as they meet every
long-lived object. Of what the poll made, the records die as soon as they are decoded;
reference cycles among the rest (a refused record's error, the client's own) wait for
the next full collection instead of a young one. A process that froze objects itself (``gc.freeze()`` before a fork) is left as it
is: its freeze is not undone here. A collector the application disabled stays disabled.

It knows nothing about Kafka or messages: the consumer says when and how much.
"""

from __future__ import annotations

import gc

__all__ = ["PROMOTE_MIN_RECORDS", "pause", "resume", "sweep"]

#: Records a poll must hand out before its batch skips the young generations; below it the
#: one young collection costs less than the sweep before it (a few hundred objects).
PROMOTE_MIN_RECORDS = 256


def pause() -> bool:
    """Pause automatic collection; True if this call paused it (then :func:`resume` resumes
    it). No allocation here: one would set off the very collection this defers."""
    if gc.isenabled():
        gc.disable()
        return True
    return False


def sweep(paused: bool, records: int) -> bool:
    """Before decoding ``records`` fetched records with collection ``paused``: whether their
    batch is to skip the young generations (then pass ``promote=True`` to :func:`resume`);
    if so, the young generations are collected now, before the batch is made."""
    if not paused or records < PROMOTE_MIN_RECORDS or gc.get_freeze_count():
        return False
    gc.collect(1)
    return True


def resume(paused: bool, promote: bool = False) -> None:
    """Undo :func:`pause`; with ``promote``, first move what the decode made (all that is
    young now) to the oldest generation."""
    if not paused:
        return
    if promote and not gc.get_freeze_count():
        gc.freeze()
        gc.unfreeze()
    gc.enable()
