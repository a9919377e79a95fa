"""AstraFlow turns numpy's huge-page hint off on import (astraflow/memory.py), unless told not to."""

import os
import subprocess
import sys

PROBE = ("import numpy\nfrom numpy._core import multiarray\nimport astraflow\n"
         "print(multiarray._set_madvise_hugepage(False))\n")


def _probe(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if env_value is not None:
        env["NUMPY_MADVISE_HUGEPAGE"] = env_value
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_importing_astraflow_turns_numpys_huge_page_hint_off():
    # The setter returns the previous value: False means astraflow had already turned it off.
    assert _probe(None) == "False"


def test_the_environment_variable_keeps_numpys_choice():
    assert _probe("1") == "True"
