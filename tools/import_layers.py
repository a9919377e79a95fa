"""The import check `make test` runs: import-linter's contracts over the installed layout.

Two contracts, both in ``pyproject.toml``: the layers (a lower layer never imports a higher
one) and no cycles (no two modules of one package, nor two packages, import each other).
grimp, import-linter's graph builder, counts every import statement it reads: at the top of
a module, inside a function, under ``if TYPE_CHECKING:``; so neither contract can be dodged
by importing lazily. An import by name at run time (``importlib.import_module``) it cannot see.

The folders of the repository are installed as ``astraflow.<folder>`` through
``[tool.setuptools.package-dir]`` in ``pyproject.toml``. An editable install maps them with
an import hook, which import-linter's graph builder does not follow: it walks the directory
of the ``astraflow`` package alone and would see the thin top and nothing else. So this
script first mirrors the layout a wheel would have (``astraflow/topics/*.py``, ...) as a
tree of links under ``build/import-layers/``, then runs ``lint-imports`` on that tree with
the contracts of ``pyproject.toml`` (``[tool.importlinter]``).

``python tools/import_layers.py`` exits with lint-imports' status: 0 when every contract
is kept, 1 with the offending import chains (or cycles) printed otherwise. It reads the
code as text and runs none of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "import-layers"


def package_dirs(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, Path]:
    """Installed package name -> its source folder, as setuptools installs them."""
    setup = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    where = setup.get("package-dir", {})
    return {name: pyproject.parent / where.get(name, name.replace(".", "/")) for name in setup["packages"]}


def mirror(out: Path = TREE, pyproject: Path = ROOT / "pyproject.toml") -> Path:
    """A fresh tree under ``out`` whose ``astraflow/<sub>/<module>.py`` links to each installed
    module's source file; returns ``out`` (the directory to put on ``sys.path``)."""
    shutil.rmtree(out, ignore_errors=True)
    for name, src in package_dirs(pyproject).items():
        dest = out.joinpath(*name.split("."))
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.glob("*.py")):
            (dest / f.name).symlink_to(f.resolve())
    return out


def lint(tree: Path, pyproject: Path = ROOT / "pyproject.toml") -> subprocess.CompletedProcess:
    """``lint-imports`` over ``tree`` with the contracts in ``pyproject``; output captured."""
    # The console script's own code, run from ``tree`` so that its ``astraflow`` is the one found.
    cmd = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
                                 "sys.exit(c())", "--config", str(pyproject), "--no-cache", "--no-logo"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)


def main() -> int:
    result = lint(mirror())
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
