"""rqrl.algorithms.tracking: --wandb's scalars are each metrics row's, and a missing wandb is one line naming the
extra (tests/e2e/test_tracking.py runs wandb itself, offline)."""

from __future__ import annotations

import sys

import pytest

from rqrl.algorithms.metrics import MetricsWriter
from tests.cli_runner import invoke
from tests.run_files import tensorboard_scalars


class RecordingLog:
    """A ScalarLog that keeps what it is given."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.closed = False

    def log(self, step, scalars):
        self.logged.append((step, dict(scalars)))

    def close(self):
        self.closed = True


def test_the_tracker_gets_each_rows_tensorboard_scalars(tmp_path):
    tracker = RecordingLog()
    writer = MetricsWriter(tmp_path, ["mean_return", "policy_loss"], tracker=tracker)
    writer.write(10, {"mean_return": None, "policy_loss": 0.5})
    writer.write(20, {"mean_return": 3.0, "policy_loss": float("nan")})
    writer.close()
    assert tracker.logged == [(10, {"losses/policy_loss": 0.5}), (20, {"charts/mean_return": 3.0})]
    assert sorted((step, tag) for step, tag, _ in tensorboard_scalars(tmp_path)) == [
        (10, "losses/policy_loss"), (20, "charts/mean_return")]
    assert tracker.closed


@pytest.mark.parametrize("algorithm", [(), ("ppo",), ("dqn",)], ids=["impala", "ppo", "dqn"])
def test_wandb_missing_is_one_line_naming_the_extra(tmp_path, monkeypatch, algorithm):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` finds where it is not installed
    result = invoke("train", *algorithm, "--wandb", "--run-dir", str(tmp_path))
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines() == [
        "Error: --wandb needs wandb, which is not installed: pip install 'rqrl[wandb]'"]
    assert list(tmp_path.iterdir()) == [], "refused before the run started"
