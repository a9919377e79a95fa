"""The shapes every benchmark's results table shares: a README row, the docs link it points to,
the load a result was measured under, and the generated blocks between two markers.

Each benchmark module ends with ``report_rows(load)`` (its section of ``docs/benchmarks.md``)
and, for the few the README quotes, ``readme_row(load)``; ``load(name)`` returns the JSON of
``benchmarks/results/<name>.json`` or ``None``. This module knows the formats and nothing of
any benchmark's JSON; ``benchmarks/report.py`` loops over the benchmarks.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import NamedTuple

from astraflow.benchmarks.lib.stats import fmt_spread  # a spread's cell: every table's, so re-exported here

#: ``load(name)``: the results file ``benchmarks/results/<name>.json``, or None when it is missing
Loader = Callable[[str], "dict | None"]

START, END = "<!-- results:start -->", "<!-- results:end -->"
DOCS_PAGE = "docs/benchmarks.md"

__all__ = ["DOCS_PAGE", "END", "START", "Loader", "ReadmeRow", "between", "fmt_spread", "heading", "load_note",
           "readme_table", "replace_between", "slug"]


class ReadmeRow(NamedTuple):
    """One line of the README's results table."""

    section: str
    """The title of the benchmark's section of docs/benchmarks.md (the row links it)."""
    measure: str
    """What the numbers are, with their unit."""
    value: str
    """The numbers, short: one line of the table."""
    better: str
    """``"lower"`` or ``"higher"``: which way the measure improves."""
    emulated: bool = False
    """Modelled seconds on emulated accelerators, not a measurement on a GPU."""


def slug(title: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading of this title."""
    text = unicodedata.normalize("NFKD", re.sub(r"[`*_]", "", title)).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def heading(title: str) -> list[str]:
    """A benchmark's section heading in docs/benchmarks.md (the README links it by :func:`slug`)."""
    return [f"## {title}", ""]


def readme_table(rows: list[ReadmeRow]) -> str:
    """The README's results table: one line per benchmark, its units and which way is better."""
    if any(r.better not in ("lower", "higher") for r in rows):
        raise ValueError(f"a README row's 'better' is 'lower' or 'higher': {[r.better for r in rows]}")
    out = ["| benchmark | measure | result | better |", "|---|---|---|---|"]
    for r in rows:
        kind = "**EMULATED** " if r.emulated else ""
        out.append(f"| [{r.section}]({DOCS_PAGE}#{slug(r.section)}) | {kind}{r.measure} | {r.value} | "
                   f"{r.better} is better |")
    return "\n".join(out) + "\n"


def between(text: str, start: str = START, end: str = END) -> str:
    """The text between the two markers (without them)."""
    return text[text.index(start) + len(start):text.index(end)]


def replace_between(text: str, block: str, start: str = START, end: str = END) -> str:
    """``text`` with what lies between the markers replaced by a newline and ``block``."""
    i, j = text.index(start) + len(start), text.index(end)
    return text[:i] + "\n" + block + text[j:]


def load_note(d: dict) -> str:
    """``; 1-minute load average a → b on N cores``: how busy the box was while measuring."""
    if d.get("load_earlier_runs"):  # measured in several sittings: the range of their loads
        loads = [x["load"] for x in d["load_earlier_runs"] if x.get("load")] + [d.get("load") or {}]
        ones = [v[0] for x in loads for v in ((x.get("before") or {}).get("loadavg"),
                                                (x.get("after") or {}).get("loadavg")) if v]
        if ones:
            return (f"; measured in {len(loads)} sittings, 1-minute load average {min(ones):.1f}–{max(ones):.1f} "
                    f"on {d['machine']['cpus']} cores")
    if "load_1m_at_run_start" in d:
        x = d["load_1m_at_run_start"]
        return f"; 1-minute load average {x['min']:.1f}–{x['max']:.1f} at the runs' starts on {d['machine']['cpus']} cores"
    load = d.get("load") or {}
    before, after = (load.get("before") or {}).get("loadavg"), (load.get("after") or {}).get("loadavg")
    if not before or not after:
        return ""
    return f"; 1-minute load average {before[0]:.1f} → {after[0]:.1f} on {d['machine']['cpus']} cores"
