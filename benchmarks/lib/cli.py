"""Command-line pieces more than one benchmark takes: ``--set KEY=VALUE`` overrides.

Knows nothing about which keys a job has (the job's loader checks them).
"""

from __future__ import annotations

import argparse

import yaml


def parse_sets(ap: argparse.ArgumentParser, pairs: list[str]) -> dict:
    """``KEY=VALUE`` pairs (the value as YAML) as dotted key -> value; a pair without ``=`` or
    without a key is a usage error of ``ap``."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            ap.error(f"--set expects KEY=VALUE, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out
