"""Test tiers, by folder (a pytest plugin, loaded by tests/conftest.py).

- ``default``: tests/unit and tests/integration (in-process, with a private Redis), the doctests in rqrl/.
  A plain ``pytest`` runs only these; none may start a process other than a redis-server (checked: a test that
  does fails and is told where it belongs).
- ``processes``: tests/processes, real ``rqrl worker`` subprocesses, local workers, env processes, signals.
- ``e2e``: tests/e2e, whole ``rqrl`` commands, compose, the dashboard, the benchmarks' smoke runs.

``--tier NAME`` (repeatable) picks tiers, ``--all`` takes every tier; a test, file or folder of a tier named on the
command line runs whatever its tier. Each test carries its tier as a marker: ``--all -m "not e2e"`` runs two tiers.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TIERS = ("default", "processes", "e2e")
TIER_FOLDERS = {"processes": "processes", "e2e": "e2e"}
"""Tier -> its folder under tests/; every other test, and every doctest, is in the default tier."""
ALLOWED_PROGRAMS = ("redis-server",)
"""What a default-tier test may start: the private Redis servers the Redis-only tests need."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rqrl tiers")
    group.addoption("--tier", action="append", choices=TIERS, default=[],
                    help="run this tier (repeatable; default: the default tier only)")
    group.addoption("--all", action="store_true", default=False, dest="all_tiers", help="run every tier")


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: a test of the {tier} tier (set from its folder, tests/tiers.py)")


def tests_root(config: pytest.Config) -> Path:
    return (config.rootpath / "tests").resolve()


def tier_of(path: Path, root: Path) -> str:
    """The tier of the test file at ``path``: its folder's under ``root`` (tests/), else default."""
    try:
        parts = path.resolve().relative_to(root).parts
    except ValueError:
        return "default"
    for tier, folder in TIER_FOLDERS.items():
        if parts and parts[0] == folder:
            return tier
    return "default"


def chosen_tiers(config: pytest.Config) -> set[str]:
    if config.getoption("all_tiers"):
        return set(TIERS)
    return set(config.getoption("tier")) or {"default"}


def named_paths(config: pytest.Config) -> list[Path]:
    """Files and folders the command line names (with or without ``::test``)."""
    return [(config.invocation_params.dir / str(argument).partition("::")[0]).resolve() for argument in config.args]


def named_explicitly(path: Path, tier: str, named: list[Path], root: Path) -> bool:
    """Whether the command line names the test file at ``path``, or a folder inside its tier's folder that holds
    it (``pytest tests/e2e`` runs the e2e tier; ``pytest tests`` does not)."""
    path = path.resolve()
    folder = root / TIER_FOLDERS[tier]
    return any(path == name or (name == folder or folder in name.parents) and name in path.parents for name in named)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark each test with its tier as it is collected (before ``-m`` selects)."""
    item.add_marker(tier_of(item.path, tests_root(item.config)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chosen, named, root = chosen_tiers(config), named_paths(config), tests_root(config)
    kept, dropped = [], []
    for item in items:
        tier = tier_of(item.path, root)
        wanted = tier in chosen or (tier != "default" and named_explicitly(item.path, tier, named, root))
        (kept if wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(autouse=True)
def default_tier_starts_no_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a default-tier test that starts a process (but a redis-server): the default tier stays in-process
    and fast; a test that needs real processes belongs in tests/processes/."""
    if tier_of(request.node.path, tests_root(request.config)) != "default":
        yield
        return
    started: list[str] = []
    with _recording_starts(started):
        yield
    if started:
        pytest.fail(f"{request.node.nodeid} started {', '.join(sorted(set(started)))}: the default tier runs "
                    f"in-process (RQ workers with work(burst=True)); move this test to tests/processes/", pytrace=False)


@contextlib.contextmanager
def _recording_starts(started: list[str]) -> Iterator[None]:
    """Note each subprocess.Popen and multiprocessing start (but ALLOWED_PROGRAMS) in ``started`` while open."""
    popen_init, process_start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start

    def noting_popen(popen: subprocess.Popen, args: Any, *more: Any, **options: Any) -> None:
        program = args if isinstance(args, str | bytes | os.PathLike) else (list(args) or [""])[0]
        name = os.path.basename(os.fsdecode(program)).split()[0] if program else "?"
        if name not in ALLOWED_PROGRAMS:
            started.append(f"a process ({name})")
        popen_init(popen, args, *more, **options)

    def noting_start(process: multiprocessing.process.BaseProcess) -> None:
        started.append(f"a multiprocessing process ({process.name})")
        process_start(process)

    subprocess.Popen.__init__ = noting_popen  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = noting_start  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]
        multiprocessing.process.BaseProcess.start = process_start  # type: ignore[method-assign]
