"""Environments: the world an agent episode acts in, registered by name like workflows.

An environment is one small protocol (:class:`Environment`): ``reset(task) -> observation``,
``step(action) -> (observation, reward, done, info)``, ``close()``; each method may be plain
or ``async``. A module registers a factory with ``@environment("name")`` (a class or a
function taking the job's ``workflow.params.env_params`` as keywords), and the agent
workflow (:mod:`.agent`) makes one instance per sample of an episode. An environment knows
its task set and its observation format; it knows nothing about tokenizers, engines, Kafka
or training: actions and observations are text (or, for JSON tool calls, a mapping). A factory
may declare its commands as OpenAI tool schemas (a ``tools`` attribute): the agent
workflow's ``chat`` format gives them to a chat model's template.

:class:`EnvHandle` is how an episode talks to one instance: every call runs on the
instance's own daemon thread (an event loop, so ``async`` methods and plain ones alike),
bounded by a timeout. An environment that raises, hangs past its timeout or returns
something that is not the protocol's shape raises :class:`EnvironmentFailed` with a
``reason`` (``env_error``, ``env_timeout``, ``env_garbage``): that episode fails with it and
the node goes on. A hung in-process call cannot be killed; its thread is abandoned (a
daemon, so it never holds the process up) and the episode does not wait for it.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Protocol

from astraflow.errors import AstraflowError

__all__ = ["EnvTask", "Environment", "EnvironmentFailed", "EnvHandle", "environment", "get_environment",
           "ENVIRONMENTS", "retriable", "ENV_ERROR", "ENV_TIMEOUT", "ENV_GARBAGE"]

ENV_ERROR, ENV_TIMEOUT, ENV_GARBAGE = "env_error", "env_timeout", "env_garbage"


@dataclass(frozen=True)
class EnvTask:
    """What ``reset`` receives: one task of the job's data, for one sample of its group."""

    episode_id: str  #: the task id (stable across redeliveries)
    prompt: str  #: the task's prompt text
    answer: str
    metadata: Mapping[str, Any] = field(default_factory=dict)  #: the row's other columns
    sample: int = 0  #: which sample of the group this instance serves
    seed: int = 0  #: a seed of (job, task, sample), for environments that draw at random
    #: this try of the episode (unique per run: a redelivered episode has a new one); an
    #: out-of-process environment keys its sessions by it (:mod:`.http_env`)
    attempt: str = ""


class Environment(Protocol):
    """The protocol; any of its methods may be ``async def``."""

    def reset(self, task: EnvTask) -> str:
        """Start the task; return the first observation."""
        ...

    def step(self, action: Any) -> tuple[str, float, bool, Mapping[str, Any]]:
        """Apply one action (text, or a ``{"name", "arguments"}`` mapping for JSON tool
        calls); return ``(observation, reward, done, info)``."""
        ...

    def close(self) -> None:
        ...


class EnvironmentFailed(AstraflowError):
    """An environment raised, hung or answered outside the protocol; ``reason`` says which.

    Retriable when it hung or raised an error of the world (``OSError``, ``RuntimeError``, a
    timeout): the same task may pass on another try; an environment that answers garbage, or
    raises a ``ValueError``-like error on its input, fails the same way again.
    """

    def __init__(self, name: str, reason: str, detail: str, retriable: bool) -> None:
        super().__init__(f"environment {name!r}: {reason}: {detail}")
        self.name, self.reason, self.retriable = name, reason, retriable


ENVIRONMENTS: dict[str, Callable[..., Any]] = {}


