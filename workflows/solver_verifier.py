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

Two prompt formats, chosen by the episode (the rules above are the same in both):

* **raw** (the tiny models, ``ep.prompt_ids`` empty; what ``models/warm_start.py`` teaches
  them): solver ``12+7=`` -> ``19``; verifier ``12+7=19|`` -> ``9<A>`` (the units digit the
  sum must end in, then the verdict of that check: a test easier than solving, which the
  tiny verifier gets right on problems it never saw); retry ``12+7=18|9<R>;12+7=`` -> the
  second answer.
* **chat** (a model with a chat template, ``ep.prompt_ids`` its rendering of the task): the
  solver answers the task's rendered conversation; the verifier gets a conversation of its
  own (:func:`verifier_messages`: the problem, the solver's reply, "Answer Yes or No")
  rendered with the template, and its verdict is the first Yes / No (or APPROVE / REJECT)
  of its reply (:func:`chat_verdict_of`). A retry continues the solver's conversation, token-exact:
  the task's ids, the first reply's tokens as generated (the end-of-turn token appended when
  the turn was cut), then a user turn with the verifier's feedback and the assistant
  prompt, rendered as the template renders them after an assistant turn
  (:func:`continuation_ids`). Only the retry's own tokens train.

It knows nothing about Kafka, engines or training (its prompts say how much of them a model
generated: :func:`~.types.chain_context`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .chat import ChatTemplateError, prompt_messages, render
from .registry import RuleChoices, get_scorer, workflow
from .types import ENV, Episode, EpisodeResult, PromptRow, Trajectory, Turn, chain_context

APPROVE, REJECT = "<A>", "<R>"
#: param -> its values; the first is the default (the reference system's rule)
RULES = RuleChoices({"verifier_reward": ("reference", "balanced"), "retry": ("verdict", "fresh")})
#: the chat verifier's instruction, after the problem and the proposed answer
#: (SmolLM2-135M-Instruct says Yes/No far more often than it follows "reply APPROVE or REJECT")
VERIFIER_ASK = "Is the proposed answer correct? Answer Yes or No."
FEEDBACK_CHARS = 300  #: the most of the verifier's reply a chat retry is shown


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


_VERDICT_WORD = re.compile(r"\b(yes|no|approve[sd]?|reject(?:s|ed)?)\b", re.IGNORECASE)
#: the instruction's options repeated back ("Yes or No", "APPROVE/REJECT"): no verdict
_ECHO = re.compile(r"\b(yes|approve)\W*(?:or|/)\W*(no|reject)\b|\b(no|reject)\W*(?:or|/)\W*(yes|approve)\b",
                   re.IGNORECASE)


def chat_verdict_of(text: str) -> bool | None:
    """A chat verifier's verdict: the first of the words Yes / No (or APPROVE / REJECT,
    approved, rejected; any case) in its reply, the options repeated back ("Yes or No") left
    out; None when there is none. The first, because a chat model answers, then explains
    ("No, the proposed answer is incorrect. The correct answer is 146.")."""
    word = _VERDICT_WORD.search(_ECHO.sub(" ", text))
    return None if word is None else word[1].lower() in ("yes", "approve", "approves", "approved")


def verifier_messages(problem: str, reply: str) -> list[dict[str, str]]:
    """The chat verifier's conversation: one user message with the problem, the solver's reply
    and the instruction (the template adds its default system message, if it has one)."""
    return [{"role": "user", "content": f"Problem: {problem}\nProposed answer: {reply.strip()}\n{VERIFIER_ASK}"}]


def feedback_message(problem: str, verdict_text: str) -> dict[str, str]:
    """The user turn a chat retry is asked after a rejection: the verifier's words and the problem again."""
    said = " ".join(verdict_text.split())[:FEEDBACK_CHARS]
    return {"role": "user", "content": f"A checker reviewed your answer and rejected it (it said: \"{said}\"). "
                                       f"Try again. {problem}"}


def continuation_ids(tokenizer: Any, history: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> list[int]:
    """The ids the chat template puts after ``history``'s last end-of-turn token when ``new``
    messages follow it, up to and including the assistant generation prompt.

    ``history`` ends with an assistant turn whose tokens are kept as generated (ending with
    the end-of-turn token); this is what goes after them: for ChatML, the newline that
    closes the turn, ``new`` in the template's per-message form and ``<|im_start|>assistant\\n``.
    Taken from the full conversation's rendering past the history's, so whatever the
    template adds once per conversation (SmolLM2's default system message) is not repeated.
    :class:`ChatTemplateError` when the template renders the history differently once more
    messages follow it (then nothing can be appended after kept tokens)."""
    before = render(tokenizer, history, add_generation_prompt=False)
    after = render(tokenizer, [*history, *new], add_generation_prompt=True)
    if after[:len(before)] != before:
        raise ChatTemplateError("the chat template renders a conversation's earlier turns differently once more "
                                "messages follow: a new turn cannot be appended to the generated tokens")
    eot = tokenizer.eos_token_id
    ends = [i for i, t in enumerate(before) if t == eot]
    return after[ends[-1] + 1 if ends else len(before):]


class _RawFormat:
    """The tiny models' prompts (see the module docstring), exactly as they were trained."""

    def __init__(self, ep: Episode) -> None:
        self.ep = ep
        self.problem = ep.encode(ep.prompt)
        self.verdict = verdict_of

    def check_prompt(self, answer: Turn) -> list[int]:
        return chain_context(self.problem, [("solver", _ids(self.ep, answer)), (ENV, self.ep.encode("|"))])

    def retry_parts(self, answer: Turn, check: Turn) -> list[tuple[str, list[int]]]:
        ep = self.ep
        return [("solver", _ids(ep, answer)), (ENV, ep.encode("|")), ("verifier", _ids(ep, check)),
                (ENV, ep.encode(";")), (ENV, self.problem)]


class _ChatFormat:
    """Chat prompts rendered with the model's template (see the module docstring)."""

    def __init__(self, ep: Episode) -> None:
        self.ep = ep
        self.problem = ep.prompt_tokens()
        self.verdict = chat_verdict_of

    def check_prompt(self, answer: Turn) -> list[int]:
        ids = render(self.ep.tokenizer, verifier_messages(self.ep.prompt, answer.text))
        # the reply's text, re-rendered inside the verifier's conversation: as many tokens as it generated
        n = min(len(ids), len(_ids(self.ep, answer)))
        return PromptRow(ids, n)

    def retry_parts(self, answer: Turn, check: Turn) -> list[tuple[str, list[int]]]:
        ep = self.ep
        eot = ep.tokenizer.eos_token_id
        reply = list(answer.tokens) if answer.tokens and answer.tokens[-1] == eot else [*answer.tokens, eot]
        # The history stands in for the task's conversation (which the episode has as ids only):
        # what follows an assistant turn does not depend on the turns before it.
        history = [*prompt_messages(ep.prompt), {"role": "assistant", "content": answer.text}]
        return [("solver", reply), (ENV, continuation_ids(ep.tokenizer, history,
                                                          [feedback_message(ep.prompt, check.text)]))]


# The solver retries once per rejected sample (up to 2n trajectories); the verifier's rewards lie
# in [0, 1] whatever the reward and rule.
@workflow("solver_verifier", roles=("solver", "verifier"), check=RULES,
          reward_ranges={"verifier": (0.0, 1.0)}, group_sizes={"solver": (1, 2)})
def solver_verifier(ep: Episode) -> EpisodeResult:
    """Solver answers, verifier approves or rejects, the solver retries once on reject."""
    score = get_scorer(str(ep.params.get("reward", "exact_match")))
    n = ep.n_samples
    fmt = _ChatFormat(ep) if ep.prompt_ids else _RawFormat(ep)
    problem = fmt.problem
    first = ep.roles["solver"].generate([problem] * n)
    checks = ep.roles["verifier"].generate([fmt.check_prompt(t) for t in first])
    correct1 = [score(t.text, ep.answer, ep.metadata) for t in first]
    verdicts = [fmt.verdict(v.text) for v in checks]
    retry_rows = [i for i, v in enumerate(verdicts) if v is False]
    fresh = RULES.rule(ep.params, "retry") == "fresh"
    retry_parts = {} if fresh else {i: fmt.retry_parts(first[i], checks[i]) for i in retry_rows}
    retry_ctx = {i: problem if fresh else chain_context(problem, retry_parts[i]) for i in retry_rows}
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
                solver.append(Trajectory.chain(problem, [*retry_parts[i], t2], "solver", c2, attempt=2))
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
    """A turn's tokens without its stop token (raw prompts: context must not contain an end of sequence)."""
    eos = ep.tokenizer.eos_token_id
    return [t for t in turn.tokens if t != eos]


def _name(v: bool | None) -> str:
    return "unparsed" if v is None else ("approve" if v else "reject")
