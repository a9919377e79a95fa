"""An environment written for OpenEnv with openenv-core's API alone (nothing of astraflow's),
served by openenv-core's own server (``create_app`` under uvicorn): what the ``openenv`` tests
run against.

``guess``: ``reset`` takes the job's row from its ``task`` keyword (the ``openenv`` adapter
sends it) and shows the prompt; each step's ``message`` is an answer: the right one ends the
episode with reward 1; a wrong one is answered "no." and the prompt, and the last try ends it
with reward 0. ``GET /live`` counts the environments open (made and not yet closed).

Run: ``python openenv_guess.py PORT [MAX_SESSIONS]``.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

TRIES = 2
_live = {"open": 0, "made": 0}
_lock = threading.Lock()


class GuessAction(Action):
    message: str = Field(..., description="the answer")


class GuessObservation(Observation):
    text: str = Field(default="", description="what the player sees")
    tries_left: int = Field(default=TRIES)


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.prompt, self.answer = "", ""
        with _lock:
            _live["open"] += 1
            _live["made"] += 1

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, task: Optional[dict] = None,
              **kwargs: Any) -> GuessObservation:
        task = task or {"prompt": "What is 1+1?", "answer": "2"}
        self.prompt, self.answer = task["prompt"], str(task["answer"]).strip()
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return GuessObservation(text=self.prompt, tries_left=TRIES, reward=0.0)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        right = action.message.strip() == self.answer
        left = TRIES - self._state.step_count
        if right or left <= 0:
            return GuessObservation(text="right" if right else "no", tries_left=left, done=True,
                                    reward=1.0 if right else 0.0)
        return GuessObservation(text=f"no. {self.prompt}", tries_left=left, reward=0.0)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        with _lock:
            _live["open"] -= 1


def make_app(max_sessions: int):
    app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess",
                     max_concurrent_envs=max_sessions)

    @app.get("/live")
    def live() -> dict:
        with _lock:
            return dict(_live)
    return app


if __name__ == "__main__":
    import uvicorn

    port, sessions = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 64
    uvicorn.run(make_app(sessions), host="127.0.0.1", port=port, log_level="warning")
