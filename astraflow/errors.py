"""The error tree of a job: which failures are worth a restart and which must stop the job.

One base, :class:`AstraflowError`; every branch states ``retriable``. A *retriable*
failure depends on the world (broker unavailable, a timeout, a dead peer) and may pass
on the next try; a *fatal* one is deterministic (bad data, bad config, missing model):
the same input fails the same way, so restarting only buries the cause under retries.
Supervisors restart retriable failures and stop at once on fatal ones; a process that
stops on a fatal error exits with :data:`EXIT_FATAL` and prints the cause as its last
stderr line, so whoever launched it can tell "do not restart me" from "I crashed".

Exceptions outside the tree (kafka-python errors, ``OSError``, bugs) count as
retriable: bounded restarts with backoff are the right answer to a broker blip, and the
supervisor's give-up message still names the error.
"""

from __future__ import annotations

#: Exit status of a process stopped by a fatal (non-retriable) error; 1 stays "crashed".
EXIT_FATAL = 3


class AstraflowError(Exception):
    """Base of every error the project raises on purpose."""

    retriable: bool = False


class RetriableError(AstraflowError):
    """The world may change: a broker comes back, a peer restarts, a timeout passes."""

    retriable = True


class FatalError(AstraflowError):
    """Deterministic: trying again with the same input fails the same way."""

    retriable = False


class DataError(FatalError):
    """A dataset file or row is unusable; the message names the file and row (``path:line``)."""


class ModelError(FatalError):
    """The model path does not exist or does not hold a loadable model config."""


def fatal_cause(exc: BaseException) -> AstraflowError | None:
    """The fatal error behind ``exc`` (itself or a ``raise ... from`` cause), else None.

    The outermost classified error decides: a retriable wrapper around a fatal cause
    means someone judged that retrying can help. Only explicit causes count: an error
    raised *while handling* a fatal one (a broker blip while dead-lettering a bad row) is
    its own failure, not the bad row's.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, AstraflowError):
            return None if e.retriable else e
        e = e.__cause__
    return None


def one_line(exc: BaseException) -> str:
    """The error as one line (multi-line messages keep their first line)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def last_words_cause(line: str) -> str:
    """The cause a stopped process printed as its last line (``astraflow node X: fatal:
    CAUSE`` or ``astraflow: error: CAUSE`` -> ``CAUSE``); any other line as it is."""
    if line.startswith("astraflow"):
        for sep in (": fatal: ", ": error: "):
            if sep in line:
                return line.split(sep, 1)[1]
    return line
