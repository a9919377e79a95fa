"""A conversation that grows turn by turn under a chat template, token-exact, and its tool calls.

A multi-turn episode samples turn ``k+1`` from the exact tokens of turn ``k`` (tokens in,
tokens out): what the model generated is kept as generated, never decoded and re-encoded.
Only the messages that arrive between turns (a user's, a tool's, an environment's) are new
text, and :class:`ChatTurns` renders them *as the model's chat template renders them*:

* the first messages: ``apply_chat_template(messages, tools, add_generation_prompt=True)``
  (:func:`.chat.render`), so the prompt is exactly what a fresh render gives;
* after a reply, the new messages: the template renders the whole conversation twice, with
  and without them, each generated reply standing in as a placeholder (:data:`PLACEHOLDER`),
  and the new tokens are the text the first rendering adds after the second (it must be a
  prefix, else the conversation cannot grow token-exact under this template:
  :class:`ChatTurnsError`), preceded by the **bridge**: what the template writes after a
  reply's content to close the turn (ChatML: ``<|im_end|>`` and a newline) minus the
  end-of-turn token the model generated itself. That text is tokenized on its own; where it
  begins at a special token (ChatML) its tokens are a fresh render's.

What a template would render differently in history is not re-rendered: the generated
tokens stay. A template that drops a past reply's reasoning, trims its whitespace or
rewrites its tool calls into its own format changes only the placeholder's text, which no
token of the conversation is taken from.

**Tools.** The tool schemas (OpenAI's ``{"type": "function", "function": {"name",
"description", "parameters"}}``) go to the template. A template that ignores them (SmolLM2's)
gets them described in the system message instead (:func:`tools_system_text`; appended to
the first system message, or as a system message of their own). Either way a tool call is
written ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the format SmolLM2's and
Hermes-style templates train; :func:`parse_tool_calls` reads it), and a tool's result comes
back as a ``tool`` message, rendered by the template.

It knows nothing about HTTP, engines, environments or training.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from .chat import ChatTemplateError, render

__all__ = ["ChatTurns", "ChatTurnsError", "PLACEHOLDER", "chat_message", "check_tools",
           "openai_tool_calls", "parse_tool_calls", "tools_system_text"]

#: what a generated reply's content is rendered as when the template renders a conversation
#: to find the text of the messages after it (no whitespace, no markup: templates leave it be)
PLACEHOLDER = "@@astraflow-reply-{}@@"

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class ChatTurnsError(ChatTemplateError):
    """Messages, tools or a template with which a conversation cannot grow token-exact."""


def check_tools(tools: Any, where: str = "tools") -> list[dict[str, Any]]:
    """``tools`` as a list of OpenAI function schemas; :class:`ChatTurnsError` naming the first bad one."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ChatTurnsError(f"{where}: a list of {{type: function, function: {{name, parameters}}}} objects, "
                             f"got {tools!r:.120}")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type") != "function" or not isinstance(fn, Mapping) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ChatTurnsError(f"{where}[{i}]: a tool is {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                                 f"\"parameters\": {{...}}}}}}, got {t!r:.120}")
        if "parameters" in fn and not isinstance(fn["parameters"], Mapping):
            raise ChatTurnsError(f"{where}[{i}].function.parameters: a JSON schema object, got "
                                 f"{fn['parameters']!r:.80}")
    return [dict(t) for t in tools]


def tools_system_text(tools: Sequence[Mapping[str, Any]]) -> str:
    """The project's description of ``tools`` for a template that does not render them: the
    schemas one JSON object a line between ``<tools>`` tags, then how to call one."""
    lines = "\n".join(json.dumps(dict(t), ensure_ascii=False) for t in tools)
    return ("You can call tools. Their JSON schemas:\n<tools>\n" + lines + "\n</tools>\n"
            "To call a tool, write <tool_call>{\"name\": \"<tool name>\", \"arguments\": {<the arguments as a JSON "
            "object>}}</tool_call> and end your turn; its result comes back in a message of role tool.")


def parse_tool_calls(text: str, names: Sequence[str] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """A reply's tool calls in the ``<tool_call>{"name", "arguments"}</tool_call>`` format and
    the rest of its text (stripped); a call is ``{"name": str, "arguments": dict}``. A block whose JSON is not such an object, or that names a
    tool outside ``names`` (when given), is not a call: it stays in the text."""
    calls: list[dict[str, Any]] = []
    rest: list[str] = []
    at = 0
    for m in _TOOL_CALL.finditer(text):
        try:
            body = json.loads(m.group(1))
        except ValueError:
            continue
        args = body.get("arguments", {}) if isinstance(body, dict) else None
        if isinstance(args, str):  # arguments as a JSON string, as OpenAI writes them
            try:
                args = json.loads(args)
            except ValueError:
                continue
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not isinstance(args, dict) \
                or (names is not None and body["name"] not in names):
            continue
        calls.append({"name": body["name"], "arguments": args})
        rest.append(text[at:m.start()])
        at = m.end()
    rest.append(text[at:])
    return "".join(rest).strip(), calls


def chat_message(m: Any, where: str = "message") -> dict[str, Any]:
    """An OpenAI-shaped message as a conversation keeps it: ``role``, ``content`` (text; content
    parts joined; empty for a reply that only calls tools), and where present ``tool_calls``
    (``[{"name", "arguments"}]``, arguments parsed: ids and JSON spelling do not count) and a
    tool message's ``tool_call_id`` / ``name``. Other fields are dropped. :class:`ChatTurnsError` otherwise."""
    if not isinstance(m, Mapping) or m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
        raise ChatTurnsError(f"{where}: an object with a role (system, user, assistant or tool), got {m!r:.120}")
    role, content = m["role"], m.get("content")
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(c, Mapping) and c.get("type") == "text" and isinstance(c.get("text"), str)
                   for c in content):
            raise ChatTurnsError(f"{where}: only text content parts are supported")
        content = "".join(c["text"] for c in content)
    calls = m.get("tool_calls") if role == "assistant" else None
    if content is None and calls:
        content = ""
    if not isinstance(content, str):
        raise ChatTurnsError(f"{where}: a {role} message needs text content")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
    if calls:
        out["tool_calls"] = []
        for c in calls if isinstance(calls, list) else [None]:
            fn = c.get("function") if isinstance(c, Mapping) else None
            args = fn.get("arguments") if isinstance(fn, Mapping) else None
            try:
                args = json.loads(args) if isinstance(args, str) else args
            except ValueError:
                args = None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not isinstance(args, dict):
                raise ChatTurnsError(f"{where}: tool_calls are [{{id, type: function, function: {{name, arguments}}}}]"
                                     f", got {calls!r:.120}")
            out["tool_calls"].append({"name": fn["name"], "arguments": args})
    for key in ("tool_call_id", "name"):
        if role == "tool" and isinstance(m.get(key), str):
            out[key] = m[key]
    return out


