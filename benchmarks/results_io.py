"""The result-writing and spread names under their first address, for the modules that still
import them from here (``report.py``, ``broker_loss.py``, ``topics_throughput.py``: each is
being changed by another hand). The code lives in
:mod:`astraflow.benchmarks.lib.results` and :mod:`astraflow.benchmarks.lib.stats`; new code
imports it from there.
"""

from astraflow.benchmarks.lib.results import RESULTS_DIR, load_now, write_results, write_section
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread

__all__ = ["RESULTS_DIR", "fmt_spread", "load_now", "ratio_spread", "spread", "write_results", "write_section"]
