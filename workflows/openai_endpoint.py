"""Bring your own agent: an OpenAI-compatible ``/v1/chat/completions`` endpoint per episode.

``workflow: {name: openai_agent, params: {agent: "my_pkg.my_agent:run"}}`` runs, per sample
of a task, the user's agent function in a thread of its own (its module found as
``workflow.module`` is: beside the config file first, then on ``sys.path``):

    def run(base_url: str, task: dict) -> float | None:
        client = openai.OpenAI(base_url=base_url, api_key="unused")
        reply = client.chat.completions.create(model="policy", messages=[...])
        ...
        return reward            # or POST {base_url}/reward {"reward": r}; None: 0

``task`` holds ``prompt``, ``answer``, ``metadata``, ``episode``, ``sample`` and ``attempt``.
The agent's code is written against the real ``openai`` client and runs unchanged: the node
serves each sample at ``base_url`` (``http://127.0.0.1:<port>/s/<sample>/v1``, on loopback,
for the episode's lifetime) and answers every completion with the policy's engine.

**Tokens in, tokens out.** The endpoint keeps each sample's conversation as the exact token
ids the engine saw and produced; a request's ``messages`` must extend the conversation so
far (the messages already sent, then the assistant replies exactly as returned) with new
messages, appended as context (loss mask 0). A request that rewrites the history is refused
(400), never re-tokenized. The trajectory is that token sequence: model tokens train with
their behaviour logprobs, the rest is masked.

**Chat template.** A model whose tokenizer has one (``chat_template: auto``, the default;
``on`` requires it, ``off`` ignores it) gets its first messages rendered as
``apply_chat_template(messages, tools, add_generation_prompt=True)`` gives them; later
messages are rendered as the template renders them after the reply and appended after the
reply's generated tokens, with the text the template closes a turn with (ChatML's
``<|im_end|>`` the model generated, the newline after it it did not) and the next
generation prompt (:class:`~.chat_turns.ChatTurns`). Past replies are never re-rendered:
where a template would render history differently (reasoning dropped, whitespace trimmed)
the generated tokens stay. A model without a template gets the new messages' ``content``
joined by ``separator`` and encoded once.

**Tools.** ``tools`` (function schemas) go to the template, or, when it ignores them
(SmolLM2's), into the system message in the project's words; they must stay the same for a
conversation. A reply holding ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
for a declared tool comes back as ``tool_calls`` (``finish_reason`` ``tool_calls``; the
rest of its text as ``content``, or null); ``role: tool`` messages in later requests are
rendered and appended like any other. ``tool_choice`` may be ``auto`` or ``none`` (no
parsing). Without a chat template ``tools`` is refused.

**Requests.** ``max_tokens`` / ``max_completion_tokens`` cap a reply (within the policy's
``max_new_tokens``); ``stop`` is passed to the engine; ``temperature`` is accepted only equal
to the policy's rollout temperature (the trainer must reproduce the sampling); ``n`` > 1,
``stream`` and ``logit_bias`` are refused with a clear error. A reply is ``finish_reason``
``stop`` (EOS or a stop string), ``tool_calls`` or ``length`` (its cap, or the model's
context window: the sample then ends with reason ``context``). Past ``max_turns``
completions a request is refused (the sample ends ``max_turns``).

**Concurrency.** The samples' requests are gathered and answered in one engine call when
several wait at once; seeds are per sample and turn, so batching never changes a sample.
While agent code runs between requests, the episode is out of the node's batch.

**Ends.** A sample ends when its agent function returns (reason ``done``), raises (the
episode fails with the error and the runner's retry rule), hits a limit, or the episode's
``deadline_s`` passes. It knows nothing about Kafka or where the engine runs.
"""

from __future__ import annotations

import json
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from http.server import ThreadingHTTPServer
from typing import Any

from .chat_turns import ChatTurns, ChatTurnsError, chat_message, check_tools, openai_tool_calls, parse_tool_calls
from .http_env import JsonHandler
from .registry import WorkflowParamError, workflow
from .roles import SamplingOverrideError, role_seed
from .types import ENV, Episode, EpisodeResult, Trajectory, Turn, chain_context
from .user_modules import import_user_module

__all__ = ["OpenAIAgentParams", "openai_agent", "load_agent"]

_MAX_BODY = 4 << 20


