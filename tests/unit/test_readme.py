"""The README stays a front door: short, with the install steps and the test commands CI runs, and links that
resolve. Its examples run in tests/e2e/test_docs.py."""

from __future__ import annotations

import re

from tests.children import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def test_the_readme_is_at_most_150_lines() -> None:
    assert len(README.splitlines()) <= 150, "move detail to a page of docs/ and link it"


def test_the_readme_gives_the_test_commands_ci_runs() -> None:
    assert "bash scripts/run-tests.sh " in README and "bash scripts/run-tests.sh --all" in README
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "bash scripts/run-tests.sh --all" in ci
    assert "RQRL_CONSTRAINTS=constraints-lowest.txt bash scripts/run-tests.sh\n" in ci


def test_the_readme_installs_torch_from_the_cpu_index_before_rqrl() -> None:
    cpu = README.index("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu")
    assert cpu < README.index('pip install -e ".[dashboard]"')
    assert "bash scripts/setup.sh" in README
    setup = (REPO_ROOT / "scripts" / "setup.sh").read_text()
    assert 'pip install "torch==2.13.0"' in setup and setup.index("torch==2.13.0") < setup.index('pip install -q -e')


def test_the_readmes_extras_are_the_projects() -> None:
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    extras = set(re.findall(r"^(\w+) = \[", pyproject.split("[project.optional-dependencies]")[1].split("\n[")[0],
                            flags=re.M))
    named = set(re.findall(r"`(\w+)` \(", README.split("Extras:")[1].split("\n\n")[0]))
    assert named == extras


def test_the_readmes_relative_links_resolve() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    relative = [link for link in links if "://" not in link]
    assert len(relative) >= 15, relative
    assert [link for link in relative if not (REPO_ROOT / link).is_file()] == []


def test_the_docs_pages_rqrl_names_in_its_messages_exist() -> None:
    named = {match for path in (REPO_ROOT / "rqrl").rglob("*.py")
             for match in re.findall(r"docs/[\w./-]+\.md", path.read_text())}
    assert {"docs/service.md", "docs/redis-security.md", "docs/maze-migration.md"} <= named
    assert [page for page in sorted(named) if not (REPO_ROOT / page).is_file()] == []
