"""The documentation: the MkDocs site builds strictly, and the README's links resolve.

``mkdocs build --strict`` (settings in ``mkdocs.yml``) fails on a link to a missing page or
file, a missing anchor, a nav entry without its page and a ``docs/*.md`` page left out of
the nav; the README is not part of the site (it is GitHub's front page), so its relative
links are checked here, anchors included.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=300)


def _headings(path: Path) -> set[str]:
    """The anchors MkDocs (Python-Markdown's toc) gives a page's headings."""
    from markdown.extensions.toc import slugify

    out, fence = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^#{1,6} (.+?)\s*#*$", line)):
            text = re.sub(r"[`*_]", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)))
            out.add(slugify(text, "-"))
    return out


def _broken_links(md: Path) -> list[str]:
    broken, fence = [], False
    for n, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
            continue
        for target in [] if fence else LINK.findall(line):
            url = urlsplit(target)
            if url.scheme or url.netloc or target.startswith("mailto:"):
                continue
            path = (md.parent / unquote(url.path)).resolve() if url.path else md
            if not path.exists():
                broken.append(f"{md.name}:{n}: {target}: no such file")
            elif url.fragment and path.suffix == ".md" and url.fragment not in _headings(path):
                broken.append(f"{md.name}:{n}: {target}: no heading with that anchor in {path.name}")
    return broken


def test_the_docs_site_builds_strictly(tmp_path):
    site = tmp_path / "site"
    run = _mkdocs(ROOT / "mkdocs.yml", site)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (site / "index.html").exists() and (site / "gpu-quickstart.html").exists()
    # the plots the pages link to under ../benchmarks/results/ are in the site (tools/mkdocs_hooks.py)
    assert (site / "repo" / "benchmarks" / "results" / "demo_plot.png").exists()


@pytest.mark.parametrize("fault", ["broken_link", "missing_anchor", "page_not_in_nav", "missing_outside_file"])
def test_the_strict_build_fails_on_a_broken_docs_tree(tmp_path, fault):
    """The same build on a copy of the tree with one fault: it must fail, naming it."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "docs", tree / "docs")
    shutil.copytree(ROOT / "tools", tree / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "mkdocs.yml", tree / "mkdocs.yml")
    (tree / "benchmarks" / "results").mkdir(parents=True)
    for png in (ROOT / "benchmarks" / "results").glob("*.png"):
        (tree / "benchmarks" / "results" / png.name).write_bytes(b"")
    (tree / "benchmarks" / "results" / "profile_e2e.md").write_text("x\n")
    assert _mkdocs(tree / "mkdocs.yml", tmp_path / "ok").returncode == 0  # the copy itself builds
    page = tree / "docs" / "chaos.md"
    expect = {"broken_link": ("[see](no-such-page.md)", "no-such-page.md"),
              "missing_anchor": ("[see](topology.md#no-such-section)", "no-such-section"),
              "page_not_in_nav": (None, "orphan.md"),
              "missing_outside_file": ("![plot](../benchmarks/results/no_such_plot.png)", "no_such_plot.png")}[fault]
    if expect[0] is None:
        (tree / "docs" / "orphan.md").write_text("# Orphan\n")
    else:
        page.write_text(page.read_text() + f"\n{expect[0]}\n")
    run = _mkdocs(tree / "mkdocs.yml", tmp_path / "bad")
    assert run.returncode != 0 and expect[1] in run.stdout + run.stderr, run.stdout + run.stderr


def test_the_readme_links_resolve():
    readme = ROOT / "README.md"
    assert _broken_links(readme) == []
    linked = {(ROOT / urlsplit(t).path).resolve() for t in LINK.findall(readme.read_text()) if t.startswith("docs/")}
    guides = {p.resolve() for p in (ROOT / "docs").glob("*.md") if p.name != "index.md"}
    assert guides - linked == set(), "README links every guide"


def test_the_link_check_finds_a_missing_file_and_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Some `code` section\n")
    md = tmp_path / "README.md"
    md.write_text("[ok](docs/a.md#some-code-section) [ok](docs/a.md#a-page) [web](https://example.com/x)\n"
                  "[gone](docs/b.md) [bad anchor](docs/a.md#nope)\n```\n[not a link](in/a/fence.md)\n```\n")
    assert _broken_links(md) == ["README.md:2: docs/b.md: no such file",
                                 "README.md:2: docs/a.md#nope: no heading with that anchor in a.md"]
