"""Every ```python example of the README and the docs site runs as a user copies it: saved as a script and run
with python, on a private Redis and local workers it starts itself, with its budget cut (fewer iterations, fewer
seconds) and a timeout; it must exit 0 and leave no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

from tests.children import REPO_ROOT, processes_with_marker, worker_env
from tests.doc_blocks import Block, all_blocks
from tests.polling import wait_until

BUDGETS = {
    " in range(100):": " in range(3):",
    " in range(20):": " in range(3):",
    " in range(10):": " in range(2):",
    " in range(1000):": " in range(50):",
    "obtain_exact_episodes(5,": "obtain_exact_episodes(1,",
    ".start(120)": ".start(10)",
    "minimum_buffer_size=1000": "minimum_buffer_size=200",
}
"""Each example's budget, cut to a test's size: iterations of its loop, the SEED trainer's seconds."""

CHECKS = {
    ".start(": "    assert agent.train_steps > 0, 'the agent never trained: the actors delivered no transitions'\n",
}
"""Lines appended to an example that holds the key (inside its ``__main__`` block): what it must have done."""

EXAMPLES = all_blocks("python")


def script(block: Block) -> str:
    code = block.code
    for budget, cut in BUDGETS.items():
        code = code.replace(budget, cut)
    return code + "".join(check for key, check in CHECKS.items() if key in code)


def test_the_examples_are_found_and_few_are_left_out() -> None:
    assert len(EXAMPLES) >= 8, [block.name for block in EXAMPLES]
    assert sum(block.not_run is not None for block in EXAMPLES) <= 2, "mark few examples as not run"
    assert sum(block.path == REPO_ROOT / "README.md" for block in EXAMPLES) == 3, "the README's three quickstarts"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("block", EXAMPLES, ids=lambda block: block.name)
def test_the_example_runs_as_a_script_and_leaves_nothing_running(block: Block, tmp_path) -> None:
    if block.not_run is not None:
        pytest.skip(f"marked not run: {block.not_run}")
    path = tmp_path / "example.py"
    path.write_text(script(block))
    marker = f"docs-{uuid.uuid4().hex}"
    try:
        result = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=worker_env(RQRL_TEST_MARKER=marker),
                                capture_output=True, text=True, timeout=150)
        assert result.returncode == 0, f"{block.name} failed:\n{result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        assert "bootstrapping phase" not in result.stderr, result.stderr[-3000:]
        wait_until(lambda: not processes_with_marker(marker), 10, interval=0.2,
                   message=lambda: f"the processes of {block.name} to end: {processes_with_marker(marker)}")
    finally:
        for pid in processes_with_marker(marker):
            os.kill(pid, signal.SIGKILL)
