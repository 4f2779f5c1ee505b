"""mkdocs hook: docstrings' doctests (``>>>`` lines and their output) render as code, not as nested quotes.

rqrl's docstrings are prose with doctests in them (pytest runs them); Markdown reads ``>>>`` as three levels of
block quote. This wraps each run of doctest lines in a ```pycon fence before Markdown sees it, on the pages and
in the docstrings mkdocstrings renders (it converts them with the site's Markdown extensions).
"""

from __future__ import annotations

import re
from typing import Any

from markdown import Markdown
from markdown.extensions import Extension
from markdown.preprocessors import Preprocessor


class DoctestFences(Preprocessor):
    """Fence each doctest: a ``>>>`` line, its ``...`` continuations, and its output up to a blank line."""

    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        in_fence = in_doctest = False
        for line in lines:
            if re.match(r"\s*(```|~~~)", line):
                in_fence = not in_fence
            if not in_fence and not in_doctest and line.lstrip().startswith(">>>"):
                out += ["```pycon"]
                in_doctest = True
            elif in_doctest and not line.strip():
                out += ["```"]
                in_doctest = False
            out.append(line)
        return out + (["```"] if in_doctest else [])


class DoctestFencesExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 (Markdown's name)
        md.preprocessors.register(DoctestFences(md), "rqrl_doctest_fences", 40)


def on_config(config: Any) -> Any:
    config.markdown_extensions.append(DoctestFencesExtension())
    return config
