"""AstraFlow: RL post-training of (agentic) LLMs as autonomous components over Kafka.

This top package is thin: the CLI (:mod:`astraflow.cli`), the launcher, the job config
(:mod:`astraflow.config`) and the errors every layer raises. Each capability has a folder
of its own (``astraflow.topics``, ``astraflow.engines``, ``astraflow.weights``,
``astraflow.actors``, ...), layered as ``docs/layout.md`` and pyproject's import contract say.
"""

from .memory import configure_numpy_hugepages

__version__ = "0.1.0"

configure_numpy_hugepages()  # see astraflow/memory.py: large fresh buffers fault 7x faster here
