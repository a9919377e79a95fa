"""The emulation tests run the real engines with the engine tests' session model."""

import pytest

from tests.engines.conftest import cpu_engine, tiny_model_path, tokenizer  # noqa: F401 - fixtures, found by name


@pytest.fixture(scope="module")
def engine_1t(tiny_model_path):  # noqa: F811 - the fixture above, by name
    """The CPU engine on one thread, as an emulated node runs it (more threads only contend)."""
    import torch

    from astraflow.engines.cpu import CpuEngine
    before = torch.get_num_threads()
    engine = CpuEngine(tiny_model_path, threads=1)
    yield engine
    engine.close()
    torch.set_num_threads(before)  # the process-wide setting the other tests run with
