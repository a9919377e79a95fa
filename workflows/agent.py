"""The generic agent workflow: model turn -> action -> environment step, until done or a limit.

``workflow: {name: agent, params: {env: text_game, ...}}`` runs, per sample of a task, one
instance of the named environment (:mod:`.environments`): its first observation is the
prompt; each model turn is one ``generate`` call of role ``agent`` (all live samples of the
task in one call) that stops at the action's closing tag; the action is parsed (a tagged
command, or a JSON tool call ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``)
and stepped in the environment while the episode is out of the node's batch
(``ep.off_engine``); the observation's tokens, then the next opening tag, are appended.
A malformed action is answered by an observation saying so, without a step.

**Chat models** (``action_format: chat``): the episode is a conversation under the model's
chat template (:class:`~.chat_turns.ChatTurns`). The first observation is a user message
(after ``system``, if set), rendered with the tools' schemas (``tools``, else the
environment's ``tools`` attribute) as ``apply_chat_template(..., add_generation_prompt=True)``
gives it; a turn ends at the end-of-turn token; its action is its first tool call
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, else its text; the
observation comes back as a ``tool`` message after a tool call, else a ``user`` message,
rendered as the template renders it after the reply and appended after the reply's
generated tokens (never re-rendered). ``max_observation_tokens`` cuts an observation's
text, not the template's markup around it.

**Tokens in, tokens out.** Each sample's trajectory is the exact token sequence the engine
saw and produced: every turn's prompt is the previous prompt plus the tokens appended since
(:meth:`Trajectory.chain` checks it and fails loudly otherwise); model tokens train (loss
mask 1, their behaviour logprobs and versions), observation tokens are context (0). Nothing
is re-tokenized: each observation is encoded once, as it arrives.

**Limits with reasons.** A sample ends with ``end_reason`` in its trajectory's ``info`` (and
an ``end.<reason>`` fraction in the episode metrics): ``done`` (the environment said so),
``max_turns``, ``max_tokens`` (``max_total_tokens`` of prompt + turns + observations),
``context`` (the model's window is full: the engines never generate past it), ``deadline``
(``deadline_s`` of wall time for the episode, environment calls included) or ``eos`` (the
model ended its turn with end-of-sequence, with ``on_eos: end``). An observation longer than
``max_observation_tokens`` is cut to it (counted). A limit's reward is ``limit_reward`` when
set, else the environment rewards so far. An environment that raises, hangs past
``env_timeout_s`` or answers garbage fails the episode with the reason
(:class:`~.environments.EnvironmentFailed`); the node records the failure and goes on.

It knows nothing about Kafka, engines or where the environment's code runs.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .chat_turns import ChatTurns, ChatTurnsError, check_tools, parse_tool_calls
from .environments import ENV_TIMEOUT, EnvHandle, EnvironmentFailed, EnvTask, get_environment
from .registry import WorkflowParamError, workflow
from .roles import role_seed
from .types import ENV, Episode, EpisodeResult, Trajectory, Turn, chain_context

__all__ = ["AgentParams", "agent", "chat_action", "parse_action", "END_REASONS", "LIMITS"]

#: every reason a sample ends for; the limits among them take ``limit_reward``
LIMITS = ("max_turns", "max_tokens", "context", "deadline")
END_REASONS = ("done", "eos") + LIMITS

#: action format -> (opening tag appended after each observation, the closing tag the turn stops at);
#: ``eos``: the turn is the action and ends with end-of-sequence (a chat model's end of turn)
_TAGS = {"tag": ("<a>", "</a>"), "json": ("<tool_call>", "</tool_call>"), "eos": ("", ""), "chat": ("", "")}


@dataclass(frozen=True)
class AgentParams:
    """``workflow.params`` of the agent workflow (checked when the job config loads)."""

    env: str = ""  #: the registered environment
    env_params: Mapping[str, Any] = field(default_factory=dict)  #: keywords for its factory
    #: ``tag`` (``<a>go 2</a>``), ``json`` (a ``<tool_call>`` JSON object), ``eos`` (the turn's text) or
    #: ``chat`` (turns under the model's chat template; a tool call or the reply's text)
    action_format: str = "tag"
    #: ``chat``: the tools' schemas (default: the environment's ``tools`` attribute, if any)
    tools: tuple = ()
    system: str = ""  #: ``chat``: a system message before the first observation
    max_turns: int = 4
    max_tokens_per_turn: int = 0  #: 0: the policy's rollout.max_new_tokens
    max_total_tokens: int = 0  #: prompt + turns + observations of a sample; 0: the context window alone
    max_observation_tokens: int = 48
    deadline_s: float = 120.0
    env_timeout_s: float = 30.0  #: one environment call (reset, step); past it the episode fails
    limit_reward: float | None = None  #: reward of a sample ended by a limit; None: its env rewards so far
    on_eos: str = "end"  #: a turn ending in EOS: ``end`` the sample, or ``continue`` (a malformed action)
    #: the reward of step ``k`` (0-based, counting the sample's environment steps) counts
    #: ``turn_discount ** k``: 1.0 sums them as they come; below 1 a sooner success pays more
    turn_discount: float = 1.0
    #: shaping: added to the reward once per model turn (e.g. -0.05 to prefer short episodes);
    #: a limit's ``limit_reward``, when set, replaces the whole sum
    turn_penalty: float = 0.0

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> "AgentParams":
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in params.items() if k in known}
        unknown = sorted(k for k in params if k not in known and k != "reward" and not k.startswith("_"))
        if unknown:
            raise WorkflowParamError(unknown[0], f"the agent workflow has no parameter {unknown[0]!r} (its "
                                                 f"parameters: {', '.join(sorted(known))})")
        try:
            p = cls(**kw)
        except TypeError as e:
            raise WorkflowParamError("env", str(e)) from None
        p.check()
        return p

    def check(self) -> None:
        if not isinstance(self.env, str) or not self.env:
            raise WorkflowParamError("env", "name the environment the agent acts in (e.g. text_game)")
        try:
            get_environment(self.env)
        except KeyError as e:
            raise WorkflowParamError("env", str(e.args[0])) from None
        if not isinstance(self.env_params, Mapping):
            raise WorkflowParamError("env_params", f"is {type(self.env_params).__name__}; it is a mapping of the "
                                                   f"environment's keyword arguments")
        check = getattr(get_environment(self.env), "check_params", None)  # an environment's own check
        if callable(check):
            try:
                check(**dict(self.env_params))
            except (TypeError, ValueError) as e:
                raise WorkflowParamError("env_params", f"{e} (environment {self.env!r})") from None
        if self.action_format not in _TAGS:
            raise WorkflowParamError("action_format", f"is {self.action_format!r}; it is one of {', '.join(_TAGS)}")
        try:
            check_tools(list(self.tools) if isinstance(self.tools, (list, tuple)) else self.tools, "tools")
        except ChatTurnsError as e:
            raise WorkflowParamError("tools", str(e)) from None
        if not isinstance(self.system, str):
            raise WorkflowParamError("system", f"is {self.system!r}; it is text")
        if self.on_eos not in ("end", "continue"):
            raise WorkflowParamError("on_eos", f"is {self.on_eos!r}; it is 'end' or 'continue'")
        for key, lo in (("max_turns", 1), ("max_tokens_per_turn", 0), ("max_total_tokens", 0),
                        ("max_observation_tokens", 1)):
            v = getattr(self, key)
            if type(v) is not int or v < lo:
                raise WorkflowParamError(key, f"is {v!r}; it is an integer >= {lo}")
        for key in ("deadline_s", "env_timeout_s"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise WorkflowParamError(key, f"is {v!r}; it is a number of seconds > 0")
        if isinstance(self.turn_discount, bool) or not isinstance(self.turn_discount, (int, float)) or \
                not 0 < self.turn_discount <= 1:
            raise WorkflowParamError("turn_discount", f"is {self.turn_discount!r}; it is a number in (0, 1]")
        if isinstance(self.turn_penalty, bool) or not isinstance(self.turn_penalty, (int, float)) or \
                not math.isfinite(self.turn_penalty) or abs(self.turn_penalty) > 1:
            raise WorkflowParamError("turn_penalty", f"is {self.turn_penalty!r}; it is a number in [-1, 1]")
        v = self.limit_reward
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise WorkflowParamError("limit_reward", f"is {v!r}; it is a number or null")


def check_params(params: Mapping[str, Any]) -> None:
    AgentParams.of(params)


def parse_action(text: str, action_format: str, ended: bool = False) -> tuple[Any, str]:
    """A model turn's action: ``(action, "")``, or ``(None, why it is malformed)``. ``text``
    is the turn decoded; the opening tag was the end of its prompt; ``ended``: the turn ended
    with end-of-sequence (what the ``eos`` format needs)."""
    if action_format == "eos":
        if not ended:
            return None, "end the turn"
        return (text.strip(), "") if text.strip() else (None, "empty action")
    close = _TAGS[action_format][1]
    if close not in text:
        return None, f"end the action with {close}"
    body = text.split(close, 1)[0].strip()
    if not body:
        return None, "empty action"
    if action_format == "tag":
        return body, ""
    try:
        call = json.loads(body)
    except ValueError as e:
        return None, f"tool call is not JSON ({e.msg})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) \
            or not isinstance(call.get("arguments", {}), dict):
        return None, 'a tool call is {"name": ..., "arguments": {...}}'
    return {"name": call["name"], "arguments": call.get("arguments", {})}, ""


def chat_action(text: str, ended: bool, names=None) -> tuple[Any, str]:
    """A chat turn's action: its first tool call (``{"name", "arguments"}``, one of ``names``
    when given), else, once the turn has ended, its text; ``(None, why)`` when it has neither
    or holds a tool call that does not parse."""
    _rest, calls = parse_tool_calls(text, names)
    if calls:
        return {"name": calls[0]["name"], "arguments": calls[0]["arguments"]}, ""
    if "<tool_call>" in text and "</tool_call>" in text:
        return None, ('a tool call is <tool_call>{"name": ..., "arguments": {...}}</tool_call>' +
                      (f" with a name in {', '.join(names)}" if names else ""))
    if not ended:
        return None, "end the turn"
    return (text.strip(), "") if text.strip() else (None, "empty action")


@dataclass
class _Sample:
    index: int
    env: EnvHandle | None = None
    prompt: list[int] = field(default_factory=list)
    parts: list = field(default_factory=list)  #: Turns and (ENV, ids), in order
    length: int = 0  #: tokens of prompt + parts
    end: str | None = None
    env_reward: float = 0.0
    turns: int = 0
    actions: int = 0
    malformed: int = 0
    truncated: int = 0
    pending: Any = None  #: the action to step
    messages: list = field(default_factory=list)  #: ``chat``: the conversation (replies as placeholders' stand-ins)
    answer_as: str = "user"  #: ``chat``: the role of the next observation (``tool`` after a tool call)

    @property
    def context(self) -> list[int]:
        """The next turn's prompt, saying how much of it the agent generated (:func:`chain_context`)."""
        return chain_context(self.prompt, self.parts)

    def add(self, part) -> None:
        self.parts.append(part)
        self.length += len(part.tokens if isinstance(part, Turn) else part[1])