@dataclass(frozen=True)
class OpenAIAgentParams:
    """``workflow.params`` of the ``openai_agent`` workflow."""

    agent: str = ""  #: ``module:function``, the agent code
    max_turns: int = 8  #: completions per sample
    deadline_s: float = 120.0  #: wall time of an episode, agent code included
    separator: str = " "  #: between a new message's content and the conversation before it
    model: str = ""  #: the model name the endpoint reports (default: the policy's name)
    #: ``auto``: render messages with the model's chat template when it has one; ``on``: it must; ``off``: never
    chat_template: str = "auto"

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> "OpenAIAgentParams":
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in params if k not in known and k != "reward" and not k.startswith("_"))
        if unknown:
            raise WorkflowParamError(unknown[0], f"the openai_agent workflow has no parameter {unknown[0]!r} (its "
                                                 f"parameters: {', '.join(sorted(known))})")
        p = cls(**{k: v for k, v in params.items() if k in known})
        if not isinstance(p.agent, str) or ":" not in p.agent or p.agent.partition(":")[0].endswith(".py"):
            raise WorkflowParamError("agent", f"is {p.agent!r}; name the agent function as 'module:function' (a "
                                              "dotted module name, found beside the config file or on sys.path)")
        try:
            load_agent(p.agent, str(params.get("_config", "<dict>")))
        except ImportError as e:
            raise WorkflowParamError("agent", f"cannot import the module of {p.agent!r}: {e}") from None
        except (AttributeError, TypeError) as e:
            raise WorkflowParamError("agent", f"{p.agent!r}: {e}") from None
        if type(p.max_turns) is not int or p.max_turns < 1:
            raise WorkflowParamError("max_turns", f"is {p.max_turns!r}; it is an integer >= 1")
        if isinstance(p.deadline_s, bool) or not isinstance(p.deadline_s, (int, float)) or \
                not math.isfinite(p.deadline_s) or p.deadline_s <= 0:
            raise WorkflowParamError("deadline_s", f"is {p.deadline_s!r}; it is a number of seconds > 0")
        if not isinstance(p.separator, str) or not isinstance(p.model, str):
            raise WorkflowParamError("separator", "separator and model are text")
        if p.chat_template not in ("auto", "on", "off"):
            raise WorkflowParamError("chat_template", f"is {p.chat_template!r}; it is auto, on or off")
        return p


def load_agent(spec: str, source: str = "<dict>") -> Callable[[str, dict], Any]:
    """The function ``module:function`` names; the module is found as ``workflow.module`` is
    (:func:`~.user_modules.import_user_module`): first beside the config file ``source``, whose
    folder then stays on ``sys.path``, so an episode's lookup by name alone finds it too."""
    module, _, name = spec.partition(":")
    fn = getattr(import_user_module(module, source), name)
    if not callable(fn):
        raise TypeError(f"{spec} is not a function")
    return fn


