"""The console table every benchmark prints: a header with its rule, and key/value rows.

Knows nothing about which numbers a benchmark shows.
"""

from __future__ import annotations

from collections.abc import Sequence


def print_header(hdr: str) -> None:
    """A table's header line and a rule as wide as it."""
    print(hdr)
    print("-" * len(hdr))


def print_pairs(rows: Sequence[tuple[str, str]]) -> None:
    """``label  value`` rows, the values aligned after the longest label."""
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
