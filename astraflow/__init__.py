"""AstraFlow: RL post-training of (agentic) LLMs as autonomous components over Kafka.

This top package is thin: the CLI (:mod:`astraflow.cli`) and config loading.
The components live in ``astraflow.topics``, ``astraflow.engines``, ``astraflow.actors``, ...
"""

from .memory import configure_numpy_hugepages

__version__ = "0.1.0"

configure_numpy_hugepages()  # see astraflow/memory.py: large fresh buffers fault 7x faster here