class _Refused(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class _Sample:
    index: int
    prompt: list[int] | None = None  #: the first request's messages, encoded
    parts: list = field(default_factory=list)  #: Turns and (ENV, ids), in order
    messages: list[dict] = field(default_factory=list)  #: the conversation as the agent sent and received it
    chat: ChatTurns | None = None  #: its rendering under the chat template (a templated model)
    parse_tools: bool = True  #: the last request's tool_choice was not "none"
    turns: int = 0
    end: str | None = None
    reward: float | None = None
    error: BaseException | None = None
    finished: bool = False

    @property
    def context(self) -> list[int]:
        """The next turn's prompt, saying how much of it the agent generated (:func:`chain_context`)."""
        return chain_context(self.prompt or [], self.parts)


@dataclass
class _Request:
    sample: _Sample
    context: list[int]
    cap: int | None
    stop: list[str] | None
    temperature: float | None = None
    answer: "queue.Queue[tuple[int, dict]]" = field(default_factory=lambda: queue.Queue(1))


class _Endpoint:
    """The episode's HTTP server; requests are queued for the episode's own thread to answer."""

    def __init__(self, ep: Episode, cfg: OpenAIAgentParams, samples: list[_Sample]) -> None:
        self.ep, self.cfg, self.samples = ep, cfg, samples
        self.requests: "queue.Queue[_Request]" = queue.Queue()
        self.lock = threading.Lock()
        self.model = cfg.model or ep.roles["agent"].policy
        templated = bool(getattr(ep.tokenizer, "chat_template", None))
        if cfg.chat_template == "on" and not templated:
            raise ValueError("openai_agent: workflow.params.chat_template is on, but the policy's tokenizer has no "
                             "chat template")
        self.chat = templated and cfg.chat_template != "off"  #: messages rendered with the chat template
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, name=f"openai-{ep.episode_id}", daemon=True).start()

    def base_url(self, sample: int) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/s/{sample}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- one request, on a server thread --------------------------------------------------

    def completion(self, s: _Sample, body: dict) -> dict:
        for key, bad in (("n", lambda v: v not in (None, 1)), ("stream", lambda v: bool(v)),
                         ("logit_bias", lambda v: bool(v))):
            if bad(body.get(key)):
                raise _Refused(400, f"{key}={body.get(key)!r} is not supported by this endpoint (the group's "
                                    f"samples are the job's n_samples)")
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _Refused(400, "messages must be a non-empty list")
        tools = body.get("tools") or None
        if tools is not None and self.chat is False:
            raise _Refused(400, "tools need the model's chat template, and this model has none (or the workflow's "
                                "chat_template is off): describe the tools in a message and parse the reply instead")
        if body.get("tool_choice") not in (None, "auto", "none"):
            raise _Refused(400, f"tool_choice={body.get('tool_choice')!r} is not supported (auto or none): the "
                                f"endpoint cannot force a call the sampled tokens did not make")
        cap = body.get("max_completion_tokens", body.get("max_tokens"))
        if cap is not None and (type(cap) is not int or cap < 1):
            raise _Refused(400, f"max_tokens is {cap!r}; it is an integer >= 1")
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else stop
        if stop is not None and not (isinstance(stop, list) and all(isinstance(x, str) and x for x in stop)):
            raise _Refused(400, "stop is a string or a list of strings")
        temperature = body.get("temperature")
        try:
            sent = [chat_message(m, f"messages[{i}]") for i, m in enumerate(msgs)]
            tools = check_tools(tools)
        except ChatTurnsError as e:
            raise _Refused(400, str(e)) from None
        with self.lock:
            if s.end is not None:
                raise _Refused(400, f"this sample has ended ({s.end})", "episode_ended")
            if s.turns >= self.cfg.max_turns:
                s.end = "max_turns"
                raise _Refused(400, f"the episode's limit of {self.cfg.max_turns} completions is reached",
                               "max_turns")
            known = len(s.messages)
            if sent[:known] != s.messages or len(sent) <= known:
                raise _Refused(400, "messages must extend the conversation so far (the messages sent before and "
                                    "the replies exactly as returned) with new ones; this endpoint never "
                                    "re-tokenizes a rewritten history")
            new = sent[known:]
            if any(m["role"] == "assistant" for m in new):
                raise _Refused(400, "a new message may not be an assistant's: replies come from the endpoint")
            if not self.chat:
                text = self.cfg.separator.join(m["content"] for m in new)
                if s.prompt is None:
                    s.prompt = self.ep.encode(text)
                else:
                    s.parts.append((ENV, self.ep.encode(self.cfg.separator + text)))
            else:
                try:
                    if s.prompt is None:
                        s.chat = ChatTurns(self.ep.tokenizer, tools)
                        s.prompt = s.chat.first(new)
                    elif tools != s.chat.tools:
                        raise _Refused(400, "tools must stay those of the conversation's first request: they are "
                                            "rendered into its first tokens")
                    else:
                        last = next((p for p in reversed(s.parts) if isinstance(p, Turn)), None)
                        s.parts.append((ENV, s.chat.after_reply(s.messages, new, last.tokens[-1] if last and
                                                                last.tokens else None)))
                except ChatTurnsError as e:
                    if s.prompt is None:
                        s.chat = None
                    raise _Refused(400, str(e)) from None
            s.messages = sent
            s.parse_tools = body.get("tool_choice") != "none"
            context = s.context
        if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))):
            raise _Refused(400, f"temperature is {temperature!r}; it is a number")
        req = _Request(s, context, cap, stop, temperature)
        self.requests.put(req)
        status, out = req.answer.get()
        if status != 200:
            raise _Refused(status, out["error"]["message"], out["error"].get("code", "engine_error"))
        return out

    def reward(self, s: _Sample, body: dict) -> dict:
        r = body.get("reward")
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
            raise _Refused(400, f"reward is {r!r}; it is a finite number")
        with self.lock:
            s.reward = float(r)
        return {"ok": True}

    def _handler(self):
        endpoint = self

        class Handler(JsonHandler):

            def _route(self) -> tuple[_Sample | None, str]:
                parts = self.path.split("?", 1)[0].strip("/").split("/")
                if len(parts) >= 3 and parts[0] == "s" and parts[1].isdigit() and parts[2] == "v1":
                    k = int(parts[1])
                    if k < len(endpoint.samples):
                        return endpoint.samples[k], "/".join(parts[3:])
                return None, ""

            def do_GET(self) -> None:  # noqa: N802
                s, rest = self._route()
                if s is not None and rest == "models":
                    self._answer(200, {"object": "list", "data": [{"id": endpoint.model, "object": "model",
                                                                   "created": 0, "owned_by": "astraflow"}]})
                else:
                    self._answer(404, {"error": {"message": f"no GET {self.path}", "type": "not_found"}})

            def do_POST(self) -> None:  # noqa: N802
                s, rest = self._route()
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(min(n, _MAX_BODY))
                route = {"chat/completions": endpoint.completion, "reward": endpoint.reward}.get(rest)
                if s is None or route is None:
                    self._answer(404, {"error": {"message": f"no POST {self.path}", "type": "not_found"}})
                    return
                try:
                    body = json.loads(raw or b"{}")
                    if not isinstance(body, dict):
                        raise _Refused(400, "the body is not a JSON object")
                    self._answer(200, route(s, body))
                except _Refused as e:
                    self._answer(e.status, {"error": {"message": str(e), "type": "invalid_request_error",
                                                      "code": e.code}})
                except ValueError as e:
                    self._answer(400, {"error": {"message": f"the body is not JSON: {e}",
                                                 "type": "invalid_request_error"}})
        return Handler

    def _undo(self, s: _Sample) -> None:
        """Forget the messages of a request that was refused after they were appended."""
        with self.lock:
            if s.parts and not isinstance(s.parts[-1], Turn):
                s.parts.pop()
            elif not s.parts:
                s.prompt, s.chat = None, None
            while s.messages and s.messages[-1]["role"] != "assistant":
                s.messages.pop()

    def refuse_waiting(self) -> None:
        """Answer every request still queued (the episode ended)."""
        while True:
            try:
                r = self.requests.get_nowait()
            except queue.Empty:
                return
            if r is not None:
                r.answer.put((400, {"error": {"message": "the episode has ended", "code": "episode_ended"}}))

    # -- the engine, on the episode's thread ----------------------------------------------

    def answer(self, batch: list[_Request], job_seed: int) -> None:
        """Answer ``batch`` in one engine call per (cap, stop) shape."""
        role = self.ep.roles["agent"]
        shapes: dict[tuple, list[_Request]] = {}
        for r in batch:
            shapes.setdefault((r.cap, tuple(r.stop or ()), r.temperature), []).append(r)
        for (cap, stop, temperature), rows in shapes.items():
            seeds = [role_seed(job_seed, self.ep.episode_id, "agent", r.sample.turns, r.sample.index) for r in rows]
            most = getattr(role, "max_new_tokens", None)  # a reply stays within rollout.max_new_tokens
            cap = min(cap, most) if cap and most else (cap or most)
            try:
                turns = role.generate([r.context for r in rows], seeds=seeds, max_new_tokens=cap,
                                      temperature=temperature, stop=list(stop) or None)
            except SamplingOverrideError as e:  # sampling the trainer could not reproduce: the agent's mistake
                for r in rows:
                    self._undo(r.sample)
                    r.answer.put((400, {"error": {"message": str(e), "code": "sampling_override"}}))
                continue
            except Exception as e:  # noqa: BLE001 - the engine's failure fails these requests and the episode
                for r in rows:
                    r.sample.error = r.sample.error or e
                    r.answer.put((500, {"error": {"message": f"{type(e).__name__}: {e}", "code": "engine_error"}}))
                continue
            for r, t in zip(rows, turns):
                s = r.sample
                with self.lock:
                    if list(t.prompt_ids) != s.context:
                        s.error = RuntimeError(f"episode {self.ep.episode_id} sample {s.index}: a reply came back "
                                               f"for another prompt")
                        r.answer.put((500, {"error": {"message": str(s.error), "code": "engine_error"}}))
                        continue
                    s.parts.append(t)
                    s.turns += 1
                    message: dict[str, Any] = {"role": "assistant", "content": t.text}
                    rest, calls = parse_tool_calls(t.text, s.chat.tool_names) if s.chat and s.chat.tools and \
                        s.parse_tools else ("", [])
                    if calls:
                        message = {"role": "assistant", "content": rest or None, "tool_calls": openai_tool_calls(calls)}
                    s.messages.append(chat_message(message))
                    if t.finish_reason == "context":
                        s.end = "context"
                    finish = "tool_calls" if calls else "length" if t.finish_reason in ("length", "context") else "stop"
                r.answer.put((200, {
                    "id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
                    "model": self.model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    "usage": {"prompt_tokens": len(t.prompt_ids), "completion_tokens": len(t.tokens),
                              "total_tokens": len(t.prompt_ids) + len(t.tokens)}}))


