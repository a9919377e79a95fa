"""The layer check of ``tools/import_layers.py``, loaded for tests: a copy of the installed layout
with planted modules, linted with the contracts of ``pyproject.toml``.

Shared by ``tests/test_layers.py`` (layers, cycles) and ``tests/topics/test_kafka_boundary.py``
(kafka-python only inside ``topics/``). It knows no contract itself.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_tool() -> ModuleType:
    """``tools/import_layers.py`` as a module (it is a script, not an installed package)."""
    spec = importlib.util.spec_from_file_location("import_layers", ROOT / "tools" / "import_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lint_with(layers: ModuleType, tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess:
    """Mirror the layout under ``tmp_path``, add ``files`` (paths under ``astraflow/``), lint it."""
    tree = layers.mirror(tmp_path / "tree")
    for rel, text in files.items():
        path = tree / "astraflow" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return layers.lint(tree)
