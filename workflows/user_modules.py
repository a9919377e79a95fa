"""Loading user code a job config names: its module of workflows and rewards
(``workflow.module``) and the module of an agent function (``workflow.params.agent`` of the
``openai_agent`` workflow).

Both are found the same way, by :func:`import_user_module`: first in the directory of the
config file, then on ``sys.path``. A workflow module registers its workflows and rewards with
the registry when it is imported; this module only finds and imports it, the same way in every
process that loads the job config. It knows nothing about the config's other keys, nor about
what the module registers.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["import_user_module"]


def import_user_module(module: str, source: str) -> ModuleType:
    """Import user code a config names (``workflow.module``, the module of
    ``workflow.params.agent``): a dotted name, found first in the directory of the config file
    ``source`` (then on ``sys.path``, as ``PYTHONPATH`` adds to it), or a ``.py`` file,
    relative to that directory (``<dict>``: the working directory). Every component loads the
    job config, so each imports it; a dotted name's directory stays on ``sys.path``, so a later
    lookup by name alone (an episode's) finds the same module."""
    base = Path(source).parent if source != "<dict>" else Path.cwd()
    if module.endswith(".py"):
        path = (base / module).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"no file {path}")
        name = f"astraflow_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
        return mod
    top = module.split(".")[0]
    here = str(base.resolve())
    if ((base / f"{top}.py").is_file() or (base / top).is_dir()) and here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(module)
