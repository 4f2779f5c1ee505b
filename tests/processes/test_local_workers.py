"""local_workers: the forkserver the local workers come from, started so a Ctrl-C leaves no traceback there.

Each test runs a fresh interpreter: the forkserver is one per process, and these tests look at how it started.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.children import REPO_ROOT, worker_env

pytestmark = pytest.mark.timeout(120)

CTRL_C_DURING_PRELOAD = """
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as start_forkserver() hands it over
os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C pressed while the forkserver starts
import rqrl.engine.forkserver_preload
blocked = sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))
print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, blocked)
"""


def run_child(folder: Path, script: str, *arguments: str) -> subprocess.CompletedProcess:
    """``script`` as a file (the forkserver's children import their target from it), run to its end."""
    path = folder / "learner.py"
    path.write_text(script)
    return subprocess.run([sys.executable, str(path), *arguments], cwd=REPO_ROOT, env=worker_env(),
                          capture_output=True, text=True, timeout=100)


def test_a_ctrl_c_while_the_forkserver_preloads_is_dropped_and_the_handler_left_as_it_was(tmp_path):
    child = run_child(tmp_path, CTRL_C_DURING_PRELOAD)
    assert child.returncode == 0, child.stderr
    assert "KeyboardInterrupt" not in child.stderr
    assert child.stdout.split() == ["True", "[]"]


WORKERS_SIGNALS = """
import signal, sys
import multiprocessing.forkserver
from rqrl.engine.local_workers import multiprocessing_context

def report(queue):
    queue.put((signal.getsignal(signal.SIGINT) is signal.default_int_handler,
               signal.getsignal(signal.SIGINT) == signal.SIG_IGN, sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))))

if __name__ == "__main__":
    if sys.argv[1] == "ignored":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    context = multiprocessing_context("forkserver")
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == set(), "the learner's mask was not restored"
    queue = context.Queue()
    child = context.Process(target=report, args=(queue,))
    child.start()
    print(*queue.get(timeout=30))
    child.join(30)
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    print(int(status["SigBlk"], 16) & (1 << (signal.SIGINT - 1)) != 0)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads the forkserver's signal mask from /proc")
@pytest.mark.parametrize(("learner", "expected"), [("default", ["True", "False", "[]"]),
                                                  ("ignored", ["False", "True", "[]"])])
def test_workers_get_the_sigint_disposition_a_fresh_process_has_and_nothing_blocked(tmp_path, learner, expected):
    child = run_child(tmp_path, WORKERS_SIGNALS, learner)
    assert child.returncode == 0, child.stderr
    lines = child.stdout.splitlines()
    assert lines[0].split() == expected
    assert lines[1] == "False", "the forkserver kept SIGINT blocked"
