"""The evaluator actor: held-out accuracy of the policy as its versions appear.

Follows the policy's weights like a RaaS node (through a subscriber) and evaluates
pass@1 averaged over ``k`` samples at the configured temperature on the job's fixed
held-out set (rows of its own data: :mod:`.heldout`), each sample scored by the job's
reward with the row's metadata (``workflow.params.reward``, else the workflow's own), at
version 0, at every ``every``-th version it reaches, and at the final version. The
subscriber hands over the newest version, so under fast training a target version may be
skipped: the first version at or past it is evaluated, and the metric records the
version actually measured, with its lineage epoch and weights digest. After a trainer
resumed behind the announced head the subscriber moves to the new epoch, whose version
numbers restart below the old head: targets are version numbers, so the evaluator waits
for the new lineage to reach its next target.

In a multi-policy job the evaluator follows every policy's weights and, next to the lead
policy's own accuracy (the solver alone), measures the *team*: the workflow run on the
held-out problems with every role on its policy's newest weights, scored by the episode's
``team_reward`` (for solver-verifier: the solver's final answer after any retry) as
``eval.team_accuracy``, labelled with each policy's version, and per policy the mean
reward of its roles in those episodes as ``eval.policy_reward`` (labelled with the policy
and its version).

With ``eval.dataset`` it also measures real benchmark items (GSM8K-100, HumanEval:
:mod:`astraflow.workflows.eval_sets`), greedy pass@1 with the job's chat rendering, at the
first version it evaluates and at the final one, as ``eval.dataset_accuracy`` and
``eval.dataset_stderr`` labelled with the set.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from astraflow.config import JobConfig
from astraflow.engines.base import generated_context
from astraflow.topics import DeadLetters, Producer, Prompt, job_topics
from astraflow.workflows.api import EngineRole

from .common import (base_model, close_quietly, configure_sandbox, lower_thread_priority, make_rollout_engine,
                     model_path, niceness, prompt_renderer, set_threads)
from .episodes import CallBatcher
from .heldout import eval_reward, heldout_label, heldout_problems
from .signing import verifier_for
from .supervisor import LoopActor
from .telemetry import MetricsEmitter

log = logging.getLogger(__name__)


def heldout_accuracy(cfg: JobConfig, engine, tokenizer, problems: list[Prompt],
                     per_row: list[float] | None = None) -> float:
    """Pass@1 of the weights ``engine`` holds on ``problems``, scored by the job's reward with
    each row's metadata; for a workflow scored by whole episodes (``episode_eval``: an agent
    in an environment), the mean reward of its episodes' first-role trajectories.
    ``per_row``, when given, receives each problem's mean reward (pass@1 jobs only).
    ``astraflow replay`` evaluates through here too."""
    from astraflow.workflows.api import get_scorer, get_workflow
    from astraflow.workflows.evaluation import pass_at_1
    spec = get_workflow(cfg.workflow.name)
    if spec.episode_eval:
        return episode_accuracy(cfg, engine, tokenizer, problems)
    rows = [(p.text, p.answer, p.metadata) for p in problems]
    render = prompt_renderer(cfg, tokenizer)  # (the tokenizer held, not a second load)
    ids = [render(p.text, p.messages) for p in problems] if render.active else None
    return pass_at_1(engine, tokenizer, rows, get_scorer(eval_reward(cfg)), k=cfg.eval.k,
                     temperature=cfg.eval.temperature, max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed,
                     prompt_ids=ids, per_row=per_row)


class EpisodeEval(NamedTuple):
    """What the held-out episodes of an agent workflow showed (means over episodes)."""

    accuracy: float  #: mean reward of the first role's trajectories
    stderr: float  #: its standard error over episodes (sample std / sqrt(episodes))
    stderr_tasks: float  #: its standard error over tasks (std of per-task means / sqrt(tasks)): samples of a task are not independent
    episodes: int  #: trajectories measured (tasks x eval.k)
    turns: float  #: model turns per episode
    actions: float  #: environment steps (tool calls) per episode
    #: held-out row index -> the mean reward of its samples (the same rows at every version, so a
    #: change can be measured per task, paired)
    per_task: dict[int, float]


def _stderr(values: list[float]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def episode_evaluation(cfg: JobConfig, engine, tokenizer, problems: list[Prompt]) -> EpisodeEval:
    """The workflow's episodes on ``problems`` (``eval.k`` samples each, every role on
    ``engine``, at ``eval.temperature``): the mean reward of the first role's trajectories,
    its standard errors, and the turns and tool calls per episode. Seeded by the job's seed
    and each row's index, so the same weights give the same score."""
    from astraflow.workflows.api import EngineRole, Episode, get_workflow, run_episode
    spec = get_workflow(cfg.workflow.name)
    sampling = {"temperature": cfg.eval.temperature, "top_p": 1.0, "top_k": 0,
                "max_new_tokens": cfg.rollout.max_new_tokens}
    # The rows' episodes run as a RaaS node polls them: ``rollout.tasks_per_call`` at a time,
    # each on a thread of its own, their engine calls coalesced (seeds are per sample and turn,
    # so batching changes no sample); an episode waiting on its environment steps out of the
    # batch. A poll-sized batch keeps an episode's wall time, which its deadline_s bounds, what
    # it is in training: all rows at once made every turn wait for hundreds of rows.
    per_call = max(1, cfg.rollout.tasks_per_call)
    render = prompt_renderer(cfg, tokenizer)
    results = []
    with ThreadPoolExecutor(max_workers=per_call, thread_name_prefix="eval-ep") as pool:
        for start in range(0, len(problems), per_call):
            chunk = list(enumerate(problems))[start:start + per_call]
            batcher = CallBatcher(engine, episodes=len(chunk))

            def one(i: int, p: Prompt, batcher: CallBatcher = batcher):
                try:
                    roles = {role: _BatchedEvalRole(role, cfg.policy, batcher, i, tokenizer, sampling)
                             for role in spec.roles}
                    ep = Episode(f"eval-{i}", p.text, p.answer, cfg.eval.k, roles, tokenizer,
                                 {**cfg.workflow.params, "_job_seed": cfg.seed + 1000}, p.metadata,
                                 off_engine=batcher.away, prompt_ids=tuple(render(p.text, p.messages) or ()))
                    return run_episode(spec, ep, cfg.seed + 1000)
                finally:
                    batcher.leave()

            results += list(pool.map(one, *zip(*chunk)))
    rewards: list[float] = []
    per_task: dict[int, float] = {}
    turns = actions = 0.0
    for i, result in enumerate(results):
        trajs = result.trajectories.get(spec.roles[0], [])
        rewards += [t.reward for t in trajs]
        if trajs:
            per_task[i] = sum(t.reward for t in trajs) / len(trajs)
        turns += sum(float(t.info.get("turns", 0)) for t in trajs)
        actions += sum(float(t.info.get("actions", 0)) for t in trajs)
    if not rewards:
        raise ValueError(f"workflow {spec.name!r} returned no {spec.roles[0]!r} trajectories on the held-out rows")
    n = len(rewards)
    return EpisodeEval(sum(rewards) / n, _stderr(rewards), _stderr(list(per_task.values())), n, turns / n,
                       actions / n, per_task)


