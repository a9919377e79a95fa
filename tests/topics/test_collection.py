"""The garbage collector around a poll's decode (topics/collection.py): a large batch skips the
young generations, garbage made before it does not go along, and nothing of the application's
own collector settings (disabled, frozen objects) is changed."""

from __future__ import annotations

import gc
import weakref

from kafka import TopicPartition

from astraflow.topics import Prompt, collection


class Cycle:
    """A reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def _generation_of(obj) -> int | None:
    for generation in range(3):
        if any(o is obj for o in gc.get_objects(generation)):
            return generation
    return None


def test_a_large_batch_goes_to_the_oldest_generation_and_earlier_garbage_is_collected_first():
    gc.collect()
    dead = Cycle()
    gone = weakref.ref(dead)
    del dead  # young garbage the application left before the poll
    paused = collection.pause()
    try:
        assert paused and not gc.isenabled()
        promote = collection.sweep(paused, collection.PROMOTE_MIN_RECORDS)
        assert promote and gone() is None  # collected by the sweep, not promoted with the batch
        batch = [[i, [float(i)]] for i in range(1000)]
    finally:
        collection.resume(paused, promote)
    assert gc.isenabled()
    assert _generation_of(batch) == 2 and _generation_of(batch[500]) == 2


def test_a_small_batch_is_left_to_the_young_collections():
    gc.collect()
    paused = collection.pause()
    try:
        promote = collection.sweep(paused, collection.PROMOTE_MIN_RECORDS - 1)
        batch = [[i] for i in range(10)]
    finally:
        collection.resume(paused, promote)
    assert not promote
    assert _generation_of(batch) == 0


def test_objects_the_application_froze_stay_frozen_and_a_disabled_collector_stays_disabled():
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        paused = collection.pause()
        promote = collection.sweep(paused, 10_000)
        collection.resume(paused, promote)
        # neither unfrozen (0) nor frozen again (more); the worker's other threads may free a few
        # frozen objects by reference count meanwhile (a clean-clone run saw 62 of 659,976 go)
        assert not promote and 0.99 * frozen <= gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        paused = collection.pause()
        assert not paused and not collection.sweep(paused, 10_000)
        collection.resume(paused, True)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_polled_batches_of_many_records_are_handed_out_in_the_oldest_generation(job_topics, make_producer,
                                                                                make_consumer):
    """Through the consumer: a poll of more records than the threshold hands out messages the
    young collections never traverse, the first large poll (swept after the fetch) and the next
    (swept before it, predicted by the one before)."""
    topic = job_topics.prompts
    producer = make_producer()
    n = collection.PROMOTE_MIN_RECORDS + 44
    for i in range(2 * n):
        producer.send(topic, Prompt(f"p{i}", "q", "a"), partition=0)
    producer.flush()
    consumer = make_consumer(partitions=[TopicPartition(topic, 0)], max_poll_records=n)
    large = []
    for _ in range(20):  # the records were flushed first: a fetch of the log brings them all
        got = consumer.poll(5000)
        if len(got) >= collection.PROMOTE_MIN_RECORDS:
            assert _generation_of(got[-1].message) == 2 and gc.isenabled()
            large.append(len(got))
        if sum(large) >= 2 * collection.PROMOTE_MIN_RECORDS and len(large) >= 2:
            break
    assert len(large) >= 2, "the test needs two large polls"
