"""The emulation tests run the real engines with the engine tests' session model."""

from tests.engines.conftest import cpu_engine, tiny_model_path, tokenizer  # noqa: F401 - fixtures, found by name
