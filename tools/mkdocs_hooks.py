"""MkDocs hook: the repository files the docs link to from outside ``docs/``.

The guides link to the benchmarks' plots and reports where they live
(``../benchmarks/results/demo_plot.png``), so the links work on GitHub as they are. MkDocs
only knows the files under ``docs_dir``; this hook adds every existing repository file that
a page links to with a ``../`` path, copied under ``repo/`` in the site, so such links
resolve there too. A link whose target does not exist is left alone, and the strict build
fails on it like on any broken link (``tests/test_docs.py``).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

#: ``](target)`` of a Markdown link or image whose target leaves ``docs/``
_OUTSIDE = re.compile(r"\]\((\.\./[^)\s#]+)")


class _RepoFile(File):
    """A repository file outside ``docs_dir``, copied as it is (never rendered as a page)."""

    def is_documentation_page(self) -> bool:
        return False


def on_files(files, config):
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    for page in list(files.documentation_pages()):
        text = Path(page.abs_src_path).read_text(encoding="utf-8")
        base = Path(page.src_uri).parent
        for target in _OUTSIDE.findall(text):
            src_uri = posixpath.normpath((base / target).as_posix())
            path = (docs / base / target).resolve()
            if src_uri in files.src_uris or not path.is_file() or root not in path.parents:
                continue
            f = _RepoFile(src_uri, str(docs), config["site_dir"], config["use_directory_urls"],
                          dest_uri="repo/" + path.relative_to(root).as_posix(), inclusion=InclusionLevel.INCLUDED)
            files.append(f)
    return files
