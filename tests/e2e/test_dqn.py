"""`rqrl train --algo dqn` (rqrl.algorithms.dqn on the SEED trainer) as a user runs it."""

from __future__ import annotations

import json

import pytest

from tests.processes import run_rqrl
from tests.run_files import PNG_SIGNATURE, read_rows

pytestmark = pytest.mark.timeout(300)
TRIVIAL_ENV = "tests.fixtures:RqrlGuessSign-v0"


def test_a_short_run_writes_the_run_folder(tmp_path):
    result = run_rqrl("train", "--algo", "dqn", "--env", TRIVIAL_ENV, "--seconds", "4", "--run-dir", str(tmp_path),
                      "--run-name", "short", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "short"
    for name in ("final.safetensors", "metrics.csv", "config.json", "summary.json", "learning_curve.png"):
        assert (run / name).is_file(), name
    assert (run / "learning_curve.png").read_bytes()[:8] == PNG_SIGNATURE
    assert json.loads((run / "config.json").read_text())["algo"] == "dqn"
    rows = read_rows(run / "metrics.csv")
    assert rows and {"env_steps", "mean_return", "train_steps", "weights_version"} <= set(rows[0])
    assert "run folder:" in result.stdout
    evaluated = run_rqrl("evaluate", str(run), "--episodes", "1", timeout=120)
    assert evaluated.returncode == 0 and "RqrlGuessSign-v0: 1 episodes" in evaluated.stdout, evaluated.stderr[-2000:]


def test_impala_only_options_are_refused_with_dqn():
    result = run_rqrl("train", "--algo", "dqn", "--n-actors", "3", timeout=60)
    assert result.returncode == 2 and "--n-actors" in result.stderr


def test_seconds_is_refused_with_impala():
    result = run_rqrl("train", "--seconds", "3", timeout=60)
    assert result.returncode == 2 and "--seconds do(es) not apply to --algo impala" in result.stderr


@pytest.mark.slow
def test_dqn_solves_a_trivial_env(tmp_path):
    result = run_rqrl("train", "--algo", "dqn", "--env", TRIVIAL_ENV, "--seconds", "240", "--run-dir", str(tmp_path),
                      "--run-name", "trivial", timeout=290)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "trivial" / "summary.json").read_text())
    assert summary["solved"] and summary["mean_return"] >= 19.0, summary
    assert (tmp_path / "trivial" / "best.safetensors").is_file()


@pytest.mark.slow
def test_dqn_solves_cartpole(tmp_path):
    result = run_rqrl("train", "--algo", "dqn", "--env", "CartPole-v1", "--seconds", "280", "--run-dir", str(tmp_path),
                      "--run-name", "cartpole", timeout=295)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "cartpole" / "summary.json").read_text())
    assert summary["solved"] and summary["mean_return"] >= 475, summary
