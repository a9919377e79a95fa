"""The maths solver-verifier team (rules as in the reference system).

Per sample of an episode: the solver answers the problem; the verifier sees the problem
and the solver's full text and ends with a verdict tag, ``<A>`` (approve) or ``<R>``
(reject); on reject the solver retries once, with its first attempt and the verifier's
text as context. Rewards:

* solver: the correctness of each attempt (one trajectory per attempt; the retry's context
  (its first attempt, the verifier's text, the separators) is masked out of its loss);
* verifier: 1 iff its verdict parsed and equals the correctness of the first attempt;
* team: the correctness of the solver's final answer (the retry when there was one).

Prompt formats (what the warm-started tiny models learn, ``models/warm_start.py``):
solver ``12+7=`` -> ``19``; verifier ``12+7=19|`` -> ``<A>``; retry
``12+7=18|<R>;12+7=`` -> the second answer.
"""

from __future__ import annotations

from .api import ENV, Episode, EpisodeResult, Trajectory, get_scorer, workflow

APPROVE, REJECT = "<A>", "<R>"


def verdict_of(text: str) -> bool | None:
    """True (approve), False (reject) or None (no tag): the last tag in the text wins."""
    a, r = text.rfind(APPROVE), text.rfind(REJECT)
    if a < 0 and r < 0:
        return None
    return a > r


# The solver retries once per rejected sample (up to 2n trajectories); the verifier scores 0 or 1
# whatever the reward.
@workflow("solver_verifier", roles=("solver", "verifier"), reward_ranges={"verifier": (0.0, 1.0)},
          group_sizes={"solver": (1, 2)})
def solver_verifier(ep: Episode) -> EpisodeResult:
    """Solver answers, verifier approves or rejects, the solver retries once on reject."""
    score = get_scorer(str(ep.params.get("reward", "exact_match")))
    n = ep.n_samples
    problem = ep.encode(ep.prompt)
    first = ep.roles["solver"].generate([problem] * n)
    sep = ep.encode("|")
    checks = ep.roles["verifier"].generate([problem + _ids(ep, t) + sep for t in first])
    correct1 = [score(t.text, ep.answer, ep.metadata) for t in first]
    verdicts = [verdict_of(v.text) for v in checks]
    retry_rows = [i for i, v in enumerate(verdicts) if v is False]
    retry_ctx = {i: problem + _ids(ep, first[i]) + sep + _ids(ep, checks[i]) + ep.encode(";") + problem
                 for i in retry_rows}
    second = dict(zip(retry_rows, ep.roles["solver"].generate([retry_ctx[i] for i in retry_rows])
                      if retry_rows else []))
    solver, verifier = [], []
    final = []
    for i in range(n):
        solver.append(Trajectory.of(first[i], correct1[i], attempt=1))
        right = verdicts[i] is not None and verdicts[i] == (correct1[i] > 0)
        verifier.append(Trajectory.of(checks[i], 1.0 if right else 0.0, verdict=_name(verdicts[i]),
                                      first_correct=correct1[i] > 0))
        if i in second:
            t2 = second[i]
            c2 = score(t2.text, ep.answer, ep.metadata)
            # The retry trains on its own second answer only: its first attempt (already a
            # trajectory of its own), the verifier's text and the separators are context.
            solver.append(Trajectory.chain(problem, [("solver", _ids(ep, first[i])), (ENV, sep),
                                                     ("verifier", _ids(ep, checks[i])), (ENV, ep.encode(";")),
                                                     (ENV, problem), t2], "solver", c2, attempt=2))
            final.append(c2)
        else:
            final.append(correct1[i])
    n_parsed = sum(v is not None for v in verdicts)
    return EpisodeResult({"solver": solver, "verifier": verifier}, team_reward=sum(final) / n,
                         metrics={"first_accuracy": sum(correct1) / n, "retries": len(retry_rows) / n,
                                  "verdict_parsed": n_parsed / n,
                                  "verifier_accuracy": sum(t.reward for t in verifier) / n})


def _ids(ep: Episode, turn) -> list[int]:
    """A turn's tokens without its stop token (context must not contain an end of sequence)."""
    eos = ep.tokenizer.eos_token_id
    return [t for t in turn.tokens if t != eos]


def _name(v: bool | None) -> str:
    return "unparsed" if v is None else ("approve" if v else "reject")
