"""The fenced code blocks of the README and the docs site, as the tests of the docs read them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.children import REPO_ROOT

NOT_RUN = "<!-- example: not run"
"""The line just before a ```python fence that keeps the example from running; the reason follows it."""


@dataclass(frozen=True, kw_only=True)
class Block:
    """One fenced block: its language, its text, where it starts, and the reason it is not run (if marked)."""

    path: Path
    line: int
    language: str
    code: str
    not_run: str | None = None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """README.md, BENCHMARKS.md, workers/README.md (the site includes both) and every page of docs/."""
    return [REPO_ROOT / "README.md", REPO_ROOT / "BENCHMARKS.md", REPO_ROOT / "workers" / "README.md",
            *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, in order (fences at any indentation, as in list items)."""
    found, lines = [], path.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = re.match(r"\s*```(\w*)\s*$", lines[index])
        if not opening:
            index += 1
            continue
        indent = len(lines[index]) - len(lines[index].lstrip())
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        previous = lines[index - 1].strip() if index else ""
        reason = previous[len(NOT_RUN):].rstrip("->").strip(" :") if previous.startswith(NOT_RUN) else None
        code = "\n".join(line[indent:] for line in lines[index + 1:end]) + "\n"
        found.append(Block(path=path, line=index + 1, language=opening.group(1), code=code, not_run=reason))
        index = end + 1
    return found


def all_blocks(language: str) -> list[Block]:
    return [block for path in doc_files() for block in blocks(path) if block.language == language]
