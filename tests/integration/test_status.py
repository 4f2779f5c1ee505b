"""`rqrl status` against a real Redis, for every family: it says the learner is alive exactly when `rqrl health
--run` does, and shows the figures each learner publishes at its heartbeat, no others (in-process, no process
started; tests/unit/test_status.py checks the screen from a RunStatus)."""

from __future__ import annotations

import time

import pytest

from rqrl import RQSampler
from rqrl.cli.status import read_status
from rqrl.engine.keys import RunKeys
from rqrl.engine.run_config import RunConfig
from rqrl.seed.config import Config
from rqrl.seed.store import SeedRecord, SeedRun
from rqrl.seed.trainer import Trainer
from tests import fixtures
from tests.cli_runner import invoke
from tests.conftest import TEST_SECRET
from tests.in_process import obtain_in_process
from tests.seed_fixtures import cartpole_agent, make_cartpole

pytestmark = pytest.mark.timeout(120)


def status_screen(redis_url: str, run_name: str) -> str:
    result = invoke("status", "--run", run_name, "--redis-url", redis_url)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result.stdout


def learner_line(screen: str) -> str:
    [line] = [line for line in screen.splitlines() if line.startswith("  learner   ")]
    return line


def test_status_says_the_learner_is_alive_exactly_when_rqrl_health_does(connection, redis_url, run_name):
    """A sampler's learner trains between calls and beat no figures: status said "no heartbeat published yet" while
    health said alive. Both now read the heartbeat deadline."""
    keys = RunKeys(run_name)
    config = RunConfig(run_name=run_name, run_id="r", queue_name="rqrl", n_rollout_steps=4, n_actors=1, batch_size=1,
                       queue_bound=1, actor_env_seeds=[0], actor_agent_seeds=[0], actor_groups=[[0]])
    connection.set(keys.config, config.to_json())
    answers = {}
    for case, deadline, beat in (("no heartbeat", None, None), ("deadline, no figures", time.time() + 300, None),
                                 ("deadline passed", time.time() - 1, time.time() - 301),
                                 ("deadline deleted", None, time.time()), ("deadline junk", "junk", None)):
        connection.delete(keys.learner_deadline, keys.learner)
        if deadline is not None:
            connection.set(keys.learner_deadline, deadline)
        if beat is not None:
            connection.hset(keys.learner, "beat", repr(beat))
        healthy = invoke("health", "--run", run_name, "--redis-url", redis_url).exit_code == 0
        line = learner_line(status_screen(redis_url, run_name))
        assert line.startswith("  learner   alive") == healthy, (case, line)
        answers[case] = healthy
    assert answers == {"no heartbeat": False, "deadline, no figures": True, "deadline passed": False,
                       "deadline deleted": False, "deadline junk": True}


def test_a_sampler_publishes_its_steps_rates_and_call_at_its_heartbeat(connection, redis_url):
    """`rqrl train ppo`'s sampler published nothing with its heartbeat: status showed no heartbeat, and would have
    shown 0 steps/s, lag, queue and policy version for figures it has no part of."""
    with RQSampler(fixtures.VersionPolicy(1), fixtures.make_echo_env(), n_workers=2, max_episode_length=100,
                   redis_url=redis_url, secret=TEST_SECRET, n_local_workers=0, progress=False) as sampler:
        sampler.start_worker()
        first = int(obtain_in_process(connection, sampler, 1).lengths.sum())
        obtain_in_process(connection, sampler, 1)  # its first heartbeat counts the first call's steps
        learner = read_status(connection, sampler.config.run_name)[0].learner
        screen = status_screen(redis_url, sampler.config.run_name)
    assert learner["env_steps"] == first > 0 and 1 <= learner["sampler_version"] <= 2, learner
    assert learner["steps_per_second_10s"] > 0 and learner["steps_per_second_60s"] > 0, learner
    assert {"lag_mean", "lag_max", "queue_size", "queue_bound", "policy_version"}.isdisjoint(learner), learner
    line = learner_line(screen)
    assert line.startswith("  learner   alive, heartbeat ") and f"env steps {first:,}, " in line, line
    assert "steps/s (10 s)" in line and "sampler call " in line, line
    assert "lag" not in line and "queue" not in line and "policy version" not in line, line
    assert "jobs      queued 0, started 0, failed 0 (a sampler's jobs run only during its obtain_* calls)" in screen



def test_a_seed_trainers_heartbeat_shows_its_rates_and_its_actor_processes(connection, redis_url, run_name):
    """`rqrl train dqn` at ~700 steps/s showed 0 steps/s, queue 0/0 and "0 alive of 0 registered": its trainer
    published no rates, and its actors are processes of its own, not RQ workers."""
    trainer = Trainer(cartpole_agent(), Config(run_name=run_name, actor_processes=2, actor_threads=3),
                      make_cartpole)
    trainer._facts()
    trainer.stats.transitions_received = 7000
    time.sleep(0.01)
    facts = trainer._facts()
    assert facts["env_steps"] == 7000 and facts["steps_per_second_10s"] > 0 and facts["steps_per_second_60s"] > 0
    run = SeedRun(connection, RunKeys(run_name), TEST_SECRET.encode())
    run.record(SeedRecord(None, actor_processes=2, actor_threads=3))
    run.check_in(facts)
    screen = status_screen(redis_url, run_name)
    lines = screen.splitlines()
    assert lines[0] == f"run {run_name}: SEED trainer, 6 actors in 2 actor process(es)", screen
    assert lines[1].startswith("  learner   alive, heartbeat ") and "env steps 7,000, " in lines[1], screen
    assert "steps/s (10 s)" in lines[1] and "train steps 0, episodes 0" in lines[1], screen
    assert "queue" not in lines[1] and "lag" not in lines[1], screen
    assert lines[2:] == ["  workers   none on a queue: the trainer runs its 2 actor process(es) itself"], screen
