"""Data algorithms plugged into the dataflow actor: prompt curators, group filters, batch composers.

Selected and composed per policy by ``dataflow.algorithms`` in the job config (see
:mod:`.registry`); the dataflow actor calls them through :class:`DataPipeline`.
"""

from .base import (BatchComposer, BatchPlan, Candidate, Context, GroupFilter, Outcome, PromptCurator, TrainedGroup,
                   param, uniform)
from .pipeline import DataPipeline, Decision, build_pipeline
from .registry import ALGORITHMS, parse_spec, register

__all__ = [
    "ALGORITHMS", "BatchComposer", "BatchPlan", "Candidate", "Context", "DataPipeline", "Decision", "GroupFilter",
    "Outcome", "PromptCurator", "TrainedGroup", "build_pipeline", "param", "parse_spec", "register", "uniform",
]
