"""Render every benchmark's results from ``benchmarks/results/*.json``: the results section of
``docs/benchmarks.md`` and the README's short table.

Each benchmark owns its tables (``report_rows`` and, for the README's few lines, ``readme_row``,
at the end of its module); this module only knows which benchmarks there are, in the order the
page shows them, and where their output goes. ``python -m astraflow.benchmarks.report`` prints the
page's section, ``--readme`` the README's table; ``--update-docs`` rewrites both between their
``<!-- results:start -->`` and ``<!-- results:end -->`` markers, and ``--check`` exits 1 when
either differs from what the JSON renders (a test runs that check).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from astraflow.benchmarks import (async_vs_sync, async_vs_sync_emulated, async_vs_sync_partial, broker_jit, cross_region,
                                  cross_region_lora, delta_sparsity, demo_run, lora,
                                  elastic_emulated, elastic_slurm, emulated_scale, engine_throughput, multi_policy,
                                  multi_policy_emulated, multi_turn, off_policy, publish_dtype, real_model_runs, real_model_weights,
                                  topics_throughput, trainer_loss, trainer_scaling, weight_transfer)
from astraflow.benchmarks.report_format import Loader, between, readme_table, replace_between
from astraflow.benchmarks.lib.results import RESULTS_DIR

#: every benchmark with a results table, in the order docs/benchmarks.md shows them (every entry
#: must render a section)
BENCHMARKS = (demo_run, real_model_runs, real_model_weights, lora, off_policy, async_vs_sync, async_vs_sync_emulated,
              async_vs_sync_partial, publish_dtype, broker_jit,
              delta_sparsity, multi_policy,
              multi_policy_emulated, emulated_scale, elastic_emulated, elastic_slurm, multi_turn, cross_region, cross_region_lora,
              topics_throughput,
              weight_transfer, engine_throughput, trainer_scaling, trainer_loss)

ROOT = Path(__file__).resolve().parents[1]
RES = RESULTS_DIR
README, DOCS = ROOT / "README.md", ROOT / "docs" / "benchmarks.md"
UPDATE = "python -m astraflow.benchmarks.report --update-docs"


def load(name: str) -> dict | None:
    """``benchmarks/results/<name>.json``, or None when that benchmark has not been run."""
    p = RES / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def render(load: Loader = load) -> str:
    """The results section of docs/benchmarks.md: every benchmark's tables."""
    return "\n".join(line for bench in BENCHMARKS for line in bench.report_rows(load)).rstrip() + "\n"


def render_readme(load: Loader = load) -> str:
    """The README's results table: one line for each benchmark that has a ``readme_row``."""
    rows = [bench.readme_row(load) for bench in BENCHMARKS if hasattr(bench, "readme_row")]
    return readme_table([r for r in rows if r is not None])


def stale(readme: Path = README, docs: Path = DOCS, load: Loader = load) -> list[str]:
    """The files whose results block differs from what the JSON renders, each with how to fix it."""
    out = []
    for path, text in ((readme, render_readme(load)), (docs, render(load))):
        if between(path.read_text(encoding="utf-8")) != "\n" + text:
            out.append(f"{path.name}: its results block is not what the JSON renders; run `{UPDATE}`")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", action="store_true", help="print the README's results table")
    ap.add_argument("--update-docs", "--update-readme", dest="update_docs", action="store_true",
                    help="rewrite the results blocks of docs/benchmarks.md and README.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if either results block differs from the JSON")
    args = ap.parse_args(argv)
    if args.check:
        problems = stale()
        print("\n".join(problems) or "README.md and docs/benchmarks.md match benchmarks/results/")
        return 1 if problems else 0
    if args.update_docs:
        for path, text in ((DOCS, render()), (README, render_readme())):
            path.write_text(replace_between(path.read_text(encoding="utf-8"), text), encoding="utf-8")
            print(f"updated {path}")
        return 0
    print(render_readme() if args.readme else render(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
