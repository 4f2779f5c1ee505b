"""keep_freed_memory: glibc's malloc keeps freed buffers, once per process, unless told not to."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.children import REPO_ROOT

SCRIPT = textwrap.dedent("""
    import resource
    import numpy as np
    from rqrl.engine.memory import keep_freed_memory
    applied = keep_freed_memory()
    assert keep_freed_memory() == applied  # once: the second call answers the same
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):  # 48 MB: over the 32 MB up to which glibc itself learns to keep freed buffers
        buffer = np.empty(48 * 2**20, np.uint8)
        buffer[::4096] = 1  # touch every page: a fresh mapping faults on each
        del buffer
    print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def run(environment: dict[str, str]) -> tuple[bool, int]:
    completed = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, env=environment, capture_output=True,
                               text=True, timeout=60, check=True)
    applied, faults = completed.stdout.split()
    return applied == "True", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_buffers_are_reused_without_page_faults_and_the_variable_turns_it_off():
    import os

    base = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    kept, kept_faults = run({**base, "RQRL_KEEP_FREED_MEMORY": "1"})
    plain, plain_faults = run({**base, "RQRL_KEEP_FREED_MEMORY": "0"})
    assert kept and not plain
    assert plain_faults > 20 * kept_faults, (plain_faults, kept_faults)  # faults on every fresh mapping, each time
