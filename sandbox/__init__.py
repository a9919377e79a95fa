"""The sandbox for model-written code: a separate, limited, isolated process per run.

The public API is :mod:`astraflow.sandbox.api`, re-exported here. The threat model, and
what the sandbox does not stop: ``docs/security.md`` (Sandbox).
"""

from .api import CheckResult, Limits, RunResult, SandboxSettings, check_function, namespaces_available, run_python

__all__ = ["SandboxSettings", "Limits", "RunResult", "CheckResult", "run_python", "check_function",
           "namespaces_available"]
