"""The import contracts (``[tool.importlinter]`` in pyproject.toml) hold, and they can fail.

``make test`` runs ``tools/import_layers.py`` first; these tests run the same check on a
copy of the installed layout with modules added, so each shows a kind of breach the
contracts must catch: a lower layer importing a higher one (at the top of a module, or
lazily inside a function), a new folder placed in no layer, and a cycle between two
modules of one package (one side lazy, inside a function or under ``TYPE_CHECKING``).
"""

from __future__ import annotations

import pytest

from tests.layer_tool import lint_with as _with
from tests.layer_tool import load_tool


@pytest.fixture(scope="module")
def layers():
    return load_tool()


def test_the_layers_hold(layers, tmp_path):
    result = _with(layers, tmp_path, {})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout  # layers; acyclic; kafka only inside topics
    # Every installed package was seen, not only the thin top the editable install maps.
    assert all((tmp_path / "tree" / n.replace(".", "/") / "__init__.py").exists() for n in layers.package_dirs())


def test_a_backwards_import_breaks_the_contract(layers, tmp_path):
    result = _with(layers, tmp_path, {"topics/_probe.py": "from astraflow.actors import dataflow\n"})
    assert result.returncode == 1
    assert "astraflow.topics is not allowed to import astraflow.actors" in result.stdout
    assert "astraflow.topics._probe -> astraflow.actors.dataflow" in result.stdout


def test_a_lazy_backwards_import_breaks_it_too(layers, tmp_path):
    probe = "def later():\n    from astraflow.chaos import hooks\n    return hooks\n"
    result = _with(layers, tmp_path, {"engines/_probe.py": probe})
    assert result.returncode == 1
    assert "astraflow.engines._probe -> astraflow.chaos.hooks" in result.stdout


def test_a_new_folder_must_be_given_a_layer(layers, tmp_path):
    result = _with(layers, tmp_path, {"newroom/__init__.py": '"""A folder nobody placed."""\n'})
    assert result.returncode == 1
    assert "astraflow.newroom" in result.stdout and "not listed as layers" in result.stdout


@pytest.mark.parametrize("lazy", [
    "def later():\n    from astraflow.topology import _cycle_a\n    return _cycle_a\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from astraflow.topology._cycle_a import A\n",
], ids=["inside-a-function", "type-checking"])
def test_a_cycle_between_two_modules_breaks_the_acyclic_contract(layers, tmp_path, lazy):
    result = _with(layers, tmp_path, {"topology/_cycle_a.py": "from astraflow.topology import _cycle_b\nA = 1\n",
                                      "topology/_cycle_b.py": lazy})
    assert result.returncode == 1
    assert "layers: a lower layer never imports a higher one KEPT" in result.stdout  # one layer: only this sees it
    assert "acyclic: no import cycle between the modules of a package BROKEN" in result.stdout
    assert "No cycles are allowed in astraflow.topology." in result.stdout
    assert "._cycle_a -> ._cycle_b" in result.stdout or "._cycle_b -> ._cycle_a" in result.stdout