class _BatchedEvalRole(EngineRole):
    """A role of a held-out episode on the evaluator's engine, through the call batcher."""

    def __init__(self, name: str, policy: str, batcher: CallBatcher, index: int, tokenizer, sampling) -> None:
        super().__init__(name, policy, batcher.engine, tokenizer, sampling)
        self.batcher, self.index = batcher, index

    def generate(self, prompts, *, seeds, max_new_tokens=None, temperature=None, stop=None):
        gens = self.batcher.generate(self.index, prompts, self.params(max_new_tokens, temperature, stop), seeds,
                                     policy=self.policy)
        return [self.turn(g, generated_context(p)) for g, p in zip(gens, prompts)]


def episode_accuracy(cfg: JobConfig, engine, tokenizer, problems: list[Prompt]) -> float:
    """The mean reward of :func:`episode_evaluation`."""
    return episode_evaluation(cfg, engine, tokenizer, problems).accuracy


def team_evaluation(cfg: JobConfig, engines: dict, tokenizer, problems: list[Prompt]) -> tuple[float, dict[str, float]]:
    """The workflow on ``problems``, each role on its policy's engine: the mean team reward,
    and per policy the mean reward of its roles' trajectories."""
    from astraflow.workflows.api import EngineRole, Episode, get_workflow, run_episode
    spec = get_workflow(cfg.workflow.name)
    sampling = {"temperature": cfg.eval.temperature, "top_p": 1.0, "top_k": 0}
    total = 0.0
    render = prompt_renderer(cfg, tokenizer)
    rewards: dict[str, list[float]] = {p: [] for p in cfg.policy_names}
    for i, p in enumerate(problems):
        roles = {role: EngineRole(role, policy, engines[policy], tokenizer,
                                  {**sampling, "max_new_tokens": cfg.view(policy).rollout.max_new_tokens})
                 for role, policy in cfg.role_policies.items()}
        ep = Episode(f"eval-{i}", p.text, p.answer, cfg.eval.k, roles, tokenizer,
                     {**cfg.workflow.params, "_job_seed": cfg.seed + 1000}, p.metadata,
                     prompt_ids=tuple(render(p.text, p.messages) or ()))
        result = run_episode(spec, ep, cfg.seed + 1000)
        total += float(result.team_reward or 0.0)
        for role, trajs in result.trajectories.items():
            rewards[cfg.role_policies[role]] += [t.reward for t in trajs]
    return total / len(problems), {p: sum(r) / len(r) for p, r in rewards.items() if r}


