"""LocalWorkers.raise_if_all_died: the error names the exit codes and where to look, by how the workers ended."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from rqrl import NoWorkersError
from rqrl.engine.local_workers import LocalWorkers


@contextmanager
def ended(*codes: int | None) -> Iterator[LocalWorkers]:
    """LocalWorkers whose processes ended with ``codes`` (None: still alive); stand-ins that only answer is_alive
    and exitcode, taken out again before the finalizer would stop them."""
    workers = LocalWorkers()
    workers.processes.extend(SimpleNamespace(is_alive=lambda code=code: code is None, exitcode=code) for code in codes)
    try:
        yield workers
    finally:
        workers.processes.clear()


def test_workers_killed_by_a_signal_are_named_so_with_the_oom_killer_as_a_cause():
    with ended(-9, -9) as workers, pytest.raises(NoWorkersError) as raised:
        workers.raise_if_all_died()
    assert "exit codes [-9]); they were killed by SIGKILL" in str(raised.value) and "dmesg" in str(raised.value)
    assert "__main__" not in str(raised.value)


def test_workers_that_exited_point_to_their_stderr_and_the_main_guard():
    with ended(1, -9) as workers, pytest.raises(NoWorkersError, match=r"exit codes \[-9, 1\]\); their stderr says why"):
        workers.raise_if_all_died()


def test_a_live_worker_is_no_error():
    with ended(-9, None) as workers:
        workers.raise_if_all_died()
