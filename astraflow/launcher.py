"""``astraflow run CONFIG``: one job on one machine, each component its own OS process.

Starts the embedded broker (unless ``--bootstrap-servers``), makes sure the model and the
job's topics exist, then starts the dataflow, the trainer and the RaaS node(s) as
``astraflow node`` processes that talk only through Kafka. It follows the ``metrics``
topic for the progress bar, restarts a component process that dies unexpectedly (its
work is redelivered by Kafka), and when training and the final evaluation are done
stops everything and writes the run directory: ``summary.json``, ``metrics.jsonl``,
``metrics.csv``, ``plot.png``, ``logs/`` and ``traces/``. A component that exits with
:data:`~astraflow.errors.EXIT_FATAL` (bad data, bad config, missing model) is not
restarted: the job stops at once and :class:`RunFailed` carries the cause, the last
line the component wrote.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kafka import TopicPartition

from astraflow.config import JobConfig
from astraflow.errors import EXIT_FATAL, AstraflowError


class RunFailed(AstraflowError):
    """A job stopped before finishing; the message is the cause, as one line."""

    def __init__(self, cause: str, *, node_id: str | None = None, log_path: Path | None = None,
                 retriable: bool = True) -> None:
        self.cause, self.node_id, self.log_path, self.retriable = cause, node_id, log_path, retriable
        super().__init__(f"{node_id}: {cause}" if node_id else cause)


@dataclass
class Proc:
    role: str
    node_id: str
    cmd: list[str]
    log_path: Path
    popen: subprocess.Popen | None = None
    restarts: int = 0
    done: bool = False
    policy: str = ""  #: the policy a trainer / RaaS node serves ("" for the dataflow and one-policy jobs)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=component_env())
        log.close()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def last_line(self) -> str:
        """The last line the process wrote: ``astraflow node`` ends with its cause of exit there."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, 2) - 8192))
                lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1].strip() if lines else ""


#: torch.distributed's placement variables. A process that trained in-process (a test, a
#: benchmark) holds its own; a component inheriting them would take itself for a rank of
#: that world (a trainer group agent would not start its ranks, a trainer would reuse a
#: bound port). Components are placed only by their own group agent.
_TORCH_PLACEMENT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def component_env() -> dict[str, str]:
    """This process's environment without torch's placement variables (see above)."""
    return {k: v for k, v in os.environ.items() if k not in _TORCH_PLACEMENT and not k.startswith("TORCHELASTIC_")}


@dataclass
class RunState:
    rows: list[dict] = field(default_factory=list)
    trained: int = 0
    accuracy: dict[int, float] = field(default_factory=dict)
    samples: float = 0.0
    reward: float | None = None
    trained_by: dict[str, int] = field(default_factory=dict)  #: policy -> newest trained step
    reward_by: dict[str, float] = field(default_factory=dict)
    team: list[tuple[int, float]] = field(default_factory=list)  #: (lead step, team reward of its batch)
    lead: str = ""
    team_accuracy: dict[int, float] = field(default_factory=dict)  #: lead version -> held-out team accuracy


def node_command(role: str, cfg: JobConfig, bootstrap: str, run_dir: Path, node_id: str,
                 overrides: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "astraflow", "node", "--role", role, "--config", cfg.source,
           "--bootstrap-servers", bootstrap, "--run-dir", str(run_dir), "--node-id", node_id]
    if len(cfg.policy_names) > 1 and role != "dataflow":
        cmd += ["--policy", cfg.policy]
    for o in overrides:
        cmd += ["--set", o]
    return cmd


