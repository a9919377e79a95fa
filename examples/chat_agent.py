"""An agent written against the OpenAI client, for the ``openai_agent`` workflow
(``workflow.params.agent: astraflow.examples.chat_agent:run``; docs/agentic.md).

It asks the policy the task's sum; when the answer is wrong it says so and asks once more,
in the same conversation. Its reward is 1 when the last answer is right. Nothing in it knows
about AstraFlow: point ``base_url`` at any OpenAI-compatible server and it runs the same.
"""

from __future__ import annotations


def run(base_url: str, task: dict) -> float:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": task["prompt"]}]
    reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
    answer = (reply.choices[0].message.content or "").strip()
    if answer != task["answer"]:
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                     {"role": "user", "content": "wrong. " + task["prompt"]}]
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        answer = (reply.choices[0].message.content or "").strip()
    return 1.0 if answer == task["answer"] else 0.0