def openai_tool_calls(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``calls`` as an OpenAI message's ``tool_calls`` (ids made here; arguments a JSON string)."""
    return [{"id": f"call_{uuid.uuid4().hex[:20]}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
            for c in calls]


class ChatTurns:
    """One conversation's tokens under ``tokenizer``'s chat template, with ``tools`` fixed for it.

    :meth:`first` gives the prompt of the first messages; :meth:`after_reply` the tokens to
    append after a generated reply for the messages that follow it. Messages are
    ``{"role", "content"}`` dicts (``tool`` messages may carry ``tool_call_id`` / ``name``);
    replies in a history are ``assistant`` messages, rendered only as placeholders.
    """

    def __init__(self, tokenizer: Any, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTurnsError("the model's tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.tools = check_tools(list(tools) if tools else None)
        self.native_tools = True  # (while probing: render the schemas through the template alone)
        probe = [{"role": "user", "content": "x"}]
        self.native_tools = bool(self.tools) and self._text(probe, True) != self._text(probe, True, tools=False)
        self.tool_names = [t["function"]["name"] for t in self.tools]

    # -- rendering ----------------------------------------------------------------------

    def _messages(self, messages: Sequence[Mapping[str, Any]], tools: bool = True) -> list[dict[str, Any]]:
        """What the template is given: plain fields, replies as placeholders, and the tools in
        the system message when the template does not render them itself."""
        out, reply = [], 0
        for m in messages:
            if m["role"] == "assistant":
                out.append({"role": "assistant", "content": PLACEHOLDER.format(reply)})
                reply += 1
                continue
            one = {"role": m["role"], "content": m["content"]}
            for key in ("tool_call_id", "name"):
                if m["role"] == "tool" and isinstance(m.get(key), str):
                    one[key] = m[key]
            out.append(one)
        if tools and self.tools and not self.native_tools:
            described = tools_system_text(self.tools)
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + described}
            else:
                out.insert(0, {"role": "system", "content": described})
        return out

    def _text(self, messages: Sequence[Mapping[str, Any]], generation_prompt: bool, tools: bool = True) -> str:
        give = self.tools if tools and self.tools else None
        try:
            return self.tokenizer.apply_chat_template(self._messages(messages, tools), tools=give, tokenize=False,
                                                      add_generation_prompt=generation_prompt)
        except Exception as e:  # noqa: BLE001 - jinja's errors (raise_exception, undefined) are the messages' fault
            raise ChatTurnsError(f"the model's chat template refuses these messages: {type(e).__name__}: {e}") \
                from None

    def first(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The prompt of a conversation's first messages (no reply among them): a fresh render."""
        if any(m["role"] == "assistant" for m in messages):
            raise ChatTurnsError("the first messages of a conversation may not hold a reply (an assistant message): "
                                 "replies are generated")
        try:
            return render(self.tokenizer, self._messages(messages), tools=self.tools if self.native_tools else None)
        except ChatTemplateError:
            raise
        except Exception as e:  # noqa: BLE001 - as in _text
            raise ChatTurnsError(f"the model's chat template refuses these messages: {type(e).__name__}: {e}") \
                from None

    def after_reply(self, history: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]],
                    last_token: int | None) -> list[int]:
        """The tokens to append after the reply that ends ``history`` (an assistant message) for
        the ``new`` messages, through the next generation prompt. ``last_token`` is the reply's
        last generated token: when it is the text the template closes a turn with first (the
        end-of-turn token), it is not written twice."""
        if not history or history[-1]["role"] != "assistant":
            raise ChatTurnsError("after_reply(): the history must end with the reply")
        if not new or any(m["role"] == "assistant" for m in new):
            raise ChatTurnsError("after a reply come one or more messages that are not replies")
        before = self._text(history, False)
        after = self._text(list(history) + list(new), True)
        mark = PLACEHOLDER.format(sum(m["role"] == "assistant" for m in history) - 1)
        if before.count(mark) != 1 or not after.startswith(before):
            raise ChatTurnsError("the model's chat template renders this conversation differently once new messages "
                                 "follow (its earlier text is not a prefix of the longer rendering), so it cannot "
                                 "grow token-exact")
        close = before[before.index(mark) + len(mark):]
        if last_token is not None:
            generated_end = self.tokenizer.decode([int(last_token)], skip_special_tokens=False)
            if int(last_token) in set(self.tokenizer.all_special_ids) and close.startswith(generated_end):
                close = close[len(generated_end):]
        return [int(t) for t in self.tokenizer.encode(close + after[len(before):], add_special_tokens=False)]
