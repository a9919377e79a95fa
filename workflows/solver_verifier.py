"""The maths solver-verifier team (rules as in the reference system).

Per sample of an episode: the solver answers the problem; the verifier sees the problem
and the solver's full text and ends with a verdict tag, ``<A>`` (approve) or ``<R>``
(reject); on reject the solver retries once, with its first attempt and the verifier's
text as context. Rewards:

* solver: the correctness of each attempt (one trajectory per attempt; the retry's context
  (its first attempt, the verifier's text, the separators) is masked out of its loss);
* verifier: 1 iff its verdict parsed and equals the correctness of the first attempt;
* team: the correctness of the solver's final answer (the retry when there was one).

Two ``workflow.params`` change those rules (the defaults are the reference's):

* ``verifier_reward``: ``reference`` (above) or ``balanced``: both classes of first-attempt
  correctness weigh the same within an episode. With both present, a right verdict earns 1
  and a wrong one on a sample of class ``k`` earns ``1 - m / n_k`` (``n_k`` the episode's
  samples of that class, ``m`` the smaller class's count): the errors of each class cost the
  same in all, so always rejecting earns no more than always approving, and a verifier right
  on every sample earns 1 everywhere. With one class only (every first attempt wrong, the
  common case for a weak solver) no verdict can be told from the prior: every parsed verdict
  earns 1 and an unparsed one 0, so the group carries no push towards the majority verdict
  (under the reference rule those episodes teach the verifier to reject everything).
* ``retry``: ``verdict`` (above) or ``fresh``: the retry is asked the problem alone (an
  independent second sample from the plain prompt, the solver's own distribution), so the
  team is a verifier-gated best of two; the retry trains as a plain answer.

Prompt formats (what the warm-started tiny models learn, ``models/warm_start.py``):
solver ``12+7=`` -> ``19``; verifier ``12+7=19|`` -> ``9<A>`` (the units digit the sum
must end in, then the verdict of that check: a test easier than solving, which the tiny
verifier gets right on problems it never saw); retry ``12+7=18|9<R>;12+7=`` -> the second
answer.
"""

from __future__ import annotations

from .registry import RuleChoices, get_scorer, workflow
from .types import ENV, Episode, EpisodeResult, Trajectory

APPROVE, REJECT = "<A>", "<R>"
#: param -> its values; the first is the default (the reference system's rule)
RULES = RuleChoices({"verifier_reward": ("reference", "balanced"), "retry": ("verdict", "fresh")})


def verifier_rewards(verdicts: list[bool | None], first_correct: list[bool], rule: str = "reference") -> list[float]:
    """The verifier's reward per sample of an episode (``rule``: see the module docstring).
    An unparsed verdict (``None``) is wrong whatever the class."""
    right = [v is not None and v == c for v, c in zip(verdicts, first_correct)]
    if rule == "reference":
        return [1.0 if r else 0.0 for r in right]
    counts = {c: first_correct.count(c) for c in set(first_correct)}
    if len(counts) < 2:
        return [0.0 if v is None else 1.0 for v in verdicts]
    smaller = min(counts.values())
    return [1.0 if r else 1.0 - smaller / counts[c] for r, c in zip(right, first_correct)]


def verdict_of(text: str) -> bool | None:
    """True (approve), False (reject) or None (no tag): the last tag in the text wins."""
    a, r = text.rfind(APPROVE), text.rfind(REJECT)
    if a < 0 and r < 0:
        return None
    return a > r


# The solver retries once per rejected sample (up to 2n trajectories); the verifier's rewards lie
# in [0, 1] whatever the reward and rule.
@workflow("solver_verifier", roles=("solver", "verifier"), check=RULES,
          reward_ranges={"verifier": (0.0, 1.0)}, group_sizes={"solver": (1, 2)})
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
    fresh = RULES.rule(ep.params, "retry") == "fresh"
    retry_ctx = {i: problem if fresh else problem + _ids(ep, first[i]) + sep + _ids(ep, checks[i]) + ep.encode(";")
                 + problem for i in retry_rows}
    second = dict(zip(retry_rows, ep.roles["solver"].generate([retry_ctx[i] for i in retry_rows])
                      if retry_rows else []))
    v_rewards = verifier_rewards(verdicts, [c > 0 for c in correct1], RULES.rule(ep.params, "verifier_reward"))
    solver, verifier = [], []
    final = []
    for i in range(n):
        solver.append(Trajectory.of(first[i], correct1[i], attempt=1))
        verifier.append(Trajectory.of(checks[i], v_rewards[i], verdict=_name(verdicts[i]),
                                      first_correct=correct1[i] > 0))
        if i in second:
            t2 = second[i]
            c2 = score(t2.text, ep.answer, ep.metadata)
            if fresh:
                solver.append(Trajectory.of(t2, c2, attempt=2))
            else:
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
                                  "verifier_accuracy": sum(v is not None and v == (c > 0)
                                                           for v, c in zip(verdicts, correct1)) / n,
                                  # shares of the n samples: over many episodes, approved_correct /
                                  # first_accuracy is the verifier's true-positive rate, rejected_wrong /
                                  # (1 - first_accuracy) its true-negative rate
                                  "approved_correct": sum(v is True and c > 0 for v, c in zip(verdicts, correct1)) / n,
                                  "rejected_wrong": sum(v is False and c <= 0 for v, c in zip(verdicts, correct1)) / n})


def _ids(ep: Episode, turn) -> list[int]:
    """A turn's tokens without its stop token (context must not contain an end of sequence)."""
    eos = ep.tokenizer.eos_token_id
    return [t for t in turn.tokens if t != eos]


def _name(v: bool | None) -> str:
    return "unparsed" if v is None else ("approve" if v else "reject")