def run_job(cfg: JobConfig, *, bootstrap: str | None = None, overrides: list[str] | None = None,
            run_dir: str | Path | None = None, progress: bool = True, max_restarts: int = 3,
            timeout_s: float | None = None, extension=None) -> dict:
    """Run the job to completion; returns the summary (also written to the run directory).

    ``extension`` (``astraflow launch``'s :class:`~astraflow.topology.launch.TopologyRun`)
    replaces the job config's processes with its own (``processes``), runs beside them
    (``running``, a context entered once they have started), is ticked by this loop (``tick``:
    the one thread that owns the process list) and adds to the summary (``summary``). With the
    embedded broker, its ``broker_setup(broker)`` context is entered before the broker starts
    (it may add ``server.properties`` to ``broker.extra``, e.g. the listeners of emulated WAN
    links) and exited after the broker stops."""
    from astraflow.actors.common import model_path
    from astraflow.topics import Consumer, EmbeddedBroker, ensure_topics, job_topics

    overrides = list(overrides or [])
    run_dir = Path(run_dir or Path(cfg.run_dir) / f"{cfg.job}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    state = RunState(lead=cfg.lead_policy)
    started = time.time()
    from astraflow.checks import check_data, check_model
    # Bad data or a missing model fail here in seconds, before any process starts; the
    # components still stop fatally on their own (`astraflow node` runs without us too).
    for policy in cfg.policy_names:
        check_model(cfg.view(policy))
    check_data(cfg)
    with contextlib.ExitStack() as stack:
        if bootstrap is None:
            _say(progress, "starting the embedded Kafka broker ...")
            broker = EmbeddedBroker(run_dir / "kafka")
            if extension is not None:
                stack.enter_context(extension.broker_setup(broker))
            broker = stack.enter_context(_broker(broker))
            bootstrap = broker.bootstrap_servers
        for policy in cfg.policy_names:  # builds a missing tiny model once, before any process needs it
            path = model_path(cfg.view(policy))
            _say(progress, f"model: {path}" if len(cfg.policy_names) == 1 else f"model of {policy}: {path}")
        topics = job_topics(cfg)
        ensure_topics(bootstrap, topics.specs())
        if extension is not None:
            procs = extension.processes(bootstrap, run_dir)
        else:
            procs = default_processes(cfg, run_dir)
        for p in procs:
            p.cmd = p.cmd or node_command(p.role, cfg.view(p.policy) if p.policy else cfg, bootstrap, run_dir,
                                          p.node_id, overrides)
            p.start()
        stack.callback(stop_processes, procs)
        if extension is not None:
            stack.enter_context(extension.running(bootstrap, run_dir, procs))
        metrics = stack.enter_context(Consumer(bootstrap, partitions=[TopicPartition(topics.metrics, 0)],
                                               client_id="launcher"))
        metrics.raw.seek_to_beginning()
        bar = _progress_bar(cfg, progress)
        stop = {"now": False}
        previous = signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
        stack.callback(signal.signal, signal.SIGINT, previous)
        _say(progress, f"run dir: {run_dir}  (logs in {run_dir / 'logs'})")
        interrupted, error = False, None
        while True:
            for d in metrics.poll(500):
                _record(state, d.message)
            _update_bar(bar, state, started)
            error = (extension.tick(procs) if extension is not None else None) or _supervise(procs, max_restarts,
                                                                                              progress)
            finished = all(p.done for p in procs if p.role in ("trainer", "dataflow"))
            if finished or error:
                break
            if stop["now"]:
                interrupted = True
                break
            if timeout_s and time.time() - started > timeout_s:
                error = RunFailed(f"run exceeded its {timeout_s:.0f}s timeout")
                break
        for d in metrics.poll(200):
            _record(state, d.message)
        if bar is not None:
            _update_bar(bar, state, started)
            bar.close()
    summary = _write_outputs(run_dir, cfg, state, started, procs, interrupted, str(error) if error else None,
                             extension.summary() if extension is not None else None)
    if error:
        raise error
    return summary


def default_processes(cfg: JobConfig, run_dir: Path) -> list[Proc]:
    """One dataflow; per policy a trainer and ``rollout.nodes`` RaaS nodes (one policy: the
    names ``trainer``, ``raas-<i>``; several: ``trainer-<p>``, ``raas-<p>-<i>``)."""
    procs = [Proc("dataflow", "dataflow", [], run_dir / "logs" / "dataflow.log")]
    multi = len(cfg.policy_names) > 1
    for policy in cfg.policy_names:
        view, tag = cfg.view(policy), f"-{policy}" if multi else ""
        procs.append(Proc("trainer", f"trainer{tag}", [], run_dir / "logs" / f"trainer{tag}.log",
                          policy=policy if multi else ""))
        procs += [Proc("raas", f"raas{tag}-{i}", [], run_dir / "logs" / f"raas{tag}-{i}.log", policy=policy if multi else "")
                  for i in range(view.rollout.nodes)]
    return procs


@contextlib.contextmanager
def _broker(broker):
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _supervise(procs: list[Proc], max_restarts: int, progress: bool) -> RunFailed | None:
    """Restart crashed components; the failure that ends the run, if any."""
    for p in procs:
        if p.done or p.alive():
            continue
        code = p.popen.returncode
        if code == 0 and p.role in ("trainer", "dataflow"):
            p.done = True
            continue
        if code == EXIT_FATAL:
            _say(progress, f"{p.node_id} stopped with a fatal error; stopping the job")
            return RunFailed(_cause(p.last_line()), node_id=p.node_id, log_path=p.log_path, retriable=False)
        if p.restarts >= max_restarts:
            return RunFailed(f"exited with code {code} {p.restarts + 1} times; last words: {p.last_line()}",
                             node_id=p.node_id, log_path=p.log_path)
        p.restarts += 1
        _say(progress, f"{p.node_id} exited with code {code}; restarting ({p.restarts}/{max_restarts})")
        p.start()
    return None


def _cause(line: str) -> str:
    """``astraflow node X: fatal: CAUSE`` or ``astraflow: error: CAUSE`` → ``CAUSE``; other lines as they are."""
    if line.startswith("astraflow"):
        for sep in (": fatal: ", ": error: "):
            if sep in line:
                return line.split(sep, 1)[1]
    return line or "no output (see its log)"


def stop_processes(procs: list[Proc], timeout: float = 30.0) -> None:
    """SIGTERM every running component, wait up to ``timeout`` for all, SIGKILL what is left.

    A process already asked to stop (``done`` and still alive: a node the autoscaler retired,
    finishing its in-flight tasks) is waited for, not signalled again: a second SIGTERM that
    lands while its interpreter shuts down, after Python has put the default handler back,
    kills it (exit -15) instead of letting it leave cleanly."""
    for p in procs:
        if p.alive() and not p.done:
            p.popen.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        if p.popen is None:
            continue
        try:
            p.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait()


def _record(state: RunState, m) -> None:
    from astraflow.topics import Metric
    if not isinstance(m, Metric):
        return
    state.rows.append({"ts": m.ts, "component": m.component, "name": m.name, "value": m.value, "step": m.step,
                       **{f"label.{k}": v for k, v in m.labels.items()}})
    policy = m.component.split(".", 1)[1] if m.component.startswith("trainer.") else ""
    if m.name == "trainer.samples":
        state.trained = max(state.trained, m.step)
        state.trained_by[policy] = max(state.trained_by.get(policy, 0), m.step)
        state.samples += m.value
    elif m.name == "trainer.reward":
        state.reward = m.value
        state.reward_by[policy] = m.value
    elif m.name == "dataflow.team_reward" and m.labels.get("policy") in (None, state.lead):
        state.team.append((m.step, m.value))
    elif m.name == "eval.accuracy":
        state.accuracy[m.step] = m.value
    elif m.name == "eval.team_accuracy":
        state.team_accuracy[m.step] = m.value


def _progress_bar(cfg: JobConfig, enabled: bool):
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
            if p == state.lead and state.team_accuracy:
                v = max(state.team_accuracy)
                post["team_acc"] = f"{state.team_accuracy[v]:.3f}@v{v}"
            bar.set_postfix(post, refresh=False)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def _update_bar(bar, state: RunState, started: float) -> None:
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


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(text, flush=True)


def _write_outputs(run_dir: Path, cfg: JobConfig, state: RunState, started: float, procs: list[Proc],
                   interrupted: bool, error: str | None, extra: dict | None = None) -> dict:
    rows = sorted(state.rows, key=lambda r: r["ts"])
    with open(run_dir / "metrics.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("ts", "component", "name", "value", "step"), k))
    with open(run_dir / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys or ["ts"])
        w.writeheader()
        w.writerows(rows)
    steps = sorted({r["step"] for r in rows if r["name"] == "trainer.train_s"})
    first = [r for r in rows if r["name"] == "trainer.train_s" and r["step"] == 1]
    def total(name: str) -> float:
        return sum(r["value"] for r in rows if r["name"] == name)
    acc = {int(k): v for k, v in sorted(state.accuracy.items())}
    summary = {
        "job": cfg.job, "mode": cfg.mode, "config": cfg.source, "run_dir": str(run_dir),
        "steps_trained": max(steps, default=0), "wall_s": round(time.time() - started, 2),
        # launch -> the first trained step's metric (broker, model, processes, first batch)
        "time_to_first_step_s": round(min(r["ts"] for r in first) - started, 2) if first else None,
        "accuracy_by_version": acc,
        "accuracy_initial": acc.get(min(acc)) if acc else None,
        "accuracy_final": acc.get(max(acc)) if acc else None,
        "trainer_train_s": round(total("trainer.train_s"), 3), "trainer_wait_s": round(total("trainer.wait_s"), 3),
        "raas_busy_s": round(total("raas.busy_s"), 3), "samples_trained": int(total("trainer.samples")),
        "weights_delta_bytes_mean": _mean([r["value"] for r in rows if r["name"] == "weights.delta_bytes"]),
        "weights_snapshot_bytes_mean": _mean([r["value"] for r in rows if r["name"] == "weights.snapshot_bytes"]),
        "weights_delta_changed_frac_mean": _mean([r["value"] for r in rows
                                                  if r["name"] == "weights.delta_changed_frac"]),
        # Mean |logp_trainer - logp_behaviour| over tokens generated at the version being
        # trained, averaged over the steps that had such tokens (async steps may have none).
        **_gap_summary([r["value"] for r in rows if r["name"] == "trainer.train_inference_logp_gap"]),
        "restarts": {p.node_id: p.restarts for p in procs if p.restarts},
        **({"steps_trained_by_policy": dict(state.trained_by),
            "team_reward_last": state.team[-1][1] if state.team else None,
            "team_reward_by_step": {str(k): round(v, 4) for k, v in sorted(state.team)},
            "team_accuracy_by_version": {str(k): round(v, 4) for k, v in sorted(state.team_accuracy.items())},
            "team_accuracy_final": state.team_accuracy[max(state.team_accuracy)] if state.team_accuracy else None}
           if len(cfg.policy_names) > 1 else {}),
        "interrupted": interrupted, "error": error, **(extra or {}),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _plot(run_dir / "plot.png", rows, cfg)
    return summary


def _gap_summary(gaps: list[float]) -> dict:
    return {"train_inference_logp_gap": sum(gaps) / len(gaps) if gaps else None,
            "train_inference_logp_gap_max": max(gaps, default=None),
            "train_inference_logp_gap_steps": len(gaps)}


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def _plot(path: Path, rows: list[dict], cfg: JobConfig) -> None:
    if len(cfg.policy_names) > 1:
        _plot_policies(path, rows, cfg)
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    reward = sorted((r["step"], r["value"]) for r in rows if r["name"] == "trainer.reward")
    acc = sorted((r["step"], r["value"]) for r in rows if r["name"] == "eval.accuracy")
    fig, ax = plt.subplots(figsize=(7, 4))
    if reward:
        ax.plot(*zip(*reward), label="batch reward (train)", color="tab:blue")
    if acc:
        ax.plot(*zip(*acc), "o-", label="held-out accuracy (pass@1)", color="tab:red")
    ax.set_xlabel("policy version")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"{cfg.job} ({cfg.mode})")
    ax.grid(alpha=0.3)
    if reward or acc:  # a run that failed before training has nothing to label
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_policies(path: Path, rows: list[dict], cfg: JobConfig) -> None:
    """A panel per policy (its batch reward by its own versions) and the team's accuracy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = cfg.policy_names
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(4.2 * (len(names) + 1), 3.8))
    for ax, p in zip(axes, names):
        reward = sorted((r["step"], r["value"]) for r in rows
                        if r["name"] == "trainer.reward" and r["component"] == f"trainer.{p}")
        if reward:
            ax.plot(*zip(*reward), color="tab:blue", label="batch reward")
        if p == cfg.lead_policy:
            acc = sorted((r["step"], r["value"]) for r in rows if r["name"] == "eval.accuracy")
            if acc:
                ax.plot(*zip(*acc), "o-", color="tab:red", label="held-out accuracy (alone)")
        ax.set_title(f"policy {p}")
        ax.set_xlabel(f"{p} version")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="lower right", fontsize=8)
    team = sorted((r["step"], r["value"]) for r in rows if r["name"] == "dataflow.team_reward"
                  and r.get("label.policy") == cfg.lead_policy)
    ax = axes[-1]
    if team:
        ax.plot(*zip(*team), color="tab:green", label="team reward (train batches)")
    held = sorted((r["step"], r["value"]) for r in rows if r["name"] == "eval.team_accuracy")
    if held:
        ax.plot(*zip(*held), "o-", color="tab:purple", label="team accuracy (held-out)")
    if ax.lines:
        ax.legend(loc="lower right", fontsize=8)
    ax.set_title("team")
    ax.set_xlabel(f"{cfg.lead_policy} batch step")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.suptitle(f"{cfg.job} ({cfg.workflow.name}, barrier {cfg.barrier})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
