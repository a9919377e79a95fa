"""kafka-python stays inside ``topics/``: the contract in ``pyproject.toml`` holds, and it can fail.

``tools/import_layers.py`` (``make test`` runs it first) checks a ``forbidden`` contract:
no module of the project outside ``astraflow.topics`` imports ``kafka``. These tests run the
same check on a copy of the installed layout with one module added, as ``tests/test_layers.py``
does for the layers, and scan the product code for callers reaching past a
:class:`~astraflow.topics.Consumer` into its kafka-python consumer (``.raw``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.layer_tool import lint_with as _with
from tests.layer_tool import load_tool

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "kafka: kafka-python is imported only inside astraflow.topics"


@pytest.fixture(scope="module")
def layers():
    return load_tool()


def test_only_topics_imports_kafka(layers, tmp_path):
    result = _with(layers, tmp_path, {})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{CONTRACT} KEPT" in result.stdout


def test_a_planted_kafka_import_outside_topics_breaks_it(layers, tmp_path):
    result = _with(layers, tmp_path, {"weights/_probe.py": "from kafka import TopicPartition\n"})
    assert result.returncode == 1
    assert f"{CONTRACT} BROKEN" in result.stdout
    assert "astraflow.weights._probe -> kafka" in result.stdout


def test_a_lazy_kafka_import_breaks_it_too(layers, tmp_path):
    probe = "def later():\n    import kafka.errors\n    return kafka.errors\n"
    result = _with(layers, tmp_path, {"status_probe.py": probe})
    assert result.returncode == 1
    assert "astraflow.status_probe -> kafka" in result.stdout


def test_inside_topics_kafka_is_allowed(layers, tmp_path):
    result = _with(layers, tmp_path, {"topics/_probe.py": "import kafka\n"})
    assert result.returncode == 0, result.stdout + result.stderr


def _product_sources() -> list[Path]:
    skip = {".venv", "tests", "build", ".git", "topics", "node_modules"}
    return [p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts)]


def test_no_product_code_outside_topics_reaches_into_a_consumers_kafka_client():
    """``consumer.raw.seek(...)`` and the like: a Consumer method does each of these."""
    sources = _product_sources()
    assert len(sources) > 100
    offenders = {str(p.relative_to(ROOT)): n for p in sources
                 if (n := len(re.findall(r"\.raw\.\w", p.read_text())))}
    assert not offenders, f".raw used outside topics/ (use the Consumer's methods): {offenders}"
