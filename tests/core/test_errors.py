"""Which errors are fatal: the tree's ``retriable`` flags and explicit causes decide."""

import pytest

from astraflow.config import ConfigError
from astraflow.errors import DataError, RetriableError, fatal_cause
from astraflow.topics.exceptions import ProduceError, TopicConfigMismatch


def _raised(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        return e
    raise AssertionError("nothing raised")


@pytest.mark.parametrize("error,fatal", [
    (DataError("d.jsonl:2: not JSON"), True),
    (ConfigError("job.yaml", "trainer.steps", "expected int"), True),
    (TopicConfigMismatch("af.x.prompts", "partitions", 1, 2), True),
    (ProduceError("not acknowledged"), False),
    (TimeoutError("broker did not answer"), False),  # outside the tree: retried with backoff
])
def test_classification(error, fatal):
    assert (fatal_cause(error) is error) is fatal


def test_explicit_cause_decides_and_handling_errors_do_not_inherit_it():
    bad = DataError("d.jsonl:2: not JSON")

    def wrapped():
        raise RuntimeError("loading prompts failed") from bad

    def while_handling():
        try:
            raise bad
        except DataError:
            raise ConnectionError("broker gone while dead-lettering")  # noqa: B904 - the point of the test

    def retriable_wrapper():
        raise RetriableError("will try a replica") from bad

    assert fatal_cause(_raised(wrapped)) is bad
    assert fatal_cause(_raised(while_handling)) is None
    assert fatal_cause(_raised(retriable_wrapper)) is None


def test_the_cause_is_read_back_from_a_stopped_process_last_line():
    from astraflow.errors import last_words_cause
    assert last_words_cause("astraflow node raas-0: fatal: examples/d.jsonl:2: not JSON") == "examples/d.jsonl:2: not JSON"
    assert last_words_cause("astraflow: error: unknown job x") == "unknown job x"
    assert last_words_cause("Traceback (most recent call last):") == "Traceback (most recent call last):"
    assert last_words_cause("") == ""