def reward_range(params: Mapping[str, Any]) -> tuple[float, float]:
    """What a sample's reward may be: the environment's (its factory's ``reward_range``, the
    sum of its step rewards, or ``reward_range(env_params)`` where the job says it; default 0
    to 1) plus the turn penalty over ``max_turns``, or the limit reward."""
    cfg = AgentParams.of(params)
    declared = getattr(get_environment(cfg.env), "reward_range", (0.0, 1.0))
    lo, hi = declared(dict(cfg.env_params)) if callable(declared) else declared
    shaping = cfg.turn_penalty * cfg.max_turns
    lo, hi = lo + min(0.0, shaping), hi + max(0.0, shaping)
    if cfg.limit_reward is not None:
        lo, hi = min(lo, cfg.limit_reward), max(hi, cfg.limit_reward)
    return lo, hi


def turn_tokens(params: Mapping[str, Any], max_new_tokens: int) -> int:
    """The longest turn: ``max_tokens_per_turn``, else the policy's ``rollout.max_new_tokens``."""
    return int(params.get("max_tokens_per_turn") or 0) or max_new_tokens


@workflow("agent", roles=("agent",), check=check_params, episode_eval=True, reward_ranges={"agent": reward_range},
          turn_tokens=turn_tokens)
def agent(ep: Episode) -> EpisodeResult:
    """Multi-turn agent episodes in a registered environment, with limits and their reasons."""
    cfg = AgentParams.of(ep.params)
    factory = get_environment(cfg.env)
    open_tag, close_tag = _TAGS[cfg.action_format]
    eos = ep.tokenizer.eos_token_id
    job_seed = int(ep.params.get("_job_seed", 0))
    deadline = time.monotonic() + float(cfg.deadline_s)
    samples = [_Sample(i) for i in range(ep.n_samples)]
    chat = None
    if cfg.action_format == "chat":
        if not getattr(ep.tokenizer, "chat_template", None):
            raise ValueError("agent: action_format chat needs the model's chat template, and the policy's tokenizer "
                             "has none (use tag, json or eos)")
        tools = list(cfg.tools) or list(getattr(factory, "tools", None) or ())
        chat = ChatTurns(ep.tokenizer, tools)

    def left() -> float:
        return deadline - time.monotonic()

    def env_call(s: _Sample, what: str, future):
        """An environment call's answer; past the episode's deadline the sample ends
        (``deadline``), past ``env_timeout_s`` the environment hung and the episode fails."""
        budget = min(float(cfg.env_timeout_s), left())
        try:
            return s.env.wait(what, future, budget)
        except EnvironmentFailed as e:
            if e.reason == ENV_TIMEOUT and budget < cfg.env_timeout_s:
                s.end = "deadline"
                return None
            raise

    def observe(s: _Sample, text: str) -> None:
        if chat is not None:  # a message after the reply, rendered as the template renders it
            message = {"role": s.answer_as, "content": clip(s, text.strip())}
            last = s.parts[-1].tokens[-1] if s.parts and isinstance(s.parts[-1], Turn) and s.parts[-1].tokens \
                else None
            s.add((ENV, chat.after_reply(s.messages, [message], last)))
            s.messages.append(message)
            return
        ids = ep.encode(text)
        if len(ids) > cfg.max_observation_tokens:
            ids, s.truncated = ids[:cfg.max_observation_tokens], s.truncated + 1
        s.add((ENV, ids + ep.encode(open_tag)))

    def clip(s: _Sample, text: str) -> str:
        """``text`` within max_observation_tokens (cut on tokens, counted)."""
        ids = ep.encode(text)
        if len(ids) <= cfg.max_observation_tokens:
            return text
        s.truncated += 1
        return ep.decode(ids[:cfg.max_observation_tokens])

    try:
        with ep.off_engine():
            for s in samples:
                s.env = EnvHandle(cfg.env, factory, cfg.env_params, cfg.env_timeout_s)
                task = EnvTask(ep.episode_id, ep.prompt, ep.answer, dict(ep.metadata), s.index,
                               role_seed(job_seed, ep.episode_id, "env", 0, s.index), ep.attempt)
                first = env_call(s, "reset", s.env.submit_reset(task))
                if s.end is not None:  # (the deadline passed while resetting)
                    raise EnvironmentFailed(cfg.env, ENV_TIMEOUT, "reset outlasted the episode's deadline_s", True)
                first = s.env.checked_reset(first)
                if chat is not None:
                    s.messages = [{"role": "system", "content": cfg.system}] if cfg.system else []
                    s.messages.append({"role": "user", "content": clip(s, first)})
                    ids = chat.first(s.messages)
                else:
                    ids = ep.encode(first)
                    s.truncated += len(ids) > cfg.max_observation_tokens
                    ids = ids[:cfg.max_observation_tokens] + ep.encode(open_tag)
                s.prompt, s.length = ids, len(ids)
        turn = 0
        while True:
            for s in samples:
                if s.end is None:
                    if s.turns >= cfg.max_turns:
                        s.end = "max_turns"
                    elif left() <= 0:
                        s.end = "deadline"
                    elif cfg.max_total_tokens and s.length >= cfg.max_total_tokens:
                        s.end = "max_tokens"
            live = [s for s in samples if s.end is None]
            if not live:
                break
            by_budget: dict[int | None, list[_Sample]] = {}
            for s in live:
                # a turn is at most max_tokens_per_turn, else the policy's rollout.max_new_tokens
                # (what the dataflow's content check allows), and within max_total_tokens
                cap = cfg.max_tokens_per_turn or getattr(ep.roles["agent"], "max_new_tokens", None)
                if cfg.max_total_tokens:
                    room = cfg.max_total_tokens - s.length
                    cap = room if cap is None else min(cap, room)
                by_budget.setdefault(cap, []).append(s)
            for cap, rows in by_budget.items():
                turns = ep.roles["agent"].generate(
                    [s.context for s in rows], seeds=[role_seed(job_seed, ep.episode_id, "agent", turn, s.index)
                                                      for s in rows],
                    max_new_tokens=cap, stop=[close_tag] if close_tag else None)
                for s, t in zip(rows, turns):
                    if list(t.prompt_ids) != s.context:  # the engine answered another prompt: never train on it
                        raise RuntimeError(f"episode {ep.episode_id} sample {s.index}: turn {turn} came back for a "
                                           f"prompt that is not the one sent")
                    s.add(t)
                    s.turns += 1
                    if t.finish_reason == "context":
                        s.end = "context"
                        continue
                    ended = bool(t.tokens) and t.tokens[-1] == eos
                    if ended and cfg.on_eos == "end" and cfg.action_format not in ("eos", "chat"):
                        s.end = "eos"
                        continue
                    if chat is not None:
                        s.messages.append({"role": "assistant", "content": t.text})
                        action, why = chat_action(t.text, ended, chat.tool_names or None)
                        s.answer_as = "tool" if isinstance(action, Mapping) else "user"
                    else:
                        action, why = parse_action(t.text, cfg.action_format, ended)
                    if action is None:
                        s.malformed += 1
                        observe(s, f" error: {why}")
                    else:
                        s.pending = action
            stepping = [s for s in live if s.end is None and s.pending is not None]
            if stepping:
                with ep.off_engine():
                    futures = [(s, s.env.submit_step(s.pending)) for s in stepping]
                    for s, f in futures:
                        s.actions += 1
                        s.pending, out = None, env_call(s, "step", f)
                        if s.end is not None:
                            continue
                        obs, reward, done, _info = s.env.checked_step(out)
                        s.env_reward += reward * cfg.turn_discount ** (s.actions - 1)
                        if done:
                            s.end = "done"
                        else:
                            observe(s, " " + obs)
            turn += 1
    finally:
        for s in samples:
            if s.env is not None:
                s.env.close()

    trajs = []
    for s in samples:
        parts = list(s.parts)
        while parts and not (isinstance(parts[-1], Turn) and parts[-1].tokens):  # context after the last
            parts.pop()  # generated token trains nothing (and may not fit the window)
        shaped = s.env_reward + cfg.turn_penalty * s.turns
        reward = cfg.limit_reward if s.end in LIMITS and cfg.limit_reward is not None else shaped
        trajs.append(Trajectory.chain(s.prompt, parts, "agent", float(reward), end_reason=s.end, turns=s.turns,
                                      actions=s.actions, malformed=s.malformed, observations_truncated=s.truncated,
                                      env_reward=s.env_reward, sample=s.index))
    n = len(samples)
    metrics = {"turns": sum(s.turns for s in samples) / n, "actions": sum(s.actions for s in samples) / n,
               "malformed": sum(s.malformed for s in samples) / n, "success": sum(s.end == "done" for s in samples) / n,
               **{f"end.{r}": sum(s.end == r for s in samples) / n for r in END_REASONS}}
    return EpisodeResult({"agent": trajs}, team_reward=sum(t.reward for t in trajs) / n, metrics=metrics)
