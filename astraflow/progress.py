"""The progress display of ``astraflow run`` / ``astraflow launch``: tqdm bars and one-line notes.

:func:`progress_bar` makes the bar (one for a one-policy job: versions trained, samples/s,
the last batch reward and the newest held-out accuracy; a :class:`MultiBar` of one per
policy otherwise, each at its own pace with its held-out role reward, the lead's with its
accuracy alone and the team reward and accuracy);
:func:`update_bar` brings it up to a :class:`~astraflow.run_outputs.RunState`; :func:`say`
prints a note when the display is on.

It only reads the run's state: it knows nothing of processes, the broker or the run
directory, and records nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from astraflow.config import JobConfig
    from astraflow.run_outputs import RunState


def progress_bar(cfg: JobConfig, enabled: bool):
    """The job's bar, or ``None`` when the display is off."""
    if not enabled:
        return None
    from tqdm import tqdm
    if len(cfg.policy_names) > 1:  # a bar per policy: each trains at its own pace
        return MultiBar({p: tqdm(total=cfg.view(p).trainer.steps, desc=f"{cfg.job} {p} versions", unit="v",
                                 mininterval=1.0, dynamic_ncols=True, position=i)
                         for i, p in enumerate(cfg.policy_names)})
    return tqdm(total=cfg.trainer.steps, desc=f"{cfg.job} [{cfg.mode}] versions", unit="v", mininterval=1.0,
                dynamic_ncols=True)


class MultiBar:
    """One progress bar per policy, updated and closed together."""

    def __init__(self, bars: dict) -> None:
        self.bars = bars

    def update_from(self, state: RunState) -> None:
        for p, bar in self.bars.items():
            done = state.trained_by.get(p, 0)
            if done > bar.n:
                bar.update(done - bar.n)
            post = {}
            if p in state.reward_by:
                post["reward"] = f"{state.reward_by[p]:.2f}"
            if p == state.lead and state.team:
                post["team"] = f"{state.team[-1][1]:.2f}"
            if p == state.lead and state.accuracy:
                v = max(state.accuracy)
                post["acc"] = f"{state.accuracy[v]:.3f}@v{v}"
            if p in state.policy_reward and state.policy_reward[p]:  # its held-out reward in the team
                v = max(state.policy_reward[p])
                post["eval"] = f"{state.policy_reward[p][v]:.3f}@v{v}"
            if p == state.lead and state.team_accuracy:
                v = max(state.team_accuracy)
                post["team_acc"] = f"{state.team_accuracy[v]:.3f}@v{v}"
            bar.set_postfix(post, refresh=False)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def update_bar(bar, state: RunState, started: float) -> None:
    if bar is None:
        return
    if isinstance(bar, MultiBar):
        bar.update_from(state)
        return
    if state.trained > bar.n:
        bar.update(state.trained - bar.n)
    post = {"samples/s": f"{state.samples / max(1e-9, time.time() - started):.1f}"}
    if state.reward is not None:
        post["reward"] = f"{state.reward:.2f}"
    if state.accuracy:
        v = max(state.accuracy)
        post["acc"] = f"{state.accuracy[v]:.3f}@v{v}"
    bar.set_postfix(post, refresh=False)


def say(enabled: bool, text: str) -> None:
    if enabled:
        print(text, flush=True)
