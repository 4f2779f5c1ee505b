"""rqrl.algorithms.run_folder: a new run never writes over an earlier run's folder (two learners at once:
tests/processes/test_run_folder.py)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from rqrl.algorithms.common import write_config
from rqrl.algorithms.dqn import DqnConfig, _DqnRun, save_agent_checkpoint
from rqrl.algorithms.impala import ImpalaConfig, Learner
from rqrl.algorithms.ppo import PpoConfig, PpoLearner
from rqrl.algorithms.run_folder import LOCK_NAME, RunFolder
from rqrl.errors import ConfigError, RunFolderError


@pytest.fixture
def earlier_run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    write_config(folder, PpoConfig(run_name="run", run_dir=str(tmp_path)), "ppo")
    return folder


def test_a_new_run_in_a_folder_that_holds_a_run_is_refused_naming_resume(earlier_run: Path) -> None:
    with pytest.raises(RunFolderError, match=f"holds a run already: resume it with `rqrl train --resume {earlier_run}"):
        RunFolder(earlier_run)
    assert issubclass(RunFolderError, ConfigError)


@pytest.mark.parametrize("learner", ["impala", "ppo", "dqn"])
def test_every_learner_refuses_a_run_name_in_use_before_it_starts(earlier_run: Path, learner: str) -> None:
    settings = {"run_dir": str(earlier_run.parent), "run_name": "run", "progress": False}
    with pytest.raises(RunFolderError, match="holds a run already"):
        if learner == "impala":
            Learner(ImpalaConfig(**settings))
        elif learner == "ppo":
            PpoLearner(PpoConfig(**settings))
        else:
            _DqnRun(DqnConfig(**settings))
    assert sorted(path.name for path in earlier_run.iterdir()) == ["config.json"]  # nothing written over


def test_resuming_the_run_in_the_folder_is_let_in(earlier_run: Path) -> None:
    for resumed in (earlier_run, earlier_run / "checkpoint.safetensors", str(earlier_run / ".." / "run")):
        folder = RunFolder(earlier_run, resumed)
        assert folder.stopping("interrupted (SIGINT)") == ("interrupted (SIGINT) before the run went on: nothing "
                                                           f"written; resume with --resume {earlier_run}")
        folder.close()
    with pytest.raises(RunFolderError):
        RunFolder(earlier_run, earlier_run.parent / "another-run")  # another run's checkpoint into this folder


def test_what_a_learner_says_as_it_stops_depends_on_whether_it_wrote_a_folder(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "new")
    assert folder.stopping("interrupted (SIGINT)") == ("interrupted (SIGINT) before the run started: nothing "
                                                       "written, no run folder")
    assert not (tmp_path / "new").exists()
    folder.open()
    assert (tmp_path / "new" / LOCK_NAME).is_file()
    assert folder.stopping("interrupted (SIGINT)") == (f"interrupted (SIGINT): writing a checkpoint; resume with "
                                                       f"--resume {tmp_path / 'new'}")
    folder.close()


def test_two_learners_of_one_process_cannot_hold_one_folder(tmp_path: Path) -> None:
    """A process's POSIX lock cannot tell its own learners apart (and a second handle's close would drop it): the
    process keeps the folders its learners hold."""
    first = RunFolder(tmp_path / "run")
    first.open()
    with pytest.raises(RunFolderError, match="another learner of this process"):
        RunFolder(tmp_path / "run")
    first.close()
    RunFolder(tmp_path / "run").close()


@pytest.mark.parametrize("learner", ["impala", "ppo", "dqn"])
def test_a_learner_leaves_the_callers_config_as_given(tmp_path: Path, learner: str) -> None:
    """A sweep that trains one config object twice gets two runs: the generated run name stays the learner's."""
    made = {"impala": (ImpalaConfig, Learner), "ppo": (PpoConfig, PpoLearner), "dqn": (DqnConfig, _DqnRun)}
    config_class, learner_class = made[learner]
    config = config_class(run_dir=str(tmp_path), progress=False)
    names = set()
    for _ in range(2):
        made_learner = learner_class(config)
        names.add(made_learner.run_dir.name)
        made_learner.folder.close()
    assert config.run_name is None and len(names) == 2 and all(name.startswith(learner) for name in names)


# --------------------------------------------------------------- resuming: the folder first, then its checkpoint

CONFIGS = {"impala": ImpalaConfig, "ppo": PpoConfig, "dqn": DqnConfig}


def make_learner(algo: str, **settings: object) -> Learner | PpoLearner | _DqnRun:
    config = CONFIGS[algo](progress=False, **settings)
    return {"impala": Learner, "ppo": PpoLearner, "dqn": _DqnRun}[algo](config)


def recorded_run(tmp_path: Path, algo: str, *, checkpoint: bool) -> Path:
    """A run folder as a learner leaves it: config.json, and a checkpoint at 64 env steps if ``checkpoint``."""
    learner = make_learner(algo, run_dir=str(tmp_path), run_name="run")
    learner.folder.open()
    write_config(learner.run_dir, learner.config, algo)
    if checkpoint:
        save_checkpoint_of(learner, env_steps=64)
    learner.folder.close()
    return learner.run_dir