def team_accuracy(cfg: JobConfig, engines: dict, tokenizer, problems: list[Prompt]) -> float:
    """Mean team reward of the workflow on ``problems``, each role on its policy's engine."""
    return team_evaluation(cfg, engines, tokenizer, problems)[0]


class EvaluatorActor(LoopActor):
    def __init__(self, supervisor, name: str, cfg: JobConfig, bootstrap: str) -> None:
        super().__init__(supervisor, name)
        self.cfg, self.bootstrap = cfg, bootstrap
        self.topics = job_topics(cfg)
        self.next_target = 0
        self.engine = self.subscriber = self.producer = None
        self.team = len(cfg.policy_names) > 1
        self.others: dict = {}  #: multi-policy: policy -> (engine, subscriber) of every other policy
        self.dataset_versions: set[int] = set()  #: versions eval.dataset was measured at

    def setup(self) -> None:
        from transformers import AutoTokenizer

        from astraflow.weights import WeightSubscriber

        # First: the imports and model load below, every evaluation and the threads started here
        # (its subscriber's, its clients') run at this niceness, the dataflow's threads at theirs.
        lower_thread_priority(self.cfg.eval.cpu_nice)
        set_threads(self.cfg.eval.threads)
        configure_sandbox(self.cfg)
        path = model_path(self.cfg)
        self.engine = make_rollout_engine(self.cfg, path, kind="cpu", device=self.cfg.eval.device, name="evaluator")
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.problems = heldout_problems(self.cfg)
        self.label = heldout_label(self.cfg)
        self.render = prompt_renderer(self.cfg, self.tokenizer)  # eval.dataset's prompts, rendered as the job's
        log.info("eval: %d held-out problems from %s", len(self.problems), self.label)
        self.producer = Producer(self.bootstrap, client_id=f"eval.{self.cfg.policy}")
        self.metrics = MetricsEmitter(self.producer, self.topics.metrics, f"eval.{self.cfg.policy}")
        dead = DeadLetters(self.producer, self.topics.dlq, f"eval.{self.cfg.policy}", recall=self.bootstrap)

        def signed(view: JobConfig) -> dict:  # only the policy's trainer's announcements, for its base, count
            return {"verifier": verifier_for(view), "dead_letters": dead,
                    "base_model": base_model(view, model_path(view)),
                    "on_reject": lambda r: self.metrics.emit("eval.versions_rejected", 1, reason=r.reason,
                                                             policy=r.policy, epoch=r.epoch, version=r.version)}
        # On demand: it evaluates every `eval.every`-th version, so it loads the chain's latest
        # snapshot when a target is announced instead of applying every delta on the way.
        self.subscriber = WeightSubscriber(self.bootstrap, self.topics, self.cfg.policy,
                                           initial_version=self.engine.version, node_id="evaluator",
                                           on_demand=True, **signed(self.cfg))
        self.subscriber.start()
        for p in self.cfg.policy_names if self.team else ():
            if p == self.cfg.policy:
                continue
            view = self.cfg.view(p)
            engine = make_rollout_engine(view, model_path(view), kind="cpu", device=self.cfg.eval.device,
                                         name=f"evaluator.{p}")
            sub = WeightSubscriber(self.bootstrap, self.topics, p, initial_version=engine.version,
                                   node_id=f"evaluator.{p}", **signed(view))
            sub.start()
            self.others[p] = (engine, sub)

    def step(self) -> None:
        final = self.cfg.trainer.steps
        self.subscriber.apply_to(self.engine)
        v = self.engine.version
        for engine, sub in self.others.values():
            sub.apply_to(engine)
        # A multi-policy job ends when every policy has trained its last version: the final
        # (team) evaluation waits for the slowest policy, not just for the lead.
        all_final = v >= final and all(engine.version >= self.cfg.view(p).trainer.steps
                                       for p, (engine, _) in self.others.items())
        at_target = self.next_target <= final and v >= self.next_target
        if not at_target and not all_final:
            self.subscriber.wait_for(max(v + 1, self.next_target) if v < final else v + 1, timeout=1.0)
            return
        t0 = time.monotonic()
        episodes = None
        from astraflow.workflows.api import get_workflow
        if get_workflow(self.cfg.workflow.name).episode_eval:  # an agent: its episodes say more than the mean
            episodes = episode_evaluation(self.cfg, self.engine, self.tokenizer, self.problems)
            acc, per_task = episodes.accuracy, episodes.per_task
        else:
            per_row: list[float] = []
            acc = heldout_accuracy(self.cfg, self.engine, self.tokenizer, self.problems, per_row)
            per_task = dict(enumerate(per_row))
        held = self.subscriber.held_by(self.engine)
        log.info("eval: version %d accuracy %.3f on %d problems of %s (%.1fs)", v, acc, len(self.problems),
                 self.label, time.monotonic() - t0)
        self.metrics.emit("eval.accuracy", acc, step=v, problems=len(self.problems), k=self.cfg.eval.k,
                          epoch=held.epoch if held else 0, weights_digest=held.digest if held else "",
                          nice=niceness(), heldout=self.label, reward=eval_reward(self.cfg))
        if episodes is not None:
            for key in ("stderr", "stderr_tasks", "episodes", "turns", "actions"):
                self.metrics.emit(f"eval.{key}", float(getattr(episodes, key)), step=v, heldout=self.label)
        for i, r in per_task.items():  # per held-out problem: a rise can be judged paired (summary.json)
            self.metrics.emit("eval.task_reward", r, step=v, task=i)
        self.metrics.emit_device(self.engine, step=v)
        if self.cfg.eval.datasets and v not in self.dataset_versions and (not self.dataset_versions or v >= final):
            self.dataset_versions.add(v)
            self.evaluate_datasets(v)
        if self.team:
            engines = {self.cfg.policy: self.engine, **{p: e for p, (e, _) in self.others.items()}}
            t0 = time.monotonic()
            team, by_policy = team_evaluation(self.cfg, engines, self.tokenizer, self.problems)
            log.info("eval: team accuracy %.3f at versions %s, rewards %s (%.1fs)", team,
                     {p: e.version for p, e in engines.items()}, by_policy, time.monotonic() - t0)
            versions = {f"version.{p}": e.version for p, e in engines.items()}
            self.metrics.emit("eval.team_accuracy", team, step=v, problems=len(self.problems), heldout=self.label,
                              **versions)
            for p, r in by_policy.items():  # each policy's held-out score in its role(s) of the team
                self.metrics.emit("eval.policy_reward", r, step=v, policy=p, version=engines[p].version,
                                  problems=len(self.problems))
        self.producer.flush()
        every = self.cfg.eval.every or final
        if at_target:
            self.next_target = min(final, (v // every + 1) * every) if v < final else final + 1
        if all_final:
            self.finished = True

    def evaluate_datasets(self, v: int) -> None:
        """``eval.dataset``'s sets on the weights held now (version ``v``): greedy pass@1 and its
        standard error over items, prompts rendered as the job's."""
        from astraflow.workflows.eval_sets import EVAL_SETS, evaluate_set
        ev = self.cfg.eval
        for name in ev.datasets:
            t0 = time.monotonic()
            acc, per_row = evaluate_set(self.engine, self.tokenizer, name, render=self.render,
                                        limit=ev.dataset_problems, max_new_tokens=ev.dataset_max_new_tokens,
                                        seed=self.cfg.seed)
            log.info("eval: version %d %s accuracy %.3f on %d items (%.1fs)", v, name, acc, len(per_row),
                     time.monotonic() - t0)
            labels = {"dataset": name, "problems": len(per_row), "reward": EVAL_SETS[name].reward,
                      "max_new_tokens": ev.dataset_max_new_tokens or EVAL_SETS[name].max_new_tokens}
            self.metrics.emit("eval.dataset_accuracy", acc, step=v, **labels)
            self.metrics.emit("eval.dataset_stderr", _stderr(per_row), step=v, **labels)

    def teardown(self) -> None:
        close_quietly(self.subscriber, self.producer, self.engine,
                      *[x for pair in self.others.values() for x in reversed(pair)])
        self.engine = self.subscriber = self.producer = None
        self.others = {}
