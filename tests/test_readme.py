"""The README reads in a minute: at most 120 lines, and its results table is what
``python -m astraflow.benchmarks.report --readme`` renders from ``benchmarks/results/*.json``
(as docs/benchmarks.md's sections are what ``report`` renders), never numbers typed by hand."""

from __future__ import annotations

import re
import shutil

import pytest

from astraflow.benchmarks import report
from astraflow.benchmarks.report_format import ReadmeRow, between, readme_table, slug


def test_the_readme_is_at_most_120_lines():
    assert len(report.README.read_text(encoding="utf-8").splitlines()) <= 120


def test_the_results_blocks_are_what_the_json_renders():
    assert report.stale() == []
    assert report.main(["--check"]) == 0


@pytest.mark.parametrize("which", ["readme", "docs"])
def test_a_changed_number_in_a_copy_is_caught(tmp_path, which, capsys):
    readme, docs = tmp_path / "README.md", tmp_path / "benchmarks.md"
    shutil.copy(report.README, readme)
    shutil.copy(report.DOCS, docs)
    page = readme if which == "readme" else docs
    text = page.read_text(encoding="utf-8")
    block = between(text)
    number = re.search(r"\d+\.\d+", block.split("|---", 1)[1])  # the first number of a table's rows
    changed = block.replace(number[0], f"{float(number[0]) + 1:.{len(number[0].split('.')[1])}f}", 1)
    page.write_text(text.replace(block, changed), encoding="utf-8")
    assert report.stale(readme, docs) == [f"{page.name}: its results block is not what the JSON renders; "
                                         f"run `{report.UPDATE}`"]


def test_the_readme_rows_are_few_one_line_with_units_direction_and_a_section():
    rows = [r for b in report.BENCHMARKS if hasattr(b, "readme_row") and (r := b.readme_row(report.load))]
    assert 1 <= len(rows) <= 8
    table = report.render_readme().splitlines()
    assert len(table) == len(rows) + 2  # header and rule, then one line per row
    headings = {slug(line[3:]) for line in report.render().splitlines() if line.startswith("## ")}
    for row, line in zip(rows, table[2:]):
        assert line.endswith(f"| {row.better} is better |") and row.better in ("lower", "higher")
        assert f"(docs/benchmarks.md#{slug(row.section)})" in line and slug(row.section) in headings
        assert row.emulated == ("EMULATED" in row.section) and ("**EMULATED**" in line) == row.emulated
        assert row.measure and row.value and "\n" not in row.value


def test_a_row_without_a_direction_is_refused():
    with pytest.raises(ValueError, match="'lower' or 'higher'"):
        readme_table([ReadmeRow("Demo", "pass@1", "0.5", "better")])


def test_every_benchmark_renders_its_own_section_and_a_missing_file_renders_nothing():
    for bench in report.BENCHMARKS:
        assert bench.report_rows(report.load)[0].startswith("## "), bench.__name__
        assert bench.report_rows(lambda name: None) == []
        assert getattr(bench, "readme_row", lambda load: None)(lambda name: None) is None
