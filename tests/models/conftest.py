"""The model tests share the engine tests' session model (built once, then cached)."""

from tests.engines.conftest import tiny_model_path  # noqa: F401 - a fixture, found by name