@workflow("openai_agent", roles=("agent",), check=lambda params: OpenAIAgentParams.of(params), episode_eval=True)
def openai_agent(ep: Episode) -> EpisodeResult:
    """Agent code written against the OpenAI client, served by the policy's engine."""
    cfg = OpenAIAgentParams.of(ep.params)
    fn = load_agent(cfg.agent)
    job_seed = int(ep.params.get("_job_seed", 0))
    samples = [_Sample(i) for i in range(ep.n_samples)]
    endpoint = _Endpoint(ep, cfg, samples)
    deadline = time.monotonic() + float(cfg.deadline_s)

    def run(s: _Sample) -> None:
        task = {"prompt": ep.prompt, "answer": ep.answer, "metadata": dict(ep.metadata), "episode": ep.episode_id,
                "sample": s.index, "attempt": ep.attempt}
        try:
            out = fn(endpoint.base_url(s.index), task)
            with endpoint.lock:
                if out is not None:
                    if isinstance(out, bool) or not isinstance(out, (int, float)) or not math.isfinite(out):
                        raise TypeError(f"agent {cfg.agent} returned {out!r:.40}, not a reward (a finite number) "
                                        f"or None")
                    s.reward = float(out)
                s.end = s.end or "done"
        except BaseException as e:  # noqa: BLE001 - reported by the episode
            with endpoint.lock:
                if s.end is None:  # a refusal the agent did not catch after a limit is that limit's end
                    s.error = e
        finally:
            with endpoint.lock:
                s.finished = True
            endpoint.requests.put(None)  # type: ignore[arg-type]  # wake the episode's thread

    threads = [threading.Thread(target=run, args=(s,), name=f"agent-{ep.episode_id}-{s.index}", daemon=True)
               for s in samples]
    try:
        with ep.off_engine():
            for t in threads:
                t.start()
        while True:
            with endpoint.lock:
                live = [s for s in samples if not s.finished]
            if not live:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                with endpoint.lock:
                    for s in live:
                        s.end = s.end or "deadline"
                break
            with ep.off_engine():  # agent code runs: the node's other episodes use the engine
                try:
                    first = endpoint.requests.get(timeout=min(left, 1.0))
                except queue.Empty:
                    continue
            batch = [first] if first is not None else []
            # gather the requests of every sample that is waiting right now (one engine call)
            while True:
                with endpoint.lock:
                    waiting = sum(1 for s in samples if not s.finished)
                if len(batch) >= waiting:
                    break
                try:
                    r = endpoint.requests.get(timeout=0.02)
                except queue.Empty:
                    break
                if r is not None:
                    batch.append(r)
            if batch:
                endpoint.answer(batch, job_seed)
    finally:
        endpoint.refuse_waiting()
        endpoint.close()
    errors = [s.error for s in samples if s.error is not None]
    if errors:
        raise errors[0]
    trajs = []
    for s in samples:
        if s.prompt is None:
            raise RuntimeError(f"agent {cfg.agent} of sample {s.index} ended without asking for a completion")
        parts = list(s.parts)
        while parts and not (isinstance(parts[-1], Turn) and parts[-1].tokens):
            parts.pop()
        trajs.append(Trajectory.chain(s.prompt, parts, "agent", s.reward or 0.0, end_reason=s.end, turns=s.turns,
                                      sample=s.index, reward_reported=s.reward is not None))
    n = len(samples)
    metrics = {"turns": sum(s.turns for s in samples) / n,
               **{f"end.{r}": sum(s.end == r for s in samples) / n for r in ("done", "max_turns", "context",
                                                                           "deadline")}}
    return EpisodeResult({"agent": trajs}, team_reward=sum(t.reward for t in trajs) / n, metrics=metrics)
