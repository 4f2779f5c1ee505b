"""The README's examples run as a user copies them: saved as a script and run with python."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.children import REPO_ROOT, worker_env


def python_block(containing: str) -> str:
    """The README's ```python block that contains ``containing``."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO_ROOT / "README.md").read_text(), flags=re.S)
    [block] = [block for block in blocks if containing in block]
    return block


def test_the_seed_example_trains_as_a_script_and_leaves_nothing_running(tmp_path):
    code = python_block("from rqrl.seed import Config, Trainer")
    assert ".start(120)" in code
    script = tmp_path / "seed_example.py"
    script.write_text(code.replace(".start(120)", ".start(6)") + "    print('trained', agent.train_steps)\n")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=worker_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bootstrapping phase" not in result.stderr, result.stderr[-3000:]
    trained = int(result.stdout.split("trained", 1)[1])
    assert trained > 0, "the agent never trained: the actors delivered no transitions"