def environment(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register an environment factory (a class, or a function returning an instance) under
    ``name``; it is called with ``workflow.params.env_params`` as keyword arguments."""
    def deco(factory):
        old = ENVIRONMENTS.get(name)
        if old is not None and old is not factory and (old.__module__, old.__qualname__) != \
                (factory.__module__, factory.__qualname__):
            raise ValueError(f"environment {name!r} registered twice")
        ENVIRONMENTS[name] = factory
        return factory
    return deco


def get_environment(name: str) -> Callable[..., Any]:
    """The factory registered as ``name`` so far; :func:`astraflow.workflows.api.get_environment`
    registers the shipped ones (``text_game``, ``search``, ``http``, ``openenv``) first."""
    if name not in ENVIRONMENTS:
        raise KeyError(f"unknown environment {name!r} (registered: {', '.join(sorted(ENVIRONMENTS)) or 'none'})")
    return ENVIRONMENTS[name]


#: what an environment raises on an input it cannot handle: the same task fails the same way
#: again (the episode runner's rule for workflows); anything else may pass on another try
_ON_ITS_INPUT = (ValueError, TypeError, LookupError, AttributeError, NameError, ArithmeticError, AssertionError,
                 NotImplementedError)


def retriable(e: BaseException) -> bool:
    """Whether another try of the same task may pass after ``e`` (the episode runner's rule)."""
    if isinstance(e, AstraflowError):
        return e.retriable
    return isinstance(e, OSError) or not isinstance(e, _ON_ITS_INPUT)


class EnvHandle:
    """One environment instance on a thread of its own; every call bounded by ``timeout_s``."""

    def __init__(self, name: str, factory: Callable[..., Any], params: Mapping[str, Any], timeout_s: float) -> None:
        self.name, self.timeout_s = name, float(timeout_s)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"env-{name}", daemon=True)
        self._thread.start()
        self._abandoned = False
        try:
            self.env = self._call("create", lambda: factory(**dict(params)), self.timeout_s)
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise

    def _call(self, what: str, fn: Callable[[], Any], timeout_s: float | None = None) -> Any:
        return self.wait(what, self.submit(what, fn), timeout_s)

    def submit(self, what: str, fn: Callable[[], Any]):
        """Start ``fn`` (plain or returning an awaitable) on the instance's thread; a future."""
        if self._abandoned:
            raise EnvironmentFailed(self.name, ENV_TIMEOUT, f"{what}: an earlier call is still hung", True)

        async def run():
            out = fn()
            return await out if inspect.isawaitable(out) else out
        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    def wait(self, what: str, future, timeout_s: float | None = None) -> Any:
        """The result of a :meth:`submit`, within ``timeout_s`` (default: the handle's)."""
        limit = self.timeout_s if timeout_s is None else max(0.0, timeout_s)
        try:
            return future.result(timeout=limit)
        except FutureTimeout:
            future.cancel()  # an async call is cancelled; a plain one runs on, abandoned
            self._abandoned = True
            raise EnvironmentFailed(self.name, ENV_TIMEOUT, f"{what} did not answer within {limit:.3g}s",
                                    True) from None
        except EnvironmentFailed:
            raise
        except Exception as e:  # noqa: BLE001 - the environment's own error, whatever it is
            raise EnvironmentFailed(self.name, ENV_ERROR, f"{what} raised {type(e).__name__}: {e}",
                                    retriable(e)) from e

    def reset(self, task: EnvTask, timeout_s: float | None = None) -> str:
        return self.checked_reset(self._call("reset", lambda: self.env.reset(task), timeout_s))

    def submit_reset(self, task: EnvTask):
        return self.submit("reset", lambda: self.env.reset(task))

    def checked_reset(self, obs: Any) -> str:
        """A reset's answer in the protocol's shape, or :class:`EnvironmentFailed` (garbage)."""
        if not isinstance(obs, str):
            raise EnvironmentFailed(self.name, ENV_GARBAGE, f"reset returned {type(obs).__name__}, not the "
                                                            f"observation text", False)
        return obs

    def step(self, action: Any, timeout_s: float | None = None) -> tuple[str, float, bool, dict]:
        return self.checked_step(self._call("step", lambda: self.env.step(action), timeout_s))

    def submit_step(self, action: Any):
        """Start a step (several instances' steps run at once); :meth:`wait` and
        :meth:`checked_step` finish it."""
        return self.submit("step", lambda: self.env.step(action))

    def checked_step(self, out: Any) -> tuple[str, float, bool, dict]:
        """A step's answer in the protocol's shape, or :class:`EnvironmentFailed` (garbage)."""
        if not isinstance(out, (tuple, list)) or len(out) != 4:
            raise EnvironmentFailed(self.name, ENV_GARBAGE, f"step returned {type(out).__name__} "
                                                            f"{str(out)[:60]!r}, not (observation, reward, done, "
                                                            f"info)", False)
        obs, reward, done, info = out
        if not isinstance(obs, str):
            raise EnvironmentFailed(self.name, ENV_GARBAGE, f"step's observation is {type(obs).__name__}, not text",
                                    False)
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise EnvironmentFailed(self.name, ENV_GARBAGE, f"step's reward is {reward!r:.40}, not a finite number",
                                    False)
        if not isinstance(done, bool):
            raise EnvironmentFailed(self.name, ENV_GARBAGE, f"step's done is {done!r:.40}, not a bool", False)
        if info is None:
            info = {}
        if not isinstance(info, Mapping):
            raise EnvironmentFailed(self.name, ENV_GARBAGE, f"step's info is {type(info).__name__}, not a mapping",
                                    False)
        return obs, float(reward), done, dict(info)

    def _cancel_and_stop(self) -> None:
        """On the loop: cancel what is left (a step of an episode that failed meanwhile), then stop."""
        for task in asyncio.all_tasks(self._loop):
            task.cancel()
        self._loop.call_soon(self._loop.stop)

    def close(self, timeout_s: float = 5.0) -> None:
        """Close the instance (bounded; a failing close is logged by the caller's choice, not
        raised) and stop its thread."""
        try:
            env = getattr(self, "env", None)
            if not self._abandoned and hasattr(env, "close"):
                self._call("close", env.close, timeout_s)
        except EnvironmentFailed:
            pass
        finally:
            self._loop.call_soon_threadsafe(self._cancel_and_stop)
            if not self._abandoned:
                self._thread.join(timeout=min(timeout_s, 1.0))  # (a neighbour's hung step may hold it)
                if not self._thread.is_alive():
                    self._loop.close()
