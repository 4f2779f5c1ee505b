"""rqrl.algorithms.run_folder across processes: two learners never write one folder at once; the second is refused
while the first lives, and let in once it has ended, however it ended."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rqrl.algorithms.common import write_config
from rqrl.algorithms.ppo import PpoConfig
from rqrl.algorithms.run_folder import RunFolder
from rqrl.errors import RunFolderError

HOLD = ("import sys; from rqrl.algorithms.run_folder import RunFolder; folder = RunFolder(sys.argv[1], sys.argv[1]); "
        "folder.open(); print('held', flush=True); sys.stdin.read()")


@pytest.mark.timeout(60)
def test_a_folder_another_learner_holds_is_refused_until_that_learner_ends(tmp_path: Path) -> None:
    earlier_run = tmp_path / "run"
    earlier_run.mkdir()
    write_config(earlier_run, PpoConfig(run_name="run", run_dir=str(tmp_path)), "ppo")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(earlier_run)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderError, match=f"being written by another learner \\(process {holder.pid} on "):
            RunFolder(earlier_run, earlier_run)
        holder.kill()  # not even a chance to let go: the lock ends with the process
        holder.wait(10)
        RunFolder(earlier_run, earlier_run).close()
    finally:
        holder.kill()
        holder.wait(10)


@pytest.mark.timeout(120)
def test_a_dqn_launch_that_fails_leaves_no_run_folder(tmp_path: Path) -> None:
    """An env registered only in the learner's process: every actor thread dies, the trainer gives up, and the
    run's name is free for the run that fixes it (a folder left behind would be refused as a run)."""
    import gymnasium

    from rqrl.algorithms.dqn import DqnConfig, train
    from rqrl.errors import ProcessesDiedError

    gymnasium.register("LearnerOnlyCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv",
                       max_episode_steps=200)
    try:
        with pytest.raises(ProcessesDiedError, match="every thread of actor 0"):
            train(DqnConfig(env_id="LearnerOnlyCartPole-v0", run_dir=str(tmp_path), run_name="exp", progress=False,
                            actor_processes=1, actor_threads=2, total_env_steps=2000, minimum_buffer_size=100))
    finally:
        del gymnasium.registry["LearnerOnlyCartPole-v0"]
    assert not (tmp_path / "exp").exists()
