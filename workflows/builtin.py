"""The workflows and rewards that ship with AstraFlow; importing this module registers them.

``rlvr`` (one role: generate ``n`` samples, score each) is what a single-policy job runs;
``solver_verifier`` is the maths solver-verifier team; the code workflows, the maths
answer checker, HumanEval's hidden-test reward (``humaneval_tests``, :mod:`.eval_sets`), the
``agent`` workflow and the ``text_game``, ``search``, ``http`` and ``openenv`` environments
register themselves from their modules, imported here. A user workflow registers the same way from
any module the job imports (``workflow.module`` in the job config). Nothing here knows
where an episode runs or how its calls are batched: the episode runner
(``astraflow.actors.episodes``) runs these for RaaS nodes and the in-process baselines.

:mod:`astraflow.workflows.api`'s lookups import this module at their first call; a shipped
module whose dependency is missing fails that call with its ``ModuleNotFoundError`` (naming
the missing module), never with an "unknown workflow" later.
"""

from __future__ import annotations

# Imported for what they register (their @workflow, @reward and @environment).
from . import (agent, code_workflows, eval_sets, http_env, math_answers, openai_endpoint,  # noqa: F401
               openenv_env, search_env, solver_verifier, text_game)
from . import arithmetic
from .registry import get_scorer, reward, workflow
from .seeds import task_seeds
from .types import Episode, EpisodeResult, Trajectory

reward("exact_match")(arithmetic.reward)
reward("answer_before_tail")(arithmetic.tail_reward)


@workflow("rlvr", roles=("solver",))
def rlvr(ep: Episode) -> EpisodeResult:
    """Single-turn RL with verifiable rewards: ``n`` samples of the prompt, each scored.

    Sample ``j`` draws from ``sample_seed(job seed, task id, j)`` (:func:`.seeds.task_seeds`),
    so its tokens depend on nothing else: not on the node, the poll's other tasks or how
    the runner batches their calls (RaaS nodes and the in-process baseline alike).
    """
    score = get_scorer(str(ep.params.get("reward", "exact_match")))
    ids = ep.prompt_tokens()
    seeds = task_seeds(int(ep.params.get("_job_seed", 0)), ep.episode_id, ep.n_samples)
    turns = ep.roles["solver"].generate([ids] * ep.n_samples, seeds=seeds)
    trajs = [Trajectory.of(t, score(t.text, ep.answer, ep.metadata)) for t in turns]
    return EpisodeResult({"solver": trajs}, team_reward=sum(t.reward for t in trajs) / len(trajs))