def save_checkpoint_of(learner: Learner | PpoLearner | _DqnRun, env_steps: int, seconds: float = 1.0,
                       recent_returns: tuple[float, ...] = (), best: float | None = None) -> None:
    """The learner's own checkpoint, as if it had run ``env_steps`` steps for ``seconds``."""
    if isinstance(learner, _DqnRun):
        stats = SimpleNamespace(transitions_received=env_steps, train_steps=0, episodes=0, weights_version=0,
                                recent_returns=list(recent_returns))
        learner.best = best
        counters = {**learner.counters(SimpleNamespace(stats=stats)), "seconds": seconds}
        save_agent_checkpoint(learner.run_dir / "checkpoint.safetensors", learner.agent, counters)
        return
    learner.env_steps = env_steps
    learner.recent_returns.extend(recent_returns)
    learner.best_mean_return = best
    learner.checkpoint(seconds)


@pytest.mark.parametrize("algo", ["impala", "ppo", "dqn"])
def test_a_run_killed_before_its_first_checkpoint_resumes_from_its_start(tmp_path: Path, algo: str,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Its learner wrote config.json (and maybe best weights, metrics) but no checkpoint: nothing to go on from."""
    run = recorded_run(tmp_path, algo, checkpoint=False)
    learner = make_learner(algo, resume=str(run))
    try:
        assert learner.run_dir == run
        steps = learner.before["env_steps"] if isinstance(learner, _DqnRun) else learner.env_steps
        assert steps == 0
        assert "holds no checkpoint" in caplog.text and "starts again from its first step" in caplog.text
    finally:
        learner.folder.close()


@pytest.mark.parametrize("algo", ["impala", "ppo", "dqn"])
@pytest.mark.parametrize("name", ["checkpoint", "chekpoint.safetensors"], ids=["no-suffix", "typo"])
def test_a_misnamed_checkpoint_file_is_refused_not_taken_for_a_run_to_start_over(tmp_path: Path, algo: str,
                                                                               name: str) -> None:
    """A file name that is not there, in a run folder that has a checkpoint, restarted the run from step 0 and
    dropped every row of its metrics.csv."""
    from rqrl.algorithms.checkpoint import CheckpointError

    run = recorded_run(tmp_path, algo, checkpoint=True)
    with pytest.raises(CheckpointError, match=f"no weights file at {run / name}"):
        make_learner(algo, resume=str(run / name))
    assert (run / "checkpoint.safetensors").is_file()


@pytest.mark.parametrize("algo", ["impala", "ppo", "dqn"])
def test_a_second_resume_of_a_held_run_is_refused_by_the_lock_before_any_checkpoint(tmp_path: Path,
                                                                                    algo: str) -> None:
    run = recorded_run(tmp_path, algo, checkpoint=False)
    live = RunFolder(run, run)  # the learner writing the run, before its first checkpoint
    try:
        with pytest.raises(RunFolderError, match="is being written by another learner"):
            make_learner(algo, resume=str(run))
    finally:
        live.close()


@pytest.mark.parametrize("algo", ["impala", "ppo", "dqn"])
def test_resuming_a_checkpoint_file_in_a_run_folder_continues_that_folder(tmp_path: Path, algo: str) -> None:
    run = recorded_run(tmp_path, algo, checkpoint=True)
    learner = make_learner(algo, resume=str(run / "checkpoint.safetensors"))
    try:
        assert learner.run_dir == run
        assert (learner.before["env_steps"] if isinstance(learner, _DqnRun) else learner.env_steps) == 64
    finally:
        learner.folder.close()


def test_a_loose_checkpoint_file_starts_a_run_folder_of_its_own(tmp_path: Path) -> None:
    run = recorded_run(tmp_path, "impala", checkpoint=True)
    loose = tmp_path / "loose" / "checkpoint.safetensors"
    loose.parent.mkdir()
    loose.write_bytes((run / "checkpoint.safetensors").read_bytes())
    learner = make_learner("impala", resume=str(loose), run_dir=str(tmp_path))
    learner.folder.close()
    assert learner.run_dir.parent == tmp_path and learner.run_dir.name.startswith("impala-")
    assert learner.env_steps == 64


# ------------------------------------------------------------------------ disks that cannot be written


@pytest.mark.parametrize("algo", ["impala", "ppo", "dqn"])
def test_a_run_folder_that_cannot_be_written_is_refused_before_anything_starts(
        tmp_path: Path, algo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if Path(path) == tmp_path
                        else real_access(path, mode, **kw))
    with pytest.raises(RunFolderError, match=f"cannot write the run folder {tmp_path / 'new'}: {tmp_path} is"):
        make_learner(algo, run_dir=str(tmp_path), run_name="new")
    assert not (tmp_path / "new").exists()


def test_a_run_dir_under_a_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("not a folder")
    with pytest.raises(RunFolderError, match=f"{tmp_path / 'runs'} is a file, not a folder; give a writable"):
        RunFolder(tmp_path / "runs" / "new")


def test_the_learner_that_takes_a_folder_removes_saves_a_killed_learner_cut_short(tmp_path: Path) -> None:
    run = recorded_run(tmp_path, "ppo", checkpoint=True)
    leftovers = [run / "checkpoint.safetensors.tmp", run / "best.safetensors.tmp", run / ".tmpAb3dE9",
                 run / "summary.json.tmp", run / "metrics.csv.partial"]
    kept = [run / ".tmp-notes", run / "notes.tmp", run / "checkpoint.safetensors"]
    for path in [*leftovers, *kept[:2]]:
        path.write_bytes(b"half a file")
    folder = RunFolder(run, run)
    folder.close()
    assert not any(path.exists() for path in leftovers)
    assert all(path.exists() for path in kept)
