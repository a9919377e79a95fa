"""Chat templates: a prompt's messages rendered to the token ids a chat model is trained and sampled on.

A chat model's tokenizer carries a template (Jinja, in ``chat_template.jinja`` or
``tokenizer_config.json``) that turns ``[{"role", "content"}, ...]`` into the text it was
tuned on. Here that rendering happens once per prompt, and what travels afterwards is token
ids, never text that something downstream could re-tokenize differently:

* :func:`has_chat_template` — whether a model directory's tokenizer declares a template,
  read from its files without loading transformers (the tiny models have none);
* :func:`prompt_messages` — the conversation a :class:`~astraflow.topics.Prompt` asks for:
  its ``messages`` if it has them, else its text as one user message, after a ``system``
  message when one is given;
* :func:`render` — messages (and ``tools``) to ids, exactly as ``apply_chat_template``
  with ``add_generation_prompt`` gives them;
* :class:`PromptRenderer` — the above for one model and one ``data.chat_template`` setting:
  ``auto`` renders with the model's template when it has one and leaves the tiny models'
  raw prompts as they are; ``off`` never renders; ``on`` requires a template.

It knows nothing about Kafka, engines or training.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CHAT_MODES", "ChatTemplateError", "PromptRenderer", "check_messages", "has_chat_template",
           "prompt_messages", "render"]

CHAT_MODES = ("auto", "on", "off")  #: the values of ``data.chat_template``
ROLES = ("system", "user", "assistant", "tool")


class ChatTemplateError(ValueError):
    """Messages that cannot be rendered, or a chat prompt for a model without a template."""


def has_chat_template(model_dir: str | Path) -> bool:
    """Whether the tokenizer in ``model_dir`` declares a chat template (its files only)."""
    path = Path(model_dir)
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return False
    try:
        return bool(json.loads(config.read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def check_messages(messages: Any, where: str = "messages") -> list[dict[str, Any]]:
    """``messages`` as a list of ``{"role", "content", ...}`` dicts; :class:`ChatTemplateError`
    naming ``where`` and the first bad entry otherwise."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError(f"{where}: a non-empty list of {{role, content}} objects, got {messages!r:.120}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ChatTemplateError(f"{where}[{i}]: needs a role in {'/'.join(ROLES)}, got {m!r:.120}")
        content = m.get("content")
        if not (isinstance(content, str) or (content is None and m.get("tool_calls"))):
            raise ChatTemplateError(f"{where}[{i}]: content must be a string, got {content!r:.120}")
    return messages


def prompt_messages(text: str, messages: Sequence[Mapping[str, Any]] = (), system: str | None = None
                    ) -> list[dict[str, Any]]:
    """The conversation of a prompt: ``messages`` if given, else ``text`` as one user message;
    ``system`` first unless the messages begin with their own."""
    convo = [dict(m) for m in messages] if messages else [{"role": "user", "content": text}]
    if system and convo[0].get("role") != "system":
        convo.insert(0, {"role": "system", "content": system})
    return convo


def render(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
           add_generation_prompt: bool = True) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template (``apply_chat_template``'s,
    with ``tools`` passed to the template)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError("the model's tokenizer has no chat template: chat messages cannot be rendered "
                                "(set data.chat_template: off to send the prompt text as it is)")
    out = tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None, tokenize=True,
                                        add_generation_prompt=add_generation_prompt)
    ids = out["input_ids"] if isinstance(out, Mapping) or hasattr(out, "keys") else out
    return [int(t) for t in ids]


class PromptRenderer:
    """A prompt's token ids for one model: rendered with its chat template, or None (raw text).

    ``mode`` is ``data.chat_template``: ``auto`` (render when the model has a template),
    ``on`` (it must have one) or ``off``; ``model_dir`` None is a model without one (the tiny
    models). ``system`` is ``data.system``, a system message for prompts that bring none. The
    tokenizer (``tokenizer``: the model's, if the caller holds it) is loaded on the first prompt
    that needs it.
    """

    def __init__(self, model_dir: str | Path | None, mode: str = "auto", system: str | None = None,
                 tokenizer: Any = None) -> None:
        if mode not in CHAT_MODES:
            raise ChatTemplateError(f"data.chat_template must be one of {', '.join(CHAT_MODES)}, got {mode!r}")
        self.model_dir, self.system = Path(model_dir) if model_dir is not None else None, system
        templated = self.model_dir is not None and has_chat_template(self.model_dir)
        if mode == "on" and not templated:
            raise ChatTemplateError(f"data.chat_template is on, but the model {self.model_dir} has no chat template")
        self.active = templated and mode != "off"
        self._tokenizer = tokenizer  #: the model's, when the caller has it loaded already

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            # Imported here: transformers costs seconds, and a job on a model without a template never needs it.
            from transformers import AutoTokenizer
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        return self._tokenizer

    def __call__(self, text: str, messages: Sequence[Mapping[str, Any]] = ()) -> list[int] | None:
        """The prompt's ids, or None when prompts go as raw text (then ``messages`` must be empty)."""
        if not self.active:
            if messages:
                raise ChatTemplateError("a prompt brings chat messages, but prompts are not rendered with a chat "
                                        f"template (data.chat_template, or the model {self.model_dir} has none)")
            return None
        return render(self.tokenizer, prompt_messages(text, messages, self.system))
