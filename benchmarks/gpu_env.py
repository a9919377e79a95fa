"""Make a GPU machine with PyTorch but no package index able to run ``gpu_check.sh``.

Run by path, before anything of AstraFlow can be imported (so it imports only the standard
library), by ``benchmarks/gpu_check.sh``:

* **wheels**: of the wheels in ``--wheels`` (``make gpu-wheels``: ``benchmarks/gpu_wheels.txt``),
  installs the ones whose distribution this Python lacks into ``--site`` with
  ``pip --no-index --no-deps --target``; a distribution the machine has (its own
  transformers, say) is kept, whatever version the folder holds;
* **package**: where ``astraflow`` is not installed, ``--tree`` becomes a folder holding an
  ``astraflow`` package of links to this checkout's folders, laid out as pyproject.toml's
  ``[tool.setuptools.package-dir]`` maps them (what ``pip install -e .`` would give, with no
  build step). Python must then run with ``PYTHONSAFEPATH=1`` so the checkout's own
  ``astraflow/`` folder (the top package alone) does not shadow it;
* **kernel**: the weight codec's optional C kernel (``weights/_deltakernel.c``) built with the
  C compiler where there is one and no build for this Python yet (it is ignored by git, so a
  copied checkout has none); without it the codec's numpy path writes the same bytes.

Prints one line per step and, last, ``PYTHONPATH=...`` (the folders to put first) for the
shell to export. Knows nothing about what the check measures.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wheel_distribution(wheel: Path) -> str:
    """A wheel's distribution name, from its file name (``pydantic_core-2.50.5-cp312-....whl``)."""
    return wheel.name.split("-")[0]


def missing_wheels(folder: Path) -> list[Path]:
    """The wheels in ``folder`` whose distribution this Python does not have."""
    missing = []
    for wheel in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
        try:
            importlib.metadata.version(wheel_distribution(wheel))
        except importlib.metadata.PackageNotFoundError:
            missing.append(wheel)
    return missing


def install(wheels: list[Path], site: Path) -> None:
    site.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--disable-pip-version-check", "--target", str(site), *map(str, wheels)],
                   check=True)


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """``astraflow`` and each sub-package mapped to its folder, as pyproject.toml's package-dir says."""
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in mapping.items()}


def package_tree(tree: Path, root: Path = ROOT) -> Path:
    """``tree/astraflow``: the top package's files and one link per sub-package folder.

    Only the mappings one level below ``astraflow`` need a link; deeper ones
    (``astraflow.benchmarks.lib`` = ``benchmarks/lib``) follow from their parent's folder."""
    dirs = package_dirs(root)
    pkg = tree / "astraflow"
    if pkg.exists():
        shutil.rmtree(pkg)
    pkg.mkdir(parents=True)
    for entry in dirs["astraflow"].iterdir():
        (pkg / entry.name).symlink_to(entry)
    for name, folder in dirs.items():
        parts = name.split(".")
        if len(parts) == 2:
            link = pkg / parts[1]
            if link.exists() or link.is_symlink():
                link.unlink()
            link.symlink_to(folder, target_is_directory=True)
        elif len(parts) > 2 and dirs[".".join(parts[:-1])] / parts[-1] != folder:
            raise ValueError(f"pyproject.toml maps {name} to {folder}, not inside its parent's folder: "
                             "the link tree cannot express that")
    return pkg


def astraflow_installed() -> bool:
    """Whether ``astraflow.engines`` resolves without this checkout on the path (an install)."""
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if p not in ("", ".") and Path(p or ".").resolve() != ROOT]
        return importlib.util.find_spec("astraflow") is not None and \
            importlib.util.find_spec("astraflow.engines") is not None
    except ModuleNotFoundError:
        return False
    finally:
        sys.path[:] = saved


def build_kernel(root: Path = ROOT) -> str:
    """Build ``weights/_deltakernel`` for this Python with ``cc`` where it is missing; what happened."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    out = root / "weights" / f"_deltakernel{suffix}"
    if out.exists():
        return f"kept {out.name}"
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        return "no C compiler: the codec uses its numpy path (same bytes, slower)"
    done = subprocess.run([cc, "-O3", "-shared", "-fPIC", "-o", str(out), str(root / "weights" / "_deltakernel.c")],
                          capture_output=True, text=True)
    if done.returncode:
        return f"build failed, the codec uses its numpy path: {done.stderr.strip().splitlines()[-1:]}"
    return f"built {out.name}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheels", type=Path, default=ROOT / ".gpu-wheels")
    p.add_argument("--site", type=Path, required=True, help="where missing wheels are installed")
    p.add_argument("--tree", type=Path, required=True, help="where the astraflow link tree goes if needed")
    args = p.parse_args(argv)
    path = []
    missing = missing_wheels(args.wheels)
    if missing:
        install(missing, args.site)
        path.append(str(args.site))
        print(f"installed from {args.wheels}: {', '.join(wheel_distribution(w) for w in missing)}")
    else:
        print(f"no wheel to install ({args.wheels}: {'nothing missing' if args.wheels.is_dir() else 'no such folder'})")
    if astraflow_installed():
        print("astraflow: installed")
    else:
        package_tree(args.tree)
        path.append(str(args.tree))
        print(f"astraflow: this checkout as a package in {args.tree} (run Python with PYTHONSAFEPATH=1)")
    print(f"codec kernel: {build_kernel()}")
    print("PYTHONPATH=" + os.pathsep.join(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
